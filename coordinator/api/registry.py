"""The method registry: every API method is declared once, here, with its name, kind,
permission, scope, phase, status, input model and handler. Routing, authorization, the
OpenAPI document and the docs' method table are all generated from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from coordinator.api.context import CallContext

Kind = Literal["read", "write"]
Scope = Literal["compute-tenant", "compute-pool", "platform"]
Handler = Callable[[CallContext, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer with an explicit status (a replayed idempotent response)."""

    status: int
    body: Any


class ApiInput(BaseModel):
    """Base of every input model: camelCase names, strict types, unknown fields rejected
    (a misspelt optional field must not be silently ignored)."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


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

    @property
    def module(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def method(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def path(self) -> str:
        return f"/api/compute/{self.module}/{self.method}"


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
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            if name in self._methods:
                raise ValueError(f"method {name} declared twice")
            doc = (handler.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            self._methods[name] = Method(
                name, kind, permission, scope, phase, status, input, handler, doc
            )
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
                f"| `{m.name}` | `POST {m.path}` | {m.kind} | `{m.permission}` @ `{m.scope}` "
                f"| {m.phase} | {m.status} |"
            )
        return "\n".join(lines)


# The process-wide registry the method modules declare into.
REGISTRY = Registry()
