"""`gpufleet-agent gres-uuids INDEXES`: Slurm's gres indexes on this node (`6,7`, as
Slurm without its NVML AutoDetect plugin puts them in CUDA_VISIBLE_DEVICES) as the GPU
or MIG UUIDs they stand for, comma-separated on stdout, for the shipped TaskProlog
(ops/slurm/task_prolog.sh) to hand CUDA devices it reads right.

The indexes are numbered as `gpufleet slurm conf` wrote this node's gres.conf
(shared.slurm_gres, one function for both), from the inventory the agent with these
settings reads now (NVML or its simulated profile; no NATS). An index that does not fit
exits 3 with the reason on stderr and prints nothing; bad settings exit 2. The daemon's
TOML file is read when neither `--config` nor `GPUFLEET_CONFIG` names one and it exists,
as `gpufleet-agent env` does.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.config import Settings
from agent.errors import CONFIG, exit_status
from procs.settings import ConfigError, load
from shared.slurm_gres import GresGpu, GresIndexError, GresMig, uuids_for
from shared.wire import Inventory

DEFAULT_CONFIG = Path("/etc/gpufleet/agent.toml")  # systemd/gpufleet-agent.service's
PLACEHOLDER_POOL = "pool_" + "0" * 26
USAGE = "usage: gpufleet-agent gres-uuids INDEXES [agent settings flags]"
NOT_FOUND = 3


def gres_gpus(inv: Inventory) -> list[GresGpu]:
    """The inventory's GPUs as shared.slurm_gres takes them."""
    return [
        GresGpu(
            g.index, g.name, uuid=g.uuid, mig_enabled=g.mig_enabled, missing=g.missing is not None,
            migs=tuple(
                GresMig(m.profile, m.gpu_instance_id, m.compute_instance_id, uuid=m.uuid)
                for m in g.mig_instances
            ),
        )
        for g in inv.gpus
    ]  # fmt: skip


def main(argv: Sequence[str], env: Mapping[str, str], default_config: Path = DEFAULT_CONFIG) -> int:
    """`argv` starts with `gres-uuids`."""
    rest = list(argv[1:])
    if not rest or rest[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return CONFIG
    indexes, rest = rest[0], rest[1:]
    named = any(a == "--config" or a.startswith("--config=") for a in rest)
    if not named and not env.get(Settings.config_env) and default_config.exists():
        env = {**env, Settings.config_env: str(default_config)}
    try:
        settings = load(Settings, rest, env, defaults={"pool_id": PLACEHOLDER_POOL})
    except ConfigError as exc:
        return exit_status(exc, "gres-uuids", hint=USAGE)
    from agent.inventory_report import read_settings  # NVML: only once settings are good

    try:
        uuids = uuids_for(gres_gpus(read_settings(settings)), indexes)
    except GresIndexError as exc:
        print(f"gpufleet-agent gres-uuids: {exc}", file=sys.stderr)
        return NOT_FOUND
    print(",".join(uuids))
    return 0
