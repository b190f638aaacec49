"""The ledger: the only package that imports SQLAlchemy. Repositories return domain values."""

from coordinator.ledger.database import Database, normalize_url
from coordinator.ledger.facade import Ledger

__all__ = ["Database", "Ledger", "normalize_url"]
