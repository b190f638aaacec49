"""A node's transitions: what changed between its state before and after (pure).

`node_transitions(before, after)` is the one place that decides what counts as a
transition (SPEC §3: reachability, health, provisioning, maintenance, per-device health
and form, pool and pending pool moves). Each transition is a typed value whose `kind` is
the wire's alert kind, so the node event the ledger records and the alert a subscriber
receives carry the same name, and mypy refuses a kind that is not in
`shared.wire.AlertKind`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from shared.wire import AlertKind, HealthStatus, Heartbeat, Inventory

COORDINATOR = "coordinator"
# The maintenance reason of a node held in its old pool until its bookings end (SPEC §5).
POOL_CHANGE_PENDING = "pool change pending"
REACHABLE_REASON = "heartbeat received"
# A device the agent cannot read or find (agent.presence, agent.health) says why with a
# reason that starts so; the inventory also sets `GpuInfo.missing` on a GPU never read.
MISSING_PREFIX = "missing:"
NO_LONGER_MISSING = "no longer missing: the agent reports it readable or replaced"
UNREACHABLE_REASON = "no heartbeat within misses x interval"

# Health as a device's kind: `unmonitored` is a fault for a device (SPEC §3: never
# silently healthy), so it is published as `device.unhealthy` with its reasons.
_DEVICE_KIND: dict[HealthStatus, AlertKind] = {
    "healthy": "device.healthy",
    "degraded": "device.degraded",
    "unhealthy": "device.unhealthy",
    "unmonitored": "device.unhealthy",
}
_NODE_KIND: dict[HealthStatus, AlertKind] = {
    "healthy": "node.healthy",
    "degraded": "node.degraded",
    "unhealthy": "node.unhealthy",
    "unmonitored": "node.unmonitored",
}


@dataclass(frozen=True, slots=True)
class DeviceFlags:
    status: HealthStatus = "healthy"
    reasons: tuple[str, ...] = ()

    @property
    def missing(self) -> bool:
        """The agent cannot read or find the device (SPEC §4: reported, never dropped)."""
        return any(r.startswith(MISSING_PREFIX) for r in self.reasons)


HEALTHY_DEVICE = DeviceFlags()


@dataclass(frozen=True, slots=True)
class NodeFlags:
    """The flags a node's state is derived from, with the reasons the agent or operator
    gave. `devices` maps a device id to its health; a device not listed is healthy."""

    pool_id: str
    reachable: bool = True
    health: HealthStatus = "healthy"
    health_reasons: tuple[str, ...] = ()
    provisioning: bool = False
    maintenance: bool = False
    maintenance_reason: str = ""
    maintenance_by: str = ""
    devices: Mapping[str, DeviceFlags] = field(default_factory=dict)
    # The pool an agent reported while the node held bookings here; see `pool_moves`.
    pending_pool: str | None = None
    # Device → the ids of its current atoms (its form: whole, MIG layout, slots, VFs).
    forms: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Why the node is held in provisioning for exceeding an expected shape ("": it is
    # not); see `shapes`. `provisioning` includes the hold.
    shape_hold: str = ""
    # Why the node is held in provisioning because another node holds one of its
    # physical devices, or it was replaced ("": it is not); see `physical_ids`.
    duplicate_hold: str = ""

    def device(self, device_id: str) -> DeviceFlags:
        return self.devices.get(device_id, HEALTHY_DEVICE)

    @property
    def held_for_pool_change(self) -> bool:
        """In maintenance only because a pool move waits for its bookings to end."""
        return self.maintenance and self.maintenance_reason == POOL_CHANGE_PENDING


@dataclass(frozen=True, slots=True)
class Cause:
    """Who changed a flag and why, for the flags an operator sets (maintenance)."""

    by: str = COORDINATOR
    reason: str = ""


BY_COORDINATOR = Cause()


@dataclass(frozen=True, slots=True)
class NodeRegistered:
    hostname: str
    kind: ClassVar[AlertKind] = "node.registered"
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def reason(self) -> str:
        return f"first inventory from {self.hostname}"

    @property
    def details(self) -> dict[str, Any]:
        return {"hostname": self.hostname}


@dataclass(frozen=True, slots=True)
class PoolChanged:
    from_pool: str
    to_pool: str
    kind: ClassVar[AlertKind] = "node.poolChanged"
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def reason(self) -> str:
        return f"from {self.from_pool}"

    @property
    def details(self) -> dict[str, Any]:
        return {"fromPool": self.from_pool, "toPool": self.to_pool}


@dataclass(frozen=True, slots=True)
class PoolChangePending:
    """The agent reported `to_pool`; the node stays in `from_pool`, in maintenance, until
    the last booking it holds there ends."""

    from_pool: str
    to_pool: str
    kind: ClassVar[AlertKind] = "node.poolChangePending"
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None
    reason: ClassVar[str] = POOL_CHANGE_PENDING

    @property
    def details(self) -> dict[str, Any]:
        return {"fromPool": self.from_pool, "toPool": self.to_pool}


@dataclass(frozen=True, slots=True)
class DeviceReconfigured:
    """A device changed form (MIG layout, time-slice replicas, VF count): its atoms were
    replaced. Bookings on its old forms keep the device until they end."""

    device_id: str
    before: int
    after: int
    kind: ClassVar[AlertKind] = "device.reconfigured"
    by: ClassVar[str] = COORDINATOR

    @property
    def reason(self) -> str:
        return f"{self.before} forms replaced by {self.after}"

    @property
    def details(self) -> dict[str, Any]:
        return {"formsBefore": self.before, "formsAfter": self.after}


@dataclass(frozen=True, slots=True)
class DuplicateIdSeen:
    """Two boots interleave for one node id (two hosts share it); no flag changes: the
    liveness tracker follows `boot_id` and ignores `other_boot_id`."""

    boot_id: str
    other_boot_id: str
    kind: ClassVar[AlertKind] = "node.duplicateId"
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def reason(self) -> str:
        return (
            f"two boots interleave for this node id: following {self.boot_id},"
            f" ignoring {self.other_boot_id}"
        )

    @property
    def details(self) -> dict[str, Any]:
        return {"bootId": self.boot_id, "otherBootId": self.other_boot_id}


@dataclass(frozen=True, slots=True)
class DuplicateDevice:
    """The node's inventory names physical devices that other nodes hold (live, or with
    a booking not ended): it is held in provisioning until an operator says which node
    is real. The alert names both nodes and every device."""

    reason: str
    other_node_ids: tuple[str, ...]
    devices: tuple[str, ...]
    kind: ClassVar[AlertKind] = "node.duplicateDevice"
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def details(self) -> dict[str, Any]:
        return {"otherNodeIds": list(self.other_node_ids), "devices": list(self.devices)}


@dataclass(frozen=True, slots=True)
class NodeReplaced:
    """An operator said `new_node_id` is the host this node was (`nodes.replace`): its
    devices are the new node's, its bookings moved there or ended, and it stays held."""

    new_node_id: str
    by: str
    moved: tuple[str, ...] = ()
    ended: tuple[str, ...] = ()
    kind: ClassVar[AlertKind] = "node.replaced"
    device_id: ClassVar[str | None] = None

    @property
    def reason(self) -> str:
        return f"replaced by node {self.new_node_id}"

    @property
    def details(self) -> dict[str, Any]:
        return {
            "newNodeId": self.new_node_id,
            "moved": list(self.moved),
            "ended": list(self.ended),
        }


@dataclass(frozen=True, slots=True)
class ReachabilityChanged:
    reachable: bool
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def kind(self) -> AlertKind:
        return "node.reachable" if self.reachable else "node.unreachable"

    @property
    def reason(self) -> str:
        return REACHABLE_REASON if self.reachable else UNREACHABLE_REASON

    @property
    def details(self) -> dict[str, Any]:
        return {"reachable": self.reachable}


@dataclass(frozen=True, slots=True)
class MaintenanceChanged:
    on: bool
    reason: str
    by: str
    device_id: ClassVar[str | None] = None

    @property
    def kind(self) -> AlertKind:
        return "node.maintenance" if self.on else "node.maintenanceEnded"

    @property
    def details(self) -> dict[str, Any]:
        return {"maintenance": self.on}


@dataclass(frozen=True, slots=True)
class ProvisioningChanged:
    provisioning: bool
    # Why, when the coordinator holds it (an expected shape exceeded); "" when the agent
    # says so.
    reason: str = ""
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def kind(self) -> AlertKind:
        return "node.provisioning" if self.provisioning else "node.provisioned"

    @property
    def details(self) -> dict[str, Any]:
        return {"provisioning": self.provisioning}


@dataclass(frozen=True, slots=True)
class HealthChanged:
    health: HealthStatus
    reasons: tuple[str, ...]
    by: ClassVar[str] = COORDINATOR
    device_id: ClassVar[str | None] = None

    @property
    def kind(self) -> AlertKind:
        return _NODE_KIND[self.health]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def details(self) -> dict[str, Any]:
        return {"health": self.health}


@dataclass(frozen=True, slots=True)
class DeviceHealthChanged:
    device_id: str
    health: HealthStatus
    reasons: tuple[str, ...]
    by: ClassVar[str] = COORDINATOR

    @property
    def kind(self) -> AlertKind:
        return _DEVICE_KIND[self.health]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def details(self) -> dict[str, Any]:
        return {"health": self.health}


@dataclass(frozen=True, slots=True)
class DeviceMissing:
    """The agent cannot read or find a device it should have (held unhealthy); its
    return, or its stand-in's replacement, is `device.healthy` (or the health it has)."""

    device_id: str
    reasons: tuple[str, ...]
    kind: ClassVar[AlertKind] = "device.missing"
    by: ClassVar[str] = COORDINATOR

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    @property
    def details(self) -> dict[str, Any]:
        return {"health": "unhealthy", "missing": True}


Transition = (
    NodeRegistered
    | PoolChanged
    | PoolChangePending
    | DuplicateIdSeen
    | DuplicateDevice
    | NodeReplaced
    | ReachabilityChanged
    | MaintenanceChanged
    | ProvisioningChanged
    | HealthChanged
    | DeviceHealthChanged
    | DeviceMissing
    | DeviceReconfigured
)


def node_transitions(
    before: NodeFlags | None,
    after: NodeFlags,
    cause: Cause = BY_COORDINATOR,
    hostname: str = "",
) -> tuple[Transition, ...]:
    """Every transition from `before` (None: the node is new) to `after`, in a fixed
    order: registration, pool, reachability, maintenance, provisioning, health, devices.

    A new node is compared with a fresh one (reachable, healthy, in service), so a node
    that registers unhealthy or provisioning says so. Devices that left the node (retired
    atoms) make no transition here, except a missing one: its stand-in was replaced by the
    GPU read again (or the shortfall ended), which is `device.healthy`. A device that
    appears is compared with healthy, and one whose atoms were replaced is reconfigured.
    A device that goes missing is `device.missing` (not also `device.unhealthy`); one that
    is found again says the health it has then, even if that is unhealthy as before.
    The maintenance that holds a node for a pending pool move is said by
    `node.poolChangePending` and `node.poolChanged`, not by maintenance transitions of
    its own."""
    out: list[Transition] = []
    if before is None:
        out.append(NodeRegistered(hostname))
        before = NodeFlags(after.pool_id)
    if before.pool_id != after.pool_id:
        out.append(PoolChanged(before.pool_id, after.pool_id))
    if after.pending_pool is not None and after.pending_pool != before.pending_pool:
        out.append(PoolChangePending(after.pool_id, after.pending_pool))
    if before.reachable != after.reachable:
        out.append(ReachabilityChanged(after.reachable))
    # Held for a pool move, or let go because it moved: the pool transitions say it.
    held = (after.held_for_pool_change and after.pending_pool != before.pending_pool) or (
        before.held_for_pool_change and before.pool_id != after.pool_id
    )
    if before.maintenance != after.maintenance and not held:
        reason = cause.reason or after.maintenance_reason
        out.append(MaintenanceChanged(after.maintenance, reason, cause.by))
    if before.provisioning != after.provisioning:
        out.append(
            ProvisioningChanged(after.provisioning, after.duplicate_hold or after.shape_hold)
        )
    if before.health != after.health:
        out.append(HealthChanged(after.health, after.health_reasons))
    for device_id in sorted(after.devices):
        old, new = before.device(device_id), after.devices[device_id]
        if new.missing and not old.missing:
            out.append(DeviceMissing(device_id, new.reasons))
        elif old.status != new.status or (old.missing and not new.missing):
            out.append(DeviceHealthChanged(device_id, new.status, new.reasons))
    for device_id in sorted(set(before.devices) - set(after.devices)):
        if before.devices[device_id].missing:
            out.append(DeviceHealthChanged(device_id, "healthy", (NO_LONGER_MISSING,)))
    for device_id in sorted(set(before.forms) & set(after.forms)):
        old_forms, new_forms = before.forms[device_id], after.forms[device_id]
        if old_forms != new_forms:
            out.append(DeviceReconfigured(device_id, len(old_forms), len(new_forms)))
    return tuple(out)


def after_inventory(before: NodeFlags | None, inv: Inventory) -> NodeFlags:
    """The flags a full inventory implies. Reachability and maintenance are not the
    agent's to say (the liveness tracker and the operator own them); every device that
    has an atom gets the health the inventory reports, healthy when it reports none. A GPU
    the inventory marks missing is unhealthy and missing whatever its health says."""
    reported = {d.device_id: DeviceFlags(d.status, d.reasons) for d in inv.devices}
    for gpu in inv.gpus:
        if gpu.missing is not None:
            flags = reported.get(gpu.uuid, HEALTHY_DEVICE)
            if not flags.missing:
                why = f"{MISSING_PREFIX} {gpu.missing}"
                reported[gpu.uuid] = DeviceFlags("unhealthy", (why, *flags.reasons))
    devices = {
        a.device_id: reported.get(a.device_id, HEALTHY_DEVICE) for a in inv.atoms if a.device_id
    }
    return replace(
        before or NodeFlags(inv.pool_id),
        pool_id=inv.pool_id,
        health=inv.health.status,
        health_reasons=inv.health.reasons,
        provisioning=inv.provisioning,
        devices=devices,
        forms=forms_of(inv),
    )


def forms_of(inv: Inventory) -> dict[str, frozenset[str]]:
    """Device → the ids of the atoms an inventory gives it."""
    forms: dict[str, set[str]] = {}
    for a in inv.atoms:
        if a.device_id:
            forms.setdefault(a.device_id, set()).add(a.atom_id)
    return {device: frozenset(ids) for device, ids in forms.items()}


def after_heartbeat(before: NodeFlags, hb: Heartbeat) -> NodeFlags:
    """The flags a heartbeat implies. It lists only the devices that are not healthy, so
    every other known device is healthy; a device the ledger does not know is ignored
    until the inventory that names it."""
    reported = {d.device_id: DeviceFlags(d.status, d.reasons) for d in hb.devices}
    return replace(
        before,
        health=hb.health.status,
        health_reasons=hb.health.reasons,
        provisioning=hb.provisioning,
        devices={dev: reported.get(dev, HEALTHY_DEVICE) for dev in before.devices},
    )
