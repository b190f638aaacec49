"""gpufleet's version, declared once. pyproject.toml reads it at build time
(`[tool.setuptools.dynamic]`), so the installed metadata, every command's `--version`,
the agent's inventory and `gpufleet_build_info` all say the same, and no process reads
its install's metadata to learn it: `importlib.metadata` brings email, zipfile and csv
with it, about 3 MB of the agent's 30 MB budget (issue 30)."""

from __future__ import annotations

__version__ = "0.1.0"
