"""Validating JSON values against the OpenAPI document's schemas (jsonschema, 2020-12:
the document's `$ref`s resolve against the document itself)."""

from __future__ import annotations

from typing import Any

import jsonschema


def validate(document: dict[str, Any], schema: dict[str, Any], value: Any) -> None:
    """Raise `jsonschema.ValidationError` unless `value` matches `schema` (which may be a
    `$ref` into `document`)."""
    root = {"components": document["components"], **schema}
    jsonschema.Draft202012Validator(
        root, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(value)


def operation(document: dict[str, Any], name: str) -> dict[str, Any]:
    for verbs in document["paths"].values():
        for op in verbs.values():
            if op["operationId"] == name:
                return dict(op)
    raise KeyError(name)


def response_schema(document: dict[str, Any], name: str, status: int) -> tuple[str, Any]:
    """(media type, schema) the document declares for `name` answering `status`."""
    responses = operation(document, name)["responses"]
    response = responses.get(str(status), responses.get("default"))
    assert response is not None, f"{name} declares no {status} response"
    ref = response.get("$ref")
    if ref:
        response = document["components"]["responses"][ref.rsplit("/", 1)[1]]
    ((media, content),) = response["content"].items()
    return media, content.get("schema")


def check_answer(
    document: dict[str, Any], name: str, status: int, content_type: str, body: Any
) -> None:
    """`body` (parsed JSON, or text) as `name` answered it is what the document says."""
    media, schema = response_schema(document, name, status)
    assert content_type == media, f"{name} {status}: {content_type}, declared {media}"
    if media == "application/json":
        validate(document, schema, body)
    else:
        assert isinstance(body, str)
