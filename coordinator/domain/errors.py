"""The coordinator's one exception root and its subclasses, one per API error code.

The HTTP layer maps `CoordinatorError` to the error envelope in exactly one place
(`api/http/server.py`); everything below raises these and nothing else on purpose.
"""

from __future__ import annotations

from typing import Any, ClassVar


class CoordinatorError(Exception):
    code: ClassVar[str] = "INTERNAL"
    status: ClassVar[int] = 500

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details if details is not None else {}


class InvalidInput(CoordinatorError):
    code = "INVALID_INPUT"
    status = 400


class Unauthenticated(CoordinatorError):
    code = "UNAUTHENTICATED"
    status = 401


class PermissionDenied(CoordinatorError):
    code = "PERMISSION_DENIED"
    status = 403


class NotFound(CoordinatorError):
    code = "NOT_FOUND"
    status = 404


class UnknownPool(NotFound):
    """An agent reported a pool the ledger does not know."""


class CapacityNotAvailable(CoordinatorError):
    code = "CAPACITY_NOT_AVAILABLE"
    status = 409


class QuotaExceeded(CoordinatorError):
    code = "QUOTA_EXCEEDED"
    status = 409


class IdempotencyKeyConflict(CoordinatorError):
    code = "IDEMPOTENCY_KEY_CONFLICT"
    status = 409


class Conflict(CoordinatorError):
    """A uniqueness clash on an admin object (tenant or pool that already exists)."""

    code = "ALREADY_EXISTS"
    status = 409


class PayloadTooLarge(CoordinatorError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class Unavailable(CoordinatorError):
    code = "UNAVAILABLE"
    status = 503


class RequestTimeout(InvalidInput):
    """The request body did not arrive within the server's time limit."""

    status = 408
