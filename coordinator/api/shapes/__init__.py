"""What API methods take and answer: the input and output models, one declaration each
(their fields, descriptions and examples are the OpenAPI document's)."""
