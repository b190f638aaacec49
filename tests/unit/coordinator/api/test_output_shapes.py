"""Each answer's shape is declared once, by its output model: every handler says in its
return type that it answers with the model its method declares (the model itself, or
`Prebuilt` with the model's keys; `Reply` for a replay or a refusal), and mypy holds
the body of the handler to that. A handler typed to return a dict or `Any` fails here."""

from __future__ import annotations

import types
import typing

import pytest

from coordinator.api.http.registry import Method, Reply, Streamed
from coordinator.api.methods import REGISTRY
from coordinator.api.shapes.base import Prebuilt, keys
from coordinator.api.shapes.node_outputs import NodeSummary


def _answers(method: Method) -> set[object]:
    """What the handler's return type says it answers, besides a `Reply`; a `Prebuilt`
    answer counts as its model."""
    hint = typing.get_type_hints(method.handler)["return"]
    parts = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return {
        typing.get_args(p)[0] if typing.get_origin(p) is Prebuilt else p
        for p in parts
        if p is not Reply
    }


@pytest.mark.parametrize("method", list(REGISTRY), ids=lambda m: m.name)
def test_every_handler_answers_with_its_declared_output_model(method: Method) -> None:
    if method.streams is not None:  # an export answers a stream of its media type
        assert method.output is None and _answers(method) == {Streamed}
        return
    assert method.output is not None
    assert _answers(method) == {method.output}, f"{method.name} answers {_answers(method)}"


def test_prebuilt_keys_are_the_models_own() -> None:
    node = keys(NodeSummary)
    assert (node.node_id, node.interval_ms, node.atoms) == ("nodeId", "intervalMs", "atoms")
    with pytest.raises(AttributeError):
        _ = node.interval  # a field the model does not declare has no key
