"""`gpufleet-agent`: flags → settings → wiring (NVML or simulated, sysfs or fake tree,
poller, XID thread, publisher) → run until SIGTERM/SIGINT, then a clean exit 0.

Exit codes: 0 after a signal, 1 if a background task died, 2 for bad configuration or
a missing NVML binding. Logs go to stderr. Under systemd (Type=notify) it says READY=1
once NATS is connected and the first inventory is out, and STOPPING=1 when told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.bookings import BookingsKeeper
from agent.cgroup_memory import CgroupMemory
from agent.config import Settings
from agent.errors import AgentError, exit_status
from agent.feature_file import FeatureFile
from agent.gpu_map_file import FILE_NAME as GPU_MAP_FILE
from agent.gpu_map_file import GpuMapFile
from agent.health import HealthPolicy
from agent.inventory import Identity
from agent.liveness import agent_boot_id, check_interval
from agent.nvml import NvmlLike, real_nvml
from agent.owners import ProcOwners
from agent.sim.faults import FaultFile
from agent.sim.profile import HostProfile, load_profile
from agent.sim.sysfs_tree import FaultedPorts, build_tree
from agent.state import AgentState
from agent.sysfs import read_host, read_ports
from agent.xid import XidTable
from procs import logs
from procs.settings import ConfigError, load
from procs.signals import Systemd, on_stop_signals, run_daemon
from procs.version import __version__
from shared.clock import Clock, SystemClock
from shared.subjects import Subjects

if TYPE_CHECKING:
    from agent.poller import Poller
    from agent.publisher import Publisher

log = logging.getLogger("agent")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["inventory"], ["bookings"], ["env"]) and {"-h", "--help"} & set(args[1:]):
        print(_subcommand_help(args[0]))
        return 0
    if args[:1] == ["inventory"]:
        from agent import inventory_report  # one-shot: never loaded by the daemon

        # What NVML could not read is in the report itself (health, NVML line).
        logs.configure(logging.ERROR)
        return inventory_report.main(args[1:], os.environ)
    if args[:1] == ["gres-uuids"]:
        from agent import gres_command  # one-shot, for Slurm's TaskProlog

        logs.configure(logging.ERROR)
        return gres_command.main(args, os.environ)
    if args[:1] in (["bookings"], ["env"]):
        from agent import bookings_command  # one-shot: reads the state file, no NATS

        return bookings_command.main(args, os.environ)
    try:
        settings = load(Settings, argv, os.environ)
    except ConfigError as exc:
        return exit_status(exc)
    try:
        return run_daemon(
            lambda systemd: run(settings, systemd=systemd), settings.log_level, os.environ
        )
    # The credentials file (read when the publisher starts), the profile, NVML.
    except (ConfigError, AgentError) as exc:
        return exit_status(exc)


def _subcommand_help(name: str) -> str:
    """A subcommand's own `--help`: its usage and what its module says it does."""
    if name == "inventory":
        from agent import inventory_report as module

        usage = module.USAGE
    else:
        from agent import bookings_command as module  # type: ignore[no-redef]

        usage = module.USAGE
    about = (module.__doc__ or "").split("\n\n")[0].strip()
    return (
        f"{usage}\n\n{about}\n\nThe agent settings flags are the daemon's"
        " (gpufleet-agent --help); settings are read from --config or GPUFLEET_CONFIG,"
        " else /etc/gpufleet/agent.toml."
    )


@contextlib.contextmanager
def _host_sources(settings: Settings) -> Iterator[tuple[NvmlLike, HostProfile | None, Path]]:
    """The NVML and the sysfs root to read: real ones, or a simulated host whose fake
    tree lives in a temporary directory for the life of the process."""
    if settings.simulate is None:
        yield real_nvml(), None, settings.sysfs_root
        return
    from agent.sim.nvml import SimulatedNvml  # only simulate mode needs it

    profile = load_profile(settings.simulate)
    faults = FaultFile(settings.fault_file)
    if settings.sysfs_root != Path("/"):
        root = settings.sysfs_root
        yield SimulatedNvml(profile, settings.node_id, faults, root / "proc"), profile, root
        return
    with tempfile.TemporaryDirectory(prefix="gpufleet-sysfs-") as tmp:
        root = build_tree(Path(tmp), profile, settings.node_id)
        # The workloads' /proc/<pid> entries go in the fake tree the agent reads.
        yield SimulatedNvml(profile, settings.node_id, faults, root / "proc"), profile, root


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    clock: Clock | None = None,
    install_signals: bool = True,
    systemd: Systemd | None = None,
) -> int:
    from agent.publisher import Publisher

    real_nvml()  # NvmlMissing, with the fix, before anything imports pynvml
    # The NVML-facing modules import pynvml at their top; only now may they be loaded.
    from agent.poller import Poller
    from agent.reader import NvmlReader
    from agent.usage import UsageReader
    from agent.xid_watch import XidWatcher

    check_interval(settings.interval_s)
    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    boot_id = agent_boot_id(settings.sysfs_root)
    features = (
        FeatureFile(settings.nfd_features_dir, settings.interval_s)
        if settings.nfd_features_dir is not None
        else None
    )
    bookings = BookingsKeeper(
        settings.node_id,
        settings.bookings_path,
        on_change=(lambda b: features.on_bookings(b, clock.now_ms())) if features else None,
        clock=clock,
    )
    # First: a bad credentials file stops us before NVML is touched.
    publisher = Publisher(
        nats=settings.nats,
        subjects=Subjects(settings.nats.subject_prefix),
        pool_id=settings.pool_id,
        node_id=settings.node_id,
        boot_id=boot_id,
        interval_s=settings.interval_s,
        misses=settings.misses,
        clock=clock,
        on_ready=lambda: _ready(systemd),
        on_bookings=bookings.on_message,
        bookings_etag=lambda: bookings.etag,
        idle_util_percent=settings.idle_util_percent,
        bookings_echoed=bookings.confirm,
    )
    with _host_sources(settings) as (nvml, profile, root):
        reader = NvmlReader(nvml, cpu_count=profile.vcpu if profile else None)
        watcher = XidWatcher(nvml, clock)
        ident = Identity(
            node_id=settings.node_id,
            pool_id=settings.pool_id,
            hostname=socket.gethostname(),
            agent_version=__version__,
            profile_id=settings.profile_id or (profile.id if profile else None),
            profile_version=settings.profile_version or (profile.version if profile else None),
            labels=settings.label_pairs,
            provisioning=settings.provisioning,
        )
        h = settings.health
        poller = Poller(
            reader=reader,
            read_host=lambda: read_host(root, settings.management_nics),
            ident=ident,
            clock=clock,
            boot_id=boot_id,
            policy=HealthPolicy(
                xids=XidTable.configured(h.xid_faults, h.xid_ignore),
                recover_after_s=h.recover_after_s,
                xid_hold_s=h.xid_hold_s,
            ),
            sharing=settings.sharing_rules,
            watcher=watcher,
            read_ports=(
                FaultedPorts(root, FaultFile(settings.fault_file))
                if profile
                else lambda nics: read_ports(root, nics)
            ),
            expected=_expected(settings, profile),
            offer_boot_disks=settings.offer_boot_disks,
            offer_management_nics=settings.offer_management_nics,
            release_file=settings.release_file,
            usage=UsageReader(
                nvml,
                ProcOwners(root / "proc", root),
                holders=lambda: bookings.holders(clock.now_ms()),
            ),
            memory=CgroupMemory(root),
        )
        kept = GpuMapFile(settings.runtime_dir / GPU_MAP_FILE, clock)
        log.info(
            "agent %s starting: node %s pool %s, %s, every %.1fs",
            boot_id[:8],
            settings.node_id,
            settings.pool_id,
            f"simulated {profile.id}" if profile else "NVML",
            settings.interval_s,
        )
        try:
            return await _supervise(
                settings, poller, _sink(publisher, features, kept, clock), publisher, stop,
                install_signals, systemd,
            )  # fmt: skip
        finally:
            await asyncio.to_thread(watcher.stop)
            reader.close()
            log.info("agent stopped")


def _sink(
    publisher: Publisher, features: FeatureFile | None, kept: GpuMapFile, clock: Clock
) -> Callable[[AgentState], None]:
    """Where each poll's state goes: the publisher, the GPU map file (for
    `gpufleet-agent gres-uuids`), and the NFD feature file when set."""

    def update(state: AgentState) -> None:
        publisher.update(state)
        kept.on_state(state)
        if features is not None:
            features.on_state(state, clock.now_ms())

    return update


def _ready(systemd: Systemd | None) -> None:
    """Connected and the first inventory is out: tell systemd, and give back the heap
    that start-up (flags, profile, schema builds, the first inventory) freed but glibc
    keeps, about 1 MB of the 40 MB footprint budget (bench/agent_bench.py)."""
    if systemd is not None:
        systemd.ready()
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc only; elsewhere nothing to give back
    except (OSError, AttributeError):
        return
    trim(0)


def _expected(settings: Settings, profile: HostProfile | None) -> dict[str, int] | None:
    """The configured expected inventory, else the simulated profile's."""
    configured: dict[str, int] = {str(cls): n for cls, n in settings.expected.items()}
    return configured or (dict(profile.expected) if profile else None)


async def _supervise(
    settings: Settings,
    poller: Poller,
    sink: Callable[[AgentState], None],
    publisher: Publisher,
    stop: asyncio.Event,
    install_signals: bool,
    systemd: Systemd | None,
) -> int:
    signals = contextlib.ExitStack()
    if install_signals:  # SIGUSR1: let go of NVML for a GPU reset/driver reload; SIGUSR2: resume
        also = {signal.SIGUSR1: poller.request_release, signal.SIGUSR2: poller.request_resume}
        signals.enter_context(on_stop_signals(stop.set, systemd, also))
    tasks = [
        asyncio.create_task(poller.run(settings.interval_s, sink), name="agent-poll"),
        asyncio.create_task(publisher.run(), name="agent-publish"),
    ]
    stopper = asyncio.create_task(stop.wait(), name="agent-stop")
    code = 0
    try:
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper:
                exc = task.exception()
                log.error("%s ended: %r", task.get_name(), exc)
                code = 1
    finally:
        if systemd is not None:
            systemd.stopping()  # before the tasks wind down, whatever ended them
        for task in [stopper, *tasks]:
            task.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
        signals.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
