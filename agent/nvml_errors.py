"""How the agent's NVML readers take a failed call: a lost GPU ends that GPU's read
(`GpuLost`, raised by `raise_if_lost`), anything else is described in words an operator
can act on; and the one way to read an `nvmlFieldValue_t`'s value."""

from __future__ import annotations

from typing import Any

import pynvml

from agent.errors import AgentError


class GpuLost(AgentError):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus."""


def field_int(value: Any) -> int:
    kind = int(value.valueType)
    v = value.value
    by_type = {0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal}
    return int(by_type.get(kind, v.ullVal))


def return_name(code: int) -> str:
    try:
        return str(pynvml.NVMLError(code))
    except Exception:
        return str(code)


def raise_if_lost(exc: BaseException) -> None:
    if getattr(exc, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
        raise GpuLost from exc


def describe(exc: BaseException) -> str:
    if isinstance(exc, pynvml.NVMLError):
        return f"{type(exc).__name__} ({exc})"
    return f"{type(exc).__name__}: {exc}"
