"""Tenants and their API keys. Keys are random, shown once, stored as sha256 hashes.

A key given from configuration (the bootstrap operator key) is registered once; a
revoked one stays revoked whatever the configuration says at the next start, and a
key id that is already stored with another secret is refused — rotating means a new
key (a new id), which is registered and logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from coordinator.domain.errors import Conflict, NotFound
from coordinator.domain.model import ApiKey, IssuedKey, Principal, Tenant
from coordinator.ledger import schema
from coordinator.ledger.database import Database
from shared.ids import CROCKFORD

log = logging.getLogger(__name__)

KEY_PREFIX = "gpf"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_key_id() -> str:
    return "".join(secrets.choice(CROCKFORD) for _ in range(16))


def split_key(key: str) -> tuple[str, str] | None:
    """`gpf_<keyId>_<secret>` → (keyId, secret); None for anything else."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != 16 or not parts[2]:
        return None
    return parts[1], parts[2]


class TenantRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, tenant_id: str, name: str, now: int) -> Tenant:
        try:
            async with self._db.transaction() as conn:
                await conn.execute(
                    schema.tenants.insert().values(tenant_id=tenant_id, name=name, created_at=now)
                )
        except IntegrityError as exc:
            raise Conflict(f"tenant {tenant_id!r} already exists") from exc
        return Tenant(tenant_id, name, now)

    async def ensure(self, tenant_id: str, name: str, now: int) -> Tenant:
        existing = await self.get(tenant_id)
        if existing is not None:
            return existing
        try:
            return await self.create(tenant_id, name, now)
        except Conflict:
            # Lost a race with another coordinator starting: theirs is as good.
            found = await self.get(tenant_id)
            assert found is not None
            return found

    async def get(self, tenant_id: str) -> Tenant | None:
        async with self._db.read() as conn:
            row = (
                await conn.execute(
                    select(schema.tenants).where(schema.tenants.c.tenant_id == tenant_id)
                )
            ).first()
        return Tenant(row.tenant_id, row.name, row.created_at) if row else None

    async def list(self) -> list[Tenant]:
        t = schema.tenants.c
        async with self._db.read() as conn:
            rows = await conn.execute(select(schema.tenants).order_by(t.tenant_id))
            return [Tenant(r.tenant_id, r.name, r.created_at) for r in rows.all()]


class ApiKeyRepo:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self, tenant_id: str, roles: frozenset[str], label: str, now: int
    ) -> IssuedKey:
        """The full key is never stored."""
        key_id = _new_key_id()
        secret = secrets.token_urlsafe(32)
        await self.insert(key_id, secret, tenant_id, roles, label, now)
        return IssuedKey(key_id, f"{KEY_PREFIX}_{key_id}_{secret}")

    async def insert(
        self,
        key_id: str,
        secret: str,
        tenant_id: str,
        roles: frozenset[str],
        label: str,
        now: int,
    ) -> None:
        try:
            async with self._db.transaction() as conn:
                await conn.execute(
                    schema.api_keys.insert().values(
                        key_id=key_id,
                        tenant_id=tenant_id,
                        key_hash=_hash(secret),
                        roles=",".join(sorted(roles)),
                        label=label,
                        created_at=now,
                        revoked_at=None,
                    )
                )
        except IntegrityError as exc:
            raise NotFound(f"tenant {tenant_id!r} not found") from exc

    async def ensure(
        self, key: str, tenant_id: str, roles: frozenset[str], label: str, now: int
    ) -> None:
        """Register a key given from configuration (the bootstrap operator key)."""
        parts = split_key(key)
        if parts is None:
            raise ValueError("bootstrap key must look like gpf_<16 chars>_<secret>")
        key_id, secret = parts
        k = schema.api_keys.c
        async with self._db.read() as conn:
            row = (
                await conn.execute(select(k.key_hash, k.revoked_at).where(k.key_id == key_id))
            ).first()
        if row is None:
            try:
                await self.insert(key_id, secret, tenant_id, roles, label, now)
            except NotFound:
                if await self.authenticate(key) is not None:
                    return  # another coordinator starting registered it first
                raise
            log.warning("registered a new %s key %s for tenant %s", label, key_id, tenant_id)
            return
        if row.revoked_at is not None:
            log.warning(
                "the configured %s key %s was revoked and stays revoked: configure a new key"
                " (`gpufleet new-key`) to rotate it",
                label,
                key_id,
            )
            return
        if not hmac.compare_digest(row.key_hash, _hash(secret)):
            raise ValueError(
                f"bootstrap key {key_id} is already registered with another secret; a rotated"
                " key must be a new key (`gpufleet new-key`)"
            )

    async def authenticate(self, key: str) -> Principal | None:
        parts = split_key(key)
        if parts is None:
            return None
        key_id, secret = parts
        k = schema.api_keys.c
        async with self._db.read() as conn:
            row = (
                await conn.execute(
                    select(k.tenant_id, k.key_hash, k.roles, k.revoked_at).where(k.key_id == key_id)
                )
            ).first()
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(row.key_hash, _hash(secret)):
            return None
        return Principal(key_id, row.tenant_id, frozenset(filter(None, row.roles.split(","))))

    async def list(self, tenant_id: str | None = None) -> list[ApiKey]:
        """Keys (revoked ones included), by tenant then creation; no secret, no hash."""
        k = schema.api_keys.c
        query = select(k.key_id, k.tenant_id, k.roles, k.label, k.created_at, k.revoked_at)
        if tenant_id is not None:
            query = query.where(k.tenant_id == tenant_id)
        async with self._db.read() as conn:
            rows = await conn.execute(query.order_by(k.tenant_id, k.created_at, k.key_id))
            return [
                ApiKey(
                    key_id=r.key_id,
                    tenant_id=r.tenant_id,
                    roles=frozenset(filter(None, r.roles.split(","))),
                    label=r.label,
                    created_at=r.created_at,
                    revoked_at=r.revoked_at,
                )
                for r in rows.all()
            ]

    async def revoke(self, key_id: str, tenant_id: str | None, now: int) -> bool:
        """Revoke a key; with `tenant_id` only a key of that tenant. True if it was live."""
        k = schema.api_keys.c
        cond = (k.key_id == key_id) & k.revoked_at.is_(None)
        if tenant_id is not None:
            cond = cond & (k.tenant_id == tenant_id)
        async with self._db.transaction() as conn:
            result = await conn.execute(update(schema.api_keys).where(cond).values(revoked_at=now))
        return bool(result.rowcount)
