"""The HTTP machinery: the aiohttp server and its routes, bodies, authentication and
authorization, the method registry and what a handler receives, rendering answers and
errors, the OpenAPI document, the console and its alert feed."""
