"""Which build is running: the git revision gpufleet was built from, for
`gpufleet_build_info` (its version is `procs.version`). Never runs git: a host may have
none. The revision comes from the install's own record (PEP 610 `direct_url.json`, which
pip and uv write for an install from a git URL), else from the `REVISION` file beside
this module (written by `scripts/bootstrap-venv` from the checkout, and by whoever builds
a package), else "unknown"."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

REVISION_FILE = Path(__file__).with_name("REVISION")
UNKNOWN = "unknown"
_SHA = re.compile(r"[0-9a-f]{7,64}")


def _from_install() -> str | None:
    try:
        text = metadata.distribution("gpufleet").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return commit if isinstance(commit, str) and _SHA.fullmatch(commit) else None


def _from_file(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text if _SHA.fullmatch(text) else None


def revision(path: Path = REVISION_FILE) -> str:
    """The git commit this build is from, or "unknown"."""
    return _from_install() or _from_file(path) or UNKNOWN
