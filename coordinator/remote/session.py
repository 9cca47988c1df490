"""Profile every host of a cluster at once: connect, deploy, start together, watch, stop, fetch, clean up.

``profile_cluster`` is the Python API behind ``coordinator profile`` (the demo calls it too). One thread
per host, so the wall time is the duration plus a small constant whatever the number of hosts.
"""

from __future__ import annotations

import platform
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from coordinator import rundir
from coordinator.errors import HostKeyError, PartialRunError
from coordinator.remote.cluster import HostSpec, load_cluster
from coordinator.remote.hosts import (
    HostTransport,
    LocalHost,
    ProfilerStatus,
    RunRequest,
    TransportLost,
    one_line,
)
from coordinator.remote.progress import ProgressBoard, Renderer, make_renderer
from coordinator.rundir import HOST_FAILED, HOST_OK, HOST_PARTIAL, HostOutcome, RunInfo
from profiler import __version__
from profiler.capture import format as capture
from profiler.capture.read import is_capture_dir, read_events, read_meta, read_sampler_stats, read_scope
from profiler.errors import CapabilityError, ProfilerError, config_error
from profiler.files.outputs import MARKER, check_output_dir, mark_output_dir
from profiler.matching.appprofile import load_profile
from profiler.scope.spes import load_known_spes

__all__ = ["ProfileOutcome", "profile_cluster", "load_cluster", "make_transport", "prepare_run_dir"]

POLL_INTERVAL = 0.5
DEFAULT_START_DELAY = 10.0  # seconds after every host is deployed: covers BPF compilation on the hosts
READY_TIMEOUT = 120.0  # connect + deploy budget per host before the others start without it
LOG_FILE = "coordinator.log"
LATE_START_TOLERANCE = 0.5  # seconds after the common start a host may begin without a warning
NOT_COLLECTED = "not collected"  # a host's reason in run.json until its outcome is known
RECOVER_TIMEOUT = 300.0  # seconds `profiler recover` may take on a host (symbolizing a long window)

TransportFactory = Callable[[HostSpec], HostTransport]


@dataclass(frozen=True)
class ProfileOutcome:
    run_dir: Path
    complete: bool
    exit_code: int  # 0 when complete, PartialRunError.exit_code otherwise
    info: RunInfo
    summary_csv: Path | None = None
    report: Path | None = None
    analysis_error: str | None = None
    warnings: tuple[str, ...] = ()  # e.g. a host that started sampling late


# A run this large (hosts × seconds) may outgrow the in-process analysis: start Spark beside the
# hosts' writing and fetching so its JVM start-up is off the critical path. Smaller runs are
# summarised in-process (same code and output) in a second or two.
SPARK_WARMUP_HOST_SECONDS = 8 * 3600


def make_transport(
    known_hosts: Path | None = None, accept_new_hosts: bool = False, connect_timeout: float = 10.0
) -> TransportFactory:
    """Local subprocess for the bare ``localhost`` entry, SSH for everything else."""

    def factory(spec: HostSpec) -> HostTransport:
        if spec.is_local:
            return LocalHost(spec)
        from coordinator.remote.ssh import DEFAULT_KNOWN_HOSTS, SshHost, SshOptions

        return SshHost(
            spec,
            SshOptions(
                known_hosts=known_hosts or DEFAULT_KNOWN_HOSTS,
                accept_new_hosts=accept_new_hosts,
                connect_timeout=connect_timeout,
            ),
        )

    return factory


def prepare_run_dir(out_dir: Path, force: bool) -> None:
    """Create the run directory; a non-empty one is replaced only with ``force`` and only when this tool
    wrote it (a run: run.json or its marker); a directory of the user's never (profiler.files.outputs)."""
    check_output_dir(out_dir, "--out", force=force, own_kind=(rundir.RUN_FILE,))
    if out_dir.exists() and any(child.name != MARKER for child in out_dir.iterdir()):
        shutil.rmtree(out_dir)
    (out_dir / rundir.HOSTS_DIR).mkdir(parents=True, exist_ok=True)
    mark_output_dir(out_dir, "coordinator profile")


class RunLog:
    """coordinator.log in the run directory: one timestamped line per host event."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, host: str, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        with self._lock:
            if not self._handle.closed:
                self._handle.write(f"{stamp} {host}: {text}\n")
                self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._handle.close()


class RunControl:
    """What the main thread tells the workers: when to start sampling, and when to stop early."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.go = threading.Event()
        self.start_at: float | None = None
        self.analysing = False  # every capture is home and run.json written

    def release(self, start_at: float) -> None:
        self.start_at = start_at
        self.go.set()


class HostWorker(threading.Thread):
    """Drives one host through connect → deploy → start → watch → fetch → clean up."""

    def __init__(
        self,
        transport: HostTransport,
        request: RunRequest,
        run_dir: Path,
        control: RunControl,
        board: ProgressBoard,
        log: RunLog,
        finish_grace: float,
        reconnect_window: float = 60.0,
    ) -> None:
        super().__init__(name=f"host-{transport.spec.label}", daemon=True)
        self.transport = transport
        self.spec = transport.spec
        self.request = request
        self.run_dir = run_dir
        self.control = control
        self.board = board
        self.log = log
        self.finish_grace = finish_grace
        self.reconnect_window = reconnect_window  # seconds a lost host is retried beyond the profiler's end
        self.ready = threading.Event()
        self.collected = threading.Event()  # the outcome is known; only the clean-up may still run
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
        self.board.update(self.spec.label, phase=phase, message=message, **extra)
        self.log.write(self.spec.label, phase + (f": {message}" if message else ""))

    def _fail(self, reason: str) -> None:
        reason = one_line(reason, 500)
        self.outcome = replace(self.outcome, state=HOST_FAILED, reason=reason)
        self._phase("failed", reason)

    def _reconnect(self, deadline: float) -> bool:
        """Reconnect until ``deadline`` (coordinator monotonic clock); the remote profiler keeps running."""
        attempt = 0
        # At least one attempt: a command that blocked on a silent link may have outlasted the deadline.
        while attempt == 0 or time.monotonic() < deadline:
            attempt += 1
            self._phase("reconnecting", f"attempt {attempt}")
            try:
                self.transport.reconnect()
                self.log.write(self.spec.label, "reconnected")
                return True
            except HostKeyError:
                raise
            except ProfilerError as exc:
                self.log.write(self.spec.label, f"reconnect failed: {exc}")
            # Not interruptible by a stop request: stopping needs the host too.
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        return False

    def _with_reconnect(self, action: Callable[[], Any], deadline: float) -> Any:
        while True:
            try:
                return action()
            except TransportLost as exc:
                self.log.write(self.spec.label, f"connection lost: {exc}")
                if not self._reconnect(deadline):
                    raise

    # --------------------------------------------------------------- the run

    def run(self) -> None:
        try:
            self._run()
        except ProfilerError as exc:
            self._fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must fail one host, not hang the run
            self.log.write(self.spec.label, traceback.format_exc())
            self._fail(f"internal error: {exc.__class__.__name__}: {exc}")
        finally:
            self.ready.set()
            self.collected.set()
            self._cleanup()

    def _cleanup(self) -> None:
        try:
            deadline = time.monotonic() + self.reconnect_window
            self._with_reconnect(self.transport.cleanup, deadline)
            self.log.write(self.spec.label, "cleaned up")
            self.outcome = replace(self.outcome, workdir="")
        except Exception as exc:  # noqa: BLE001 - report, never mask the outcome
            self.log.write(self.spec.label, f"cleanup failed: {exc}")
            note = f"cleanup failed, check the host for leftovers: {exc}"
            if self.outcome.workdir:
                note = (
                    f"not cleaned up ({exc}): {self.outcome.workdir} stays on the host; "
                    f"`coordinator fetch {self.run_dir}` fetches what it holds and removes it"
                )
            reason = f"{self.outcome.reason}; {note}" if self.outcome.reason else note
            self.outcome = replace(self.outcome, reason=reason)
        finally:
            try:
                self.transport.close()
            except Exception:  # noqa: BLE001
                pass

    def _run(self) -> None:
        transport = self.transport
        self._phase("connecting")
        transport.connect()
        self._phase("deploying")
        offset = transport.measure_clock_offset()
        self.outcome = replace(self.outcome, clock_offset=round(offset, 6))
        self.log.write(self.spec.label, f"clock offset {offset:+.6f} s")
        transport.deploy(self.request.profile, self.request.known_spes)
        self.outcome = replace(
            self.outcome,
            workdir=transport.work_directory or "",
            reason=f"{NOT_COLLECTED}: the coordinator stopped first; try `coordinator fetch {self.run_dir}`",
        )
        self._preflight()
        self._phase("ready")
        self.ready.set()
        while not self.control.go.wait(0.2):
            if self.control.stop.is_set():
                break
        if self.control.stop.is_set():
            self._fail("interrupted before sampling started")
            return
        start_at = self.control.start_at
        request = replace(self.request, start_at=start_at)
        self._phase("starting")
        transport.start_profiler(request)
        try:
            status = self._watch(start_at or time.time())
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
        window_end = start_at + self.request.duration
        stop_deadline = window_end + self.finish_grace  # coordinator wall clock
        last: ProfilerStatus | None = None
        polls = 0
        kill_at: float | None = None
        while True:
            now = time.time()
            retry = max(self.reconnect_window / 2, stop_deadline + self.reconnect_window - now)
            reconnect_until = time.monotonic() + retry
            if self.control.stop.is_set() and not self.stop_sent:
                self.stop_sent = True
                self._phase("stopping", "asked the profiler to stop (SIGINT)")
                self._with_reconnect(lambda: transport.signal_profiler("INT"), reconnect_until)
            if now > stop_deadline and not self.stop_sent:
                self.stop_sent = True
                self._phase("stopping", f"not finished {self.finish_grace:.0f} s after the window; sent SIGINT")
                self._with_reconnect(lambda: transport.signal_profiler("INT"), reconnect_until)
                kill_at = time.time() + 30
            if kill_at is not None and time.time() > kill_at:
                self._with_reconnect(lambda: transport.signal_profiler("KILL"), reconnect_until)
                self.outcome = replace(self.outcome, reason="profiler did not stop; killed")
                return last
            status = self._with_reconnect(transport.read_status, reconnect_until)
            if status is not None:
                last = status
                # A host that starts late (BPF compilation slower than the start delay) gets its whole
                # window before the grace; one stuck compiling is waited for READY_TIMEOUT at most.
                if status.state == "sampling":
                    stop_deadline = max(stop_deadline, now - status.elapsed + self.request.duration + self.finish_grace)
                elif status.state == "starting" and now < start_at + READY_TIMEOUT:
                    stop_deadline = max(stop_deadline, now + self.request.duration + self.finish_grace)
                phase = "stopping" if self.stop_sent and not status.finished else status.state
                self.board.update(
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
                    self.log.write(self.spec.label, f"profiler {status.state}{detail}")
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
                    self.log.write(self.spec.label, f"profiler exited without finishing; log:\n{tail}")
                    last_line = _error_line(tail) if _has_error(tail) else _vanished(final or last)
                    self.outcome = replace(self.outcome, reason=f"profiler exited early: {last_line}")
                    return final or ProfilerStatus("failed", error=last_line)
            interval = (
                POLL_INTERVAL
                if last is None or last.state != "sampling"
                else min(1.0, max(0.2, (last.remaining or 1.0) / 2))
            )
            if self.stop_sent:
                time.sleep(interval)
            else:
                self.control.stop.wait(interval)

    def _collect(self, status: ProfilerStatus | None) -> None:
        self._phase("fetching")
        dest = rundir.host_capture_dir(self.run_dir, self.spec.label)
        deadline = time.monotonic() + 2 * self.reconnect_window
        try:
            self._with_reconnect(lambda: self.transport.fetch_capture(dest, self.request.fetch_all), deadline)
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
                if self.control.stop.is_set()
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
                self.log.write(self.spec.label, f"recovery failed: {why}")
                return f"nothing recovered: {why}"
            self.log.write(self.spec.label, f"recovery: {one_line(result.stdout)}")
            self._phase("fetching", "the recovered capture")
            self._with_reconnect(lambda: transport.fetch_capture(dest, self.request.fetch_all), deadline)
        except TransportLost as exc:
            return f"not recovered: {exc}"
        return ""

    def _recovered_note(self, dest: Path, meta: capture.RunMeta) -> str:
        """How much a recovered capture holds: samples, and up to when (coordinator clock)."""
        samples = 0
        try:
            for process in read_scope(dest):
                stats = read_sampler_stats(dest, process.pid) if process.sampled else None
                samples += stats.samples if stats is not None else 0
        except ProfilerError as exc:  # the analysis will say what is wrong with the capture
            self.log.write(self.spec.label, f"recovered capture unreadable: {exc}")
        until = meta.end_time - (self.outcome.clock_offset or 0.0)
        stamp = time.strftime("%H:%M:%S", time.localtime(until))
        return (
            f"recovered {samples} samples up to {stamp} ({meta.duration:.1f} s into the window, its last checkpoint; "
            "the samples after it are lost)"
        )

    def _check_start(self, host_start: float) -> None:
        """All hosts should begin within a second: say which host missed the common start and the fix."""
        planned = self.control.start_at
        if planned is None or self.control.stop.is_set():
            return
        late = host_start - (self.outcome.clock_offset or 0.0) - planned
        if late > LATE_START_TOLERANCE:
            self.warnings.append(
                f"{self.spec.label}: started sampling {late:.1f} s after the common start (BPF compilation "
                "took longer than the start delay); raise --start-delay"
            )
            self.log.write(self.spec.label, self.warnings[-1])


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


def _versions() -> dict[str, str]:
    versions = {"coordinator": __version__, "python": platform.python_version()}
    try:
        import paramiko

        versions["paramiko"] = paramiko.__version__
    except ImportError:
        pass
    return versions


def _write_cluster_copy(run_dir: Path, hosts: Sequence[HostSpec], cluster_file: Path | None) -> None:
    target = run_dir / rundir.CLUSTER_COPY
    if cluster_file is not None and Path(cluster_file).is_file():
        shutil.copyfile(cluster_file, target)
        return
    lines = []
    for spec in hosts:
        address = spec.hostname if not spec.port_given else f"{spec.address.split('@')[-1]}"
        user = f"{spec.user}@" if spec.user else ""
        words = [user + address, *spec.roles, *(f"{k}={v}" for k, v in spec.options.items())]
        lines.append(" ".join(words))
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


class _SigintToStop:
    """While a run is under way, Ctrl-C (SIGINT) means "stop every host and fetch what it has"."""

    def __init__(self, control: RunControl, renderer: Renderer) -> None:
        self.control = control
        self.renderer = renderer
        self.previous: Any = None
        self.installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.control.analysing:
            raise KeyboardInterrupt  # the captures are home; Ctrl-C now abandons only the analysis
        if not self.control.stop.is_set():
            self.control.stop.set()
            self.renderer.note("coordinator: stopping every host's profiler and fetching partial results…")
        else:
            self.renderer.note("coordinator: still stopping; cleaning up the hosts (this takes a few seconds)")

    def __enter__(self) -> _SigintToStop:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
            self.installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            signal.signal(signal.SIGINT, self.previous)


@dataclass(frozen=True)
class RunOptions:
    """How the coordinator runs a profile, beside what every host is asked (``RunRequest``)."""

    labels: Mapping[str, str] = field(default_factory=dict)  # written to run.json
    cluster_file: Path | None = None  # copied into the run directory
    known_hosts: Path | None = None
    accept_new_hosts: bool = False
    connect_timeout: float = 10.0
    transport_factory: TransportFactory | None = None  # tests script hosts with this
    start_delay: float | None = None  # seconds between "every host ready" and the common start
    progress: bool = True
    stream: IO[str] | None = None  # where progress goes (stderr)
    analyze: bool = True  # summary.csv and the report once the captures are in
    force: bool = False  # replace an existing run directory
    finish_grace: float | None = None  # seconds after the window before a silent profiler is stopped
    reconnect_window: float = 60.0  # seconds a lost host is retried beyond that (tests shorten both)


def profile_cluster(
    hosts: Sequence[HostSpec], request: RunRequest, out_dir: Path, options: RunOptions | None = None
) -> ProfileOutcome:
    """Profile ``hosts`` as ``request`` says (duration, frequency, profile, known_spes, net, events,
    extra ``pids``, sampling) into the run directory ``out_dir``.

    ``out_dir`` is the run directory itself (created; a non-empty one only replaced with
    ``options.force``, and only if it is a run directory). Returns the outcome; never raises for host
    failures (they are in ``info.hosts``, and make ``exit_code`` PartialRunError.exit_code). Raises
    OutputExistsError/ProfilerError before anything starts. The analysis (summary.csv, report) runs
    when ``options.analyze``; its failure is reported in ``analysis_error``, the captures stay.

    Steps: check the inputs, create the run directory, start every host, release them together,
    wait for their captures, analyse.
    """
    options = options or RunOptions()
    _check_inputs(hosts, request.profile, request.known_spes)
    out_dir = Path(out_dir)
    prepare_run_dir(out_dir, options.force)
    shutil.copyfile(request.profile, out_dir / rundir.PROFILE_COPY)
    _write_cluster_copy(out_dir, hosts, options.cluster_file)

    factory = options.transport_factory or make_transport(
        options.known_hosts, options.accept_new_hosts, options.connect_timeout
    )
    info = _first_run_info(out_dir, hosts, request, options.labels, options.cluster_file)
    rundir.write_run(out_dir, info)

    board = ProgressBoard([h.label for h in hosts])
    renderer = make_renderer(options.progress, options.stream)
    log = RunLog(out_dir / LOG_FILE)
    control = RunControl()
    finish_grace = max(60.0, 0.25 * request.duration) if options.finish_grace is None else options.finish_grace
    workers = [
        HostWorker(factory(spec), request, out_dir, control, board, log, finish_grace, options.reconnect_window)
        for spec in hosts
    ]
    progress = RunJsonWriter(out_dir, info)
    delay = DEFAULT_START_DELAY if options.start_delay is None else options.start_delay
    warmup: SparkWarmup | None = None
    renderer.start()
    with _SigintToStop(control, renderer):
        try:
            for worker in workers:
                worker.start()
            start_at = _start_together(workers, control, board, renderer, log, delay, progress)
            if start_at is not None:
                info = replace(info, start_time=start_at)
                progress.info = replace(progress.info, start_time=start_at)
            warmup = _wait_collected(workers, control, board, renderer, request.duration, options.analyze, progress)
        finally:
            renderer.stop(board)

        info = replace(info, end_time=time.time()).with_hosts(tuple(w.outcome for w in workers))
        rundir.write_run(out_dir, info)
        warnings = tuple(w for worker in workers for w in worker.warnings)
        exit_code = 0 if info.complete else PartialRunError.exit_code
        outcome = ProfileOutcome(out_dir, info.complete, exit_code, info, warnings=warnings)
        control.analysing = True
        try:
            if options.analyze and any(h.has_capture for h in info.hosts):
                outcome = _analyze(outcome, warmup, log)
        finally:
            if warmup is not None:
                warmup.close()
            for worker in workers:
                worker.join()
            log.close()

    final = info.with_hosts(tuple(w.outcome for w in workers))
    if final != info:  # a clean-up added a note
        rundir.write_run(out_dir, final)
        outcome = replace(outcome, info=final)
    return outcome


def _first_run_info(
    out_dir: Path,
    hosts: Sequence[HostSpec],
    request: RunRequest,
    labels: Mapping[str, str],
    cluster_file: Path | None,
) -> RunInfo:
    """run.json as written before any host starts (complete: false until every host is ok)."""
    return RunInfo(
        run_id=out_dir.name,
        cluster_file=str(cluster_file) if cluster_file is not None else "",
        profile_name=request.profile.name,
        duration=request.duration,
        frequency=request.frequency,
        labels=dict(labels),
        versions=_versions(),
        start_time=time.time(),
        complete=False,
        hosts=tuple(HostOutcome(h.label, h.address, h.roles) for h in hosts),
    )


def _check_inputs(hosts: Sequence[HostSpec], profile: Path, known_spes: Path) -> None:
    """Everything the user gave is checked before a host is touched."""
    if not hosts:
        raise ProfilerError("no hosts to profile; add lines to cluster.txt")
    labels_seen = [h.label for h in hosts]
    if len(set(labels_seen)) != len(labels_seen):
        raise ProfilerError(f"duplicate host labels {labels_seen}; give each entry a distinct name=")
    for path, what in ((profile, "application profile"), (known_spes, "known_spes file")):
        if not Path(path).is_file():
            raise config_error(str(path), None, f"{what} not found or not a file", "pass an existing file")
    # Parsed here, with the user's own paths in any error, before a host is touched: every host would
    # otherwise fail the same way, naming a temporary copy on the remote side.
    load_profile(profile)
    load_known_spes(known_spes)


class RunJsonWriter:
    """run.json rewritten by the main thread whenever a host's outcome changes, so a coordinator killed
    mid-run leaves each host's work directory and state behind for `coordinator fetch`."""

    def __init__(self, run_dir: Path, info: RunInfo) -> None:
        self.run_dir = run_dir
        self.info = info

    def refresh(self, workers: Sequence[HostWorker]) -> None:
        info = self.info.with_hosts(tuple(w.outcome for w in workers))
        if info != self.info:
            rundir.write_run(self.run_dir, info)
            self.info = info


def _start_together(
    workers: Sequence[HostWorker],
    control: RunControl,
    board: ProgressBoard,
    renderer: Renderer,
    log: RunLog,
    delay: float,
    progress: RunJsonWriter,
) -> float | None:
    """Release every host at one moment once all are ready (or the wait timed out); the start time,
    or None when a stop came first."""
    ready_deadline = time.monotonic() + READY_TIMEOUT
    while not control.go.is_set():
        progress.refresh(workers)
        if all(w.ready.is_set() for w in workers) or time.monotonic() > ready_deadline:
            start_at = time.time() + delay
            log.write("*", f"all hosts ready; sampling starts at {start_at:.3f} (coordinator clock)")
            progress.info = replace(progress.info, start_time=start_at)
            progress.refresh(workers)
            control.release(start_at)
            return start_at
        if control.stop.is_set():
            control.release(time.time())
            return None
        renderer.refresh(board)
        time.sleep(0.1)
    return None


def _wait_collected(
    workers: Sequence[HostWorker],
    control: RunControl,
    board: ProgressBoard,
    renderer: Renderer,
    duration: float,
    analyze: bool,
    progress: RunJsonWriter,
) -> SparkWarmup | None:
    """Until every host's capture is home; clean-ups continue beside the analysis. A Spark session for
    a large analysis is warmed up once the window is over."""
    warmup: SparkWarmup | None = None
    window_end = (control.start_at or time.time()) + duration
    while not all(w.collected.is_set() for w in workers):
        if (
            analyze
            and warmup is None
            and len(workers) * duration >= SPARK_WARMUP_HOST_SECONDS
            and (time.time() >= window_end or control.stop.is_set())
        ):
            warmup = SparkWarmup.start_if_available()
        renderer.refresh(board)
        progress.refresh(workers)
        for worker in workers:
            worker.collected.wait(0.2 / len(workers))
    return warmup


class SparkWarmup(threading.Thread):
    """Starts the analysis's Spark session once sampling is over, while hosts write and send their
    captures, so the JVM start-up is not on the path from end of sampling to summary.csv."""

    def __init__(self) -> None:
        super().__init__(name="spark-warmup", daemon=True)
        self.session: Any = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._release = threading.Event()
        self.started_at = time.time()
        self.ready_at: float | None = None

    @classmethod
    def start_if_available(cls) -> SparkWarmup | None:
        warmup = cls()
        warmup.start()
        return warmup

    def run(self) -> None:
        try:
            from coordinator.analysis import engines as pipeline

            with pipeline.spark_session() as spark:
                self.session = spark
                self.ready_at = time.time()
                self.ready.set()
                self._release.wait()
        except BaseException as exc:  # noqa: BLE001 - the analysis falls back to its own session
            self.error = exc
        finally:
            self.ready.set()

    def take(self) -> Any:
        self.ready.wait()
        return self.session

    def close(self) -> None:
        self._release.set()
        self.join(120)


def analyze_run(outcome: ProfileOutcome) -> ProfileOutcome:
    """summary.csv and the report of a run profiled with ``analyze=False`` (after the caller added to
    its captures, e.g. the demo's event count from the engine's own progress)."""
    return _analyze(outcome)


def _analyze(outcome: ProfileOutcome, warmup: SparkWarmup | None = None, log: RunLog | None = None) -> ProfileOutcome:
    """summary.csv through the pipeline, then the HTML report."""
    summary: Path | None = None
    report_index: Path | None = None
    try:
        from coordinator.analysis import engines as pipeline
        from coordinator.report.render import render_report

        spark = warmup.take() if warmup is not None else None
        if log is not None and warmup is not None:
            log.write(
                "*",
                f"analysis: spark session warm-up began {warmup.started_at:.3f}, ready {warmup.ready_at or 0:.3f}, "
                f"used {time.time():.3f}",
            )
        result = (
            pipeline.analyze([outcome.run_dir], spark=spark)
            if spark is not None
            else pipeline.analyze([outcome.run_dir])
        )
        summary = Path(result.summary_csv)
        if log is not None:
            log.write("*", f"analysis: {summary.name} written at {time.time():.3f}")
        report_index = Path(render_report(outcome.run_dir))
        if log is not None:
            log.write("*", f"analysis: report written at {time.time():.3f}")
    except ProfilerError as exc:
        return replace(outcome, summary_csv=summary, report=report_index, analysis_error=str(exc))
    except Exception as exc:  # noqa: BLE001 - the captures are safe; the analysis can be re-run alone
        detail = one_line(f"{exc.__class__.__name__}: {exc}")
        return replace(outcome, summary_csv=summary, report=report_index, analysis_error=f"internal error: {detail}")
    return replace(outcome, summary_csv=summary, report=report_index)
