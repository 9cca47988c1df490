"""One host of a profile run, driven by its own thread: connect, deploy, wait for the common start,
watch the profiler, fetch its capture (or have the host recover it from its journal), clean up.

session.py starts one HostWorker per host and releases them together; what the main thread tells them
is a RunControl, what they say goes to the progress board and coordinator.log (RunLog).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coordinator import rundir
from coordinator.errors import HostKeyError
from coordinator.remote.clock import SYSTEM_CLOCK, Clock
from coordinator.remote.hosts import HostTransport, ProfilerStatus, RunRequest, TransportLost, one_line
from coordinator.remote.progress import ProgressBoard
from coordinator.rundir import HOST_FAILED, HOST_OK, HOST_PARTIAL, HostOutcome
from profiler.capture.format import RunMeta
from profiler.capture.read import is_capture_dir, read_events, read_meta, read_sampler_stats, read_scope
from profiler.errors import CapabilityError, ProfilerError

POLL_INTERVAL = 0.5
READY_POLL_INTERVAL = 0.2  # before the window: how soon a host's "waiting" (every program attached) is seen
READY_TIMEOUT = 120.0  # connect + deploy budget per host before the others start without it
LATE_START_TOLERANCE = 0.5  # seconds after the common start a host may begin without a warning
NOT_COLLECTED = "not collected"  # a host's reason in run.json until its outcome is known
RECOVER_TIMEOUT = 300.0  # seconds `profiler recover` may take on a host (symbolizing a long window)


class RunLog:
    """coordinator.log in the run directory: one line per host event, stamped by the run's clock."""

    def __init__(self, path: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, host: str, text: str) -> None:
        now = self._clock.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        with self._lock:
            if not self._handle.closed:
                self._handle.write(f"{stamp} {host}: {text}\n")
                self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._handle.close()


class RunControl:
    """What the main thread tells the workers: when to start sampling, and when to stop early.

    The hosts are released with the latest start (``release``: every host deployed, plus the start delay);
    once every profiler waits with its programs attached, the main thread brings the start forward
    (``confirm``) and each worker writes it to its host's start file (profiler/run/start.py). Every thread of
    the run reads the time and waits through ``clock`` (coordinator/remote/clock.py)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.stop = threading.Event()
        self.go = threading.Event()
        self.confirmed = threading.Event()
        self.start_at: float | None = None  # the common start: the latest until confirmed earlier
        self.analysing = False  # every capture is home and run.json written

    def release(self, start_at: float) -> None:
        self.start_at = start_at
        self.go.set()

    def confirm(self, start_at: float) -> None:
        self.start_at = start_at
        self.confirmed.set()


@dataclass(frozen=True)
class RunContext:
    """What the workers of one run share: the request every host runs, the run's directory, control, board and
    log, and how long a host is waited for past its window."""

    request: RunRequest
    run_dir: Path
    control: RunControl
    board: ProgressBoard
    log: RunLog
    finish_grace: float
    reconnect_window: float = 60.0  # seconds a lost host is retried beyond the profiler's end


class HostWorker(threading.Thread):
    """Drives one host through connect → deploy → start → watch → fetch → clean up."""

    def __init__(self, transport: HostTransport, context: RunContext) -> None:
        super().__init__(name=f"host-{transport.spec.label}", daemon=True)
        self.transport = transport
        self.spec = transport.spec
        self.context = context
        self.ready = threading.Event()
        # its profiler waits with every program attached, or is past that (sampling, finished, failed): the
        # common start need not wait for it any longer
        self.armed = threading.Event()
        self.start_sent = False
        self.start_missed = ""  # why the confirmed start did not reach the host
        self.collected = threading.Event()  # the outcome is known; only the clean-up may still run
        self.finished = threading.Event()  # cleaned up (or given up) and closed: the thread ends
        self.clock = context.control.clock
        self.outcome = HostOutcome(
            host=self.spec.label,
            address=transport.address,
            roles=self.spec.roles,
            state=HOST_FAILED,
            reason=NOT_COLLECTED,
        )
        self.stop_sent = False
        self.warnings: list[str] = []

    # --------------------------------------------------------------- helpers

    def _phase(self, phase: str, message: str = "", **extra: Any) -> None:
        self.context.board.update(self.spec.label, phase=phase, message=message, **extra)
        self.context.log.write(self.spec.label, phase + (f": {message}" if message else ""))

    def _fail(self, reason: str) -> None:
        reason = one_line(reason, 500)
        self.outcome = replace(self.outcome, state=HOST_FAILED, reason=reason)
        self._phase("failed", reason)

    def _reconnect(self, deadline: float) -> bool:
        """Reconnect until ``deadline`` (coordinator monotonic clock); the remote profiler keeps running."""
        attempt = 0
        # At least one attempt: a command that blocked on a silent link may have outlasted the deadline.
        while attempt == 0 or self.clock.monotonic() < deadline:
            attempt += 1
            self._phase("reconnecting", f"attempt {attempt}")
            try:
                self.transport.reconnect()
                self.context.log.write(self.spec.label, "reconnected")
                return True
            except HostKeyError:
                raise
            except ProfilerError as exc:
                self.context.log.write(self.spec.label, f"reconnect failed: {exc}")
            # Not interruptible by a stop request: stopping needs the host too.
            self.clock.sleep(min(2.0, max(0.0, deadline - self.clock.monotonic())))
        return False

    def _with_reconnect(self, action: Callable[[], Any], deadline: float) -> Any:
        while True:
            try:
                return action()
            except TransportLost as exc:
                self.context.log.write(self.spec.label, f"connection lost: {exc}")
                if not self._reconnect(deadline):
                    raise

    # --------------------------------------------------------------- the run

    def run(self) -> None:
        try:
            self._run()
        except ProfilerError as exc:
            self._fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must fail one host, not hang the run
            self.context.log.write(self.spec.label, traceback.format_exc())
            self._fail(f"internal error: {exc.__class__.__name__}: {exc}")
        finally:
            self.ready.set()
            self.armed.set()
            self.collected.set()
            self._cleanup()

    def _cleanup(self) -> None:
        try:
            deadline = self.clock.monotonic() + self.context.reconnect_window
            self._with_reconnect(self.transport.cleanup, deadline)
            self.context.log.write(self.spec.label, "cleaned up")
            self.outcome = replace(self.outcome, workdir="")
        except Exception as exc:  # noqa: BLE001 - report, never mask the outcome
            self.context.log.write(self.spec.label, f"cleanup failed: {exc}")
            note = f"cleanup failed, check the host for leftovers: {exc}"
            if self.outcome.workdir:
                note = (
                    f"not cleaned up ({exc}): {self.outcome.workdir} stays on the host; "
                    f"`coordinator fetch {self.context.run_dir}` fetches what it holds and removes it"
                )
            reason = f"{self.outcome.reason}; {note}" if self.outcome.reason else note
            self.outcome = replace(self.outcome, reason=reason)
        finally:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001
                pass
            self.finished.set()

    def _run(self) -> None:
        transport = self.transport
        self._phase("connecting")
        transport.connect()
        self._phase("deploying")
        offset = transport.measure_clock_offset()
        self.outcome = replace(self.outcome, clock_offset=round(offset, 6))
        self.context.log.write(self.spec.label, f"clock offset {offset:+.6f} s")
        transport.deploy(self.context.request.profile, self.context.request.known_spes)
        self.outcome = replace(
            self.outcome,
            workdir=transport.work_directory or "",
            reason=f"{NOT_COLLECTED}: the coordinator stopped first; try `coordinator fetch {self.context.run_dir}`",
        )
        self._preflight()
        self._phase("ready")
        self.ready.set()
        while not self.clock.wait(self.context.control.go, 0.2):
            if self.context.control.stop.is_set():
                break
        if self.context.control.stop.is_set():
            self._fail("interrupted before sampling started")
            return
        start_at = self.context.control.start_at
        request = replace(self.context.request, start_at=start_at)
        self._phase("starting")
        transport.start_profiler(request)
        try:
            status = self._watch(start_at or self.clock.time())
        except TransportLost as exc:
            self._fail(f"connection lost and not re-established: {exc}")
            return
        self._collect(status)

    def _preflight(self) -> None:
        """Refuse a host that cannot sample (no root or sudo, no bcc, no kernel headers) before the common
        start, with the reason and the fix, instead of a profiler failing there once the others sample."""
        result = self.transport.run_profiler(["doctor", "--preflight", "--json"], timeout=60)
        if result.returncode == 0:
            return
        from coordinator.remote.hosts import parse_doctor_output

        try:
            failed = [c for c in parse_doctor_output(result.stdout) if c["status"] == "fail"]
        except ValueError:
            failed = []
        if failed:
            problems = "; ".join(f"{c['check']}: {c['detail']} (fix: {c['fix']})" for c in failed)
        else:
            problems = _error_line(result.stderr or result.stdout) or f"exit code {result.returncode}"
        where = self.spec.source or self.spec.label
        raise CapabilityError(f"{where}: cannot profile {self.transport.address}: {problems}")

    def _watch(self, start_at: float) -> ProfilerStatus | None:
        """Poll the status file until the profiler finishes; forward a stop; survive connection drops
        (TransportLost once the host stayed unreachable beyond the reconnect window)."""
        transport = self.transport
        window_end = start_at + self.context.request.duration
        stop_deadline = window_end + self.context.finish_grace  # coordinator wall clock
        last: ProfilerStatus | None = None
        polls = 0
        kill_at: float | None = None
        while True:
            now = self.clock.time()
            retry = max(self.context.reconnect_window / 2, stop_deadline + self.context.reconnect_window - now)
            reconnect_until = self.clock.monotonic() + retry
            if self.context.control.stop.is_set() and not self.stop_sent:
                self.stop_sent = True
                self._phase("stopping", "asked the profiler to stop (SIGINT)")
                self._with_reconnect(lambda: transport.signal_profiler("INT"), reconnect_until)
            if now > stop_deadline and not self.stop_sent:
                self.stop_sent = True
                self._phase("stopping", f"not finished {self.context.finish_grace:.0f} s after the window; sent SIGINT")
                self._with_reconnect(lambda: transport.signal_profiler("INT"), reconnect_until)
                kill_at = self.clock.time() + 30
            if self.context.control.confirmed.is_set() and not self.start_sent:
                self._send_start()
            if kill_at is not None and self.clock.time() > kill_at:
                self._with_reconnect(lambda: transport.signal_profiler("KILL"), reconnect_until)
                self.outcome = replace(self.outcome, reason="profiler did not stop; killed")
                return last
            status = self._with_reconnect(transport.read_status, reconnect_until)
            if status is not None:
                last = status
                if status.state != "starting":
                    self.armed.set()
                # A host that starts late (BPF compilation slower than the start delay) gets its whole
                # window before the grace; one stuck compiling is waited for READY_TIMEOUT at most.
                window = self.context.request.duration + self.context.finish_grace
                if status.state == "sampling":
                    stop_deadline = max(stop_deadline, now - status.elapsed + window)
                elif status.state == "starting" and now < start_at + READY_TIMEOUT:
                    stop_deadline = max(stop_deadline, now + window)
                phase = "stopping" if self.stop_sent and not status.finished else status.state
                self.context.board.update(
                    self.spec.label,
                    phase=phase,
                    elapsed=status.elapsed,
                    remaining=status.remaining,
                    samples=status.samples,
                    processes=status.processes,
                    message=status.error or "",
                )
                if status.finished:
                    detail = f": {status.error}" if status.error else ""
                    self.context.log.write(self.spec.label, f"profiler {status.state}{detail}")
                    return status
            # A profiler that died before writing "done" leaves a stale or no status file: check the process.
            polls += 1
            if polls % 6 == 0 or (now > window_end + 2 and polls % 2 == 0):
                alive = self._with_reconnect(transport.profiler_alive, reconnect_until)
                if not alive:
                    final = self._with_reconnect(transport.read_status, reconnect_until)
                    if final is not None and final.finished:
                        return final
                    tail = self._with_reconnect(lambda: transport.log_tail(5), reconnect_until).strip()
                    self.context.log.write(self.spec.label, f"profiler exited without finishing; log:\n{tail}")
                    last_line = _error_line(tail) if _has_error(tail) else _vanished(final or last)
                    self.outcome = replace(self.outcome, reason=f"profiler exited early: {last_line}")
                    return final or ProfilerStatus("failed", error=last_line)
            interval = (
                POLL_INTERVAL
                if last is None or last.state != "sampling"
                else min(1.0, max(0.2, (last.remaining or 1.0) / 2))
            )
            if self.stop_sent:
                self.clock.sleep(interval)
            elif not (confirmed := self.context.control.confirmed).is_set() and (
                last is None or last.state in ("starting", "waiting")
            ):
                # before the window: wake as soon as the common start is confirmed (a stop waits this long)
                self.clock.wait(confirmed, READY_POLL_INTERVAL)
            else:
                self.clock.wait(self.context.control.stop, interval)

    def _send_start(self) -> None:
        """The confirmed common start to the host's start file; one try: without it the host starts at the
        latest start it was given, and _check_start says why it was late."""
        self.start_sent = True
        start_at = self.context.control.start_at
        assert start_at is not None
        try:
            self.transport.confirm_start(start_at)
        except (TransportLost, OSError) as exc:
            self.start_missed = one_line(str(exc))
            message = f"start not sent ({self.start_missed}); it starts at the latest start"
            self.context.log.write(self.spec.label, message)

    def _collect(self, status: ProfilerStatus | None) -> None:
        self._phase("fetching")
        dest = rundir.host_capture_dir(self.context.run_dir, self.spec.label)
        deadline = self.clock.monotonic() + 2 * self.context.reconnect_window
        try:
            self._with_reconnect(lambda: self.transport.fetch_capture(dest, self.context.request.fetch_all), deadline)
        except TransportLost as exc:
            self._fail(f"could not fetch the capture: {exc}")
            return
        recovery = ""
        if not is_capture_dir(dest):
            recovery = self._recover(dest, deadline)
        if not is_capture_dir(dest):
            if dest.is_dir() and not any(dest.iterdir()):
                dest.rmdir()
            reason = self.outcome.reason if not self.outcome.reason.startswith(NOT_COLLECTED) else ""
            error = status.error if status is not None and status.error else reason or "no meta.json written"
            self._fail(f"profiler failed: {error}" + (f"; {recovery}" if recovery else ""))
            return
        try:
            meta = read_meta(dest)
        except ProfilerError as exc:
            self._fail(f"unreadable capture: {exc}")
            return
        reasons = []
        if meta.stopped_by == "recovered":
            died = self.outcome.reason if not self.outcome.reason.startswith(NOT_COLLECTED) else ""
            reasons.append(died or f"profiler failed: {status.error if status and status.error else 'see the log'}")
            reasons.append(self._recovered_note(dest, meta))
        elif status is None or status.state != "done":
            reasons.append(f"profiler failed: {status.error if status and status.error else 'see coordinator.log'}")
        if meta.stopped_by not in ("duration", "recovered"):
            reasons.append(
                "stopped early by Ctrl-C on the coordinator"
                if self.context.control.stop.is_set()
                else f"stopped early ({meta.stopped_by})"
            )
        state = HOST_OK if not reasons else HOST_PARTIAL
        try:
            counted = read_events(dest)
        except ProfilerError as exc:
            reasons.append(f"unreadable events.json: {exc}")
            counted = None
        self.outcome = replace(
            self.outcome,
            state=state,
            reason="; ".join(reasons),
            start_time=meta.start_time,
            end_time=meta.end_time,
            events=counted.count if counted is not None else None,
            events_uncertainty=counted.uncertainty if counted is not None else None,
            events_method=counted.method if counted is not None else "",
        )
        self._phase("done" if state == HOST_OK else "partial", self.outcome.reason)
        self._check_start(meta.start_time)

    def _recover(self, dest: Path, deadline: float) -> str:
        """A profiler that died without writing its capture (SIGKILL, the OOM killer) leaves a checkpoint
        journal: ``profiler recover`` rebuilds the capture on the host, then it is fetched again. Returns
        why nothing was recovered ("" when the capture is now home)."""
        transport = self.transport
        try:
            if self._with_reconnect(transport.profiler_alive, deadline):
                return "not recovered: the profiler still runs"
            self._phase("recovering", "rebuilding the capture from the profiler's checkpoint journal")
            result = self._with_reconnect(lambda: transport.recover_capture(RECOVER_TIMEOUT), deadline)
            if result.returncode != 0:
                why = _error_line(result.stderr or result.stdout)
                self.context.log.write(self.spec.label, f"recovery failed: {why}")
                return f"nothing recovered: {why}"
            self.context.log.write(self.spec.label, f"recovery: {one_line(result.stdout)}")
            self._phase("fetching", "the recovered capture")
            self._with_reconnect(lambda: transport.fetch_capture(dest, self.context.request.fetch_all), deadline)
        except TransportLost as exc:
            return f"not recovered: {exc}"
        return ""

    def _recovered_note(self, dest: Path, meta: RunMeta) -> str:
        """How much a recovered capture holds: samples, and up to when (coordinator clock)."""
        samples = 0
        try:
            for process in read_scope(dest):
                stats = read_sampler_stats(dest, process.pid) if process.sampled else None
                samples += stats.samples if stats is not None else 0
        except ProfilerError as exc:  # the analysis will say what is wrong with the capture
            self.context.log.write(self.spec.label, f"recovered capture unreadable: {exc}")
        until = meta.end_time - (self.outcome.clock_offset or 0.0)
        stamp = time.strftime("%H:%M:%S", time.localtime(until))
        return (
            f"recovered {samples} samples up to {stamp} ({meta.duration:.1f} s into the window, its last checkpoint; "
            "the samples after it are lost)"
        )

    def _check_start(self, host_start: float) -> None:
        """All hosts should begin within a second: say which host missed the common start and the fix."""
        planned = self.context.control.start_at
        if planned is None or self.context.control.stop.is_set():
            return
        late = host_start - (self.outcome.clock_offset or 0.0) - planned
        if late > LATE_START_TOLERANCE:
            why = (
                f"(the start did not reach it: {self.start_missed})"
                if self.start_missed
                else "(BPF compilation took longer than the start delay); raise --start-delay"
            )
            self.warnings.append(f"{self.spec.label}: started sampling {late:.1f} s after the common start {why}")
            self.context.log.write(self.spec.label, self.warnings[-1])


def _has_error(log_tail: str) -> bool:
    return any(word in log_tail.lower() for word in ("error", "traceback"))


def _vanished(last: ProfilerStatus | None) -> str:
    """A profiler gone without a word (SIGKILL, the OOM killer): what its last status said."""
    where = ""
    if last is not None and last.state == "sampling":
        where = f" {last.elapsed:.1f} s into the window"
        if last.samples is not None:
            where += f" with {last.samples} samples"
    return f"the process vanished without an error{where} (killed: SIGKILL or the OOM killer?)"


def _error_line(log_tail: str) -> str:
    """The most telling line of a profiler log: the last error line, else the last line."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return one_line((errors or lines or ["no output"])[-1])
