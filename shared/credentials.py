"""How a NATS credentials file is read, the same on agent and coordinator: a NATS JWT
`.creds` file is handed to nats-py as is; anything else must be the user/password TOML
that `gpufleet nats-auth` writes. Pure: callers read the file."""

from __future__ import annotations

import tomllib
from typing import Any

JWT_CREDS_MARKER = "-----BEGIN NATS USER JWT-----"


class CredentialsError(ValueError):
    pass


def parse_credentials(text: str, where: str = "credentials") -> tuple[str, str]:
    """(user, password) from a credentials file written by `gpufleet nats-auth`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CredentialsError(f"{where}: not a gpufleet credentials file: {exc}") from None
    user, password = data.get("user"), data.get("password")
    if not isinstance(user, str) or not user or not isinstance(password, str) or not password:
        raise CredentialsError(f"{where}: needs user and password strings")
    return user, password


def connect_options(text: str, path: str, where: str) -> dict[str, Any]:
    """nats-py connect keyword arguments for the credentials file at `path`."""
    if JWT_CREDS_MARKER in text:
        return {"user_credentials": path}
    user, password = parse_credentials(text, where)
    return {"user": user, "password": password}
