"""`gpufleet-agent`: flags → settings → wiring (NVML or simulated, sysfs or fake tree,
poller, XID thread, publisher) → run until SIGTERM/SIGINT, then a clean exit 0.

Exit codes: 0 after a signal, 1 if a background task died, 2 for bad configuration or
a missing NVML binding. Logs go to stderr. Under systemd (Type=notify) it says READY=1
once NATS is connected and the first inventory is out, and STOPPING=1 when told to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.clock import Clock, SystemClock
from agent.config import (
    ConfigError,
    Settings,
    environment,
    load_settings,
    parse_labels,
    parse_share,
)
from agent.fake_sysfs import FaultedPorts, build_tree
from agent.faults import FaultFile
from agent.health import HealthPolicy
from agent.inventory import Identity
from agent.nvml import NvmlLike, real_nvml
from agent.poller import Poller
from agent.profile import HostProfile, ProfileError, load_profile
from agent.reader import NvmlReader
from agent.sysfs import read_host, read_ports
from agent.xid import XidTable
from agent.xid_watch import XidWatcher
from shared.subjects import Subjects

if TYPE_CHECKING:
    from agent.publisher import Publisher

from shared.systemd import sd_notify

log = logging.getLogger("agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpufleet-agent",
        description="Inventory and health of one GPU host, published to NATS.",
    )
    p.add_argument("--config", type=Path, help="TOML config file (env GPUFLEET_CONFIG)")
    p.add_argument("--pool-id", dest="pool_id")
    p.add_argument("--node-id", dest="node_id", help="default: the host name")
    p.add_argument("--nats-url", dest="nats_url", help="comma-separated server URLs")
    p.add_argument("--nats-creds", dest="nats_creds", type=Path, help="NATS credentials file")
    p.add_argument("--subject-prefix", dest="subject_prefix")
    p.add_argument("--interval", dest="interval_s", type=float, help="seconds between polls")
    p.add_argument("--simulate", help="host profile name or .toml path: simulated NVML")
    p.add_argument("--sysfs-root", dest="sysfs_root", help="root of sys/ and proc/ trees")
    p.add_argument("--fault-file", dest="fault_file", type=Path, help="simulated faults (JSON)")
    p.add_argument("--label", dest="labels", action="append", default=None, metavar="K=V")
    p.add_argument(
        "--share",
        dest="sharing",
        action="append",
        default=None,
        metavar="GPUS:MODE:N",
        help="offer GPUs as N slots, e.g. all:timeslice:4 or 0,1:mps:2",
    )
    p.add_argument("--provisioning", action="store_const", const=True, default=None)
    p.add_argument("--log-level", dest="log_level")
    return p


def settings_from_args(argv: Sequence[str] | None) -> Settings:
    args = build_parser().parse_args(argv)
    flags: dict[str, Any] = {
        k: v for k, v in vars(args).items() if k not in ("config", "labels", "sharing")
    }
    if args.labels is not None:
        flags["labels"] = parse_labels(args.labels)
    if args.sharing is not None:
        flags["sharing"] = [parse_share(s) for s in args.sharing]
    env = environment()
    config = args.config or (Path(env["GPUFLEET_CONFIG"]) if env.get("GPUFLEET_CONFIG") else None)
    return load_settings(flags, env, config)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_from_args(argv)
    except ConfigError as exc:
        print(f"gpufleet-agent: config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _leave_out_websocket_support(settings)
    try:
        return asyncio.run(run(settings, notify_socket=os.environ.get("NOTIFY_SOCKET")))
    except ConfigError as exc:  # the credentials file, read when the publisher starts
        print(f"gpufleet-agent: config error: {exc}", file=sys.stderr)
        return 2
    except (ProfileError, ImportError) as exc:
        print(f"gpufleet-agent: {exc}", file=sys.stderr)
        return 2


def _version() -> str:
    try:
        return metadata.version("gpufleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _leave_out_websocket_support(settings: Settings) -> None:
    """nats-py imports aiohttp (about 19 MB resident) whenever it is installed, only to
    offer ws:// URLs. A GPU host installs gpufleet[agent], which has no aiohttp; where it
    is present anyway (a dev box, the demo) keep it out of a plain-NATS agent process so
    the footprint is the one a host sees. Only this process entry point does it."""
    urls = [u.strip() for u in settings.nats_url.split(",")]
    if "aiohttp" not in sys.modules and not any(u.startswith("ws") for u in urls):
        sys.modules["aiohttp"] = None  # type: ignore[assignment]


@contextlib.contextmanager
def _host_sources(settings: Settings) -> Iterator[tuple[NvmlLike, HostProfile | None, Path]]:
    """The NVML and the sysfs root to read: real ones, or a simulated host whose fake
    tree lives in a temporary directory for the life of the process."""
    if settings.simulate is None:
        yield real_nvml(), None, settings.sysfs_root
        return
    from agent.simulated import SimulatedNvml  # only simulate mode needs it

    profile = load_profile(settings.simulate)
    nvml = SimulatedNvml(profile, settings.node_id, FaultFile(settings.fault_file))
    if settings.sysfs_root != Path("/"):
        yield nvml, profile, settings.sysfs_root
        return
    with tempfile.TemporaryDirectory(prefix="gpufleet-sysfs-") as tmp:
        yield nvml, profile, build_tree(Path(tmp), profile)


async def run(
    settings: Settings,
    stop: asyncio.Event | None = None,
    clock: Clock | None = None,
    install_signals: bool = True,
    notify_socket: str | None = None,
) -> int:
    from agent.publisher import Publisher  # after main() decided what nats-py may import

    clock = clock or SystemClock()
    stop = stop or asyncio.Event()
    boot_id = uuid.uuid4().hex
    # First: a bad credentials file stops us before NVML is touched.
    publisher = Publisher(
        servers=settings.nats_url,
        subjects=Subjects(settings.subject_prefix),
        pool_id=settings.pool_id,
        node_id=settings.node_id,
        boot_id=boot_id,
        interval_s=settings.interval_s,
        clock=clock,
        creds=settings.nats_creds,
        on_ready=lambda: sd_notify("READY=1", notify_socket),
    )
    with _host_sources(settings) as (nvml, profile, root):
        reader = NvmlReader(nvml, cpu_count=profile.vcpu if profile else None)
        watcher = XidWatcher(nvml, clock)
        ident = Identity(
            node_id=settings.node_id,
            pool_id=settings.pool_id,
            hostname=socket.gethostname(),
            agent_version=_version(),
            profile_id=settings.profile_id or (profile.id if profile else None),
            profile_version=settings.profile_version or (profile.version if profile else None),
            labels=settings.labels,
            provisioning=settings.provisioning,
        )
        h = settings.health
        poller = Poller(
            reader=reader,
            read_host=lambda: read_host(root),
            ident=ident,
            clock=clock,
            boot_id=boot_id,
            policy=HealthPolicy(
                xids=XidTable.configured(h.xid_faults, h.xid_ignore),
                recover_after_s=h.recover_after_s,
                xid_hold_s=h.xid_hold_s,
            ),
            sharing=settings.sharing,
            watcher=watcher,
            read_ports=(
                FaultedPorts(root, FaultFile(settings.fault_file))
                if profile
                else lambda nics: read_ports(root, nics)
            ),
            expected=dict(profile.expected) if profile else None,
        )
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
                settings, poller, publisher, stop, install_signals, notify_socket
            )
        finally:
            await asyncio.to_thread(watcher.stop)
            reader.close()
            log.info("agent stopped")


async def _supervise(
    settings: Settings,
    poller: Poller,
    publisher: Publisher,
    stop: asyncio.Event,
    install_signals: bool,
    notify_socket: str | None,
) -> int:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if install_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    if install_signals:  # SIGUSR1: let go of NVML for a GPU reset/driver reload; SIGUSR2: resume
        loop.add_signal_handler(signal.SIGUSR1, poller.request_release)
        loop.add_signal_handler(signal.SIGUSR2, poller.request_resume)
    tasks = [
        asyncio.create_task(poller.run(settings.interval_s, publisher.update), name="agent-poll"),
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
        sd_notify("STOPPING=1", notify_socket)
        for task in [stopper, *tasks]:
            task.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
        for sig in (*signals, signal.SIGUSR1, signal.SIGUSR2) if install_signals else ():
            loop.remove_signal_handler(sig)
    return code


if __name__ == "__main__":
    sys.exit(main())
