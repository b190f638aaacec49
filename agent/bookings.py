"""The bookings on this node, as the coordinator last told them (`NodeBookings` on
`Subjects.bookings`), and the state file that hands them to the CLI and to launchers.

`BookingsKeeper.on_message` takes a message off the bus: one that is not a valid
`NodeBookings`, or that names another node, is ignored and counted; a valid one
replaces what was held, and the keeper's `etag` (which the heartbeat echoes) moves to
it. The state file is written atomically (a temporary file in the same directory,
flushed to disk, then renamed over the old one) whenever the etag changes, so a reader
sees the old list or the new one, never half of either; it is the message as received.
Its mode follows its directory's: readable by the group (launchers: a Slurm prolog, a
device plugin) when the group may enter the directory (systemd's
`StateDirectoryMode=0750`), never writable by anyone else.
The file is written only into a directory that exists (systemd's `StateDirectory=`
makes `/var/lib/gpufleet-agent`): an agent run by hand, or by tests, leaves the host's
`/var/lib` alone and says so once. A file that cannot be written is logged (throttled)
and counted; the etag is still echoed, since the coordinator has nothing to re-send.
The file's modification time is when the agent last knew it current (agent.bookings_trust):
set at each write, and by `confirm` after each heartbeat that echoed its etag reached the
server, a touch of the inode, not a rewrite.

Also `write_atomically` and `read_stamped`, the state file mechanics the GPU map file
(agent.gpu_map_file) shares, and `read_state` / `read_held`: what `gpufleet-agent
bookings` / `env` (and anything else on the host) read, with clear errors for a missing
or unreadable file.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec

from agent.bookings_trust import Held
from agent.errors import AgentError
from procs.log_throttle import LogThrottle
from shared.clock import Clock, SystemClock
from shared.wire import NodeBookings

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder(NodeBookings)


class BookingsError(AgentError, ValueError):
    """The state file is missing or does not hold valid bookings."""


class BookingsKeeper:
    def __init__(
        self,
        node_id: str,
        state_file: Path | None,
        on_change: Callable[[NodeBookings], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.node_id = node_id
        self.state_file = state_file
        self.clock = clock or SystemClock()
        self._written = ""  # the etag of the file this keeper wrote ("" when none)
        self._on_change = on_change
        self.latest: NodeBookings | None = None
        self.ignored: Counter[str] = Counter()  # by reason: "bad_schema", "wrong_node"
        self.write_failures = 0
        self._throttle = LogThrottle(log)
        self._dir = StateDir("bookings")

    @property
    def etag(self) -> str:
        """What the heartbeat echoes: "" until the first bookings arrive."""
        return self.latest.etag if self.latest is not None else ""

    def holders(self, now_ms: int) -> dict[str, frozenset[str]]:
        """Unit (GPU or MIG UUID) → the reservations booked on it at `now_ms`: the
        processes a full use list leaves out first (`agent.usage`)."""
        out: dict[str, set[str]] = {}
        latest = self.latest  # replaced whole on the NATS thread, read on the poll's
        for b in latest.bookings if latest is not None else ():
            if b.start <= now_ms < b.end:
                for d in b.devices:
                    if d.device_id:
                        out.setdefault(d.device_id, set()).add(b.reservation_id)
        return {unit: frozenset(ids) for unit, ids in out.items()}

    def on_message(self, data: bytes) -> None:
        try:
            value = _DECODER.decode(data)
        except msgspec.DecodeError as exc:  # ValidationError included
            self._ignore("bad_schema", "bookings message ignored: %s", exc)
            return
        if value.node_id != self.node_id:
            self._ignore(
                "wrong_node",
                "bookings for node %r ignored (this is %r)",
                value.node_id,
                self.node_id,
            )
            return
        changed = self.latest is None or value.etag != self.latest.etag
        self.latest = value
        if not changed:
            return
        log.info("bookings %s: %d on this node", value.etag[:12], len(value.bookings))
        if self.state_file is not None:
            self._write(data, value.etag)
        if self._on_change is not None:
            self._on_change(value)

    def confirm(self, etag: str) -> None:
        """A heartbeat echoing `etag` reached the server: the file, if it holds that etag
        and this keeper wrote it, is current now (a file left by an earlier run is not)."""
        if not etag or etag != self._written or self.state_file is None:
            return
        try:
            self._stamp()
        except OSError as exc:
            self.write_failures += 1
            self._throttle.warning(
                "write", "cannot touch the bookings file %s: %s", self.state_file, exc
            )

    def _stamp(self) -> None:
        assert self.state_file is not None
        ns = self.clock.now_ms() * 1_000_000
        os.utime(self.state_file, ns=(ns, ns))

    def _ignore(self, reason: str, msg: str, *args: object) -> None:
        self.ignored[reason] += 1
        self._throttle.warning(reason, msg, *args)

    def _write(self, data: bytes, etag: str) -> None:
        assert self.state_file is not None
        directory = self.state_file.parent
        if not self._dir.ready(directory):
            return
        self._written = ""
        try:
            write_atomically(self.state_file, data, readable_as(directory))
            self._stamp()
            self._written = etag
        except OSError as exc:
            self.write_failures += 1
            self._throttle.warning(
                "write", "cannot write the bookings file %s: %s", self.state_file, exc
            )


class StateDir:
    """Whether a state file's directory exists (systemd's `StateDirectory=` makes it):
    a file is written only into one that does; the first miss is logged, once."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._told = False

    def ready(self, directory: Path) -> bool:
        if directory.is_dir():
            return True
        if not self._told:
            self._told = True
            log.info("%s not written to a file: %s does not exist", self.what, directory)
        return False


def readable_as(directory: Path) -> int:
    """A file mode that lets read it whoever may enter `directory`."""
    mode = directory.stat().st_mode
    return 0o600 | (0o040 if mode & 0o010 else 0) | (0o004 if mode & 0o001 else 0)


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data` so that a reader sees all of the old or all of the new."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_stamped(path: Path) -> tuple[bytes, int]:
    """A state file's content and its modification time (ms): when the agent last knew
    it current. `OSError` as `open` raises it."""
    with path.open("rb") as fh:
        checked_at = os.fstat(fh.fileno()).st_mtime_ns // 1_000_000
        return fh.read(), checked_at


def read_state(path: Path) -> NodeBookings:
    return read_held(path).bookings


def read_held(path: Path) -> Held:
    """The state file's bookings and when the agent last confirmed them (its mtime)."""
    try:
        data, checked_at = read_stamped(path)
    except FileNotFoundError:
        raise BookingsError(
            f"{path} does not exist: the agent has not received this node's bookings yet"
            " (is it running, and connected to NATS?)"
        ) from None
    except OSError as exc:
        raise BookingsError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return Held(path, _DECODER.decode(data), checked_at)
    except msgspec.DecodeError as exc:
        raise BookingsError(f"{path} does not hold bookings: {exc}") from None
