"""Host memory per owner (issue 35): what each owner of the node's GPU processes holds in
its cgroup, read under a configurable root (`/` on a host, a fake tree in tests and
simulation), never raised past here.

An owner's cgroup is the one its name came from (`agent.owners`): a pod's
`…/kubepods-…-pod<uid>.slice`, a Slurm job's `…/job_42`, a container's scope, a unit's
`<name>.service`; a process named by its environment (`GPUFLEET_RESERVATION_ID`) is
charged its cgroup-named owner's cgroup where the path names one, else its own. Each
cgroup is read once however many processes share it: cgroup v2's `memory.current` (and
`memory.peak`) under `sys/fs/cgroup/<path>`, or, where a v1 hierarchy holds the memory
controller (v1 hosts, and systemd's hybrid mode, whose v2 line is then empty), v1's
`memory.usage_in_bytes` under `sys/fs/cgroup/memory/<path>` (no peak there: the reading
itself).

Nothing is counted twice: a cgroup two owners claim is given to neither but to the
`unknown` entry; a claimed cgroup inside another (a reservation's process under a
session that another owner's process also runs in) is taken out of the outer one. The
root cgroup is the host, no one's: not read. The peak is "since the last read": the
cgroup's `memory.peak` where it grew since then (the high-water mark was set in
between), else the current reading. The entries are bounded by `MAX_OWNER_MEMORY`: the
smallest past it are folded into `unknown`, so their memory is kept, unattributed.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import msgspec

from agent.owners import MAX_ENVIRON, owner_from_path
from shared.wire import MAX_OWNER_MEMORY, DeviceUse, OwnerKind, OwnerMemory

MIB = 1024 * 1024
SLURM_ACCOUNT_ENV = b"SLURM_JOB_ACCOUNT="
MAX_TEXT = 128  # OwnerMemory's attribute bound

Key = tuple[OwnerKind, str]
UNKNOWN_KEY: Key = ("unknown", "")


class OwnerMemoryReader(Protocol):
    """The poller's seam: the memory of the owners of `use`'s processes."""

    def read(self, use: Sequence[DeviceUse]) -> tuple[OwnerMemory, ...]: ...


class _Proc(msgspec.Struct, frozen=True):
    """What one process says of where its memory is: its cgroup directory (relative to
    the cgroup mount, "" when none can be read), whether it is v2, its Slurm account and
    its unix group."""

    start: bytes
    where: str  # the owner's cgroup: "2:/path" (v2) or "1:/path" (v1 memory), "" none
    account: str
    group: str


class _Held(msgspec.Struct):
    current: int = 0
    peak: int = 0
    account: str = ""
    namespace: str = ""
    group: str = ""


def cgroup_dir(text: str) -> tuple[str, bool] | None:
    """The memory cgroup a `/proc/<pid>/cgroup` names: the v1 `memory` controller's path
    where a v1 hierarchy has it (a hybrid host also lists an empty v2 line, `0::/`),
    else the v2 line's; (path, is_v2), or None."""
    v2: str | None = None
    for line in text.replace("\0", "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if not sep:
            continue
        if hier == "0" and controllers == "":
            v2 = path.strip()
        elif "memory" in controllers.split(","):
            return path.strip(), False
    return (v2, True) if v2 is not None else None


def owner_cgroup(path: str) -> str:
    """The cgroup that names the owner of a process in `path`: the shortest prefix whose
    owner is the path's own (a pod's slice holds its containers); `path` when none."""
    named = owner_from_path(path)
    if named is None:
        return path
    parts = [p for p in path.split("/") if p]
    for i in range(1, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        found = owner_from_path(prefix)
        if found is not None and (found.kind, found.id) == (named.kind, named.id):
            return prefix
    return path


class CgroupMemory:
    """Reads owners' cgroup memory under `root`. Not thread-safe: the poll thread's."""

    def __init__(self, root: Path) -> None:
        self._proc = os.path.join(root, "proc")
        self._cgroup = os.path.join(root, "sys", "fs", "cgroup")  # no trailing slash
        self._procs: dict[int, _Proc] = {}
        self._marks: dict[str, int] = {}  # cgroup → its memory.peak at the last read

    def read(self, use: Sequence[DeviceUse]) -> tuple[OwnerMemory, ...]:
        claims: dict[str, set[Key]] = {}  # cgroup dir (v2: "2:/p", v1: "1:/p") → owners
        held: dict[Key, _Held] = {}
        pids: set[int] = set()
        for device in use:
            for p in device.processes:
                if p.pid in pids:
                    continue
                pids.add(p.pid)
                key: Key = (p.owner_kind, p.owner) if p.owner_kind != "unknown" else UNKNOWN_KEY
                info = self._process(p.pid)
                facts = held.setdefault(key, _Held())
                if info is None or not info.where:
                    continue
                facts.account = facts.account or info.account
                facts.group = facts.group or info.group
                if p.owner_kind == "pod" and "/" in p.owner_name:
                    facts.namespace = p.owner_name.split("/", 1)[0][:MAX_TEXT]
                claims.setdefault(info.where, set()).add(key)
        self._procs = {pid: v for pid, v in self._procs.items() if pid in pids}
        readings = {d: r for d in claims if (r := self._memory(d)) is not None}
        self._marks = {d: m for d, m in self._marks.items() if d in readings}
        inner = _inner(readings)
        for d, (current, peak) in readings.items():
            below = sum(readings[c][0] for c in inner.get(d, ()))
            owners = claims[d]
            key = next(iter(owners)) if len(owners) == 1 else UNKNOWN_KEY
            facts = held.setdefault(key, _Held())
            own = max(0, current - below)
            facts.current += own
            facts.peak += max(own, peak - below)
        return _bounded(held)

    def _process(self, pid: int) -> _Proc | None:
        base = f"{self._proc}/{pid}"
        try:
            start = _read(f"{base}/stat").rsplit(b")", 1)[1].split()[19]
        except (OSError, IndexError):
            return None
        cached = self._procs.get(pid)
        if cached is not None and cached.start == start:
            return cached
        try:
            found = cgroup_dir(_read(f"{base}/cgroup").decode("utf-8", "replace"))
        except OSError:
            found = None
        where = ""
        if found is not None and found[0].strip("/"):  # the root: the host's, no one's
            where = f"{2 if found[1] else 1}:{owner_cgroup(found[0])}"
        info = _Proc(start, where, _account(base), _group(base))
        self._procs[pid] = info
        return info

    def _memory(self, where: str) -> tuple[int, int] | None:
        """(current, peak since the last read) in bytes, or None where unreadable."""
        v2, path = where[0] == "2", where[2:].strip("/")
        if v2:
            base = f"{self._cgroup}/{path}"
            current = _number(f"{base}/memory.current")
        else:
            current = _number(f"{self._cgroup}/memory/{path}/memory.usage_in_bytes")
        if current is None:
            return None
        mark = _number(f"{base}/memory.peak") if v2 else None
        peak = current
        if mark is not None:
            last = self._marks.get(where)
            if last is not None and mark > last:
                peak = max(current, mark)  # the high-water mark rose since the last read
            self._marks[where] = mark
        return current, peak


def _inner(readings: Iterable[str]) -> dict[str, list[str]]:
    """Each read cgroup's nearest read descendants (same hierarchy): theirs is taken out
    of its memory, which counts them too."""
    dirs = set(readings)
    out: dict[str, list[str]] = {}
    for d in dirs:
        parts = d[2:].strip("/").split("/")
        for i in range(len(parts) - 1, 0, -1):
            up = f"{d[:2]}/" + "/".join(parts[:i])
            if up in dirs:
                out.setdefault(up, []).append(d)
                break
    return out


def _bounded(held: dict[Key, _Held]) -> tuple[OwnerMemory, ...]:
    """The entries, the largest `MAX_OWNER_MEMORY - 1` by owner and the rest folded into
    `unknown` (kept, unattributed), in a stable order."""
    rest = held.pop(UNKNOWN_KEY, _Held())
    ranked = sorted(held.items(), key=lambda kv: (-kv[1].current, kv[0]))
    keep = ranked[: MAX_OWNER_MEMORY - 1]
    for _, folded in ranked[MAX_OWNER_MEMORY - 1 :]:
        rest.current += folded.current
        rest.peak += folded.peak
    keep.append((UNKNOWN_KEY, rest))
    return tuple(
        OwnerMemory(
            owner_kind=kind, owner=owner, current_mib=h.current // MIB,
            peak_mib=max(h.peak, h.current) // MIB, slurm_account=h.account,
            k8s_namespace=h.namespace, unix_group=h.group,
        )
        for (kind, owner), h in sorted(keep, key=lambda kv: kv[0])
        if h.current or h.peak  # an owner holding nothing is absent (0 MiB: gone)
    )  # fmt: skip


def _read(path: str, most: int = 4096) -> bytes:
    """A small file's bytes (os.read: a poll reads hundreds of these, no text layer)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, most)
    finally:
        os.close(fd)


def _number(path: str) -> int | None:
    try:
        return max(0, int(_read(path, 64).strip() or b"0"))
    except (OSError, ValueError):
        return None


def _account(base: str) -> str:
    """The Slurm account a job's process runs under (its environment), or ""."""
    try:
        env = _read(f"{base}/environ", MAX_ENVIRON)
    except OSError:
        return ""
    for entry in env.split(b"\0"):
        if entry.startswith(SLURM_ACCOUNT_ENV):
            return entry[len(SLURM_ACCOUNT_ENV) :].decode("utf-8", "replace").strip()[:MAX_TEXT]
    return ""


def _group(base: str) -> str:
    """The name of the process's real group (`status`'s `Gid:`), or ""."""
    try:
        with open(f"{base}/status") as f:
            line = next(ln for ln in f if ln.startswith("Gid:"))
        return grp.getgrgid(int(line.split()[1])).gr_name[:MAX_TEXT]
    except (OSError, StopIteration, IndexError, ValueError, KeyError):
        return ""
