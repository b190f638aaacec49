"""The adapter to Slurm: `scontrol` run as a subprocess (argv, never a shell), with a
timeout, in UTC (Slurm prints and reads times in the caller's zone), reading the
one-line forms of `show reservation` and `show node`, and running the planner's
actions. Parsing and argv building are pure functions; `Scontrol` runs them.

Idempotent by construction: deleting a reservation that is gone, or creating one that
exists, is success once Slurm shows what was asked (the next plan checks)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ops.kit.errors import OpsError
from ops.slurm.bridge.model import (
    CreateReservation,
    DeleteReservation,
    Drain,
    EndReservation,
    Resume,
    ScontrolAction,
    SlurmNode,
    SlurmReservation,
    SlurmState,
    UpdateReservation,
)

_FIELD = re.compile(r"(\w+)=(\S*)")
# `Reason=why [user@2026-12-01T06:15:27]`: the last field of `show node -o`.
_REASON = re.compile(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$")
_NULL = "(null)"
# scontrol's refusal to delete a reservation jobs run in.
_IN_USE = "reservation is in use"
# …and to delete one it does not have (22.05 says "invalid").
_GONE = re.compile(r"not found|reservation is invalid")
_TIME = "%Y-%m-%dT%H:%M:%S"


class SlurmError(OpsError):
    """scontrol failed (exit status, timeout, or not found); the message says which."""


def _set(value: str) -> frozenset[str]:
    return frozenset() if value in ("", _NULL) else frozenset(value.split(","))


def parse_time(text: str) -> int:
    return int(datetime.strptime(text, _TIME).replace(tzinfo=UTC).timestamp())


def format_time(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime(_TIME)


def expand_hostlist(text: str) -> frozenset[str]:
    """Slurm's compressed host list (`gpu-a[01-03,7],gpu-b`) as names."""
    names: set[str] = set()
    for part in re.findall(r"[^,\[]*(?:\[[^\]]*\])?[^,\[]*", text):
        if not part or part == _NULL:
            continue
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if m is None:
            names.add(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit():
                names.add(part)  # not a range Slurm writes: the name as it stands
                continue
            for n in range(int(lo), int(hi or lo) + 1):
                names.add(f"{head}{str(n).zfill(len(lo))}{tail}")
    return frozenset(names)


def gpu_types(gres: str) -> tuple[str, ...]:
    """`gpu:h100:8(S:0-1),gpu:a100:2` -> ('h100', 'a100'); untyped gpus give none."""
    out = []
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.split(":")
        if parts[0] == "gpu" and len(parts) == 3:
            out.append(parts[1])
    return tuple(out)


def parse_reservations(text: str) -> dict[str, SlurmReservation]:
    out = {}
    for line in text.splitlines():
        f = dict(_FIELD.findall(line))
        if "ReservationName" not in f:
            continue
        out[f["ReservationName"]] = SlurmReservation(
            name=f["ReservationName"],
            nodes=expand_hostlist(f.get("Nodes", "")),
            start_s=parse_time(f["StartTime"]),
            end_s=parse_time(f["EndTime"]),
            tres=f.get("TRES", ""),
            users=_set(f.get("Users", "")),
            accounts=_set(f.get("Accounts", "")),
            core_total=int(f["CoreCnt"]) if f.get("CoreCnt", "").isdigit() else 0,
        )
    return out


def cores_per_gpu(fields: dict[str, str]) -> int:
    """CoresPerSocket when the node has a socket per whole GPU (Sockets= their count,
    as `gpufleet slurm conf --socket-per-gpu` writes it); else 0."""
    gres = re.sub(r"\([^)]*\)", "", fields.get("Gres", ""))
    whole = 0
    for item in gres.split(","):
        parts = item.split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            if len(parts) == 2 or "_" not in parts[1]:
                whole += int(parts[-1])
    sockets, per = fields.get("Sockets", ""), fields.get("CoresPerSocket", "")
    if whole and sockets.isdigit() and per.isdigit() and int(sockets) == whole:
        return int(per)
    return 0


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    out = {}
    for line in text.splitlines():
        head, _, _ = line.partition(" Reason=")
        f = dict(_FIELD.findall(head))
        if "NodeName" not in f:
            continue
        reason = _REASON.search(line)
        out[f["NodeName"]] = SlurmNode(
            name=f["NodeName"],
            drained="DRAIN" in f.get("State", "").upper().replace("+", " ").split(),
            reason=reason.group(1).strip() if reason else "",
            gpu_types=gpu_types(f.get("Gres", "")),
            cores_per_gpu=cores_per_gpu(f),
        )
    return out


def _reservation_fields(want: SlurmReservation, fields: Sequence[str], now_s: int) -> list[str]:
    args = []
    if "start" in fields:
        args.append("StartTime=" + ("now" if want.start_s <= now_s else format_time(want.start_s)))
    if "end" in fields:
        args.append("EndTime=" + format_time(want.end_s))
    if "nodes" in fields:
        args.append("Nodes=" + ",".join(sorted(want.nodes)))
        if want.cores:  # per node, in the order of Nodes=
            by_node = dict(want.cores)
            args.append("CoreCnt=" + ",".join(str(by_node[n]) for n in sorted(want.nodes)))
    if "tres" in fields and want.tres:
        args.append("TRES=" + want.tres)
    if "users" in fields or "accounts" in fields:
        # Slurm wants one of them at all times: both are set together.
        args.append("Users=" + ",".join(sorted(want.users)))
        args.append("Accounts=" + ",".join(sorted(want.accounts)))
    return args


def action_argv(action: ScontrolAction, now_s: int) -> list[str]:
    """The scontrol arguments of one action."""
    if isinstance(action, CreateReservation):
        w = action.want
        fields = ["start", "end", "nodes", "tres"]
        fields += [k for k, v in (("users", w.users), ("accounts", w.accounts)) if v]
        args = _reservation_fields(w, fields, now_s)
        args = [a for a in args if not a.endswith("=")]  # an empty Users/Accounts
        # IGNORE_JOBS: a booking is made now, whatever runs there; without it Slurm
        # refuses ("Requested nodes are busy") until every job on the node has ended.
        # OVERLAP: gpufleet's whole-node and TRES reservations share nodes (the ledger
        # keeps their GPUs apart); without it Slurm refuses a second one on a node.
        # Core reservations go without: Slurm then gives each cores of its own.
        flags = "Flags=IGNORE_JOBS" if w.cores else "Flags=OVERLAP,IGNORE_JOBS"
        return ["create", "reservation", f"ReservationName={w.name}", *args, flags]
    if isinstance(action, UpdateReservation):
        fields = _reservation_fields(action.want, action.changed, now_s)
        return ["update", f"ReservationName={action.want.name}", *fields]
    if isinstance(action, DeleteReservation):
        return ["delete", f"ReservationName={action.name}"]
    if isinstance(action, EndReservation):
        return ["update", f"ReservationName={action.name}", "EndTime=now"]
    if isinstance(action, Drain):
        return ["update", f"NodeName={action.node}", "State=DRAIN", f"Reason={action.reason}"]
    return ["update", f"NodeName={action.node}", "State=RESUME"]


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()


@dataclass(frozen=True)
class ScontrolConfig:
    path: str = "scontrol"
    slurm_conf: str | None = None
    timeout_s: float = 10.0


class Scontrol:
    def __init__(self, config: ScontrolConfig) -> None:
        self.config = config
        env = {"TZ": "UTC", "PATH": os.defpath, "LC_ALL": "C"}
        if config.slurm_conf:
            env["SLURM_CONF"] = config.slurm_conf
        self._env = env

    @property
    def program(self) -> str:
        return os.path.basename(self.config.path)

    async def run(self, *args: str, stdin: str | None = None) -> str:
        """The program's output for `args` (and `stdin`, when given: commands for an
        interactive mode); SlurmError for a non-zero exit or no answer in time."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self.config.path, *args, env=self._env,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as exc:
            raise SlurmError(f"cannot run {self.config.path}: {exc}") from None
        given = None if stdin is None else stdin.encode()
        try:
            out, err = await asyncio.wait_for(proc.communicate(given), self.config.timeout_s)
        except TimeoutError:
            await _kill(proc)
            raise SlurmError(f"{self.program} {' '.join(args[:2])}: no answer in "
                             f"{self.config.timeout_s:g} s") from None  # fmt: skip
        except asyncio.CancelledError:
            await _kill(proc)  # stopping: no change lands after the bridge is gone
            raise
        # One line: scontrol spreads one refusal over several.
        text = " ".join((out.decode(errors="replace") + err.decode(errors="replace")).split())
        if proc.returncode != 0:
            raise SlurmError(f"{self.program} {' '.join(args)}: {text or proc.returncode}")
        return out.decode(errors="replace")

    async def state(self) -> SlurmState:
        nodes = parse_nodes(await self.run("--oneliner", "show", "node"))
        reservations = parse_reservations(await self.run("--oneliner", "show", "reservation"))
        return SlurmState(reservations, nodes)

    async def node(self, name: str) -> SlurmNode | None:
        try:
            return parse_nodes(await self.run("--oneliner", "show", "node", name)).get(name)
        except SlurmError:
            return None

    async def apply(self, action: ScontrolAction, now_s: int) -> None:
        if isinstance(action, Resume):
            # Read again: a drain someone else set since the plan is not the bridge's.
            node = await self.node(action.node)
            if node is None or not node.drained_by_gpufleet:
                return
        try:
            await self.run(*action_argv(action, now_s))
        except SlurmError as exc:
            text = str(exc).lower()
            if isinstance(action, DeleteReservation) and _GONE.search(text):
                return  # already gone
            if isinstance(action, DeleteReservation) and _IN_USE in text:
                # Jobs run in it: Slurm deletes none such, but ends one at its EndTime,
                # ending its jobs (after ResvOverRun, 0 by default), then purges it.
                await self.run(*action_argv(EndReservation(action.name), now_s))
                return
            raise
