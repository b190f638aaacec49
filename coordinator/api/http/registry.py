"""The method registry: every API method is declared once, here, with its name, kind,
permission, scope, phase, status, input model, output model and handler. Routing,
authorization, the OpenAPI document (its response schemas included), the docs' method
table and the CLI's per-method commands are all generated from it.

Two conventions share it. `compute`: `POST /api/compute/<module>/<method>`, a JSON
object in, the error envelope out. `seed-002` (the interval endpoints): any verb and
path, input from query parameters, headers and a JSON body (`RestInput`, each field
saying where it comes from), RFC 3339 times, plain-text 400s and the seed's own 409s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from coordinator.api.http.context import CallContext
from coordinator.api.shapes.base import ApiInput, RestInput

Kind = Literal["read", "write"]
# caller-tenant: the tenant of the calling key, never named in the input (seed 002).
Scope = Literal["compute-tenant", "compute-pool", "platform", "caller-tenant"]
Convention = Literal["compute", "seed-002"]
Verb = Literal["GET", "POST"]
Handler = Callable[[CallContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer with an explicit status (a replayed idempotent response); a
    `str` body is sent as text/plain."""

    status: int
    body: Any


@dataclass(frozen=True, slots=True)
class Streamed:
    """A handler's answer written out as it is made (an export): chunks of
    `content_type`, offered for download as `filename`."""

    content_type: str
    filename: str
    chunks: Iterator[bytes]


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    kind: Kind
    permission: str
    scope: Scope
    phase: str
    status: str
    input: type[ApiInput]
    handler: Handler
    summary: str
    convention: Convention = "compute"
    verb: Verb = "POST"
    route: str | None = None
    # The answer's model (200); for `seed-002` methods also the JSON body a POST takes
    # (documentation only: the handler checks the seed's rules in its own words) and the
    # seed's own 409 bodies.
    output: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    conflicts: tuple[type[BaseModel], ...] = ()
    # The media type of a streamed answer (`Streamed`) instead of an output model.
    streams: str | None = None

    @property
    def module(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def method(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def path(self) -> str:
        return self.route or f"/api/compute/{self.module}/{self.method}"

    @property
    def label(self) -> str:
        """The metrics label: the method name, or verb and path for the seed's routes."""
        return self.name if self.convention == "compute" else f"{self.verb} {self.path}"


class Registry:
    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def method(
        self,
        name: str,
        *,
        kind: Kind,
        permission: str,
        scope: Scope,
        input: type[ApiInput],
        phase: str = "v0.1",
        status: str = "registered",
        convention: Convention = "compute",
        verb: Verb = "POST",
        path: str | None = None,
        output: type[BaseModel] | None = None,
        body: type[BaseModel] | None = None,
        conflicts: tuple[type[BaseModel], ...] = (),
        streams: str | None = None,
    ) -> Callable[[Handler], Handler]:
        if (convention == "seed-002") != issubclass(input, RestInput):
            raise ValueError(f"method {name}: seed-002 methods, and only they, take RestInput")

        def register(handler: Handler) -> Handler:
            if name in self._methods:
                raise ValueError(f"method {name} declared twice")
            doc = (handler.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            method = Method(
                name, kind, permission, scope, phase, status, input, handler, doc,
                convention, verb, path, output, body, conflicts, streams,
            )  # fmt: skip
            if any((m.verb, m.path) == (verb, method.path) for m in self._methods.values()):
                raise ValueError(f"route {verb} {method.path} declared twice")
            self._methods[name] = method
            return handler

        return register

    def __iter__(self) -> Iterator[Method]:
        return iter(sorted(self._methods.values(), key=lambda m: m.name))

    def get(self, name: str) -> Method | None:
        return self._methods.get(name)

    def markdown_table(self) -> str:
        """The method table for the docs, from the same declarations as the routes."""
        lines = [
            "| Method | Path | Kind | Authorization | Phase | Status |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for m in self:
            lines.append(
                f"| `{m.name}` | `{m.verb} {m.path}` | {m.kind} | `{m.permission}` @ `{m.scope}` "
                f"| {m.phase} | {m.status} |"
            )
        return "\n".join(lines)


# The process-wide registry the method modules declare into.
REGISTRY = Registry()
