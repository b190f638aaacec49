"""Typed API client methods and TypedDicts, generated from the OpenAPI document.

Do not edit: run `python -m ops.apiclient_gen` (a test checks this file is current).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal, NotRequired, TypedDict, cast

from ops.apiclient.transport import AsyncTransport, SyncTransport


ApiKeyCreateInput = TypedDict("ApiKeyCreateInput", {
    'tenantId': str,
    'roles': NotRequired[list[Literal['tenant', 'operator']]],
    'label': NotRequired[str],
})


ApiKeyCreated = TypedDict("ApiKeyCreated", {
    'keyId': str,
    'key': str,
    'tenantId': str,
    'roles': list[Literal['tenant', 'operator']],
})


ApiKeyOut = TypedDict("ApiKeyOut", {
    'keyId': str,
    'tenantId': str,
    'roles': list[Literal['tenant', 'operator']],
    'label': str,
    'createdAt': int,
    'revokedAt': int | None,
})


ApiKeyList = TypedDict("ApiKeyList", {
    'tenantId': str | None,
    'keys': list[ApiKeyOut],
})


ApiKeyListInput = TypedDict("ApiKeyListInput", {
    'tenantId': NotRequired[str | None],
    'includeRevoked': NotRequired[bool],
})


ApiKeyRevokeInput = TypedDict("ApiKeyRevokeInput", {
    'keyId': str,
})


ApiKeyRevoked = TypedDict("ApiKeyRevoked", {
    'keyId': str,
    'revoked': Literal[True],
})


# Why a live reservation may not get what it booked (SPEC §5, truth under change).
AtRisk = TypedDict("AtRisk", {
    'reason': str,
    'since': int,
    'atoms': list[str],
})


BookedAtomOut = TypedDict("BookedAtomOut", {
    'atomId': str,
    'nodeId': str,
    'class': Literal['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'],
})


ByPoolInput = TypedDict("ByPoolInput", {
    'tenantId': str,
    'poolId': str,
})


CalendarInterval = TypedDict("CalendarInterval", {
    'startsAt': str,
    'endsAt': str,
    'reservationLimitGb': int,
    'reservedGb': int,
    'reservableGb': int,
})


Calendar = TypedDict("Calendar", {
    'from': str,
    'to': str,
    'resource': Literal['memory_gb'],
    'intervals': list[CalendarInterval],
})


CallerKey = TypedDict("CallerKey", {
    'keyId': str,
    'tenantId': str,
    'roles': list[Literal['tenant', 'operator']],
    'operator': bool,
})


# An atom the placer would take, with its attributes (model, memory, …) inline.
CandidateAtom = TypedDict("CandidateAtom", {
    'atomId': str,
    'class': Literal['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'],
})


Candidate = TypedDict("Candidate", {
    'nodeId': str,
    'atoms': list[CandidateAtom],
    'score': float,
})


IntervalShortfall = TypedDict("IntervalShortfall", {
    'startsAt': str,
    'requestedGb': int,
    'reservableGb': int,
    'reason': Literal['insufficient_capacity', 'concurrent_write'],
})


# Seed 002's 409 when a well-formed request does not fit: every interval that
# does not, so the client can retry in one round trip.
CapacityNotAvailableBody = TypedDict("CapacityNotAvailableBody", {
    'error': Literal['capacity_not_available'],
    'intervals': list[IntervalShortfall],
})


# Whole GPUs of one GPU model over the listed pools.
ModelTotals = TypedDict("ModelTotals", {
    'total': int,
    'allocatable': int,
    'allocated': int,
    'reserved': int,
    'available': int,
})


# One resource's counts in a pool (whole units: GPUs, GiB, vCPUs…).
RollupRowOut = TypedDict("RollupRowOut", {
    'resource': str,
    'total': int,
    'allocatable': int,
    'allocated': int,
    'reserved': int,
    'available': int,
    'provisioning': int,
    'unhealthy': int,
    'maintenance': int,
    'unreachable': int,
    'updatedAt': int,
})


PoolCapacity = TypedDict("PoolCapacity", {
    'poolId': str,
    'name': str,
    'gpuModel': str | None,
    'owner': str,
    'archived': bool,
    'capacity': list[RollupRowOut],
})


CapacitySummary = TypedDict("CapacitySummary", {
    'tenantId': str | None,
    'pools': list[PoolCapacity],
    'byGpuModel': dict[str, ModelTotals],
})


DeviceInput = TypedDict("DeviceInput", {
    'class': Literal['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'],
    'count': int,
    'selector': NotRequired[dict[str, str | int | float | bool | list[str | int | float | bool]] | None],
    'topology': NotRequired[Literal['any', 'nvlink-all'] | None],
    'sharing': NotRequired[Literal['exclusive', 'mig', 'timeslice', 'mps'] | None],
})


DeviceShortfall = TypedDict("DeviceShortfall", {
    'index': int | None,
    'class': Literal['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'] | None,
    'requested': int,
    'available': int,
    'reason': str,
})


ErrorBody = TypedDict("ErrorBody", {
    'code': str,
    'message': str,
    'details': Any,
})


# The error envelope every compute method answers a failure with.
ErrorEnvelope = TypedDict("ErrorEnvelope", {
    'error': ErrorBody,
})


FleetInput = TypedDict("FleetInput", {
})


Gang = TypedDict("Gang", {
    'size': int,
    'topologyKey': NotRequired[str | None],
})


GangInput = TypedDict("GangInput", {
    'size': int,
    'topologyKey': NotRequired[str | None],
})


HealthFlag = TypedDict("HealthFlag", {
    'value': Literal['healthy', 'degraded', 'unhealthy', 'unmonitored'],
    'reasons': list[str],
    'since': int,
})


Holder = TypedDict("Holder", {
    'reservationId': str,
    'tenantId': str,
    'projectId': str | None,
    'until': int,
})


# Held by another tenant's reservation: only that it is held is said.
OtherHolder = TypedDict("OtherHolder", {
    'other': Literal[True],
})


HeldAtom = TypedDict("HeldAtom", {
    'atomId': str,
    'class': Literal['gpu', 'gpu.mig', 'gpu.slot', 'nic.vf', 'disk', 'node'],
    'deviceId': str,
    'health': Literal['healthy', 'degraded', 'unhealthy', 'unmonitored'],
    'healthReasons': list[str],
    'attrs': dict[str, str | int | float | bool | None],
    'bucket': Literal['allocatable', 'provisioning', 'unhealthy', 'maintenance', 'unreachable'],
    'heldBy': Holder | OtherHolder | None,
})


# Seed 002's 409 when an Idempotency-Key is reused with another body.
IdempotencyConflictBody = TypedDict("IdempotencyConflictBody", {
    'error': Literal['idempotency_key_conflict'],
    'message': str,
})


IntervalOut = TypedDict("IntervalOut", {
    'startsAt': str,
    'endsAt': str,
    'capacityGb': int,
})


IntervalReservationOut = TypedDict("IntervalReservationOut", {
    'reservationId': str,
    'createdAt': str,
    'intervals': list[IntervalOut],
})


IntervalReservationPage = TypedDict("IntervalReservationPage", {
    'from': str,
    'to': str,
    'reservations': list[IntervalReservationOut],
    'nextCursor': str | None,
})


# The body of `POST /api/capacity/reservations`.
IntervalsRequest = TypedDict("IntervalsRequest", {
    'intervals': list[IntervalOut],
    'poolId': NotRequired[str | None],
})


ListInput = TypedDict("ListInput", {
    'tenantId': NotRequired[str | None],
    'poolId': NotRequired[str | None],
    'projectId': NotRequired[str | None],
    'state': NotRequired[list[Literal['scheduled', 'active', 'noticed', 'completed', 'released', 'expired', 'preempted']]],
    'from': NotRequired[int | None],
    'to': NotRequired[int | None],
    'cursor': NotRequired[str | None],
    'limit': NotRequired[int],
})


MaintenanceFlag = TypedDict("MaintenanceFlag", {
    'value': bool,
    'reason': str,
    'by': str,
    'since': int | None,
})


MaintenanceInput = TypedDict("MaintenanceInput", {
    'nodeId': str,
    'maintenance': bool,
    'reason': NotRequired[str],
})


# The brief answer to `nodes.setMaintenance` (`nodes.get` has the whole node).
MaintenanceSet = TypedDict("MaintenanceSet", {
    'nodeId': str,
    'poolId': str,
    'status': Literal['ready', 'degraded', 'provisioning', 'unhealthy', 'maintenance', 'unreachable'],
    'maintenance': bool,
    'reason': str,
    'changed': bool,
    'reservationsAtRisk': int,
})


ProvisioningFlag = TypedDict("ProvisioningFlag", {
    'value': bool,
})


Reachable = TypedDict("Reachable", {
    'value': bool,
    'since': int,
})


NodeFlags = TypedDict("NodeFlags", {
    'reachable': Reachable,
    'health': HealthFlag,
    'maintenance': MaintenanceFlag,
    'provisioning': ProvisioningFlag,
})


NodeResources = TypedDict("NodeResources", {
    'vcpu': int,
    'memoryGiB': int,
    'hugepages1Gi': int,
})


# One node with every atom, its bucket and its holder.
NodeDetail = TypedDict("NodeDetail", {
    'nodeId': str,
    'poolId': str,
    'hostname': str,
    'status': Literal['ready', 'degraded', 'provisioning', 'unhealthy', 'maintenance', 'unreachable'],
    'labels': dict[str, str],
    'profileId': str | None,
    'profileVersion': int | None,
    'state': NodeFlags,
    'lastSeen': int,
    'intervalMs': int,
    'resources': NodeResources,
    'atoms': list[HeldAtom],
})


NodeEventOut = TypedDict("NodeEventOut", {
    'eventId': int,
    'nodeId': str,
    'poolId': str,
    'kind': str,
    'reason': str,
    'by': str,
    'at': int,
    'deviceId': str | None,
})


NodeEvents = TypedDict("NodeEvents", {
    'nodeId': str,
    'events': list[NodeEventOut],
})


NodeEventsInput = TypedDict("NodeEventsInput", {
    'tenantId': NotRequired[str | None],
    'nodeId': str,
    'after': NotRequired[int],
    'limit': NotRequired[int],
})


NodeListInput = TypedDict("NodeListInput", {
    'tenantId': NotRequired[str | None],
    'poolId': NotRequired[str | None],
    'cursor': NotRequired[str | None],
    'limit': NotRequired[int],
})


# A node in a listing: its atoms counted per class.
NodeSummary = TypedDict("NodeSummary", {
    'nodeId': str,
    'poolId': str,
    'hostname': str,
    'status': Literal['ready', 'degraded', 'provisioning', 'unhealthy', 'maintenance', 'unreachable'],
    'labels': dict[str, str],
    'profileId': str | None,
    'profileVersion': int | None,
    'state': NodeFlags,
    'lastSeen': int,
    'intervalMs': int,
    'resources': NodeResources,
    'atoms': dict[str, int],
})


NodePage = TypedDict("NodePage", {
    'poolId': str | None,
    'nodes': list[NodeSummary],
    'nextCursor': str | None,
})


NodeProfileInput = TypedDict("NodeProfileInput", {
    'profileId': str,
    'profileVersion': NotRequired[int | None],
})


NodeRef = TypedDict("NodeRef", {
    'tenantId': NotRequired[str | None],
    'nodeId': str,
})


PoolCreateInput = TypedDict("PoolCreateInput", {
    'tenantId': str,
    'name': str,
    'gpuModel': NotRequired[str | None],
})


PoolOut = TypedDict("PoolOut", {
    'poolId': str,
    'name': str,
    'gpuModel': str | None,
    'owner': str,
    'archived': bool,
    'createdAt': int,
    'offeredTo': NotRequired[list[str] | None],
})


PoolList = TypedDict("PoolList", {
    'tenantId': str,
    'pools': list[PoolOut],
})


PoolListInput = TypedDict("PoolListInput", {
    'tenantId': str,
})


PoolOfferInput = TypedDict("PoolOfferInput", {
    'tenantId': str,
    'poolId': str,
    'offerTo': str,
})


PoolRef = TypedDict("PoolRef", {
    'tenantId': str,
    'poolId': str,
})


PoolRows = TypedDict("PoolRows", {
    'poolId': str,
    'rows': list[RollupRowOut],
})


Preemptible = TypedDict("Preemptible", {
    'count': int,
    'startsAt': int,
})


Preview = TypedDict("Preview", {
    'fits': bool,
    'candidates': list[Candidate],
    'reason': NotRequired[str | None],
    'shortfalls': NotRequired[list[DeviceShortfall] | None],
    'preemptible': NotRequired[Preemptible | None],
    'filtered': NotRequired[dict[str, int] | None],
})


ResourcesInput = TypedDict("ResourcesInput", {
    'vcpu': NotRequired[int | None],
    'memoryGiB': NotRequired[int | None],
    'hugepages1Gi': NotRequired[int | None],
})


WaitInput = TypedDict("WaitInput", {
    'timeoutMs': int,
})


# A reservation request to try: seed 000 has it validated as `reservations.create`'s
# input, `idempotencyKey` included (the CLI fills one in); nothing is booked with it.
PreviewInput = TypedDict("PreviewInput", {
    'tenantId': str,
    'poolId': str,
    'projectId': NotRequired[str | None],
    'devices': list[DeviceInput],
    'topology': NotRequired[Literal['any', 'nvlink-all'] | None],
    'start': NotRequired[int | None],
    'duration': Any,
    'binding': NotRequired[str],
    'resources': NotRequired[ResourcesInput | None],
    'node': NotRequired[NodeProfileInput | None],
    'leaseSeconds': NotRequired[int | None],
    'spot': NotRequired[bool],
    'idempotencyKey': str,
    'wait': NotRequired[WaitInput | None],
    'gang': NotRequired[GangInput | None],
})


QuotaOut = TypedDict("QuotaOut", {
    'poolId': str | None,
    'resource': str,
    'limit': int,
})


QuotaSetInput = TypedDict("QuotaSetInput", {
    'tenantId': str,
    'poolId': NotRequired[str | None],
    'resource': Literal['disk', 'gpu', 'gpu.mig', 'gpu.slot', 'hugepages1Gi', 'memoryGiB', 'nic.vf', 'node', 'vcpu'],
    'limit': int,
})


Quotas = TypedDict("Quotas", {
    'tenantId': str,
    'quotas': list[QuotaOut],
})


RenewInput = TypedDict("RenewInput", {
    'tenantId': str,
    'reservationId': str,
    'leaseSeconds': NotRequired[int | None],
})


ReservationCreateInput = TypedDict("ReservationCreateInput", {
    'tenantId': str,
    'poolId': str,
    'projectId': NotRequired[str | None],
    'devices': list[DeviceInput],
    'topology': NotRequired[Literal['any', 'nvlink-all'] | None],
    'start': NotRequired[int | None],
    'duration': Any,
    'binding': NotRequired[str],
    'resources': NotRequired[ResourcesInput | None],
    'node': NotRequired[NodeProfileInput | None],
    'leaseSeconds': NotRequired[int | None],
    'spot': NotRequired[bool],
    'idempotencyKey': str,
    'wait': NotRequired[WaitInput | None],
    'gang': NotRequired[GangInput | None],
})


ReservationLookup = TypedDict("ReservationLookup", {
    'tenantId': NotRequired[str | None],
    'reservationId': str,
})


# A reservation as its tenant sees it, with its state now.
ReservationOut = TypedDict("ReservationOut", {
    'reservationId': str,
    'tenantId': str,
    'poolId': str,
    'projectId': NotRequired[str | None],
    'state': Literal['scheduled', 'active', 'noticed', 'completed', 'released', 'expired', 'preempted'],
    'start': int,
    'end': int,
    'spot': bool,
    'binding': Literal['hold', 'node'],
    'atoms': list[BookedAtomOut],
    'createdAt': int,
    'leaseExpiresAt': NotRequired[int | None],
    'preemptAt': NotRequired[int | None],
    'resources': NotRequired[dict[str, int] | None],
    'gang': NotRequired[Gang | None],
    'endedAt': NotRequired[int | None],
    'atRisk': NotRequired[AtRisk | None],
})


ReservationPage = TypedDict("ReservationPage", {
    'reservations': list[ReservationOut],
    'nextCursor': str | None,
})


ReservationRef = TypedDict("ReservationRef", {
    'tenantId': str,
    'reservationId': str,
})


SummaryInput = TypedDict("SummaryInput", {
    'tenantId': str,
})


TenantCreateInput = TypedDict("TenantCreateInput", {
    'tenantId': str,
    'name': NotRequired[str | None],
})


TenantRow = TypedDict("TenantRow", {
    'tenantId': str,
    'name': str,
    'createdAt': int,
    'pools': int,
    'keys': int,
})


TenantList = TypedDict("TenantList", {
    'tenants': list[TenantRow],
})


TenantListInput = TypedDict("TenantListInput", {
})


TenantOut = TypedDict("TenantOut", {
    'tenantId': str,
    'name': str,
    'createdAt': int,
})


TimelineBucket = TypedDict("TimelineBucket", {
    'start': int,
    'end': int,
    'booked': int,
    'free': int,
})


Timeline = TypedDict("Timeline", {
    'poolId': str,
    'from': int,
    'to': int,
    'stepMinutes': int,
    'allocatable': int,
    'buckets': list[TimelineBucket],
})


TimelineInput = TypedDict("TimelineInput", {
    'tenantId': str,
    'poolId': str,
    'from': NotRequired[int | None],
    'to': NotRequired[int | None],
    'stepMinutes': NotRequired[int | None],
})


UsageInput = TypedDict("UsageInput", {
    'tenantId': NotRequired[str | None],
    'poolId': NotRequired[str | None],
    'projectId': NotRequired[str | None],
    'from': NotRequired[int | None],
    'to': NotRequired[int | None],
})


UsageRow = TypedDict("UsageRow", {
    'tenantId': str,
    'poolId': str,
    'projectId': str | None,
    'resource': str,
    'hours': float,
    'reservations': int,
})


UsageReport = TypedDict("UsageReport", {
    'from': int,
    'to': int,
    'asOf': int,
    'rows': list[UsageRow],
    'totals': dict[str, float],
})


WhoAmIInput = TypedDict("WhoAmIInput", {
})


class ApiKeysApi:
    """The `apiKeys` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, body: ApiKeyCreateInput) -> ApiKeyCreated:
        """Create an API key for a tenant (operator). The key is shown once, stored hashed."""
        return cast("ApiKeyCreated", self._t.call("apiKeys.create", body))

    def list(self, body: ApiKeyListInput | None = None) -> ApiKeyList:
        """A tenant's API keys, or every tenant's (operator): id, roles, label, times; never the secret. Revoked keys only with includeRevoked."""
        return cast("ApiKeyList", self._t.call("apiKeys.list", body or {}))

    def revoke(self, body: ApiKeyRevokeInput) -> ApiKeyRevoked:
        """Revoke an API key (operator); it stops working at once."""
        return cast("ApiKeyRevoked", self._t.call("apiKeys.revoke", body))

    def self_(self, body: WhoAmIInput | None = None) -> CallerKey:
        """The calling key: its id, tenant and roles (a CLI infers the tenant from it)."""
        return cast("CallerKey", self._t.call("apiKeys.self", body or {}))


class CapacityApi:
    """The `capacity` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def by_pool(self, body: ByPoolInput) -> PoolRows:
        """One pool's rollup rows, one per resource, ordered by resource name."""
        return cast("PoolRows", self._t.call("capacity.byPool", body))

    def fleet(self, body: FleetInput | None = None) -> CapacitySummary:
        """capacity.summary over every pool of every tenant, archived ones included (operator)."""
        return cast("CapacitySummary", self._t.call("capacity.fleet", body or {}))

    def preview(self, body: PreviewInput) -> Preview:
        """Run the placer on a reservation request without booking anything."""
        return cast("Preview", self._t.call("capacity.preview", body))

    def summary(self, body: SummaryInput) -> CapacitySummary:
        """Every pool the tenant owns or is offered with its rollup rows, plus whole-GPU totals per GPU model."""
        return cast("CapacitySummary", self._t.call("capacity.summary", body))

    def timeline(self, body: TimelineInput) -> Timeline:
        """Whole GPUs booked per time bucket and how many of the allocatable remain free."""
        return cast("Timeline", self._t.call("capacity.timeline", body))


class IntervalsApi:
    """The `intervals` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def calendar(self, from_: str, to: str, *, pool_id: str | None = None, tenant_id: str | None = None) -> Calendar:
        """Per quarter-hour of [from, to): the tenant's limit, reserved and reservable GB."""
        return cast("Calendar", self._t.request("GET", "/api/capacity/calendar", query={"from": from_, "to": to, "poolId": pool_id, "tenantId": tenant_id}))

    def list(self, from_: str, to: str, *, cursor: str | None = None, limit: int | None = None) -> IntervalReservationPage:
        """The audit list: every interval reservation made in [from, to), newest first."""
        return cast("IntervalReservationPage", self._t.request("GET", "/api/capacity/reservations", query={"from": from_, "to": to, "cursor": cursor, "limit": limit}))

    def list_iter(self, from_: str, to: str, *, limit: int | None = None) -> Iterator[IntervalReservationOut]:
        """Every item `intervals.list` answers, page after page (`nextCursor`)."""
        cursor: str | None = None
        while True:
            page = self.list(from_=from_, to=to, limit=limit, cursor=cursor)
            for item in page["reservations"]:
                yield item
            cursor = page["nextCursor"]
            if cursor is None:
                return

    def reserve(self, body: IntervalsRequest, *, idempotency_key: str | None = None, pool_id: str | None = None) -> IntervalReservationOut:
        """Commit capacity to one or more 15-minute intervals, all or nothing."""
        return cast("IntervalReservationOut", self._t.request("POST", "/api/capacity/reservations", query={"poolId": pool_id}, headers={"Idempotency-Key": idempotency_key}, body=body))


class NodesApi:
    """The `nodes` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def events(self, body: NodeEventsInput) -> NodeEvents:
        """A node's recorded transitions, oldest first, after an event id."""
        return cast("NodeEvents", self._t.call("nodes.events", body))

    def get(self, body: NodeRef) -> NodeDetail:
        """One node with its state flags and every atom with its bucket and holder (NOT_FOUND unless its pool is visible)."""
        return cast("NodeDetail", self._t.call("nodes.get", body))

    def list(self, body: NodeListInput | None = None) -> NodePage:
        """Nodes with their state, ordered by nodeId, a page at a time: one pool's, or (poolId left out) every pool's the tenant sees; operators may leave out tenantId."""
        return cast("NodePage", self._t.call("nodes.list", body or {}))

    def list_iter(self, body: NodeListInput | None = None) -> Iterator[NodeSummary]:
        """Every item `nodes.list` answers, page after page (`nextCursor`)."""
        ask: dict[str, Any] = dict(body or {})
        while True:
            page = self.list(cast("NodeListInput", ask))
            for item in page["nodes"]:
                yield item
            if page["nextCursor"] is None:
                return
            ask["cursor"] = page["nextCursor"]

    def set_maintenance(self, body: MaintenanceInput) -> MaintenanceSet:
        """Put a node in or out of maintenance with a reason (operator). Its atoms move to the maintenance bucket at once; the change is a node event and an alert, and the reservations it puts at risk are counted in the answer (each holder is alerted)."""
        return cast("MaintenanceSet", self._t.call("nodes.setMaintenance", body))


class PoolsApi:
    """The `pools` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def archive(self, body: PoolRef) -> PoolOut:
        """Archive a pool (owner): it stays visible to its owner only."""
        return cast("PoolOut", self._t.call("pools.archive", body))

    def capacity(self, body: ByPoolInput) -> PoolRows:
        """One pool's rollup rows, one per resource, ordered by resource name."""
        return cast("PoolRows", self._t.call("pools.capacity", body))

    def create(self, body: PoolCreateInput) -> PoolOut:
        """Create a pool owned by a tenant (operator)."""
        return cast("PoolOut", self._t.call("pools.create", body))

    def get(self, body: PoolRef) -> PoolOut:
        """One pool the tenant owns or is offered."""
        return cast("PoolOut", self._t.call("pools.get", body))

    def list(self, body: PoolListInput) -> PoolList:
        """Every pool the tenant owns (archived included) or is offered (not archived)."""
        return cast("PoolList", self._t.call("pools.list", body))

    def offer(self, body: PoolOfferInput) -> PoolOut:
        """Offer a pool to another tenant (owner)."""
        return cast("PoolOut", self._t.call("pools.offer", body))

    def unoffer(self, body: PoolOfferInput) -> PoolOut:
        """Withdraw an offer (owner); the pool vanishes for that tenant at once."""
        return cast("PoolOut", self._t.call("pools.unoffer", body))


class QuotasApi:
    """The `quotas` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def set(self, body: QuotaSetInput) -> Quotas:
        """Set a tenant's limit on a resource, in one pool or across its pools (operator)."""
        return cast("Quotas", self._t.call("quotas.set", body))


class ReservationsApi:
    """The `reservations` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, body: ReservationCreateInput) -> ReservationOut:
        """Place and book a request atomically across every atom and gang member."""
        return cast("ReservationOut", self._t.call("reservations.create", body))

    def get(self, body: ReservationLookup) -> ReservationOut:
        """One of the tenant's reservations, with its state now (operators: any tenant's)."""
        return cast("ReservationOut", self._t.call("reservations.get", body))

    def list(self, body: ListInput | None = None) -> ReservationPage:
        """The tenant's reservations, newest first, a page at a time (opaque cursor); filtered by pool, project, state now and a time window; operators may leave out tenantId for every tenant's."""
        return cast("ReservationPage", self._t.call("reservations.list", body or {}))

    def list_iter(self, body: ListInput | None = None) -> Iterator[ReservationOut]:
        """Every item `reservations.list` answers, page after page (`nextCursor`)."""
        ask: dict[str, Any] = dict(body or {})
        while True:
            page = self.list(cast("ListInput", ask))
            for item in page["reservations"]:
                yield item
            if page["nextCursor"] is None:
                return
            ask["cursor"] = page["nextCursor"]

    def release(self, body: ReservationRef) -> ReservationOut:
        """End a reservation now; the rest of its time is free at once (rollup included)."""
        return cast("ReservationOut", self._t.call("reservations.release", body))

    def renew(self, body: RenewInput) -> ReservationOut:
        """Extend a leased reservation's lease from now (by its leaseSeconds, or a new one)."""
        return cast("ReservationOut", self._t.call("reservations.renew", body))


class TenantsApi:
    """The `tenants` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, body: TenantCreateInput) -> TenantOut:
        """Create a tenant (operator)."""
        return cast("TenantOut", self._t.call("tenants.create", body))

    def list(self, body: TenantListInput | None = None) -> TenantList:
        """Every tenant with how many pools it owns and live keys it has (operator)."""
        return cast("TenantList", self._t.call("tenants.list", body or {}))


class UsageApi:
    """The `usage` methods."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def report(self, body: UsageInput | None = None) -> UsageReport:
        """Unit-hours (GPU-hours for `gpu`; MIG, slot, VF, disk and node hours; vCPU- and GiB-hours for scalars) per tenant, pool, project and resource over [from, to)."""
        return cast("UsageReport", self._t.call("usage.report", body or {}))


class Methods:
    """Every API method, one attribute per module."""

    def __init__(self, transport: SyncTransport) -> None:
        self.api_keys = ApiKeysApi(transport)
        self.capacity = CapacityApi(transport)
        self.intervals = IntervalsApi(transport)
        self.nodes = NodesApi(transport)
        self.pools = PoolsApi(transport)
        self.quotas = QuotasApi(transport)
        self.reservations = ReservationsApi(transport)
        self.tenants = TenantsApi(transport)
        self.usage = UsageApi(transport)


class AsyncApiKeysApi:
    """The `apiKeys` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: ApiKeyCreateInput) -> ApiKeyCreated:
        """Create an API key for a tenant (operator). The key is shown once, stored hashed."""
        return cast("ApiKeyCreated", await self._t.call("apiKeys.create", body))

    async def list(self, body: ApiKeyListInput | None = None) -> ApiKeyList:
        """A tenant's API keys, or every tenant's (operator): id, roles, label, times; never the secret. Revoked keys only with includeRevoked."""
        return cast("ApiKeyList", await self._t.call("apiKeys.list", body or {}))

    async def revoke(self, body: ApiKeyRevokeInput) -> ApiKeyRevoked:
        """Revoke an API key (operator); it stops working at once."""
        return cast("ApiKeyRevoked", await self._t.call("apiKeys.revoke", body))

    async def self_(self, body: WhoAmIInput | None = None) -> CallerKey:
        """The calling key: its id, tenant and roles (a CLI infers the tenant from it)."""
        return cast("CallerKey", await self._t.call("apiKeys.self", body or {}))


class AsyncCapacityApi:
    """The `capacity` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def by_pool(self, body: ByPoolInput) -> PoolRows:
        """One pool's rollup rows, one per resource, ordered by resource name."""
        return cast("PoolRows", await self._t.call("capacity.byPool", body))

    async def fleet(self, body: FleetInput | None = None) -> CapacitySummary:
        """capacity.summary over every pool of every tenant, archived ones included (operator)."""
        return cast("CapacitySummary", await self._t.call("capacity.fleet", body or {}))

    async def preview(self, body: PreviewInput) -> Preview:
        """Run the placer on a reservation request without booking anything."""
        return cast("Preview", await self._t.call("capacity.preview", body))

    async def summary(self, body: SummaryInput) -> CapacitySummary:
        """Every pool the tenant owns or is offered with its rollup rows, plus whole-GPU totals per GPU model."""
        return cast("CapacitySummary", await self._t.call("capacity.summary", body))

    async def timeline(self, body: TimelineInput) -> Timeline:
        """Whole GPUs booked per time bucket and how many of the allocatable remain free."""
        return cast("Timeline", await self._t.call("capacity.timeline", body))


class AsyncIntervalsApi:
    """The `intervals` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def calendar(self, from_: str, to: str, *, pool_id: str | None = None, tenant_id: str | None = None) -> Calendar:
        """Per quarter-hour of [from, to): the tenant's limit, reserved and reservable GB."""
        return cast("Calendar", await self._t.request("GET", "/api/capacity/calendar", query={"from": from_, "to": to, "poolId": pool_id, "tenantId": tenant_id}))

    async def list(self, from_: str, to: str, *, cursor: str | None = None, limit: int | None = None) -> IntervalReservationPage:
        """The audit list: every interval reservation made in [from, to), newest first."""
        return cast("IntervalReservationPage", await self._t.request("GET", "/api/capacity/reservations", query={"from": from_, "to": to, "cursor": cursor, "limit": limit}))

    async def list_iter(self, from_: str, to: str, *, limit: int | None = None) -> AsyncIterator[IntervalReservationOut]:
        """Every item `intervals.list` answers, page after page (`nextCursor`)."""
        cursor: str | None = None
        while True:
            page = await self.list(from_=from_, to=to, limit=limit, cursor=cursor)
            for item in page["reservations"]:
                yield item
            cursor = page["nextCursor"]
            if cursor is None:
                return

    async def reserve(self, body: IntervalsRequest, *, idempotency_key: str | None = None, pool_id: str | None = None) -> IntervalReservationOut:
        """Commit capacity to one or more 15-minute intervals, all or nothing."""
        return cast("IntervalReservationOut", await self._t.request("POST", "/api/capacity/reservations", query={"poolId": pool_id}, headers={"Idempotency-Key": idempotency_key}, body=body))


class AsyncNodesApi:
    """The `nodes` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def events(self, body: NodeEventsInput) -> NodeEvents:
        """A node's recorded transitions, oldest first, after an event id."""
        return cast("NodeEvents", await self._t.call("nodes.events", body))

    async def get(self, body: NodeRef) -> NodeDetail:
        """One node with its state flags and every atom with its bucket and holder (NOT_FOUND unless its pool is visible)."""
        return cast("NodeDetail", await self._t.call("nodes.get", body))

    async def list(self, body: NodeListInput | None = None) -> NodePage:
        """Nodes with their state, ordered by nodeId, a page at a time: one pool's, or (poolId left out) every pool's the tenant sees; operators may leave out tenantId."""
        return cast("NodePage", await self._t.call("nodes.list", body or {}))

    async def list_iter(self, body: NodeListInput | None = None) -> AsyncIterator[NodeSummary]:
        """Every item `nodes.list` answers, page after page (`nextCursor`)."""
        ask: dict[str, Any] = dict(body or {})
        while True:
            page = await self.list(cast("NodeListInput", ask))
            for item in page["nodes"]:
                yield item
            if page["nextCursor"] is None:
                return
            ask["cursor"] = page["nextCursor"]

    async def set_maintenance(self, body: MaintenanceInput) -> MaintenanceSet:
        """Put a node in or out of maintenance with a reason (operator). Its atoms move to the maintenance bucket at once; the change is a node event and an alert, and the reservations it puts at risk are counted in the answer (each holder is alerted)."""
        return cast("MaintenanceSet", await self._t.call("nodes.setMaintenance", body))


class AsyncPoolsApi:
    """The `pools` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def archive(self, body: PoolRef) -> PoolOut:
        """Archive a pool (owner): it stays visible to its owner only."""
        return cast("PoolOut", await self._t.call("pools.archive", body))

    async def capacity(self, body: ByPoolInput) -> PoolRows:
        """One pool's rollup rows, one per resource, ordered by resource name."""
        return cast("PoolRows", await self._t.call("pools.capacity", body))

    async def create(self, body: PoolCreateInput) -> PoolOut:
        """Create a pool owned by a tenant (operator)."""
        return cast("PoolOut", await self._t.call("pools.create", body))

    async def get(self, body: PoolRef) -> PoolOut:
        """One pool the tenant owns or is offered."""
        return cast("PoolOut", await self._t.call("pools.get", body))

    async def list(self, body: PoolListInput) -> PoolList:
        """Every pool the tenant owns (archived included) or is offered (not archived)."""
        return cast("PoolList", await self._t.call("pools.list", body))

    async def offer(self, body: PoolOfferInput) -> PoolOut:
        """Offer a pool to another tenant (owner)."""
        return cast("PoolOut", await self._t.call("pools.offer", body))

    async def unoffer(self, body: PoolOfferInput) -> PoolOut:
        """Withdraw an offer (owner); the pool vanishes for that tenant at once."""
        return cast("PoolOut", await self._t.call("pools.unoffer", body))


class AsyncQuotasApi:
    """The `quotas` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def set(self, body: QuotaSetInput) -> Quotas:
        """Set a tenant's limit on a resource, in one pool or across its pools (operator)."""
        return cast("Quotas", await self._t.call("quotas.set", body))


class AsyncReservationsApi:
    """The `reservations` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: ReservationCreateInput) -> ReservationOut:
        """Place and book a request atomically across every atom and gang member."""
        return cast("ReservationOut", await self._t.call("reservations.create", body))

    async def get(self, body: ReservationLookup) -> ReservationOut:
        """One of the tenant's reservations, with its state now (operators: any tenant's)."""
        return cast("ReservationOut", await self._t.call("reservations.get", body))

    async def list(self, body: ListInput | None = None) -> ReservationPage:
        """The tenant's reservations, newest first, a page at a time (opaque cursor); filtered by pool, project, state now and a time window; operators may leave out tenantId for every tenant's."""
        return cast("ReservationPage", await self._t.call("reservations.list", body or {}))

    async def list_iter(self, body: ListInput | None = None) -> AsyncIterator[ReservationOut]:
        """Every item `reservations.list` answers, page after page (`nextCursor`)."""
        ask: dict[str, Any] = dict(body or {})
        while True:
            page = await self.list(cast("ListInput", ask))
            for item in page["reservations"]:
                yield item
            if page["nextCursor"] is None:
                return
            ask["cursor"] = page["nextCursor"]

    async def release(self, body: ReservationRef) -> ReservationOut:
        """End a reservation now; the rest of its time is free at once (rollup included)."""
        return cast("ReservationOut", await self._t.call("reservations.release", body))

    async def renew(self, body: RenewInput) -> ReservationOut:
        """Extend a leased reservation's lease from now (by its leaseSeconds, or a new one)."""
        return cast("ReservationOut", await self._t.call("reservations.renew", body))


class AsyncTenantsApi:
    """The `tenants` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: TenantCreateInput) -> TenantOut:
        """Create a tenant (operator)."""
        return cast("TenantOut", await self._t.call("tenants.create", body))

    async def list(self, body: TenantListInput | None = None) -> TenantList:
        """Every tenant with how many pools it owns and live keys it has (operator)."""
        return cast("TenantList", await self._t.call("tenants.list", body or {}))


class AsyncUsageApi:
    """The `usage` methods."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def report(self, body: UsageInput | None = None) -> UsageReport:
        """Unit-hours (GPU-hours for `gpu`; MIG, slot, VF, disk and node hours; vCPU- and GiB-hours for scalars) per tenant, pool, project and resource over [from, to)."""
        return cast("UsageReport", await self._t.call("usage.report", body or {}))


class AsyncMethods:
    """Every API method, one attribute per module."""

    def __init__(self, transport: AsyncTransport) -> None:
        self.api_keys = AsyncApiKeysApi(transport)
        self.capacity = AsyncCapacityApi(transport)
        self.intervals = AsyncIntervalsApi(transport)
        self.nodes = AsyncNodesApi(transport)
        self.pools = AsyncPoolsApi(transport)
        self.quotas = AsyncQuotasApi(transport)
        self.reservations = AsyncReservationsApi(transport)
        self.tenants = AsyncTenantsApi(transport)
        self.usage = AsyncUsageApi(transport)
