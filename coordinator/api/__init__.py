"""The HTTP API (the coordinator's only aiohttp importer), in three groups pointing one
way: `shapes/` what methods take and answer <- `http/` the machinery (server, bodies,
auth, registry, rendering, OpenAPI, console) <- `methods/` the methods by resource
(plain async functions over validated pydantic inputs). `app.py` mounts the methods on
the server; `docs.py` writes their table into docs/api.md."""
