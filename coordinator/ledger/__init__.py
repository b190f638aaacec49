"""The ledger: the only package that imports SQLAlchemy. Repositories return domain values.

Everything outside the package uses the names below and nothing else, and they are all
storage: the `Ledger` facade with its repositories, the database and the leadership
lock, the unit of work a workflow writes through with its booking batch and node
writer, the query shapes a caller builds or keeps (`ReservationFilter`, `GpuFilter`,
`OutboxBacklog`), and the storage failures a caller may retry. Values, rules and the
errors that mean something to a client are the domain's (`coordinator/domain/`); the
other values repositories return are reached through their methods, not named here.
"""

from coordinator.ledger.booking_batch import BookingBatch
from coordinator.ledger.database import Database, LedgerUnavailable
from coordinator.ledger.facade import Ledger
from coordinator.ledger.fence import NotLeader
from coordinator.ledger.gpu_listing import GpuFilter
from coordinator.ledger.leadership import Leadership
from coordinator.ledger.node_writer import NodeWriter
from coordinator.ledger.outbox import OutboxBacklog
from coordinator.ledger.reservation_listing import ReservationFilter
from coordinator.ledger.unit_of_work import UnitOfWork, WriteRaced

__all__ = [
    "BookingBatch",
    "Database",
    "GpuFilter",
    "Leadership",
    "Ledger",
    "LedgerUnavailable",
    "NodeWriter",
    "NotLeader",
    "OutboxBacklog",
    "ReservationFilter",
    "UnitOfWork",
    "WriteRaced",
]
