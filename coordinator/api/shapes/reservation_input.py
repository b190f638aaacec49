"""The `reservations.create` input, exactly as the seed's table has it; `capacity.preview`
validates the same model. Also its translation into the placer's request."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from coordinator.api.shapes.base import ApiInput
from coordinator.api.shapes.fields import EpochMs, IdempotencyKey, PoolId, ProjectId, TenantId
from coordinator.domain.placement_model import DeviceRequest, PlacementRequest
from shared.durations import DurationError, parse_duration
from shared.wire import AtomClass

TopologyName = Literal["any", "nvlink-all"]
SharingMode = Literal["exclusive", "mig", "timeslice", "mps"]
Scalar = str | int | float | bool
_SHARING_FOR = {
    "gpu": ("exclusive",),
    "gpu.mig": ("mig",),
    "gpu.slot": ("timeslice", "mps"),
}


class DeviceInput(ApiInput):
    cls: AtomClass = Field(alias="class", description="The device class.", examples=["gpu"])
    count: Annotated[int, Field(ge=1, le=64)] = Field(description="How many.", examples=[1])
    selector: Annotated[dict[str, Scalar | list[Scalar]], Field(max_length=32)] | None = Field(
        default=None,
        description="Attributes the devices must have: a value, or a list of allowed ones.",
    )
    topology: TopologyName | None = Field(
        default=None, description="nvlink-all: every device of this request linked by NVLink."
    )
    sharing: SharingMode | None = Field(
        default=None, description="How the device is shared (must fit the class)."
    )

    @field_validator("sharing")
    @classmethod
    def _sharing_fits_class(cls, value: str | None, info: ValidationInfo) -> str | None:
        device_class = info.data.get("cls")
        if value is not None and device_class is not None:
            allowed = _SHARING_FOR.get(device_class, ())
            if value not in allowed:
                raise ValueError(
                    f"sharing {value!r} does not fit class {device_class!r}"
                    + (f" (use {', '.join(allowed)})" if allowed else "")
                )
        return value


class ResourcesInput(ApiInput):
    vcpu: Annotated[int, Field(ge=0, le=4096)] | None = Field(default=None, description="vCPUs.")
    memory_gi_b: Annotated[int, Field(ge=0, le=65536)] | None = Field(
        default=None, alias="memoryGiB", description="Memory, GiB."
    )
    hugepages1_gi: Annotated[int, Field(ge=0, le=4096)] | None = Field(
        default=None, alias="hugepages1Gi", description="1 GiB huge pages."
    )

    def as_dict(self) -> dict[str, int]:
        values = {
            "vcpu": self.vcpu,
            "memoryGiB": self.memory_gi_b,
            "hugepages1Gi": self.hugepages1_gi,
        }
        return {k: v for k, v in values.items() if v}


class NodeProfileInput(ApiInput):
    profile_id: Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z0-9._:/-]{1,128}$")] = Field(
        description="The node profile the nodes must run.", examples=["base"]
    )
    profile_version: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="At least this version of it."
    )


class WaitInput(ApiInput):
    timeout_ms: Annotated[int, Field(ge=0, le=30000)] = Field(
        description="How long to wait for capacity before answering 409."
    )


class GangInput(ApiInput):
    size: Annotated[int, Field(ge=2, le=64)] = Field(
        description="How many nodes, each given the devices asked for."
    )
    topology_key: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="A node label every member must share the value of."
    )


class ReservationCreateInput(ApiInput):
    tenant_id: TenantId = Field(description="The tenant booking.")
    pool_id: PoolId = Field(description="The pool to book in.")
    project_id: ProjectId | None = Field(default=None, description="A project to book under.")
    devices: Annotated[list[DeviceInput], Field(min_length=1, max_length=8)] = Field(
        description="The device requests, all on one node (per gang member)."
    )
    topology: TopologyName | None = Field(
        default=None, description="nvlink-all: every GPU of the request linked by NVLink."
    )
    start: EpochMs | None = Field(default=None, description="When it starts (default: now).")
    # Any here and checked below, so that errors name `duration`, not a union member.
    duration: Any = Field(
        description="How long: integer seconds or a string like 90m, 2h, PT2H.",
        examples=["2h"],
    )
    binding: str = Field(
        default="hold", description="hold: the devices; node: whole nodes.", examples=["hold"]
    )
    resources: ResourcesInput | None = Field(
        default=None, description="Scalar resources on the same node."
    )
    node: NodeProfileInput | None = Field(
        default=None, description="The node profile the nodes must run."
    )
    lease_seconds: Annotated[int, Field(ge=30, le=86400)] | None = Field(
        default=None, description="A lease: it expires unless renewed within this."
    )
    spot: bool = Field(default=False, description="Preemptible, at a notice.")
    idempotency_key: IdempotencyKey = Field(description="Names this booking for retries.")
    wait: WaitInput | None = Field(
        default=None, description="Wait for capacity to free up before answering 409."
    )
    gang: GangInput | None = Field(default=None, description="Book several nodes at once.")

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: Any) -> str | int:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError("duration must be integer seconds or a string like 90m, 2h, PT2H")
        try:
            parse_duration(value)
        except DurationError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("binding")
    @classmethod
    def _binding(cls, value: str) -> str:
        if value not in ("hold", "node"):
            raise ValueError("binding must be 'hold' or 'node'")
        return value

    @property
    def duration_ms(self) -> int:
        return parse_duration(self.duration) * 1000

    def canonical(self) -> dict[str, Any]:
        """The body as sent, normalised (aliases, no defaults), for idempotency hashes."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def placement(self) -> PlacementRequest:
        return PlacementRequest(
            devices=tuple(
                DeviceRequest(
                    cls=d.cls,
                    count=d.count,
                    selector=tuple(
                        (k, tuple(v) if isinstance(v, list) else (v,))
                        for k, v in sorted((d.selector or {}).items())
                    ),
                    topology=d.topology,
                    sharing=d.sharing,
                )
                for d in self.devices
            ),
            topology=self.topology or "any",
            binding="node" if self.binding == "node" else "hold",
            resources=tuple(sorted((self.resources.as_dict() if self.resources else {}).items())),
            profile_id=self.node.profile_id if self.node else None,
            profile_version=self.node.profile_version if self.node else None,
            gang_size=self.gang.size if self.gang else 1,
            gang_key=self.gang.topology_key if self.gang else None,
            spot=self.spot,
        )
