"""The HTTP API, in three groups: `http/` the machinery (`http/server.py` is the only
module here, and in the coordinator, that imports aiohttp), `methods/` the methods by
resource (plain async functions over validated pydantic inputs) and `shapes/` what they
take and answer."""
