from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

import shared.ids
from shared.ids import POOL_ID_PATTERN, PROJECT_ID_PATTERN, new_pool_id, ulid
from shared.subjects import Subjects
from shared.wire import Atom, Heartbeat, Inventory, NodeHealth
from tests.factories import make_heartbeat, make_inventory


def test_ulid_is_lowercase_crockford_and_time_ordered() -> None:
    a = ulid(1_000)
    b = ulid(2_000)
    assert re.fullmatch(r"[0-9a-hjkmnp-tv-z]{26}", a)
    assert a < b
    assert ulid(0, bytes(10)) == "0" * 26


def test_prefixed_ids_match_the_seed_patterns() -> None:
    assert re.fullmatch(POOL_ID_PATTERN, new_pool_id())
    # Projects are named by their tenants; the coordinator only checks the form.
    assert re.fullmatch(PROJECT_ID_PATTERN, "prj_" + ulid())


def test_every_name_in_shared_ids_is_used_by_the_product() -> None:
    """No helper kept alive only by its own test (issue 10: dead code goes)."""
    ids = Path(shared.ids.__file__)
    defined = set()
    for node in ast.parse(ids.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    used: set[str] = set()
    for package in ("agent", "coordinator", "ops", "shared"):
        for path in (ids.parents[1] / package).rglob("*.py"):
            if path != ids:
                for node in ast.walk(ast.parse(path.read_text())):
                    if isinstance(node, ast.Name):
                        used.add(node.id)
                    elif isinstance(node, ast.ImportFrom):
                        used |= {a.name for a in node.names}
    assert {name for name in defined if not name.startswith("_")} - used == set()


def test_node_ids_with_dots_get_their_own_subject_and_parse_back() -> None:
    s = Subjects("gpufleet")
    pool = new_pool_id()
    subject = s.heartbeat(pool, "gpu01.rack2.example")
    assert subject.count(".") == 3
    assert s.parse_node_subject(subject) == ("hb", pool, "gpu01.rack2.example")
    assert s.heartbeat(pool, "a.b") != s.heartbeat(pool, "a_b")


def test_subject_prefix_is_configurable_and_validated() -> None:
    assert Subjects("acme.fleet").inventory("pool_x", "n1") == "acme.fleet.inv.pool_x.n1"
    with pytest.raises(ValueError):
        Subjects("bad prefix")
    assert Subjects("x").parse_node_subject("y.hb.p.n") is None


def test_heartbeat_is_small_and_tolerates_unknown_fields() -> None:
    inv = make_inventory("node-1", new_pool_id())
    hb = make_heartbeat(inv)
    assert len(hb.to_json()) < 1024
    raw = hb.to_json()[:-1] + b',"someFutureField":{"x":1}}'
    assert Heartbeat.from_json(raw) == hb


def test_heartbeat_rejects_a_node_id_outside_the_pattern() -> None:
    hb = Heartbeat(
        node_id="bad node",
        pool_id=new_pool_id(),
        boot_id="b",
        seq=0,
        sent_at=0,
        interval_ms=1000,
        inventory_hash="h",
        health=NodeHealth(status="healthy"),
    )
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.nodeId`"):
        Heartbeat.from_json(hb.to_json())


def test_inventory_refuses_duplicate_atom_ids() -> None:
    atom = Atom(atom_id="n1:nic.vf:0000:1a:00.1", cls="nic.vf", device_id="0000:1a:00.0")
    one = Inventory(node_id="n1", pool_id=new_pool_id(), boot_id="b", sent_at=0, inventory_hash="")
    sent = one.to_json().replace(b'"atoms":[]', b'"atoms":[%s,%s]' % ((atom.to_json(),) * 2))
    dupes = r"duplicate atom ids: n1:nic\.vf:0000:1a:00\.1"
    with pytest.raises(msgspec.ValidationError, match=dupes):
        Inventory.from_json(sent)
    # Nor can the agent build one (msgspec runs `__post_init__` on replace as well).
    with pytest.raises(ValueError, match=dupes):
        msgspec.structs.replace(one, atoms=(atom, atom))


def test_the_wire_models_need_no_pydantic() -> None:
    """The agent sends and the coordinator reads them; only the HTTP edge has pydantic."""
    code = "import sys, shared.wire; print('pydantic' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
