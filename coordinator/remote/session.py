"""Profile every host of a cluster at once: connect, deploy, start together, watch, stop, fetch, clean up.

``profile_cluster`` is the Python API behind ``coordinator profile`` (the demo calls it too). One thread
per host (worker.py), so the wall time is the duration plus a small constant whatever the number of
hosts; this module checks the inputs, releases the hosts together, keeps run.json current and analyses
the captures once they are home.
"""

from __future__ import annotations

import platform
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from coordinator import rundir
from coordinator.errors import PartialRunError
from coordinator.remote.clock import SYSTEM_CLOCK, Clock
from coordinator.remote.cluster import HostSpec, load_cluster
from coordinator.remote.hosts import (
    HostTransport,
    LocalHost,
    RunRequest,
    one_line,
)
from coordinator.remote.progress import ProgressBoard, Renderer, make_renderer
from coordinator.remote.worker import READY_TIMEOUT, HostWorker, RunContext, RunControl, RunLog
from coordinator.rundir import HostOutcome, RunInfo
from profiler import __version__
from profiler.errors import ProfilerError, config_error
from profiler.files.outputs import MARKER, check_output_dir, mark_output_dir
from profiler.matching.appprofile import load_profile
from profiler.scope.spes import load_known_spes

__all__ = ["ProfileOutcome", "profile_cluster", "load_cluster", "make_transport", "prepare_run_dir"]

# Seconds after every host is deployed: the latest common start, which covers BPF compilation on the hosts.
# The start comes earlier once every profiler waits with its programs attached (_start_when_attached).
DEFAULT_START_DELAY = 10.0
# Seconds between "every profiler attached" and the common start it brings forward: each worker writes its
# host's start file in that time (a few SFTP round trips, START_ROUND_TRIPS of the slowest host's).
START_CONFIRM_LEAD = 0.4
START_ROUND_TRIPS = 4
# Seconds before RunOptions.not_before at most that the hosts are released: their profilers compile and
# attach (up to ~25 s on a loaded 2-core host without the compile cache), then wait with their perf events
# attached, which a long warm-up (--warmup 900) need not carry all along.
START_LEAD = 60.0
LOG_FILE = "coordinator.log"

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
    # The window's earliest start (coordinator clock; the demo: its warm-up's end). The hosts are still
    # released once they are ready, so they deploy and compile their BPF programs before it.
    not_before: float | None = None
    # Called by the main thread about once a second until the window starts (the demo: is the query
    # alive?); its ProfilerError stops every host, as Ctrl-C does, and profile_cluster raises it.
    watch: Callable[[], None] | None = None
    # What the run reads the time from and waits on (tests: a virtual clock, tests/fixtures/virtual_clock.py).
    clock: Clock = SYSTEM_CLOCK


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
    clock = options.clock
    info = _first_run_info(out_dir, hosts, request, options.labels, options.cluster_file, clock.time())
    rundir.write_run(out_dir, info)

    board = ProgressBoard([h.label for h in hosts])
    renderer = make_renderer(options.progress, options.stream)
    log = RunLog(out_dir / LOG_FILE, clock)
    control = RunControl(clock)
    finish_grace = max(60.0, 0.25 * request.duration) if options.finish_grace is None else options.finish_grace
    context = RunContext(request, out_dir, control, board, log, finish_grace, options.reconnect_window)
    workers = [HostWorker(factory(spec), context) for spec in hosts]
    progress = RunJsonWriter(out_dir, info)
    delay = DEFAULT_START_DELAY if options.start_delay is None else options.start_delay
    warmup: SparkWarmup | None = None
    watch = _Watch(options.watch, control, log)
    renderer.start()
    with _SigintToStop(control, renderer):
        try:
            for worker in workers:
                worker.start()
            start = (delay, options.not_before)
            start_at = _start_together(workers, control, board, renderer, log, start, progress, watch)
            if start_at is not None:
                start_at = _start_when_attached(
                    workers, control, board, renderer, log, options.not_before, progress, watch
                )
            if start_at is not None:
                info = replace(info, start_time=start_at)
                progress.info = replace(progress.info, start_time=start_at)
            warmup = _wait_collected(
                workers, control, board, renderer, request.duration, options.analyze and watch.error is None, progress,
                watch,
            )
        finally:
            renderer.stop(board)

        info = replace(info, end_time=clock.time()).with_hosts(tuple(w.outcome for w in workers))
        rundir.write_run(out_dir, info)
        warnings = tuple(w for worker in workers for w in worker.warnings)
        exit_code = 0 if info.complete else PartialRunError.exit_code
        outcome = ProfileOutcome(out_dir, info.complete, exit_code, info, warnings=warnings)
        control.analysing = True
        try:
            if watch.error is not None:
                raise watch.error  # after the hosts' clean-up below: nothing of the run is left running
            if options.analyze and any(h.has_capture for h in info.hosts):
                outcome = _analyze(outcome, warmup, log)
        finally:
            if warmup is not None:
                warmup.close()
            for worker in workers:
                clock.wait(worker.finished)  # through the run's clock: a clean-up may be retrying a lost host
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
    start_time: float,
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
        start_time=start_time,
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
    start: tuple[float, float | None],
    progress: RunJsonWriter,
    watch: _Watch,
) -> float | None:
    """Release every host at one moment once all are ready (or the wait timed out); the start time,
    or None when a stop came first. ``start``: the start delay after that moment, and the earliest
    start (RunOptions.not_before), whichever is later."""
    delay, not_before = start
    clock = control.clock
    ready_deadline = clock.monotonic() + READY_TIMEOUT
    while not control.go.is_set():
        progress.refresh(workers)
        watch.poll()
        if control.stop.is_set():
            control.release(clock.time())
            return None
        hosts_in = all(w.ready.is_set() for w in workers) or clock.monotonic() > ready_deadline
        if hosts_in and clock.time() >= (not_before or 0.0) - START_LEAD:
            start_at = max(clock.time() + delay, not_before or 0.0)
            log.write(
                "*",
                f"all hosts ready; sampling starts at {start_at:.3f} at the latest, earlier once every profiler "
                "is attached (coordinator clock)",
            )
            progress.info = replace(progress.info, start_time=start_at)
            progress.refresh(workers)
            control.release(start_at)
            return start_at
        renderer.refresh(board)
        clock.sleep(0.1)
    return None


def _start_when_attached(
    workers: Sequence[HostWorker],
    control: RunControl,
    board: ProgressBoard,
    renderer: Renderer,
    log: RunLog,
    not_before: float | None,
    progress: RunJsonWriter,
    watch: _Watch,
) -> float:
    """Once every released host's profiler waits with its programs attached (or failed), bring the common
    start forward to just ahead of now (never before ``not_before``); the start, the released latest one
    when a host is not ready in time. A host that never gets ready keeps the others only until then."""
    latest = control.start_at
    assert latest is not None
    lead = START_CONFIRM_LEAD + START_ROUND_TRIPS * max((w.transport.round_trip for w in workers), default=0.0)
    while not control.stop.is_set():
        now = control.clock.time()
        start_at = max(now + lead, not_before or 0.0)
        if start_at >= latest:
            return latest
        if all(w.armed.is_set() for w in workers):
            if not any(w.ready.is_set() and not w.collected.is_set() for w in workers):
                return latest  # no host left to start
            early = latest - start_at
            log.write("*", f"every profiler attached; sampling starts at {start_at:.3f}, {early:.1f} s early")
            control.confirm(start_at)
            progress.info = replace(progress.info, start_time=start_at)
            progress.refresh(workers)
            return start_at
        progress.refresh(workers)
        watch.poll()
        renderer.refresh(board)
        control.clock.sleep(0.05)
    return latest


def _wait_collected(
    workers: Sequence[HostWorker],
    control: RunControl,
    board: ProgressBoard,
    renderer: Renderer,
    duration: float,
    analyze: bool,
    progress: RunJsonWriter,
    watch: _Watch,
) -> SparkWarmup | None:
    """Until every host's capture is home; clean-ups continue beside the analysis. A Spark session for
    a large analysis is warmed up once the window is over."""
    warmup: SparkWarmup | None = None
    clock = control.clock
    window_end = (control.start_at or clock.time()) + duration
    while not all(w.collected.is_set() for w in workers):
        watch.poll()
        if (
            analyze
            and warmup is None
            and len(workers) * duration >= SPARK_WARMUP_HOST_SECONDS
            and (clock.time() >= window_end or control.stop.is_set())
        ):
            warmup = SparkWarmup.start_if_available()
        renderer.refresh(board)
        progress.refresh(workers)
        for worker in workers:
            clock.wait(worker.collected, 0.2 / len(workers))
    return warmup


WATCH_INTERVAL = 1.0  # seconds between two calls of RunOptions.watch


class _Watch:
    """RunOptions.watch, called by the main thread at most once per WATCH_INTERVAL until the window's
    planned start (released or not); its first ProfilerError is kept and stops every host."""

    def __init__(self, check: Callable[[], None] | None, control: RunControl, log: RunLog) -> None:
        self.check = check
        self.control = control
        self.log = log
        self.error: ProfilerError | None = None
        self._next = 0.0

    def poll(self) -> None:
        control = self.control
        if self.check is None or self.error is not None or control.stop.is_set():
            return
        if control.start_at is not None and control.clock.time() >= control.start_at:
            return  # the window has started: the caller checks its own things after it
        if control.clock.monotonic() < self._next:
            return
        self._next = control.clock.monotonic() + WATCH_INTERVAL
        try:
            self.check()
        except ProfilerError as exc:
            self.error = exc
            self.log.write("*", f"stopping every host before the window: {one_line(str(exc))}")
            control.stop.set()


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
