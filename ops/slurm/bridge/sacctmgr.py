"""The adapter to Slurm's accounting: `sacctmgr` run as `scontrol` is (argv, a timeout,
`SLURM_CONF`), reading the QOS and the associations that allow them, and making,
changing and deleting a booking's QOS (`gpufleet-<id>`, `GrpTRES=` its GPUs).

A QOS is gpufleet's by name and description (`QOS_DESCRIPTION`); the only change the
bridge makes to an association is adding or removing one of its own QOS in the QOS list
of a booking's users and accounts, so that where `AccountingStorageEnforce` has `qos`
their jobs may run under it. Slurm drops a deleted QOS from every association itself.
Both listings come from one sacctmgr per pass (`read_argv`, `READ_COMMANDS`): its
interactive mode takes the two `show` commands on stdin, with `version` between them to
say where the first listing ends. Parsing and argv building are pure functions;
`Sacctmgr` runs them."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ops.kit.errors import OpsError
from ops.slurm.bridge.model import (
    QOS_DESCRIPTION,
    CreateQos,
    DeleteQos,
    QosAction,
    SlurmQos,
)
from ops.slurm.bridge.planner import normalise_tres
from ops.slurm.bridge.scontrol import Scontrol, ScontrolConfig, SlurmError

# sacctmgr's answer to deleting what is gone (exit status 1): success here. "Nothing
# modified" is not: every change is planned from what sacctmgr showed, so it means a
# booking's user or account has no association in slurmdbd (its jobs could not run).
_GONE = " nothing deleted"
_NO_ASSOCIATION = (
    "; a booking's Slurm user or account has no association in slurmdbd "
    "(sacctmgr add user/account), or gpufleet's users/accounts mapping names it wrongly"
)
QOS_FORMAT = ("show", "qos", "format=name,grptres,description")
ASSOC_FORMAT = ("show", "assoc", "format=user,account,qos")
# One sacctmgr (no header, `|`-separated) reads both: the commands on its stdin, in its
# interactive mode. It exits non-zero when slurmdbd cannot be reached, as one-shot.
READ_ARGV = ("-n", "-P")
READ_COMMANDS = "\n".join((" ".join(QOS_FORMAT), "version", " ".join(ASSOC_FORMAT), ""))
# Interactive sacctmgr prompts (`sacctmgr: `, echoing each command where it has
# readline); `version` answers `slurm-wlm 22.05.8` (Debian) or `slurm 23.11.1`.
_PROMPT = "sacctmgr: "
_VERSION = re.compile(r"^slurm\S* \d")


class ListingError(OpsError):
    """sacctmgr's answer to READ_COMMANDS is not the two listings."""


def split_listings(out: str) -> tuple[str, str]:
    """sacctmgr's answer to READ_COMMANDS as the `show qos` and `show assoc` listings:
    the lines before and after the version, prompts and echoed commands left out
    (every listing line has a `|`, they have none)."""
    lines = [line.removeprefix(_PROMPT) for line in out.splitlines()]
    marker = next((i for i, line in enumerate(lines) if _VERSION.match(line)), None)
    if marker is None:
        raise ListingError(f"no version line between its listings: {out[:200]!r}")

    def listing(part: list[str]) -> str:
        return "".join(line + "\n" for line in part if "|" in line)

    return listing(lines[:marker]), listing(lines[marker + 1 :])


def parse_qos(qos_text: str, assoc_text: str) -> dict[str, SlurmQos]:
    """`sacctmgr -n -P show qos` and `show assoc` (QOS_FORMAT, ASSOC_FORMAT) as QOS by
    name, each with the users all of whose associations allow it and the accounts
    whose own association does."""
    user_lists: dict[str, list[set[str]]] = {}
    account_lists: dict[str, set[str]] = {}
    for line in assoc_text.splitlines():
        user, _, rest = line.partition("|")
        account, _, qos = rest.partition("|")
        names = {q.strip().lower() for q in qos.split(",") if q.strip()}
        if user:
            user_lists.setdefault(user, []).append(names)
        elif account:
            account_lists[account] = names
    out = {}
    for line in qos_text.splitlines():
        name, _, rest = line.partition("|")
        grp_tres, _, description = rest.partition("|")
        name = name.strip().lower()
        if not name:
            continue
        out[name] = SlurmQos(
            name=name,
            grp_tres=normalise_tres(grp_tres),
            description=description.strip(),
            users=frozenset(u for u, lists in user_lists.items() if all(name in q for q in lists)),
            accounts=frozenset(a for a, q in account_lists.items() if name in q),
        )
    return out


def _grp_tres(want: str, have: str = "") -> str:
    """`GrpTRES=` that makes `have` into `want` (a limit dropped is set to -1)."""
    items = [t for t in want.split(",") if t]
    keep = {t.partition("=")[0] for t in items}
    items += [f"{k}=-1" for k in (t.partition("=")[0] for t in have.split(",") if t)
              if k not in keep]  # fmt: skip
    return "GrpTRES=" + ",".join(items)


def _allow(name: str, users: frozenset[str], accounts: frozenset[str], op: str) -> list[list[str]]:
    """The changes that add (`op` "+=") or remove ("-=") a QOS in associations' lists."""
    argvs = []
    if users:
        argvs.append(["-i", "modify", "user", "where", f"name={','.join(sorted(users))}",
                      "set", f"qos{op}{name}"])  # fmt: skip
    if accounts:
        argvs.append(["-i", "modify", "account", "where", f"name={','.join(sorted(accounts))}",
                      "set", f"qos{op}{name}"])  # fmt: skip
    return argvs


def qos_argvs(action: QosAction) -> list[list[str]]:
    """The sacctmgr calls of one action, in order."""
    if isinstance(action, DeleteQos):
        return [["-i", "delete", "qos", "where", f"name={action.name}"]]
    w = action.want
    if isinstance(action, CreateQos):
        add = ["-i", "add", "qos", w.name, "set", f"Description={QOS_DESCRIPTION}"]
        if w.grp_tres:
            add.append(_grp_tres(w.grp_tres))
        return [add, *_allow(w.name, w.users, w.accounts, "+=")]
    h = action.have
    argvs = []
    if w.grp_tres != h.grp_tres:
        argvs.append(["-i", "modify", "qos", "where", f"name={w.name}", "set",
                      _grp_tres(w.grp_tres, h.grp_tres)])  # fmt: skip
    argvs += _allow(w.name, w.users - h.users, w.accounts - h.accounts, "+=")
    argvs += _allow(w.name, h.users - w.users, h.accounts - w.accounts, "-=")
    return argvs


class Sacctmgr:
    """sacctmgr through the same runner as scontrol (its path in `config.path`)."""

    def __init__(self, config: ScontrolConfig) -> None:
        self._runner = Scontrol(config)

    async def qos(self) -> Mapping[str, SlurmQos]:
        """Every QOS, from one sacctmgr; SlurmError when accounting cannot be read (no
        slurmdbd, or none configured)."""
        out = await self._runner.run(*READ_ARGV, stdin=READ_COMMANDS)
        try:
            return parse_qos(*split_listings(out))
        except ListingError as exc:
            raise SlurmError(f"sacctmgr: {exc}") from None

    async def apply(self, action: QosAction) -> None:
        for argv in qos_argvs(action):
            try:
                await self._runner.run(*argv)
            except SlurmError as exc:
                text = str(exc).lower()
                if _GONE in text:
                    continue
                if "nothing modified" in text and argv[2] in ("user", "account"):
                    raise SlurmError(str(exc) + _NO_ASSOCIATION) from None
                raise
