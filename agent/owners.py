"""Who owns a GPU process: parsed from `/proc/<pid>` (under a configurable root).

The owner is `GPUFLEET_RESERVATION_ID` from the process's environment when it is set
(`/proc/<pid>/environ`, NUL-separated; unreadable for another user's process unless the
agent runs as root, in which case the cgroup is used), else the booking a Slurm job's
`SLURM_JOB_RESERVATION` names (`gpufleet-<id>` or `gpufleet-<id>--<node>`, the Slurm
bridge's names, as the shipped TaskProlog reads them): a job in a booking's reservation
is that booking's even where the TaskProlog is not installed. Otherwise the cgroup names it
(`/proc/<pid>/cgroup`, cgroup v1 lines `N:controllers:/path` or the v2 line `0::/path`):

- a Kubernetes pod UID: `…/kubepods-burstable-pod<uid>.slice/…` (systemd driver, the
  UID's dashes written as `_`) or `/kubepods/burstable/pod<uid>/…` (cgroupfs);
- a Slurm job id: `/slurm/uid_1000/job_42/step_0` (v1) or
  `/system.slice/slurmstepd.scope/job_42/step_0/…` (v2);
- a container id (64 hex): `docker-<id>.scope`, `cri-containerd-<id>.scope`,
  `crio-<id>.scope`, `libpod-<id>.scope` (systemd driver) or `/docker/<id>` (cgroupfs);
- a systemd unit: the innermost `<name>.service`.

Names, where cheap to read: a pod's `<namespace>/<name>`, a Slurm job's user, and a
container's name from its runtime's files on the host (`container_names`).

In that order: a container inside a pod is the pod, a job step under `slurmstepd.scope`
is the job, a container under `docker.service`'s slice is the container. The parsing
functions are pure; `ProcOwners` does the reading, and keeps an owner for as long as the
same process (pid and start time) lives.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from agent.container_names import container_name
from shared.wire import OwnerKind

log = logging.getLogger(__name__)

RESERVATION_ENV = b"GPUFLEET_RESERVATION_ID="
SLURM_RESERVATION_ENV = b"SLURM_JOB_RESERVATION="
_BRIDGE_ID = re.compile(r"^gpufleet-([A-Za-z0-9_-]+?)(?:--.*)?$")
MAX_OWNER = 256  # ProcessUse.owner's bound
MAX_ENVIRON = 1 << 20  # read no more of a process's environment than this
# In a pod's containers: the namespace of its service account (the pod's namespace).
SERVICE_ACCOUNT_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"

_HEX = "[0-9a-f]"
_POD = re.compile(
    rf"(?:^|[/_-])pod({_HEX}{{8}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{4}}[-_]{_HEX}{{12}}"
    rf"|{_HEX}{{32}})(?:\.slice)?$"
)
_JOB = re.compile(r"^job_(\d{1,20})$")
_CONTAINER = re.compile(rf"^(?:(?:docker|cri-containerd|crio|libpod)-)?({_HEX}{{64}})(?:\.scope)?$")
_UNIT = re.compile(r"^([^/]{1,250}\.service)$")


class Owner(msgspec.Struct, frozen=True):
    kind: OwnerKind
    id: str = ""
    name: str = ""  # readable, where cheap: a pod's `<namespace>/<name>`, a job's user,
    # a container's name


UNKNOWN = Owner("unknown")
# The order in which cgroup findings win (the reservation, from the environment, first).
_RANK: dict[OwnerKind, int] = {"pod": 0, "slurm": 1, "container": 2, "systemd": 3}


def owner_from_environ(environ: bytes) -> Owner | None:
    """The reservation named by `GPUFLEET_RESERVATION_ID` in a NUL-separated environment,
    else by a gpufleet Slurm reservation in `SLURM_JOB_RESERVATION`; None when neither
    names one. The value is kept as given (trimmed, within the wire's bounds): a process
    naming a reservation it does not hold is for the coordinator to flag, not for the
    agent to hide."""
    slurm: Owner | None = None
    for entry in environ.split(b"\0"):
        if entry.startswith(RESERVATION_ENV):
            text = entry[len(RESERVATION_ENV) :].decode("utf-8", "replace").strip()
            if text:
                return Owner("reservation", text[:MAX_OWNER])
        elif entry.startswith(SLURM_RESERVATION_ENV) and slurm is None:
            slurm = owner_from_slurm_reservation(
                entry[len(SLURM_RESERVATION_ENV) :].decode("utf-8", "replace")
            )
    return slurm


def owner_from_slurm_reservation(names: str) -> Owner | None:
    """The booking the first gpufleet one of a job's Slurm reservations (comma-separated)
    is for, or None."""
    for name in names.split(","):
        found = _BRIDGE_ID.match(name.strip())
        if found is not None and len(found.group(1)) <= MAX_OWNER:
            return Owner("reservation", found.group(1))
    return None


def owner_from_path(path: str) -> Owner | None:
    """The owner one cgroup path names, or None."""
    parts = [p for p in path.split("/") if p]
    kube = any(p.startswith("kubepods") for p in parts)
    found: list[Owner] = []
    for part in parts:
        if kube and (pod := _POD.search(part)) is not None:
            uid = pod.group(1).replace("_", "-")
            found.append(Owner("pod", uid))
        elif (job := _JOB.match(part)) is not None and "slurm" in path:
            found.append(Owner("slurm", job.group(1)))
        elif (ctr := _CONTAINER.match(part)) is not None:
            found.append(Owner("container", ctr.group(1)))
        elif (unit := _UNIT.match(part)) is not None:
            found.append(Owner("systemd", unit.group(1)))
    return _best(found, innermost=True)


def owner_from_cgroup(text: str) -> Owner | None:
    """The owner `/proc/<pid>/cgroup` names, over all its lines (v1 and v2), or None."""
    found: list[Owner] = []
    for line in text.replace("\0", "").splitlines():  # the wire refuses NUL in text
        _, sep, rest = line.partition(":")
        _, sep2, path = rest.partition(":")
        if sep and sep2:
            owner = owner_from_path(path.strip())
            if owner is not None:
                found.append(owner)
    return _best(found, innermost=False)


def _best(found: list[Owner], innermost: bool) -> Owner | None:
    """The highest-ranked finding; within one path, of equal rank, the innermost."""
    if not found:
        return None
    order = list(reversed(found)) if innermost else found
    return min(order, key=lambda o: _RANK[o.kind])


class ProcOwners:
    """Reads owners from `<proc_root>/<pid>/…`. An owner is cached for its process: the
    same pid with the same start time (`stat` field 22) is the same process, so its
    environment and cgroup (and a pod's, job's or container's name) are read once, not
    every poll. A container runtime's files are read under `host_root` (default: the
    proc root's parent, `/` for `/proc`)."""

    def __init__(self, proc_root: Path, host_root: Path | None = None) -> None:
        self._root = proc_root
        self._host = proc_root.parent if host_root is None else host_root
        self._cache: dict[int, tuple[str, Owner]] = {}
        self._denied = False

    def owner(self, pid: int) -> Owner:
        # A string path: pathlib would intern each pid, an interned name made and dropped
        # every poll, which grows CPython's table of them (bench/agent_bench.py).
        base = os.path.join(self._root, str(pid))
        try:
            with open(os.path.join(base, "stat")) as f:
                start = _start_time(f.read())
        except (OSError, ValueError):
            return UNKNOWN  # gone already, or in another PID namespace
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start:
            return cached[1]
        owner = self._read(base)
        self._cache[pid] = (start, owner)
        return owner

    def keep_only(self, pids: Iterable[int]) -> None:
        """Forget processes that are no longer on any GPU."""
        alive = set(pids)
        for pid in [p for p in self._cache if p not in alive]:
            del self._cache[pid]

    def _read(self, base: str) -> Owner:
        environ: bytes | None = None
        try:
            with open(os.path.join(base, "environ"), "rb") as f:
                environ = f.read(MAX_ENVIRON)
            owner = owner_from_environ(environ)
            if owner is not None:
                return owner
        except PermissionError:
            if not self._denied:
                self._denied = True
                log.warning(
                    "cannot read %s/environ (not root?): owners come from cgroups only", base
                )
        except OSError:
            pass
        try:
            with open(os.path.join(base, "cgroup"), errors="replace") as f:
                owner = owner_from_cgroup(f.read())
        except OSError:
            return UNKNOWN
        if owner is None:
            return UNKNOWN
        if owner.kind == "container":
            return msgspec.structs.replace(
                owner, name=container_name(self._host, owner.id, environ)[:MAX_OWNER]
            )
        return msgspec.structs.replace(owner, name=_name_of(base, owner, environ)[:MAX_OWNER])


def _name_of(base: str, owner: Owner, environ: bytes | None) -> str:
    """A pod's `<namespace>/<name>`: its name is the container's hostname (`HOSTNAME`,
    which the runtime sets to the pod's name), its namespace the service account's
    file in the container's root, both read through /proc (as root); a Slurm job's
    user, from the process's uid. "" where any of it cannot be read."""
    try:
        if owner.kind == "pod":
            env = (environ or b"").split(b"\0")
            host = next((e[9:] for e in env if e.startswith(b"HOSTNAME=")), b"")
            with open(os.path.join(base, "root", SERVICE_ACCOUNT_NAMESPACE)) as f:
                ns = f.read().strip()
            name = host.decode("utf-8", "replace").strip()
            return f"{ns}/{name}" if ns and name else ""
        if owner.kind == "slurm":
            with open(os.path.join(base, "status")) as f:
                status = f.read()
            uid = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Uid:"))
            return pwd.getpwuid(uid).pw_name
    except (OSError, ValueError, KeyError, StopIteration, IndexError):
        pass
    return ""


def _start_time(stat: str) -> str:
    """Field 22 of `/proc/<pid>/stat` (start time in clock ticks); the command name in
    field 2 may hold spaces and parentheses, so fields are counted after its last `)`."""
    rest = stat.rsplit(")", 1)[1].split()
    return rest[19]
