"""A container's readable name, from its runtime's files on the host (read as root).

The cgroup gives a container process's id (`owners.owner_from_path`); its name lives
with the runtime. Read, under the host root the agent is given (`/` on a host), in this
order, the first that names it winning:

- Docker: `var/lib/docker/containers/<id>/config.v2.json`, its `Name` (`/trainer`,
  the leading `/` dropped);
- containerd (nerdctl, or Docker ≥ 23 on containerd): the OCI bundle
  `run/containerd/io.containerd.runtime.v2.task/<namespace>/<id>/config.json`, its
  `nerdctl/name` annotation;
- Podman (and CRI-O outside Kubernetes): containers/storage's index
  `var/lib/containers/storage/overlay-containers/containers.json` (rootful) or the same
  under `run/containers/storage/` (its run root), the entry with the id, its first name;
- otherwise the process's own `HOSTNAME` (`/proc/<pid>/environ`), which Docker and
  Podman set to the container's hostname (the short id unless `--hostname` gave one).

Each file is read with a bound and any failure (absent, unreadable, not JSON) moves on
to the next: a name is a convenience, never a reason to lose the owner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_FILE = 1 << 20  # a runtime's file read no further than this
MAX_NAME = 253  # a DNS name's bound: a container name or hostname is no longer
_TASKS = "run/containerd/io.containerd.runtime.v2.task"
_STORAGE_INDEXES = (
    "var/lib/containers/storage/overlay-containers/containers.json",
    "run/containers/storage/overlay-containers/containers.json",
)


def container_name(host_root: Path, container_id: str, environ: bytes | None) -> str:
    """The container's name, or "" where nothing readable names it."""
    for found in (
        _docker(host_root, container_id),
        _containerd(host_root, container_id),
        _podman(host_root, container_id),
        _hostname(environ),
    ):
        name = found.strip().lstrip("/")
        if name and "\0" not in name:
            return name[:MAX_NAME]
    return ""


def _json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(MAX_FILE))
    except (OSError, ValueError):
        return None


def _docker(root: Path, cid: str) -> str:
    config = _json(root / "var/lib/docker/containers" / cid / "config.v2.json")
    return str(config.get("Name") or "") if isinstance(config, dict) else ""


def _containerd(root: Path, cid: str) -> str:
    try:
        namespaces = sorted(os.listdir(root / _TASKS))
    except OSError:
        return ""
    for ns in namespaces:
        spec = _json(root / _TASKS / ns / cid / "config.json")
        if isinstance(spec, dict) and isinstance(notes := spec.get("annotations"), dict):
            name = notes.get("nerdctl/name")
            if isinstance(name, str) and name:
                return name
    return ""


def _podman(root: Path, cid: str) -> str:
    for index in _STORAGE_INDEXES:
        entries = _json(root / index)
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if isinstance(entry, dict) and entry.get("id") == cid:
                names = entry.get("names")
                if isinstance(names, list) and names and isinstance(names[0], str):
                    return names[0]
    return ""


def _hostname(environ: bytes | None) -> str:
    for entry in (environ or b"").split(b"\0"):
        if entry.startswith(b"HOSTNAME="):
            return entry[9:].decode("utf-8", "replace")
    return ""
