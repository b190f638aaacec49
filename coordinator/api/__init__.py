"""The HTTP API. `server.py` is the only module here (and in the coordinator) that imports
aiohttp; the method modules are plain async functions over validated pydantic inputs."""
