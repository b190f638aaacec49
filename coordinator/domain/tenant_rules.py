"""Tenant mapping rules (issue 35), pure: which tenant an owner's memory is charged to when
no reservation names one, from what the agent reports of the owner (`OwnerMemory`): the
Slurm job's account, the pod's Kubernetes namespace, the unix group of its processes.

The file is TOML, one `[[rule]]` per match, each with exactly one of the three keys:

    [[rule]]
    slurm_account = "chem"     # the job's SLURM_JOB_ACCOUNT
    tenant = "lab-chem"

    [[rule]]
    k8s_namespace = "serving"  # the pod's namespace
    tenant = "web"

    [[rule]]
    unix_group = "students"    # the real group of the owner's processes
    tenant = "teaching"

The first rule that matches wins, in file order; two rules with the same key and value
are refused (one would never apply). Any problem refuses the whole file, naming the
file, the line and the field.

A rule naming a tenant the ledger does not have is not refused (tenants are created
through the API, after the coordinator starts): it is warned about at start, with its
file and line (`unknown_tenants`), and applies from the first use pass after the tenant
is created (`TenantRules.only`); until then what it matches stays unattributed, never
charged to a tenant that does not exist.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from coordinator.domain.toml_lines import parsed, table_line, top_line

MATCHES = ("slurm_account", "k8s_namespace", "unix_group")
_FIELDS = {*MATCHES, "tenant"}
MAX_VALUE = 128  # OwnerMemory's attribute bound


class TenantRulesError(ValueError):
    """Rules that cannot be used; the message names file, line and field."""


@dataclass(frozen=True, slots=True)
class Rule:
    match: str  # one of MATCHES
    value: str
    tenant_id: str
    line: int = 0  # of its `tenant`, for errors found after parsing
    index: int = 0


@dataclass(frozen=True, slots=True)
class TenantRules:
    rules: tuple[Rule, ...] = ()

    def tenant(self, slurm_account: str, k8s_namespace: str, unix_group: str) -> str | None:
        """The tenant of the first rule these match, or None."""
        seen = {"slurm_account": slurm_account, "k8s_namespace": k8s_namespace}
        seen["unix_group"] = unix_group
        for rule in self.rules:
            if seen[rule.match] and seen[rule.match] == rule.value:
                return rule.tenant_id
        return None

    def only(self, tenants: Collection[str]) -> TenantRules:
        """The rules whose tenant is one of `tenants` (the ledger's, now)."""
        kept = tuple(r for r in self.rules if r.tenant_id in tenants)
        return self if len(kept) == len(self.rules) else TenantRules(kept)


NO_RULES = TenantRules()


def parse_tenant_rules(text: str, path: str) -> TenantRules:
    """The rules in `text` (read from `path`, named in errors), or TenantRulesError."""
    lines = text.splitlines()
    doc = parsed(text, path, TenantRulesError)
    unknown = sorted(set(doc) - {"rule"})
    if unknown:
        line = top_line(lines, unknown[0])
        raise TenantRulesError(f"{path}:{line}: {unknown[0]}: not a tenant rules field")
    entries = doc.get("rule", [])
    if not isinstance(entries, list):
        raise TenantRulesError(f"{path}:1: rule: must be [[rule]] tables")
    rules: list[Rule] = []
    seen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(entries):

        def where(key: str | None, i: int = i) -> str:
            line = table_line(lines, "rule", i, key)
            return f"{path}:{line}: rule[{i}]" + (f".{key}" if key else "")

        if not isinstance(entry, dict):
            raise TenantRulesError(f"{where(None)}: must be a table")
        extra = sorted(set(entry) - _FIELDS)
        if extra:
            raise TenantRulesError(
                f"{where(extra[0])}: not a rule field (one of {', '.join(sorted(_FIELDS))})"
            )
        keys = [k for k in MATCHES if k in entry]
        if len(keys) != 1:
            raise TenantRulesError(
                f"{where(keys[1] if keys else None)}: exactly one of {', '.join(MATCHES)}"
            )
        match = keys[0]
        value, tenant = entry[match], entry.get("tenant")
        if not isinstance(value, str) or not 0 < len(value) <= MAX_VALUE:
            raise TenantRulesError(f"{where(match)}: a name of 1 to {MAX_VALUE} characters")
        if "tenant" not in entry:
            raise TenantRulesError(f"{where(None)}.tenant: required")
        if not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_VALUE:
            raise TenantRulesError(f"{where('tenant')}: a tenant id")
        if (match, value) in seen:
            raise TenantRulesError(
                f"{where(match)}: repeats rule[{seen[(match, value)]}] (it would never apply)"
            )
        seen[(match, value)] = i
        rules.append(Rule(match, value, tenant, table_line(lines, "rule", i, "tenant"), i))
    return TenantRules(tuple(rules))


def unknown_tenants(rules: TenantRules, path: str, known: Collection[str]) -> list[str]:
    """A line per rule naming a tenant the ledger does not have (file, line, field)."""
    return [
        f"{path}:{r.line}: rule[{r.index}].tenant: unknown tenant {r.tenant_id!r} "
        "(the rule applies once the tenant is created)"
        for r in rules.rules
        if r.tenant_id not in known
    ]
