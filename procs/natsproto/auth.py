"""Who the client says it is in CONNECT: a user and password, or a NATS JWT `.creds`
file (decentralised auth), whose user JWT is sent and whose nkey seed signs the nonce
the server put in its INFO. `nkeys` is imported only when a `.creds` file is used: a
password user never loads it.

The `.creds` file is read at each connect (as nats-py reads it), so a rotated file is
picked up by the next reconnect; the seed is held only while it signs."""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from procs.natsproto.errors import NatsError

JWT_BEGIN = "BEGIN NATS USER JWT"
SEED_BEGIN = "BEGIN USER NKEY SEED"


class CredentialsFileError(NatsError):
    """A `.creds` file that cannot be read or holds no user JWT or no seed."""


class Credentials(msgspec.Struct, frozen=True):
    """How the client authenticates: nothing, a user and password, or a `.creds` file."""

    user: str | None = None
    password: str | None = None
    creds_path: str | None = None

    def __repr__(self) -> str:  # never the password, in a log or a traceback
        return f"Credentials(user={self.user!r}, creds_path={self.creds_path!r})"

    def connect_fields(self, nonce: str | None) -> dict[str, Any]:
        """What CONNECT carries for these credentials, given INFO's `nonce`."""
        if self.creds_path is not None:
            jwt, seed = read_creds(self.creds_path)
            if nonce is None:
                return {"jwt": jwt}
            return {"jwt": jwt, "sig": sign_nonce(seed, nonce)}
        if self.user is not None:
            return {"user": self.user, "pass": self.password or ""}
        return {}


def _block(lines: list[str], marker: str, path: str) -> str:
    """The first non-empty line after the line that holds `marker`."""
    for i, line in enumerate(lines):
        if marker in line:
            for value in lines[i + 1 :]:
                if value.strip():
                    return value.strip()
    raise CredentialsFileError(f"{path}: no {marker.lower()} block")


def read_creds(path: str) -> tuple[str, bytes]:
    """(user JWT, nkey seed) from a `.creds` file as `nsc generate creds` writes it."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise CredentialsFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _block(lines, JWT_BEGIN, path), _block(lines, SEED_BEGIN, path).encode()


def sign_nonce(seed: bytes, nonce: str) -> str:
    """The server's nonce signed with the user's nkey seed, base64 as CONNECT's `sig`."""
    # Only for `.creds` users: a password user never loads it. nkeys has no types.
    import nkeys  # type: ignore[import-untyped]

    try:
        pair = nkeys.from_seed(bytearray(seed))
    except Exception as exc:  # nkeys raises its own errors, and binascii's
        raise CredentialsFileError(f"the nkey seed cannot be read: {exc}") from None
    try:
        return base64.b64encode(pair.sign(nonce.encode())).decode()
    finally:
        pair.wipe()
