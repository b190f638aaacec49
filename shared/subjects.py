"""NATS subject names: heartbeats, inventory, use, bookings, their requests, alerts.

Node ids may contain `.`, which NATS reads as a token separator, so a node id is encoded
for subjects by writing `.` as `%2E` (`%` is not allowed in node ids, so the encoding is
reversible and two node ids never share a subject). Pool ids never contain dots.
"""

from __future__ import annotations

DEFAULT_PREFIX = "gpufleet"


def encode_token(node_id: str) -> str:
    return node_id.replace(".", "%2E")


def decode_token(token: str) -> str:
    return token.replace("%2E", ".")


class Subjects:
    """Subject builder for one prefix (configurable per deployment)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or any(c in prefix for c in " *>\t\r\n") or prefix.endswith("."):
            raise ValueError(f"invalid subject prefix: {prefix!r}")
        self.prefix = prefix

    def heartbeat(self, pool_id: str, node_id: str) -> str:
        return f"{self.prefix}.hb.{pool_id}.{encode_token(node_id)}"

    def inventory(self, pool_id: str, node_id: str) -> str:
        return f"{self.prefix}.inv.{pool_id}.{encode_token(node_id)}"

    def inventory_request(self, pool_id: str, node_id: str) -> str:
        """Coordinator → agent: please publish your full inventory now."""
        return f"{self.prefix}.invreq.{pool_id}.{encode_token(node_id)}"

    def use(self, pool_id: str, node_id: str) -> str:
        """Agent → coordinator: a full `UseReport`."""
        return f"{self.prefix}.use.{pool_id}.{encode_token(node_id)}"

    def use_request(self, pool_id: str, node_id: str) -> str:
        """Coordinator → agent: please publish your full `UseReport` now."""
        return f"{self.prefix}.usereq.{pool_id}.{encode_token(node_id)}"

    def bookings(self, pool_id: str, node_id: str) -> str:
        """Coordinator → agent: the node's `NodeBookings`."""
        return f"{self.prefix}.bookings.{pool_id}.{encode_token(node_id)}"

    def alert(self, pool_id: str, node_id: str, kind: str) -> str:
        return f"{self.prefix}.alert.{pool_id}.{encode_token(node_id)}.{kind}"

    @property
    def all_heartbeats(self) -> str:
        return f"{self.prefix}.hb.*.*"

    @property
    def all_inventories(self) -> str:
        return f"{self.prefix}.inv.*.*"

    @property
    def all_use(self) -> str:
        return f"{self.prefix}.use.*.*"

    @property
    def all_alerts(self) -> str:
        return f"{self.prefix}.alert.>"

    def parse_node_subject(self, subject: str) -> tuple[str, str, str] | None:
        """`<prefix>.<kind>.<pool>.<node>` → (kind, pool_id, node_id), or None if not ours."""
        head = self.prefix + "."
        if not subject.startswith(head):
            return None
        parts = subject[len(head) :].split(".")
        if len(parts) != 3:
            return None
        kind, pool_id, node_token = parts
        return kind, pool_id, decode_token(node_token)
