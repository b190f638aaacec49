"""The shapes every API method is declared with: the input bases (`ApiInput`, and
`RestInput` for the seed-002 endpoints' query, header and body fields), the output base
`ApiOutput` and how an answer becomes its JSON object (`dump`, `keys`, `Prebuilt`).
Nothing here knows of handlers or HTTP."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

Where = Literal["query", "header", "body"]


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
