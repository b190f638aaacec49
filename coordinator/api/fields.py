"""Field types with the seed's constraints, shared by every input model."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shared.ids import (
    IDEMPOTENCY_KEY_PATTERN,
    POOL_ID_PATTERN,
    PROJECT_ID_PATTERN,
    TENANT_ID_PATTERN,
)

TenantId = Annotated[str, Field(max_length=128, pattern=TENANT_ID_PATTERN)]
PoolId = Annotated[str, Field(max_length=57, pattern=POOL_ID_PATTERN)]
ProjectId = Annotated[str, Field(max_length=56, pattern=PROJECT_ID_PATTERN)]
IdempotencyKey = Annotated[str, Field(max_length=128, pattern=IDEMPOTENCY_KEY_PATTERN)]
EpochMs = Annotated[int, Field(ge=0, le=140737488355328)]
