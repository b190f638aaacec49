"""Field types with the seed's constraints, shared by every input and output model; each
carries a description and an example for the OpenAPI document (a field may say more)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shared.ids import (
    IDEMPOTENCY_KEY_PATTERN,
    POOL_ID_PATTERN,
    PROJECT_ID_PATTERN,
    TENANT_ID_PATTERN,
)

TenantId = Annotated[
    str,
    Field(
        max_length=128,
        pattern=TENANT_ID_PATTERN,
        description="A tenant's id.",
        examples=["acme"],
    ),
]
PoolId = Annotated[
    str,
    Field(
        max_length=57,
        pattern=POOL_ID_PATTERN,
        description="A pool's id.",
        examples=["pool_01hzy3k4m5n6p7q8r9s0t1v2w3"],
    ),
]
ProjectId = Annotated[
    str,
    Field(
        max_length=56,
        pattern=PROJECT_ID_PATTERN,
        description="A project's id (a tenant's own grouping of reservations).",
        examples=["prj_01hzy3k4m5n6p7q8r9s0t1v2w3"],
    ),
]
IdempotencyKey = Annotated[
    str,
    Field(
        max_length=128,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="The client's name for this write: a retry with the same key and body "
        "gets the first answer.",
        examples=["nightly-batch-2030-01-01"],
    ),
]
EpochMs = Annotated[
    int,
    Field(
        ge=0,
        le=140737488355328,
        description="A time, in milliseconds since the Unix epoch (UTC).",
        examples=[1893456000000],
    ),
]
