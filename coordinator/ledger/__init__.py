"""The ledger: the only package that imports SQLAlchemy. Repositories return domain values.

Everything outside the package uses the names below and nothing else: the `Ledger`
facade with its repositories, the unit of work a workflow writes through, the values
repositories return and the errors they raise. What a booking is (its request and
outcomes) is the domain's (`coordinator/domain/booking.py`), not storage.
"""

from coordinator.ledger.booking_batch import BookingBatch
from coordinator.ledger.catalog import NodePage
from coordinator.ledger.database import Database, LedgerUnavailable, normalize_url
from coordinator.ledger.facade import Ledger
from coordinator.ledger.fence import NotLeader
from coordinator.ledger.gpu_use import NodeEventRow
from coordinator.ledger.idempotency import Recorded, Stored, body_hash, matching
from coordinator.ledger.leadership import Leadership
from coordinator.ledger.node_writer import InventoryRefused, NodeWriter, UnknownPool
from coordinator.ledger.outbox import OutboxBacklog, PendingAlert
from coordinator.ledger.reservation_listing import ReservationFilter
from coordinator.ledger.tenants import IssuedKey
from coordinator.ledger.unit_of_work import UnitOfWork, WriteRaced

__all__ = [
    "BookingBatch",
    "Database",
    "InventoryRefused",
    "IssuedKey",
    "Leadership",
    "Ledger",
    "LedgerUnavailable",
    "NodeEventRow",
    "NodePage",
    "NodeWriter",
    "NotLeader",
    "OutboxBacklog",
    "PendingAlert",
    "Recorded",
    "ReservationFilter",
    "Stored",
    "UnitOfWork",
    "UnknownPool",
    "WriteRaced",
    "body_hash",
    "matching",
    "normalize_url",
]
