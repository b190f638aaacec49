"""A typed Python client of the coordinator's API, sync and async, generated from its
OpenAPI document: inputs and answers are TypedDicts (`ops.apiclient.generated`), list
methods have page iterators, 503s are retried with backoff."""

from __future__ import annotations

from ops.apiclient.client import AsyncClient, Client
from ops.apiclient.transport import Retry
from ops.client import ApiError, ClientError, Unreachable

__all__ = ["ApiError", "AsyncClient", "Client", "ClientError", "Retry", "Unreachable"]
