"""A real Slurm cluster on this machine for tests: munged on its own socket with a
generated key, slurmctld and one slurmd per node (`slurmd -N NODE`, each on its own port,
all on 127.0.0.1), from a generated slurm.conf and gres.conf, in one temp directory.

Debian's Slurm 22.05 runs this as root: slurmd and slurmstepd need it, and the GPU files
gres.conf names must be character devices, which the harness makes with mknod (major
195, NVIDIA's) for every `File=`/`MultipleFiles=` path under its own `dev` directory.
`SlurmdParameters=config_overrides` lets a node declare more CPUs and memory than this
host has (a simulated agent's 8-GPU host on a 2-core test machine).

`require_slurm()` skips a test when the tools are missing or not root, and fails it
instead under `GPUFLEET_TEST_TOOLS=required` (as CI sets it), like the other Debian
tools the suite drives. Everything started is stopped by `close()`: jobs cancelled, then
each daemon's process group sent SIGTERM, then SIGKILL, bounded in time.

Accounting: without slurmdbd, slurmctld refuses `AccountingStorageTRES` naming a gres
("slurmdbd is required to run with TRES gres/gpu"). `SlurmConfig(slurmdbd=True)` runs
one (tests/slurm_accounting.py: its own database on the local MariaDB, dropped by
`close()`), registers the cluster and an account for the user running the tests
before slurmctld starts; a test asking for it calls `require_slurmdbd()` first.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.kit.embedded_nats import free_port
from ops.slurm.conf import Gpu, Node
from tests.slurm_accounting import SlurmDbd

TOOLS = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "scontrol",
    "sinfo",
    "srun",
    "scancel",
    "squeue",
)
NVIDIA_MAJOR = 195
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 20.0
_NODE_NAME = re.compile(r"^NodeName=(\S+)")
_ADDRESS_KEYS = ("NodeHostname=", "NodeAddr=", "Port=", "State=")
_FILES = re.compile(r"\b(?:File|MultipleFiles)=(\S+)")


class SlurmError(Exception):
    """The cluster did not start, or a Slurm command failed."""


def tool_path(tool: str) -> str | None:
    """A Slurm or munge program: on PATH, or in /usr/sbin where Debian puts the daemons
    (not on a non-root PATH)."""
    return shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if tool_path(tool) is None]


def require_slurm() -> None:
    """Skip (or, with GPUFLEET_TEST_TOOLS=required, fail) unless Slurm can run here."""
    missing = missing_tools()
    why = ""
    if missing:
        why = f"{', '.join(missing)} missing (Debian: slurmctld slurmd slurm-client munge)"
    elif os.geteuid() != 0:
        why = "a real slurmd needs root (slurmstepd, device files)"
    if not why:
        return
    if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
        pytest.fail(why)
    pytest.skip(why)


def two_socket_h100_host(name: str = "sim-a") -> Node:
    """A host as an agent reports it, for `gpufleet slurm conf`: 16 CPUs in two sockets
    of 8, 8 H100s, GPUs 0-3 near the first socket, 4-7 near the second."""
    gpus = tuple(
        Gpu(i, "NVIDIA H100 80GB HBM3", f"0000:{i:02x}:00.0",
            cpu_affinity="0-7" if i < 4 else "8-15")
        for i in range(8)
    )  # fmt: skip
    return Node(name, vcpu=16, memory_gib=2, gpus=gpus)


def node_line(
    name: str, gres: str = "", cpus: int = 2, memory_mib: int = 1000, features: str = ""
) -> str:
    """A `NodeName=` line without address or port (the harness sets those, replacing
    any a line gives)."""
    parts = [f"NodeName={name}", f"CPUs={cpus}", f"RealMemory={memory_mib}"]
    if gres:
        parts.append(f"Gres={gres}")
    if features:
        parts.append(f"Features={features}")
    return " ".join(parts)


def expand_hostlist(text: str) -> list[str]:
    """`/dev/nvidia[0-2,5]` → its paths (one bracket at most, as gres.conf uses it)."""
    m = re.fullmatch(r"(.*)\[([0-9,\-]+)\](.*)", text)
    if m is None:
        return [text]
    head, body, tail = m.groups()
    out: list[str] = []
    for part in body.split(","):
        lo, _, hi = part.partition("-")
        out += [f"{head}{k}{tail}" for k in range(int(lo), int(hi or lo) + 1)]
    return out


def gres_files(gres_conf: str) -> list[str]:
    """Every device path a gres.conf names."""
    out: list[str] = []
    for line in gres_conf.splitlines():
        for value in _FILES.findall(line.split("#", 1)[0]):
            for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", value):
                out += expand_hostlist(item)
    return out


def parse_record(text: str) -> dict[str, str]:
    """One `scontrol show … -o` line as key → value (values may hold spaces only in
    the last field, `Reason=`, which is taken whole)."""
    out: dict[str, str] = {}
    reason = re.search(r"\bReason=(.*)$", text)
    if reason:
        out["Reason"] = reason.group(1).strip()
        text = text[: reason.start()]
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


@dataclass
class SlurmConfig:
    """What the cluster runs: node lines (no address or port) and gres.conf text."""

    nodes: Sequence[str]
    gres_conf: str = ""
    topology_conf: str | None = None
    partition: str = "gpu"
    gres_types: str = "gpu"
    accounting_tres: Sequence[str] = ()
    extra: Sequence[str] = ()  # more slurm.conf lines
    cluster_name: str = "gpufleet-test"
    slurmdbd: bool = False  # accounting through a real slurmdbd (needed for GPU TRES)
    account: str = "gpufleet-test"  # with slurmdbd: the test user's account

    def node_names(self) -> list[str]:
        names = []
        for line in self.nodes:
            m = _NODE_NAME.match(line.strip())
            if m is None:
                raise SlurmError(f"not a NodeName line: {line!r}")
            names.append(m.group(1))
        return names


class SlurmCluster:
    """One cluster in its own temp directory: made stopped (so a test can name files under
    `dev_dir` in its config), `start(config)` returns once every node is idle in sinfo."""

    def __init__(self) -> None:
        # Short and under /tmp: munged's socket path must fit a sockaddr_un.
        self.root = Path(tempfile.mkdtemp(prefix="gpf-slurm-"))
        self.config = SlurmConfig(nodes=())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.dbd: SlurmDbd | None = None

    @property
    def conf_path(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def dev_dir(self) -> Path:
        """Where gres.conf's device files live (pass it to `gpufleet slurm conf --dev-dir`)."""
        return self.root / "dev"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge.sock"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    @property
    def node_names(self) -> list[str]:
        return self.config.node_names()

    def log(self, name: str) -> str:
        """A daemon's log (`slurmctld`, `munged`, or a node name's slurmd)."""
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- start -----------------------------------------------------------------------

    def start(self, config: SlurmConfig, timeout_s: float = START_TIMEOUT_S) -> SlurmCluster:
        if self.procs:
            raise SlurmError("already started")
        self.config = config
        deadline = time.monotonic() + timeout_s
        try:
            self._layout()
            self._start_munge(deadline)
            if config.slurmdbd:
                self._start_slurmdbd(deadline)
            self._write_conf()
            if self.dbd is not None:
                self._register()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf_path)])
            self._wait(deadline, "slurmctld answering", self._controller_up)
            for name in self.node_names:
                argv = ["slurmd", "-D", "-f", str(self.conf_path), "-N", name]
                self._spawn(f"slurmd-{name}", argv)
            self.wait_nodes(self.node_names, "idle", max(1.0, deadline - time.monotonic()))
        except BaseException:
            self._stop_daemons()  # the logs stay until close(), for the failure's report
            raise
        return self

    def _layout(self) -> None:
        self.root.chmod(0o755)  # munged wants its socket's directory open to all
        for sub, mode in (("etc", 0o755), ("run", 0o755), ("munge", 0o700), ("log", 0o755),
                          ("state", 0o700), ("spool", 0o755), ("dev", 0o755)):  # fmt: skip
            (self.root / sub).mkdir(mode=mode, exist_ok=True)
        self.make_devices(gres_files(self.config.gres_conf))

    def make_devices(self, paths: Iterable[str]) -> None:
        """Character devices (NVIDIA's major) for the paths under `dev_dir`; the minor is
        the trailing number (nvidia3 → 3, nvidia-caps/nvidia-cap21 → 21)."""
        for text in paths:
            path = Path(text)
            if not path.is_relative_to(self.dev_dir):
                raise SlurmError(f"gres.conf names {path}, outside {self.dev_dir}")
            if path.exists():
                continue
            m = re.search(r"(\d+)$", path.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            minor = int(m.group(1)) if m else 255
            # Root only: on a host with NVIDIA GPUs these would open the real ones.
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))

    def _start_munge(self, deadline: float) -> None:
        key = self.root / "munge" / "munge.key"
        self.run("mungekey", "--create", "--keyfile", str(key))
        self._spawn("munged", [
            "munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={self.root / 'run' / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={self.root / 'munge' / 'seed'}",
        ])  # fmt: skip
        self._wait(deadline, "munged's socket", self.munge_socket.exists)

    def _start_slurmdbd(self, deadline: float) -> None:
        r = self.root
        self.dbd = SlurmDbd(r / "etc", r / "run", r / "log", self.munge_socket, free_port())
        self.dbd.write_conf()
        self._spawn("slurmdbd", ["slurmdbd", "-D"])  # reads SLURM_CONF's directory
        # Its first start makes the database's tables: seconds.
        self._wait(deadline, "slurmdbd answering", self.dbd.answering)

    def _register(self) -> None:
        """The cluster, an account and the test user in slurmdbd, before slurmctld
        starts (it then registers at once)."""
        c = self.config
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.run("sacctmgr", "-i", "add", "cluster", c.cluster_name)
        self.run("sacctmgr", "-i", "add", "account", c.account, f"Cluster={c.cluster_name}")
        self.run("sacctmgr", "-i", "add", "user", user, f"Account={c.account}",
                 f"Cluster={c.cluster_name}")  # fmt: skip

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        self.ports = {"ctld": free_port()} | {name: free_port() for name in self.node_names}
        r = self.root
        lines = [
            f"ClusterName={self.config.cluster_name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['ctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            f"GresTypes={self.config.gres_types}",
            *(
                self.dbd.slurm_conf_lines()
                if self.dbd is not None
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            # Short waits so a test sees a change within seconds.
            "SlurmctldTimeout=10",
            "SlurmdTimeout=30",
            "MessageTimeout=5",
        ]
        if self.config.accounting_tres:
            lines.append(f"AccountingStorageTRES={','.join(self.config.accounting_tres)}")
        if self.config.topology_conf is not None:
            lines.append("TopologyPlugin=topology/tree")
            (r / "etc" / "topology.conf").write_text(self.config.topology_conf)
        lines += list(self.config.extra)
        for node, name in zip(self.config.nodes, self.node_names, strict=True):
            # Every node is this host on its own port, whatever address the line gave.
            kept = [t for t in node.split() if not t.startswith(_ADDRESS_KEYS)]
            lines.append(
                f"{' '.join(kept)} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={self.ports[name]} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.config.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
        )
        self.conf_path.write_text("\n".join(lines) + "\n")
        (r / "etc" / "gres.conf").write_text(self.config.gres_conf)

    def _spawn(self, name: str, argv: list[str]) -> None:
        argv = [tool_path(argv[0]) or argv[0], *argv[1:]]
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.root, start_new_session=True,
            )  # fmt: skip

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise SlurmError(f"{', '.join(dead)} exited before {what}:\n{self._tails(dead)}")
            if time.monotonic() > deadline:
                raise SlurmError(f"no {what} in time:\n{self._tails(list(self.procs))}")
            time.sleep(0.1)

    def _tails(self, names: Sequence[str]) -> str:
        out = []
        for name in names:
            path = self.root / "log" / f"{name}.out"
            text = path.read_text(errors="replace") if path.exists() else ""
            out.append(f"--- {name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(out)

    def _controller_up(self) -> bool:
        done = self.run("scontrol", "ping", check=False, timeout_s=5)
        return done.returncode == 0 and "UP" in done.stdout

    # --- use -------------------------------------------------------------------------

    def run(
        self, *argv: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster (SLURM_CONF set)."""
        try:
            done = subprocess.run(
                [tool_path(argv[0]) or argv[0], *argv[1:]], env=self.env, capture_output=True,
                text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{' '.join(argv)}: no answer in {timeout_s}s") from exc
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def sinfo(self, *args: str) -> str:
        return self.run("sinfo", *args).stdout

    def srun(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """`srun ARGS` without raising on failure (a test asserts on the result)."""
        return self.run("srun", *args, check=False, timeout_s=timeout_s)

    def node(self, name: str) -> dict[str, str]:
        """`scontrol show node NAME` as fields (State, Gres, Features, RealMemory, …)."""
        return parse_record(self.scontrol("show", "node", name, "-o").strip())

    def nodes(self) -> dict[str, dict[str, str]]:
        out = {}
        for line in self.scontrol("show", "node", "-o").splitlines():
            record = parse_record(line)
            if "NodeName" in record:
                out[record["NodeName"]] = record
        return out

    def node_gres(self, name: str) -> list[dict[str, str]]:
        """Each GRES device a node's slurmd reads from gres.conf (`slurmd -G`): Type,
        File, Cores, Links as slurmd parsed them."""
        argv = ("slurmd", "-G", "-N", name, "-f", str(self.conf_path))
        done = self.run(*argv)
        return [
            parse_record(line.split("Gres ", 1)[1])
            for line in (done.stdout + done.stderr).splitlines()
            if "Gres Name=" in line
        ]

    def reservations(self) -> dict[str, dict[str, str]]:
        """Every reservation by name (`scontrol show reservation -o`)."""
        done = self.run("scontrol", "show", "reservation", "-o")
        out = {}
        for line in done.stdout.splitlines():
            record = parse_record(line)
            if "ReservationName" in record:
                out[record["ReservationName"]] = record
        return out

    def node_states(self) -> dict[str, str]:
        """Node → sinfo's state word (idle, drain, drng, mix, alloc, down, …)."""
        out = {}
        for line in self.sinfo("-h", "-N", "-o", "%N %t").splitlines():
            name, _, state = line.partition(" ")
            out[name] = state.strip()
        return out

    def wait_nodes(self, names: Iterable[str], state: str, timeout_s: float = 15.0) -> None:
        """Until sinfo shows every one of `names` in `state` (a word like idle, drain)."""
        want = set(names)
        deadline = time.monotonic() + timeout_s
        states: Mapping[str, str] = {}
        while True:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*~#!%$@^-") == state for n in want):
                return
            # A node the controller found unlike its config stays so: say why at once.
            invalid = [
                n for n in want if states.get(n, "").startswith("inval") and state != "inval"
            ]
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if invalid or dead or time.monotonic() > deadline:
                why = {n: self.node(n).get("Reason", "") for n in invalid}
                raise SlurmError(
                    f"nodes not {state}: {dict(states)} {why}\n"
                    + self._tails(dead or list(self.procs))
                )
            time.sleep(0.2)

    # --- stop ------------------------------------------------------------------------

    def stop_slurmdbd(self) -> None:
        """slurmdbd alone (accounting lost; its database stays until `close()`)."""
        proc = self.procs.pop("slurmdbd", None)
        if proc is not None:
            _stop_group(proc)

    def close(self, keep_logs: Path | None = None) -> None:
        """Cancel jobs, stop every daemon (process groups: slurmstepd too), bounded;
        the logs are copied to `keep_logs` when given, then the directory is removed."""
        self._stop_daemons()
        if keep_logs is not None and (self.root / "log").is_dir():
            shutil.copytree(self.root / "log", keep_logs, dirs_exist_ok=True)
            shutil.copytree(self.root / "etc", keep_logs / "etc", dirs_exist_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.dbd is not None:
            self.dbd.drop()
            self.dbd = None

    def _stop_daemons(self) -> None:
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self.run("scancel", "--full", "--quiet", "--user=root", check=False, timeout_s=5)
                # scancel only asks: the controller tells each slurmd, whose slurmstepd ends
                # the job's processes. Wait until no job is left (bounded), or a job's own
                # process may outlive the daemons stopped below on a loaded machine.
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    left = self.run("squeue", "--noheader", check=False, timeout_s=5)
                    if left.returncode != 0 or not left.stdout.strip():
                        break
                    time.sleep(0.2)
            except SlurmError:
                pass
        order = [n for n in self.procs if n.startswith("slurmd-")]
        order += ["slurmctld", "slurmdbd", "munged"]
        for name in order:
            proc = self.procs.get(name)
            if proc is not None:
                _stop_group(proc)
        self.procs.clear()
        # A job's slurmstepd runs in a session of its own, out of slurmd's group: anything
        # still working in this cluster's directory (steps, their jobs) goes too.
        for pid in _working_in(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _working_in(root: Path) -> list[int]:
    """Processes whose working directory is `root` or below it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd == str(root) or cwd.startswith(f"{root}/"):
            found.append(int(proc.name))
    return found


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
