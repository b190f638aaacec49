from __future__ import annotations

from pathlib import Path

from coordinator.api.docs import with_method_table
from coordinator.api.methods import REGISTRY

DOC = Path(__file__).resolve().parents[4] / "docs" / "api.md"


def test_docs_method_table_is_the_registry() -> None:
    text = DOC.read_text()
    assert with_method_table(text) == text, "run: python -m coordinator.api.docs docs/api.md"
    for method in REGISTRY:
        assert f"`{method.name}` | `{method.verb} {method.path}`" in text
    # The seed's endpoints are in the same table as the compute methods.
    assert "`GET /api/capacity/calendar`" in text


def test_every_method_has_a_summary_and_a_known_scope() -> None:
    for method in REGISTRY:
        assert method.summary, method.name
        assert method.scope in ("compute-tenant", "compute-pool", "platform", "caller-tenant")
        if method.convention == "seed-002":
            # The seed's endpoints act for the caller's own tenant and name none.
            assert method.scope == "caller-tenant", method.name
            assert method.path.startswith("/api/capacity/"), method.name
            continue
        assert method.path == f"/api/compute/{method.module}/{method.method}", method.name
        if method.scope not in ("platform", "caller-tenant"):
            assert "tenant_id" in method.input.model_fields, method.name
        if method.scope == "compute-pool":
            assert "pool_id" in method.input.model_fields, method.name
