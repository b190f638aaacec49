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
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    # Only a handler's signature names it: the context wires the renderers, which build
    # this module's output models.
    from coordinator.api.context import CallContext

Kind = Literal["read", "write"]
# caller-tenant: the tenant of the calling key, never named in the input (seed 002).
Scope = Literal["compute-tenant", "compute-pool", "platform", "caller-tenant"]
Convention = Literal["compute", "seed-002"]
Verb = Literal["GET", "POST"]
Where = Literal["query", "header", "body"]
Handler = Callable[["CallContext", Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer with an explicit status (a replayed idempotent response); a
    `str` body is sent as text/plain."""

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


class RestInput(ApiInput):
    """Input of a `seed-002` method: fields declared with `param`, read from where each
    says; their rules are the seed's and are checked by the handler, in its words."""

    model_config = ConfigDict(strict=False, extra="ignore", alias_generator=None)


class ApiOutput(BaseModel):
    """Base of every output model: what a method answers, the one declaration of its
    shape, for the OpenAPI document, the typed client and the answer itself. Handlers
    return these models and the server dumps them by alias (`dump`); a test validates
    every method's real answers against these schemas, so no other field may appear
    (extra forbidden)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


def _is_none(value: object) -> bool:
    return value is None


def optional(description: str, **kwargs: Any) -> Any:
    """An output field left out of the answer when it does not apply (None). A field
    typed `X | None` without it is always in the answer, null when there is no value."""
    return Field(default=None, exclude_if=_is_none, description=description, **kwargs)


def dump(answer: ApiOutput) -> dict[str, Any]:
    """An answer as its JSON object: by alias, fields that do not apply left out."""
    return answer.model_dump(by_alias=True)


Out = TypeVar("Out", bound=ApiOutput)


@dataclass(frozen=True, slots=True)
class Prebuilt(Generic[Out]):
    """An answer too hot for a model round trip, built as its model's JSON object with
    the model's own keys (`keys`); the server sends `body` as it is."""

    model: type[Out]
    body: dict[str, Any]


def keys(model: type[ApiOutput]) -> SimpleNamespace:
    """`model`'s JSON keys by field name (`keys(NodeSummary).node_id == "nodeId"`), read
    from its declaration: for an answer too hot for a model round trip, built as a dict
    whose keys cannot drift from the model (a misspelt field is an AttributeError)."""
    return SimpleNamespace(**{name: f.alias or name for name, f in model.model_fields.items()})


def param(
    name: str,
    where: Where,
    *,
    required: bool = False,
    description: str = "",
    schema: dict[str, Any] | None = None,
) -> Any:
    """A `RestInput` field read from a query parameter, a header or the JSON body;
    `schema` is what the document says the text holds (default: a string)."""
    extra: dict[str, Any] = {"in": where, "required": required}
    if schema is not None:
        extra["schema"] = schema
    return Field(default=None, alias=name, description=description or None, json_schema_extra=extra)


def where(field: FieldInfo) -> Where:
    extra = field.json_schema_extra
    assert isinstance(extra, dict), "RestInput fields are declared with param()"
    return cast(Where, extra["in"])


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
    ) -> Callable[[Handler], Handler]:
        if (convention == "seed-002") != issubclass(input, RestInput):
            raise ValueError(f"method {name}: seed-002 methods, and only they, take RestInput")

        def register(handler: Handler) -> Handler:
            if name in self._methods:
                raise ValueError(f"method {name} declared twice")
            doc = (handler.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            method = Method(
                name, kind, permission, scope, phase, status, input, handler, doc,
                convention, verb, path, output, body, conflicts,
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
