"""`gpufleet-slurm-bridge`: Slurm kept in step with the ledger.

Events trigger, the ledger is the truth. The bridge follows the alert stream through
its own durable JetStream consumer (`ops.kit.alerts.AlertSource`); any event, a
NATS reconnect, its start, and every `resync_interval_s` without one (bookings, renewals
and releases publish no alert) start a pass: read the ledger (`ledger_view`), read
Slurm (`scontrol`), plan (`planner`), apply. A batch of events is acknowledged only
after a pass that read the ledger after them, so a bridge killed mid-stream gets them
again and passes again; a pass only ever sets what the ledger says, so it never
duplicates anything. An action Slurm refuses is logged, counted and retried on the next
pass; it never stops the others.

Its NATS link is probed as the coordinator's is (`procs.nats_link`): a hung server is
taken as dead within `nats_probe_interval_s` + `nats_probe_timeout_s`, logged, and left
for another, which is a reconnect and so a pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import aiohttp
import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from ops.kit.alerts import AlertSource, ConsumerSpec, raise_if_cancelled
from ops.kit.client import ApiError, ClientError
from ops.slurm.bridge.ledger_view import LedgerView
from ops.slurm.bridge.metrics import BridgeMetrics
from ops.slurm.bridge.model import Action, GpuTres, QosAction, SlurmState
from ops.slurm.bridge.planner import plan
from ops.slurm.bridge.sacctmgr import Sacctmgr, qos_argvs
from ops.slurm.bridge.scontrol import Scontrol, ScontrolConfig, SlurmError, action_argv
from ops.slurm.bridge.settings import BridgeSettings
from procs.log_throttle import LogThrottle
from procs.nats_connect import RECONNECT_FOREVER, Retry, connect
from procs.nats_link import MAX_OUTSTANDING_PINGS, PING_INTERVAL_S, LinkProbe, server_of
from procs.redact import redact
from procs.settings import ConfigError
from procs.signals import serve as run_daemon
from shared.streams import stream_name
from shared.subjects import Subjects
from shared.wire import Alert

log = logging.getLogger("gpufleet.slurm_bridge")
_RETRY_S = 1.0
# Accounting found unreachable (no slurmdbd, or none configured) is asked again this
# often, not every pass: sacctmgr may wait out its timeout each time.
QOS_PROBE_S = 60.0
# A pass takes well under this; events a killed bridge held come back after it (its
# successor has reconciled from the ledger at start anyway, so they only trigger one
# more pass), and a pass that fails keeps its events with `in_progress`.
ACK_WAIT_S = 10.0

# GPU TRES in a reservation needs AccountingStorageTRES naming the gres (so slurmdbd)
# and Slurm 23.11 or later; Slurm's refusals alone do not say what to change.
_GPU_TRES_REFUSALS = {
    "couldn't identify configured TRES 'gres/": "AccountingStorageTRES (with slurmdbd) "
    "must name each GPU type, and Slurm must be 23.11 or later",
    "not supported with reservations": "this Slurm cannot reserve GPUs (23.11 or later can)",
}


def gpu_tres_refused(refusal: str) -> str | None:
    """Why Slurm cannot take GPU TRES in a reservation, for such a refusal; else None."""
    for words, why in _GPU_TRES_REFUSALS.items():
        if words in refusal:
            return why
    return None


# What a NATS refusal means for the bridge, and what to do.
_NATS_FIX = (
    "its NATS user must create and read the durable consumer {durable} on the alert "
    "stream (`gpufleet nats-auth ... --forwarder {durable}`); until it may, events "
    "trigger nothing and Slurm follows the ledger only every {resync:g} s"
)


def _nats_refusal(exc: BaseException) -> bool:
    """A NATS error that says the bridge's user is not allowed (wrong credentials,
    or a permission its user lacks), as nats-py reports them."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return True
    text = str(exc).lower()
    return "permissions violation" in text or "authorization violation" in text


# What each mode holds, as the log says it.
_MECHANISMS: dict[GpuTres, str] = {
    "typed": "the booked GPUs by type (GRES TRES)",
    "count": "the booked GPU count (GRES TRES)",
    "cores": "the booked GPUs' cores (CoreCnt; enforce-binding via job_submit.lua) on "
    "nodes with a socket per GPU, other booked nodes whole",
    "off": "booked nodes whole",
}


# What each mechanism guarantees, as the log says it (docs/operator.md, "Slurm").
_BASES: dict[GpuTres, str] = {"typed": "gres", "count": "gres", "cores": "cores", "off": "nodes"}
_QOS_SAYS = ("; each booking's QOS gpufleet-<id> caps its jobs together at the booked GPUs "
             "(GrpTRES, with job_submit.lua's BOOKING_QOS)")  # fmt: skip


def _describe(action: Action, now_s: int) -> str:
    """The command line(s) of one action, for the log."""
    if isinstance(action, QosAction):
        return "; ".join("sacctmgr " + " ".join(argv) for argv in qos_argvs(action))
    return "scontrol " + " ".join(action_argv(action, now_s))


def _hint(refusal: str) -> str:
    """What to change, for a refusal of GPU TRES; empty for any other."""
    why = gpu_tres_refused(refusal)
    return (
        f'; {why}: else set gpu_tres = "cores" (a socket per GPU) or "off" (whole nodes)'
        if why
        else ""
    )


class SlurmBridge:
    _nc: Client | None = None  # once connected (`connect`)

    def __init__(self, settings: BridgeSettings) -> None:
        settings.check()
        self.s = settings
        try:
            self._servers = settings.nats.servers
        except ValueError as exc:
            raise ConfigError("nats_url", str(exc)) from None
        self.subjects = Subjects(settings.nats.subject_prefix)
        self.policy = settings.policy()
        self.scontrol = Scontrol(
            ScontrolConfig(settings.scontrol, settings.slurm_conf, settings.scontrol_timeout_s)
        )
        accounting = ScontrolConfig(
            settings.sacctmgr, settings.slurm_conf, settings.scontrol_timeout_s
        )
        self.sacctmgr = Sacctmgr(accounting) if settings.booking_qos == "auto" else None
        self._qos_on = False  # sacctmgr answered the last time it was asked
        self._qos_probe_at = 0.0  # monotonic: when to ask again while it does not
        self._qos_lost = False  # it answered once, not since: bookings' QOS not kept
        self._mechanism = ""
        self.metrics = BridgeMetrics()
        # "auto" falls back to whole nodes once, for the life of the process: a restart
        # (say after upgrading Slurm) tries GPU TRES again.
        self._auto = settings.gpu_tres == "auto"
        self.metrics.set_gpu_tres_mode(self.policy.gpu_tres)
        until = " (auto: until Slurm refuses GRES in reservations)" if self._auto else ""
        log.info("reserving %s%s", _MECHANISMS[self.policy.gpu_tres], until)
        self._say_mechanism()
        self.ready = asyncio.Event()  # set after the first full pass at start
        self.metrics_port: int | None = None
        self._dirty = True  # start: reconcile at once
        self._held: list[Msg] = []
        self._last_pass = 0.0
        self._unknown: frozenset[str] = frozenset()
        self._unmapped: frozenset[str] = frozenset()
        self._kept: frozenset[str] = frozenset()
        self._recheck_at: int | None = None  # epoch ms: an unreachable node's grace ends
        self._refusals = LogThrottle(log, every_s=300.0)
        self._outages = LogThrottle(log, every_s=60.0)  # passes retry every second
        self._denials = LogThrottle(log, every_s=60.0)
        self.link = LinkProbe(log, timeout_s=settings.nats.probe_timeout_s)

    def _refused(self, by: str, what: str, exc: BaseException) -> None:
        """Credentials or permissions refused: counted, and an ERROR (once a minute
        while it lasts), for it needs a person, not a retry."""
        self.metrics.refused.labels(by).inc()
        self._denials.error(by, "%s refused the bridge (%s): %s", by, exc, what)

    async def on_nats_error(self, exc: Exception) -> None:
        if _nats_refusal(exc):
            self._refused("nats", _NATS_FIX.format(durable=self.s.durable,
                          resync=self.s.resync_interval_s), exc)  # fmt: skip
        else:
            log.warning("NATS: %s", exc)

    async def connect(self) -> Client:
        """Connected to NATS, retried until it is (`procs.nats_connect`, every
        `_RETRY_S`); a refused user is an ERROR, an unreachable server a warning, each
        once a minute at most."""

        def failed(exc: BaseException) -> None:
            if _nats_refusal(exc):
                self._refused("nats", "check nats_credentials; retrying", exc)
            else:
                self._outages.warning("nats", "NATS at %s not reachable (%s); retrying",
                                      redact(",".join(self._servers)), exc)  # fmt: skip

        retry = Retry(first_s=_RETRY_S, max_s=_RETRY_S)
        self._nc = await connect(self.s.nats, self._options(), retry=retry, on_failure=failed)
        return self._nc

    def _options(self) -> dict[str, object]:
        on_error = self.on_nats_error

        async def on_disconnect() -> None:
            self.link.reset()
            if self._nc is not None and not self._nc.is_closed:  # closing is no news
                log.warning("disconnected from NATS")

        async def on_reconnect() -> None:
            self._dirty = True  # a gap: whatever happened meanwhile is in the ledger
            log.info("reconnected to NATS at %s", server_of(self._nc) if self._nc else "?")

        return dict(
            name="gpufleet-slurm-bridge", **RECONNECT_FOREVER, reconnect_time_wait=0.5,
            connect_timeout=5, error_cb=on_error, disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect, ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        )  # fmt: skip

    async def reconcile(self, view: LedgerView) -> bool:
        """One pass; False when the ledger or Slurm could not be read (nothing done)."""
        self._last_pass = time.monotonic()
        try:
            ledger = await view.read()
        except ClientError as exc:
            self.metrics.failures.labels("ledger.read").inc()
            if isinstance(exc, ApiError) and exc.status in (401, 403):
                self._refused("coordinator", "coordinator_key (GPUFLEET_SLURM_BRIDGE_KEY) "
                              "must be a key that may list every reservation and node; "
                              "nothing in Slurm changes until it is", exc)  # fmt: skip
            else:
                self._outages.warning("ledger", "reading the ledger failed (%s); retrying", exc)
            return False
        try:
            state = await self.scontrol.state()
        except SlurmError as exc:
            self.metrics.failures.labels("slurm.read").inc()
            self._outages.warning("slurm", "reading Slurm failed (%s); retrying", exc)
            return False
        state, qos_read = await self.with_qos(state)
        p = plan(ledger, state, self.policy)
        self._note(p.desired.unknown_nodes, p.desired.unmapped, len(p.left_alone))
        self._note_kept(p.desired.kept)
        self._recheck_at = p.desired.recheck_at_ms
        failed = 0 if qos_read else 1  # QOS it keeps, not read: not in step
        now_s = ledger.at_ms // 1000
        for action in p.actions:
            try:
                if isinstance(action, QosAction):
                    assert self.sacctmgr is not None  # planned only from what it read
                    await self.sacctmgr.apply(action)
                else:
                    await self.scontrol.apply(action, now_s)
            except SlurmError as exc:
                failed += 1
                self.metrics.failures.labels(action.kind).inc()
                if self._fall_back(str(exc), state):
                    break  # the rest was planned with GPU TRES: plan again at once
                # A refusal Slurm repeats every pass is logged once a throttle period.
                self._refusals.warning(
                    f"{action.kind} {_describe(action, now_s)[:60]}",
                    "%s failed, retried on the next pass: %s%s", action.kind, exc,
                    _hint(str(exc)),
                )  # fmt: skip
                continue
            self.metrics.actions.labels(action.kind).inc()
            log.info("%s: %s", action.kind, _describe(action, now_s))
        if not failed:
            self.metrics.synced_at = ledger.at_ms / 1000
        self.metrics.reconciles.inc()  # last: a pass counted is a pass done
        return True

    async def with_qos(self, state: SlurmState) -> tuple[SlurmState, bool]:
        """Slurm's state with its QOS where booking QOS are on and sacctmgr answers;
        as it was (no QOS planned, none deleted) otherwise. False while sacctmgr, having
        answered, does not (the bookings' QOS are not kept in step: the lag grows)."""
        if self.sacctmgr is None or (not self._qos_on and time.monotonic() < self._qos_probe_at):
            return state, not self._qos_lost
        try:
            qos = await self.sacctmgr.qos()
        except SlurmError as exc:
            self._qos_probe_at = time.monotonic() + QOS_PROBE_S
            self.metrics.failures.labels("qos.read").inc()
            if self._qos_on or self._mechanism.endswith("?"):  # lost, or first asked
                log.warning("no booking QOS: Slurm's accounting cannot be read (%s); "
                            "asking again every %g s", exc, QOS_PROBE_S)  # fmt: skip
            self._qos_lost = self._qos_lost or self._qos_on
            self._qos_on = False
            self._say_mechanism(probed=True)
            return state, not self._qos_lost
        self._qos_on, self._qos_lost = True, False
        self._say_mechanism(probed=True)
        return replace(state, qos=qos), True

    def _say_mechanism(self, probed: bool = False) -> None:
        """The mechanism in the metric, and an INFO line when it changes. Before
        sacctmgr was first asked the QOS part is not known (`?` in the log only)."""
        mechanism = _BASES[self.policy.gpu_tres] + ("+qos" if self._qos_on else "")
        shown = mechanism if probed or self.sacctmgr is None else mechanism + "?"
        self.metrics.set_mechanism(mechanism)
        if shown != self._mechanism and not shown.endswith("?"):
            says = _MECHANISMS[self.policy.gpu_tres] + (_QOS_SAYS if self._qos_on else "")
            log.info("holding bookings by %s: %s", mechanism, says)
        if shown != self._mechanism:
            self._mechanism = shown

    def _fall_back(self, refusal: str, state: SlurmState) -> bool:
        """In auto mode, when Slurm refuses GPU TRES in a reservation: reserve the booked
        GPUs' cores where slurm.conf gives each GPU a socket of its own (`cores`), else
        booked nodes whole (`off`); True when it switched (the next pass plans so)."""
        why = gpu_tres_refused(refusal)
        if not self._auto or why is None or self.policy.gpu_tres in ("off", "cores"):
            return False
        per_gpu = any(n.cores_per_gpu for n in state.nodes.values())
        mode: GpuTres = "cores" if per_gpu else "off"
        self.policy = replace(self.policy, gpu_tres=mode)
        self.metrics.set_gpu_tres_mode(mode)
        self._say_mechanism(probed=True)
        self._dirty = True
        log.warning('gpu_tres = "auto": Slurm refused GPUs in a reservation (%s: %s); '
                    "reserving %s until restarted", why, refusal, _MECHANISMS[mode])  # fmt: skip
        return True

    def _note(self, unknown: frozenset[str], unmapped: frozenset[str], left_alone: int) -> None:
        """Gauges, and a warning when a node or reservation is newly left out."""
        self.metrics.unknown_nodes.set(len(unknown))
        self.metrics.unmapped.set(len(unmapped))
        self.metrics.left_alone.set(left_alone)
        if unknown - self._unknown:
            log.warning("nodes unknown to Slurm, left out: %s", ", ".join(sorted(unknown)))
        if unmapped - self._unmapped:
            log.warning("reservations left out, no Slurm user or account for their tenant: %s",
                        ", ".join(sorted(unmapped)))  # fmt: skip
        self._unknown, self._unmapped = unknown, unmapped

    def _note_kept(self, kept: frozenset[str]) -> None:
        """A warning naming each reservation newly kept because a node of it left
        Slurm's listing (it is neither changed nor deleted until the node is back)."""
        if kept - self._kept:
            log.warning("reservations kept as they are in Slurm, a node of theirs is missing "
                        "from Slurm's node list (renamed? a node_names typo?): %s",
                        ", ".join(sorted(kept - self._kept)))  # fmt: skip
        self._kept = kept

    def _take(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            self.metrics.events.inc()
            with contextlib.suppress(msgspec.DecodeError):
                alert = Alert.from_json(msg.data)
                log.debug("event %s on %s", alert.kind, alert.node_id)
        self._held += msgs
        self._dirty = True

    async def _settle(self, ok: bool) -> None:
        """Acknowledge what the pass covered, or keep it held (and tell JetStream so)."""
        held, self._held = self._held, ([] if ok else self._held)
        for msg in held:
            with contextlib.suppress(Exception):
                await (msg.ack() if ok else msg.in_progress())

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        timeout = aiohttp.ClientTimeout(total=self.s.http_timeout_s)
        async with contextlib.AsyncExitStack() as stack:
            # /metrics first: a NATS user refused at connect shows there too.
            if self.s.metrics_port is not None:
                self.metrics_port = await stack.enter_async_context(
                    self.metrics.serving(self.s.metrics_host, self.s.metrics_port)
                )
            nc = await self.connect()
            try:
                http = await stack.enter_async_context(aiohttp.ClientSession(timeout=timeout))
                view = LedgerView(http, self.s.coordinator_url, self.s.coordinator_key,
                                  insecure_http=self.s.insecure_http)  # fmt: skip
                async with asyncio.TaskGroup() as tasks:
                    probe = self.link.run(lambda: nc, self.s.nats.probe_interval_s)
                    probing = tasks.create_task(probe, name="nats-link-probe")
                    await self._follow(nc, view, ready)
                    probing.cancel()
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), timeout=5)

    def source(self, nc: Client) -> AlertSource:
        """Its durable consumer on the alert stream (not yet bound)."""
        return AlertSource(
            nc,
            ConsumerSpec(
                stream=stream_name(self.s.nats.subject_prefix), subject=self.subjects.all_alerts,
                durable=self.s.durable, ack_wait_s=ACK_WAIT_S, max_ack_pending=10_000,
            ),
            wait_s=self.s.fetch_wait_s, on_mismatch=self.metrics.consumer_mismatches.inc,
        )  # fmt: skip

    async def _follow(self, nc: Client, view: LedgerView, ready: Callable[[], None] | None) -> None:
        source = self.source(nc)
        # Bound beside the passes: a NATS user refused the consumer (an ERROR, counted)
        # leaves the bridge on its resync, still keeping Slurm in step.
        bound = asyncio.create_task(source.bind())
        try:
            while True:
                raise_if_cancelled()
                due = time.monotonic() - self._last_pass >= self.s.resync_interval_s
                graced = self._recheck_at is not None and time.time() * 1000 >= self._recheck_at
                due = due or graced
                if self._dirty or due:
                    self._dirty = False
                    ok = await self.reconcile(view)
                    await self._settle(ok)
                    if not ok:
                        self._dirty = True
                        await asyncio.sleep(_RETRY_S)
                    elif not self.ready.is_set():
                        log.info("in step with the ledger; following %s (consumer %s)",
                                 source.spec.stream, self.s.durable)  # fmt: skip
                        if ready is not None:
                            ready()  # systemd: READY=1
                        self.ready.set()
                if not self.ready.is_set():
                    continue
                if not bound.done():
                    await asyncio.wait({bound}, timeout=self.s.fetch_wait_s)
                    continue
                msgs = await source.fetch(500)
                if msgs:
                    self._take(msgs)
        except asyncio.CancelledError:
            bound.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bound
            # Stopping: what was not covered by a pass comes back at once to the next.
            for msg in self._held + await source.hand_back(500):  # none when never bound
                with contextlib.suppress(Exception):
                    await msg.nak()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.flush(), timeout=2)
            raise


def serve(settings: BridgeSettings, env: Mapping[str, str]) -> int:
    """Run until SIGTERM or SIGINT (0); 2 when the settings cannot be used."""

    def stopped(_: SlurmBridge) -> None:
        log.info("stopped")

    start = partial(SlurmBridge, settings)
    return run_daemon("gpufleet-slurm-bridge", settings.log_level, start, stopped, env)
