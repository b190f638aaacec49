"""Slurm accounting for the test cluster: a real slurmdbd over a per-test database on
the local MariaDB, so that slurmctld accepts `AccountingStorageTRES=gres/gpu,…` and
reservations by GPU TRES (`TRES=gres/gpu:h100=4`), which it refuses without one
("slurmdbd is required to run with TRES gres/gpu").

`SlurmDbd` writes slurmdbd.conf next to slurm.conf (slurmdbd finds it there through
`SLURM_CONF`), mode 0600 and owned by the SlurmUser (root here), as slurmdbd insists;
`StorageType=accounting_storage/mysql` into a database of its own, `gpf_<hex>`, which
slurmdbd creates and `drop()` removes. MariaDB: `GPUFLEET_TEST_MARIADB` (default
127.0.0.1:3306, user root, no password). `require_slurmdbd()` skips when slurmdbd or
MariaDB is missing, and fails instead under `GPUFLEET_TEST_TOOLS=required` (CI has both).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path
from typing import Protocol

import pytest

MARIADB = os.environ.get("GPUFLEET_TEST_MARIADB", "127.0.0.1:3306")
MARIADB_USER = "root"
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 20.0


def _host_port() -> tuple[str, int]:
    host, _, port = MARIADB.rpartition(":")
    return host or "127.0.0.1", int(port)


def _tool(name: str) -> str | None:
    from tests.slurm_cluster import tool_path  # one lookup rule for every Slurm program

    return tool_path(name)


def why_no_slurmdbd() -> str:
    """Empty when slurmdbd can run here; else what is missing."""
    missing = [t for t in ("slurmdbd", "sacctmgr", "mysql") if _tool(t) is None]
    if missing:
        return f"{', '.join(missing)} missing (Debian: slurmdbd mariadb-client)"
    try:
        with socket.create_connection(_host_port(), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        return f"MariaDB at {MARIADB} unreachable: {exc}"
    return ""


def require_slurmdbd() -> None:
    """Skip (or, with GPUFLEET_TEST_TOOLS=required, fail) unless slurmdbd can run here."""
    why = why_no_slurmdbd()
    if not why:
        return
    if os.environ.get("GPUFLEET_TEST_TOOLS") == "required":
        pytest.fail(why)
    pytest.skip(why)


def mysql(sql: str) -> str:
    """One statement through the mysql client, as MARIADB_USER."""
    host, port = _host_port()
    argv = [_tool("mysql") or "mysql", f"--host={host}", f"--port={port}",
            f"--user={MARIADB_USER}", "--batch", "--skip-column-names", "-e", sql]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"mysql -e {sql!r}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class SlurmDbd:
    """slurmdbd's config and database for one cluster; the cluster spawns the daemon."""

    def __init__(self, etc: Path, run: Path, log: Path, munge_socket: Path, port: int) -> None:
        self.etc, self.run, self.log = etc, run, log
        self.munge_socket = munge_socket
        self.port = port
        self.database = "gpf_" + secrets.token_hex(6)

    @property
    def conf_path(self) -> Path:
        return self.etc / "slurmdbd.conf"

    def slurm_conf_lines(self) -> list[str]:
        """What slurm.conf says to send accounting to this slurmdbd."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.port}",
            # The munge socket for talking to slurmdbd (AuthInfo is not used for that).
            f"AccountingStoragePass={self.munge_socket}",
        ]

    def write_conf(self) -> None:
        host, port = _host_port()
        lines = [
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.port}",
            "SlurmUser=root",
            f"PidFile={self.run / 'slurmdbd.pid'}",
            f"LogFile={self.log / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql",
            f"StorageHost={host}",
            f"StoragePort={port}",
            f"StorageUser={MARIADB_USER}",
            f"StorageLoc={self.database}",
        ]
        # slurmdbd refuses a config others can read (it may hold StoragePass).
        fd = os.open(self.conf_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        os.chown(self.conf_path, 0, 0)

    def answering(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def drop(self) -> None:
        """Remove the database (slurmdbd stopped first)."""
        mysql(f"DROP DATABASE IF EXISTS `{self.database}`")


class _Runs(Protocol):
    def run(
        self, *argv: str, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]: ...


def gres_reservations_refused(cluster: _Runs, node: str, tres: str) -> str:
    """Empty when this Slurm reserves GRES (a probe reservation of `tres` on `node`,
    deleted again); else Slurm's version and its refusal. Slurm reserves GRES from 23.11
    on; 22.05 and 23.02 say "TRES type '…' not supported with reservations"."""
    made = cluster.run(
        "scontrol", "create", "reservation", "ReservationName=probe-gres", f"Nodes={node}",
        f"TRES={tres}", "Users=root", "StartTime=now", "Duration=1", "Flags=OVERLAP",
        check=False,
    )  # fmt: skip
    if made.returncode == 0:
        cluster.run("scontrol", "delete", "ReservationName=probe-gres")
        return ""
    version = cluster.run("scontrol", "--version").stdout.strip()
    return f"{version} cannot reserve GRES: {made.stderr.strip()}"
