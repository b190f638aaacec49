"""`gpufleet-agent gres-uuids INDEXES`: Slurm's gres indexes on this node (`6,7`, as
Slurm without its NVML AutoDetect plugin puts them in CUDA_VISIBLE_DEVICES) as the GPU
or MIG UUIDs they stand for, comma-separated on stdout, for the shipped TaskProlog
(ops/slurm/task_prolog.sh) to hand CUDA devices it reads right.

The indexes are numbered as `gpufleet slurm conf` wrote this node's gres.conf
(shared.slurm_gres, one function for both), from the GPU map the running agent keeps in
`gpus.json` in its `runtime_dir` (agent.gpu_map_file), readable by every user since the
TaskProlog runs as the job's: no NVML at task start. That file is refused (exit 2)
when it names another node, and (exit 3) when the agent has not confirmed it for longer
than `bookings_max_age_s` (`--max-age`), as `gpufleet-agent env` refuses its bookings.
Only when there is no file this user may read, or `--nvml` asks, is the inventory read
now (NVML or its simulated profile; no NATS). An index that does not fit exits 3 with
the reason on stderr and prints nothing; bad settings exit 2.

The daemon's TOML file is read when neither `--config` nor `GPUFLEET_CONFIG` names one
and this user may read it, as `gpufleet-agent env` does; a job's user, whom the shipped
`/etc/gpufleet` (0750) keeps out, goes by the defaults, and takes the file's node as this
host's unless `--node-id` or `GPUFLEET_NODE_ID` says which (the file is in this host's
`/run`, written by its agent).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.config import DEFAULT_CONFIG, Settings, readable
from agent.errors import CONFIG, AgentError, exit_status
from agent.gpu_map_file import FILE_NAME, GpuMap, gpu_map, read_gpu_map
from procs.settings import ConfigError, load
from shared.slurm_gres import GresIndexError, uuids_for

NODE_ENV = "GPUFLEET_NODE_ID"
PLACEHOLDER_POOL = "pool_" + "0" * 26
USAGE = "usage: gpufleet-agent gres-uuids INDEXES [--nvml] [--max-age S] [agent settings flags]"
NOT_FOUND = 3


def main(argv: Sequence[str], env: Mapping[str, str], default_config: Path = DEFAULT_CONFIG) -> int:
    """`argv` starts with `gres-uuids`."""
    rest = list(argv[1:])
    if not rest or rest[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return CONFIG
    indexes, rest = rest[0], [a for a in rest[1:] if a != "--nvml"]
    nvml = len(rest) < len(argv) - 2
    named = _given(rest, "--config")
    configured = named or bool(env.get(Settings.config_env))
    if not configured and readable(default_config):
        env = {**env, Settings.config_env: str(default_config)}
        configured = True
    # Without a config or a node id given, the host's agent says which node this is.
    node_known = configured or _given(rest, "--node-id") or bool(env.get(NODE_ENV))
    try:
        settings = load(Settings, rest, env, defaults={"pool_id": PLACEHOLDER_POOL})
        gpus = None if nvml else _kept(settings, node_known)
    except (ConfigError, AgentError) as exc:
        return exit_status(exc, "gres-uuids", hint=USAGE if isinstance(exc, ConfigError) else "")
    if gpus is None:
        from agent.inventory_report import read_settings  # NVML: only once settings are good

        gpus = gpu_map(read_settings(settings))
    try:
        uuids = uuids_for(gpus.gpus, indexes)
    except GresIndexError as exc:
        print(f"gpufleet-agent gres-uuids: {exc}", file=sys.stderr)
        return NOT_FOUND
    print(",".join(uuids))
    return 0


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _kept(settings: Settings, node_known: bool) -> GpuMap | None:
    """The daemon's GPU map, vouched for; `None` when there is none to read."""
    held = read_gpu_map(settings.runtime_dir / FILE_NAME)
    if held is None:
        return None
    node = settings.node_id if node_known else None
    return held.vouch(node, int(time.time() * 1000), settings.bookings_max_age_ms)
