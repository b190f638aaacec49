"""One CLI invocation's connection to the API: where, with which key, how to print, and
whose tenant the key is (asked once, with `apiKeys.self`, when a command needs it)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from ops.kit.client import ApiClient
from ops.kit.output import Format, Printer, View, default_format
from ops.kit.server_text import shown_lines

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass
class Session:
    url: str = DEFAULT_URL
    key: str | None = None
    timeout_s: float = 30.0
    insecure_http: bool = False
    fmt: Format | None = None
    local: bool = False
    # Where `GPUFLEET_*` settings are read from: the process's, or what `ops.main.run` is given.
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ), repr=False)
    _client: ApiClient | None = None
    _me: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def printer(self) -> Printer:
        out = sys.stdout
        return Printer(self.fmt or default_format(out), self.local, out, out.isatty())

    @property
    def format(self) -> Format:
        return self.printer.fmt

    def client(self) -> ApiClient:
        if not self.key:
            raise click.UsageError("an API key is needed: --key or GPUFLEET_KEY")
        if self._client is None:
            self._client = ApiClient(
                self.url, self.key, self.timeout_s, insecure_http=self.insecure_http
            )
        return self._client

    def call(self, method: str, body: dict[str, Any]) -> Any:
        return self.client().call(method, body)

    def pages(self, method: str, body: dict[str, Any]) -> Iterator[Any]:
        """Each page of a listing in turn (`ApiClient.pages`)."""
        return self.client().pages(method, body)

    def me(self) -> dict[str, Any]:
        if self._me is None:
            self._me = self.call("apiKeys.self", {})
        return self._me

    @property
    def operator(self) -> bool:
        return bool(self.me().get("operator"))

    def tenant(self, given: str | None, *, required: bool = True) -> str | None:
        """The tenant to act for: the one named, else the key's own; an operator key
        names none (None: every tenant, where the method allows it)."""
        if given:
            return given
        if not self.operator:
            return str(self.me()["tenantId"])
        if required:
            raise click.UsageError("an operator key acts for no tenant of its own: add --tenant")
        return None

    def capacity(self, tenant: str | None) -> dict[str, Any]:
        """capacity.summary for a tenant, or the whole fleet's (operator, no tenant)."""
        if tenant is None:
            return dict(self.call("capacity.fleet", {}))
        return dict(self.call("capacity.summary", {"tenantId": tenant}))

    def pool_id(self, tenant: str | None, given: str | None) -> str | None:
        """A --pool value as a pool id: an id as given, a name looked up among the pools
        the key sees (the tables show names first)."""
        if not given or given.startswith("pool_"):
            return given
        named = [p["poolId"] for p in self.capacity(tenant)["pools"] if p["name"] == given]
        if len(named) == 1:
            return str(named[0])
        if named:
            raise click.UsageError(f"{len(named)} pools are named {given!r}: give one's id")
        raise click.UsageError(f"no pool named {given!r} (gpufleet pools lists them)")

    def project_id(self, tenant: str | None, given: str | None) -> str | None:
        """A --project value as a project id: an id as given, a name looked up among the
        tenant's projects (an operator naming no tenant: every tenant's)."""
        if not given or given.startswith("prj_"):
            return given
        body = {"tenantId": tenant} if tenant else {}
        named = [p for p in self.call("projects.list", body)["projects"] if p["name"] == given]
        if len(named) == 1:
            return str(named[0]["projectId"])
        if named:
            raise click.UsageError(f"{len(named)} tenants have a project {given!r}: add --tenant")
        raise click.UsageError(f"no project named {given!r} (gpufleet projects list lists them)")

    def show(self, view: View) -> None:
        self.printer.show(view)

    def say(self, line: str) -> None:
        click.echo(shown_lines(line))

    def warn(self, line: str) -> None:
        click.echo(shown_lines(line), err=True)


def echo_err(text: str) -> None:
    sys.stderr.write(text + "\n")
