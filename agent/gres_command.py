"""`gpufleet-agent gres-uuids INDEXES`: Slurm's gres indexes on this node (`6,7`, as
Slurm without its NVML AutoDetect plugin puts them in CUDA_VISIBLE_DEVICES) as the GPU
or MIG UUIDs they stand for, comma-separated on stdout, for the shipped TaskProlog
(ops/slurm/task_prolog.sh) to hand CUDA devices it reads right.

The indexes are numbered as `gpufleet slurm conf` wrote this node's gres.conf
(shared.slurm_gres, one function for both), from the inventory the running agent keeps
in `inventory.json` in its `state_dir` (agent.inventory_file): no NVML at task start.
That file is refused (exit 2) when it names another node, and (exit 3) when the agent
has not confirmed it for longer than `bookings_max_age_s` (`--max-age`), as
`gpufleet-agent env` refuses its bookings. Only when there is no file this user may
read, or `--nvml` asks, is the inventory read now (NVML or its simulated profile; no
NATS). An index that does not fit exits 3 with the reason on stderr and prints nothing;
bad settings exit 2. The daemon's TOML file is read when neither `--config` nor
`GPUFLEET_CONFIG` names one and it exists, as `gpufleet-agent env` does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.config import Settings
from agent.errors import CONFIG, AgentError, exit_status
from agent.inventory_file import FILE_NAME, read_inventory
from procs.settings import ConfigError, load
from shared.slurm_gres import GresGpu, GresIndexError, GresMig, uuids_for
from shared.wire import Inventory

DEFAULT_CONFIG = Path("/etc/gpufleet/agent.toml")  # systemd/gpufleet-agent.service's
PLACEHOLDER_POOL = "pool_" + "0" * 26
USAGE = "usage: gpufleet-agent gres-uuids INDEXES [--nvml] [--max-age S] [agent settings flags]"
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
    indexes, rest = rest[0], [a for a in rest[1:] if a != "--nvml"]
    nvml = len(rest) < len(argv) - 2
    named = any(a == "--config" or a.startswith("--config=") for a in rest)
    if not named and not env.get(Settings.config_env) and default_config.exists():
        env = {**env, Settings.config_env: str(default_config)}
    try:
        settings = load(Settings, rest, env, defaults={"pool_id": PLACEHOLDER_POOL})
        inventory = None if nvml else _kept(settings)
    except (ConfigError, AgentError) as exc:
        return exit_status(exc, "gres-uuids", hint=USAGE if isinstance(exc, ConfigError) else "")
    if inventory is None:
        from agent.inventory_report import read_settings  # NVML: only once settings are good

        inventory = read_settings(settings)
    try:
        uuids = uuids_for(gres_gpus(inventory), indexes)
    except GresIndexError as exc:
        print(f"gpufleet-agent gres-uuids: {exc}", file=sys.stderr)
        return NOT_FOUND
    print(",".join(uuids))
    return 0


def _kept(settings: Settings) -> Inventory | None:
    """The daemon's inventory file, vouched for; `None` when there is none to read."""
    held = read_inventory(settings.state_dir / FILE_NAME)
    if held is None:
        return None
    return held.vouch(settings.node_id, int(time.time() * 1000), settings.bookings_max_age_ms)
