"""The operator's tenant mapping rules (issue 35): what matches, in file order, and a file
that cannot be used refused with its file, line and field, at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.config import CoordinatorSettings
from coordinator.domain.tenant_rules import (
    TenantRulesError,
    parse_tenant_rules,
    unknown_tenants,
)
from procs.settings import ConfigError, load

GOOD = """\
[[rule]]
slurm_account = "physics"
tenant = "acme"

[[rule]]
k8s_namespace = "ml"
tenant = "globex"

[[rule]]
unix_group = "physics"
tenant = "initech"
"""


def test_the_first_rule_that_matches_wins() -> None:
    rules = parse_tenant_rules(GOOD, "t.toml")
    assert rules.tenant("physics", "ml", "") == "acme"
    assert rules.tenant("", "ml", "physics") == "globex"
    assert rules.tenant("", "", "physics") == "initech"
    assert rules.tenant("chem", "web", "staff") is None
    assert rules.tenant("", "", "") is None  # an empty attribute matches nothing
    assert [r.tenant_id for r in rules.only({"globex"}).rules] == ["globex"]
    assert unknown_tenants(rules, "t.toml", {"acme", "globex"}) == [
        "t.toml:11: rule[2].tenant: unknown tenant 'initech' "
        "(the rule applies once the tenant is created)"
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[[rule]]\nslurm_account = 'a'\n", "t.toml:1: rule[0].tenant: required"),
        (
            "[[rule]]\nslurm_account = 'a'\nunix_group = 'b'\ntenant = 'x'\n",
            "t.toml:3: rule[0].unix_group: exactly one of",
        ),
        ("[[rule]]\ntenant = 'x'\n", "t.toml:1: rule[0]: exactly one of"),
        ("[[rule]]\nnamespace = 'ml'\ntenant = 'x'\n", "t.toml:2: rule[0].namespace: not a rule"),
        ("[[rule]]\nunix_group = 7\ntenant = 'x'\n", "t.toml:2: rule[0].unix_group: a name"),
        ("[[rule]]\nunix_group = 'g'\ntenant = ''\n", "t.toml:3: rule[0].tenant: a tenant id"),
        (GOOD + "\n[[rule]]\nk8s_namespace = 'ml'\ntenant = 'acme'\n", "t.toml:14: rule[3].k8s"),
        ("rules = 1\n", "t.toml:1: rules: not a tenant rules field"),
        ("[[rule]\n", "t.toml: does not parse"),
    ],
)
def test_a_bad_file_is_refused_naming_file_line_and_field(text: str, error: str) -> None:
    with pytest.raises(TenantRulesError) as caught:
        parse_tenant_rules(text, "t.toml")
    assert str(caught.value).startswith(error)


def test_the_coordinator_refuses_to_start_on_bad_rules(tmp_path: Path) -> None:
    bad = tmp_path / "tenants.toml"
    bad.write_text("[[rule]]\nslurm_account = 'a'\n")
    with pytest.raises(ConfigError) as caught:
        load(CoordinatorSettings, ["--tenant-rules", str(bad)], env={})
    assert f"{bad}:1: rule[0].tenant: required" in str(caught.value)
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    assert load(CoordinatorSettings, ["--tenant-rules", str(good)], env={}).tenant_rules == str(
        good
    )
