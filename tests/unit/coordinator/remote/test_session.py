"""Orchestration of a cluster run over scripted fake hosts: no processes, no network, and no real time:
each run reads and waits on a virtual clock (tests/fixtures/virtual_clock.py), so every timing below (start
delays, windows, grace, reconnect windows, warm-ups) is kept and checked in virtual seconds."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from coordinator import rundir
from coordinator.errors import HostKeyError, HostUnreachable, PartialRunError
from coordinator.remote.cluster import HostSpec, parse_cluster
from coordinator.remote.hosts import ProfilerStatus, TransportLost, run_request
from coordinator.remote.session import RunOptions, profile_cluster
from profiler.capture.format import EventCount
from profiler.errors import ConfigError, OutputExistsError
from tests.fixtures.fake_host import FakeHost, FakeScript
from tests.fixtures.sshcluster import write_inputs
from tests.fixtures.virtual_clock import ThreadedVirtualClock


def _specs(n: int) -> list[HostSpec]:
    return parse_cluster([f"10.0.0.{i + 1}:22{i:02d} worker" for i in range(n)], "cluster.txt")


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    known = "spark workload executor org.apache.spark.executor.CoarseGrainedExecutorBackend\n"
    return write_inputs(tmp_path, "Task A\n  a.b.C.run\n", known)


def _run(tmp_path: Path, inputs: tuple[Path, Path], scripts: dict[str, FakeScript], **kwargs: object):
    specs = kwargs.pop("specs", None) or _specs(len(scripts))
    clock = kwargs.pop("clock", None) or ThreadedVirtualClock()
    assert isinstance(clock, ThreadedVirtualClock)
    fakes: dict[str, FakeHost] = {}

    def factory(spec: HostSpec) -> FakeHost:
        fakes[spec.label] = FakeHost(spec, scripts.get(spec.label, FakeScript()), clock=clock.time)
        return fakes[spec.label]

    out = kwargs.pop("out", tmp_path / "run")
    request = run_request(float(kwargs.pop("duration", 0.6)), inputs[0], inputs[1])
    options = RunOptions(
        analyze=False,
        transport_factory=factory,
        start_delay=kwargs.pop("start_delay", 0.2),
        stream=io.StringIO(),
        clock=clock,
        **kwargs,
    )
    outcome = profile_cluster(specs, request, out, options)
    return outcome, fakes


def test_all_hosts_ok_gives_complete_run_and_exit_0(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    counted = EventCount(600_000, "flink-rest:x", "d", method="interpolated between metric-cache refreshes",
                         uncertainty=1200.0)
    scripts = {"10.0.0.1_2200": FakeScript(clock_offset=0.25), "10.0.0.2_2201": FakeScript(events=counted)}
    outcome, fakes = _run(tmp_path, inputs, scripts)
    assert outcome.complete and outcome.exit_code == 0
    info = rundir.read_run(outcome.run_dir)
    assert info.complete
    assert [h.state for h in info.hosts] == ["ok", "ok"]
    assert info.hosts[0].clock_offset == pytest.approx(0.25)
    # run.json says each host's event count, its uncertainty and how it was estimated
    assert (info.hosts[0].events, info.hosts[0].events_method) == (None, "")
    assert (info.hosts[1].events, info.hosts[1].events_uncertainty, info.hosts[1].events_method) == (
        600_000, 1200.0, "interpolated between metric-cache refreshes")
    assert info.hosts[0].roles == ("worker",)
    for fake in fakes.values():
        assert fake.calls[:4] == ["connect", "deploy", "profiler doctor --preflight --json", "start"]
        assert fake.cleaned
    assert [h.workdir for h in info.hosts] == ["", ""], "a cleaned-up host names no work directory"
    assert (outcome.run_dir / rundir.PROFILE_COPY).read_text() == inputs[0].read_text()
    assert (outcome.run_dir / rundir.CLUSTER_COPY).is_file()
    assert rundir.host_capture_dir(outcome.run_dir, "10.0.0.1_2200").joinpath("meta.json").is_file()


def test_hosts_start_together_and_run_in_parallel(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    # GIVEN 6 hosts of a 1-second run; WHEN profiled; THEN wall time is about one duration, not six
    scripts = {spec.label: FakeScript() for spec in _specs(6)}
    clock = ThreadedVirtualClock()
    began = clock.monotonic()
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=1.0, clock=clock)
    assert clock.monotonic() - began < 4.0
    starts = {fake._request.start_at for fake in fakes.values()}  # inspecting the fake
    assert len(starts) == 1 and None not in starts
    assert outcome.complete


def test_one_host_down_gives_partial_run(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    scripts = {
        "10.0.0.1_2200": FakeScript(connect_error=HostUnreachable("cluster.txt:1: cannot connect (refused)")),
        "10.0.0.2_2201": FakeScript(),
    }
    outcome, fakes = _run(tmp_path, inputs, scripts)
    assert not outcome.complete
    assert outcome.exit_code == PartialRunError.exit_code != 0
    info = rundir.read_run(outcome.run_dir)
    down, up = info.hosts
    assert down.state == "failed" and "refused" in down.reason
    assert up.state == "ok"
    assert "start" not in fakes["10.0.0.1_2200"].calls


def test_host_key_error_is_reported_per_host(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(connect_error=HostKeyError("unknown host key SHA256:abc"))}
    outcome, _ = _run(tmp_path, inputs, scripts)
    assert outcome.info.hosts[0].state == "failed"
    assert "SHA256:abc" in outcome.info.hosts[0].reason


def test_connection_lost_mid_run_reconnects_and_collects(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(lose_connection_at=0.3, reconnect_failures=1)}
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=1.0)
    assert outcome.complete, outcome.info.hosts
    assert fakes["10.0.0.1_2200"].calls.count("connect") >= 3


def test_profiler_crash_marks_host_failed(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(crash_at=0.1, fetch_error=None), "10.0.0.2_2201": FakeScript()}
    outcome, _ = _run(tmp_path, inputs, scripts)
    crashed = outcome.info.hosts[0]
    assert crashed.state in ("failed", "partial") and "crashed" in crashed.reason
    assert outcome.exit_code == PartialRunError.exit_code


def test_stop_request_stops_every_host_and_keeps_partial_results(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    # GIVEN a 30-second run; WHEN SIGINT arrives after 1 s (a timer of the run's clock sends it)
    clock = ThreadedVirtualClock()
    clock.after(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    scripts = {spec.label: FakeScript() for spec in _specs(2)}
    began = clock.monotonic()
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=30.0, clock=clock)
    # THEN every profiler got SIGINT, results were fetched, and the run is partial
    assert 1.0 <= clock.monotonic() - began < 10
    for fake in fakes.values():
        assert "signal INT" in fake.calls and "fetch" in fake.calls and fake.cleaned
    assert [h.state for h in outcome.info.hosts] == ["partial", "partial"]
    assert all("Ctrl-C" in h.reason for h in outcome.info.hosts)
    assert outcome.exit_code == PartialRunError.exit_code


def test_existing_run_dir_needs_force(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    scripts = {"10.0.0.1_2200": FakeScript()}
    outcome, _ = _run(tmp_path, inputs, scripts)
    with pytest.raises(OutputExistsError):
        _run(tmp_path, inputs, scripts, out=outcome.run_dir)
    again, _ = _run(tmp_path, inputs, scripts, out=outcome.run_dir, force=True)
    assert again.complete


def test_force_never_removes_a_directory_that_is_not_a_run(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("x")
    with pytest.raises(OutputExistsError):
        _run(tmp_path, inputs, {"10.0.0.1_2200": FakeScript()}, out=precious, force=True)
    assert (precious / "thesis.tex").exists()


def test_status_parsing_tolerates_garbage() -> None:
    assert ProfilerStatus.from_json("{") is None
    assert ProfilerStatus.from_json('{"state": "bogus"}') is None
    status = ProfilerStatus.from_json('{"state": "sampling", "elapsed": 2.5, "samples": true, "pid": 7}')
    assert status is not None and status.samples is None and status.pid == 7 and status.elapsed == 2.5


def test_doctor_table_joins_hosts_and_lists_fixes() -> None:
    from coordinator.commands.doctor import (
        HostReport,
        doctor_cluster,
        doctor_exit_code,
        format_doctor_table,
    )
    from coordinator.remote.hosts import parse_doctor_output

    specs = _specs(2)
    reports = doctor_cluster(specs, Path("p"), Path("k"), lambda spec: FakeHost(spec, FakeScript()))
    assert [r.host for r in reports] == [s.label for s in specs] and doctor_exit_code(reports) == 0
    checks = parse_doctor_output(
        '[{"check": "bcc", "status": "fail", "detail": "no\\nheaders \\u001b[31m", "fix": "install them"}]'
    )
    table = format_doctor_table([HostReport("a", checks), HostReport("b", error="cannot connect")])
    lines = table.splitlines()
    assert lines[0].split() == ["check", "a", "b"]
    assert lines[1].split() == ["reachable", "ok", "fail"] and lines[2].split() == ["bcc", "fail", "-"]
    assert "a: bcc fail: no headers ?[31m; fix: install them" in table and "b: cannot connect" in table
    assert "\x1b" not in table
    assert doctor_exit_code([HostReport("a", checks)]) == 1
    with pytest.raises(ValueError):
        parse_doctor_output('{"check": "x"}')


def test_plain_progress_prints_one_line_per_change() -> None:
    from coordinator.remote.progress import PlainRenderer, ProgressBoard, RichRenderer

    board = ProgressBoard(["a", "b"])
    stream = io.StringIO()
    renderer = PlainRenderer(stream, every=3600)
    board.update("a", phase="sampling", elapsed=3.0, remaining=7.0, processes=2)
    renderer.refresh(board)
    renderer.refresh(board)  # nothing changed: nothing printed again
    board.update("b", phase="failed", message="[red]cannot connect[/red]")
    renderer.stop(board)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "a: sampling, 3 s, 7 s left, 2 processes",
        "b: queued",
        "b: failed, [red]cannot connect[/red]",
    ]
    # rich shows remote text literally, never as markup
    rich = RichRenderer(io.StringIO())
    table = rich._table(board)  # checking the cells
    assert "[red]cannot connect[/red]" in [str(cell) for cell in table.columns[-1]._cells]


@pytest.mark.parametrize(
    ("which", "text", "expected"),
    [
        ("profile", "Alpha: a.b.C\nBeta: re:(unclosed\n", "profile.txt:2:"),
        ("known", "spark executor\n", "known_spes.txt:1:"),
    ],
)
def test_bad_profile_or_known_spes_fails_before_any_host_is_touched(
    tmp_path: Path, inputs: tuple[Path, Path], which: str, text: str, expected: str
) -> None:
    # GIVEN a bad line in the user's own application profile or known_spes file
    (inputs[0] if which == "profile" else inputs[1]).write_text(text)
    touched: list[str] = []

    def factory(spec: HostSpec) -> FakeHost:
        touched.append(spec.label)
        return FakeHost(spec, FakeScript())

    # WHEN profiling THEN one ConfigError names the user's file and line; no host, no run directory
    with pytest.raises(ConfigError) as failure:
        profile_cluster(
            _specs(2),
            run_request(0.5, inputs[0], inputs[1]),
            tmp_path / "run",
            RunOptions(analyze=False, transport_factory=factory, stream=io.StringIO()),
        )
    assert expected in str(failure.value) and str(tmp_path) in str(failure.value)
    assert failure.value.exit_code == ConfigError.exit_code
    assert touched == [] and not (tmp_path / "run").exists()


def test_host_failing_the_preflight_is_refused_before_the_start_with_the_reason(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(preflight_fail="bcc not importable (No module named 'bcc')")}
    outcome, fakes = _run(tmp_path, inputs, {**scripts, "10.0.0.2_2201": FakeScript()})
    assert outcome.exit_code == PartialRunError.exit_code
    refused, other = rundir.read_run(outcome.run_dir).hosts
    assert refused.state == "failed" and "python-modules: bcc not importable" in refused.reason
    assert "start" not in fakes["10.0.0.1_2200"].calls and fakes["10.0.0.1_2200"].cleaned
    assert other.state == "ok"


def test_run_json_names_each_work_directory_while_the_run_is_under_way(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN a run whose run.json is read while the hosts sample (what a killed coordinator leaves)
    seen: list[rundir.RunInfo] = []
    out = tmp_path / "run"
    clock = ThreadedVirtualClock()

    def watch() -> None:
        deadline = clock.monotonic() + 10
        while clock.monotonic() < deadline and not seen:
            try:
                info = rundir.read_run(out)
            except Exception:  # noqa: BLE001 - not written yet
                info = None
            if info is not None and all(h.workdir for h in info.hosts):
                seen.append(info)
            clock.sleep(0.02)

    watcher = threading.Thread(target=watch)
    clock.adopt(watcher)
    watcher.start()
    outcome, _fakes = _run(tmp_path, inputs, {"10.0.0.1_2200": FakeScript()}, duration=1.0, out=out, clock=clock)
    clock.join(watcher)
    # THEN it named the work directory and the recovery command, and the final one names none
    (host,) = seen[0].hosts
    assert host.workdir == "/tmp/taskprof.fake-10.0.0.1_2200" and "coordinator fetch" in host.reason
    assert seen[0].start_time is not None
    assert rundir.read_run(outcome.run_dir).hosts[0].workdir == ""


def test_host_lost_beyond_the_reconnect_window_keeps_its_work_directory_for_fetch(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    lost_script = FakeScript(lose_connection_at=0.2, reconnect_failures=10**6)
    scripts = {"10.0.0.1_2200": lost_script, "10.0.0.2_2201": FakeScript()}
    clock = ThreadedVirtualClock()
    began = clock.monotonic()
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=0.6, finish_grace=0.2, reconnect_window=0.5, clock=clock)
    assert clock.monotonic() - began < 10, "the reconnect window bounds the wait"
    assert outcome.exit_code == PartialRunError.exit_code
    lost, other = rundir.read_run(outcome.run_dir).hosts
    assert lost.state == "failed" and lost.reason.startswith("connection lost and not re-established")
    assert lost.workdir == "/tmp/taskprof.fake-10.0.0.1_2200" and "coordinator fetch" in lost.reason
    assert "fetch" not in fakes["10.0.0.1_2200"].calls, "no fetch is tried once the host is given up"
    assert other.state == "ok" and other.workdir == ""


def test_a_host_compiling_longer_than_start_delay_and_grace_is_not_stopped_early(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(compile_seconds=1.5)}
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=0.6, finish_grace=0.3)
    assert outcome.complete, outcome.info.hosts
    assert "signal INT" not in fakes["10.0.0.1_2200"].calls


def test_a_killed_profiler_is_recovered_from_its_journal_and_the_host_is_partial(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN node 1's profiler killed 1 s into a 3 s window, its journal recoverable; node 2's without one
    scripts = {
        "10.0.0.1_2200": FakeScript(vanish_at=1.0, recovered_samples=77),
        "10.0.0.2_2201": FakeScript(vanish_at=1.0),
        "10.0.0.3_2202": FakeScript(),
    }
    outcome, fakes = _run(tmp_path, inputs, scripts, duration=3.0)
    recovered, lost, whole = outcome.info.hosts
    # THEN the recovered host is partial with why and how much, its capture home; the other failed, saying why
    assert recovered.state == "partial", recovered
    assert "vanished without an error" in recovered.reason and "recovered 77 samples up to" in recovered.reason
    assert rundir.host_capture_dir(outcome.run_dir, recovered.host).joinpath("meta.json").exists()
    assert lost.state == "failed" and "nothing recovered: " in lost.reason and "no whole checkpoint" in lost.reason
    assert whole.state == "ok" and outcome.exit_code == PartialRunError.exit_code
    assert fakes[recovered.host].calls.count("recover") == 1 and "recover" not in fakes[whole.host].calls
    assert all(f.cleaned for f in fakes.values())


def test_a_refused_capture_fails_that_host_with_one_line(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    # GIVEN a host whose capture stream holds a link (what coordinator.remote.untar refuses)
    from coordinator.remote.untar import CaptureRefused

    refusal = CaptureRefused("capture member 'a-link' refused: a symbolic link, not a regular file or a directory")
    scripts = {"10.0.0.1_2200": FakeScript(fetch_error=refusal), "10.0.0.2_2201": FakeScript()}
    # WHEN the cluster is profiled
    outcome, fakes = _run(tmp_path, inputs, scripts)
    # THEN that host failed with the refusal as its reason (never retried as a lost connection), the
    # other is complete, and the refused host was cleaned up all the same
    refused, other = outcome.info.hosts
    assert refused.state == "failed" and "a-link" in refused.reason and "\n" not in refused.reason
    assert fakes["10.0.0.1_2200"].calls.count("fetch") == 1 and fakes["10.0.0.1_2200"].cleaned
    assert other.state == "ok"
    assert outcome.exit_code == PartialRunError.exit_code


def test_hosts_start_during_the_callers_warm_up_and_sample_from_its_end(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN a warm-up ending 1.5 s from now (RunOptions.not_before) and hosts whose BPF takes 0.5 s
    scripts = {spec.label: FakeScript(compile_seconds=0.5) for spec in _specs(2)}
    clock = ThreadedVirtualClock()
    warmed_at = clock.time() + 1.5
    # WHEN profiled with a start delay shorter than the warm-up
    outcome, fakes = _run(tmp_path, inputs, scripts, not_before=warmed_at, clock=clock)
    # THEN every profiler was started (deploy, compile) during the warm-up, and the window began at its end
    for fake in fakes.values():
        assert fake._started is not None and fake._started < warmed_at - 1.0  # inspecting the fake
        assert fake._request is not None and fake._request.start_at == warmed_at
    assert outcome.complete
    assert outcome.info.start_time == warmed_at
    assert [h.start_time for h in outcome.info.hosts] == [pytest.approx(warmed_at, abs=1e-6)] * 2


def test_a_warm_up_shorter_than_the_start_delay_keeps_the_delay(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    clock = ThreadedVirtualClock()
    began = clock.time()
    outcome, fakes = _run(
        tmp_path, inputs, {"10.0.0.1_2200": FakeScript()}, start_delay=0.5, not_before=began, clock=clock
    )
    start_at = fakes["10.0.0.1_2200"]._request.start_at  # type: ignore[union-attr]
    assert start_at is not None and start_at >= began + 0.5
    assert outcome.complete


def test_a_long_warm_up_releases_the_hosts_only_the_lead_before_its_end(
    tmp_path: Path, inputs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a lead of 0.5 s (60 s in use) and a warm-up ending 1.5 s from now
    from coordinator.remote import session

    monkeypatch.setattr(session, "START_LEAD", 0.5)
    clock = ThreadedVirtualClock()
    warmed_at = clock.time() + 1.5
    outcome, fakes = _run(tmp_path, inputs, {"10.0.0.1_2200": FakeScript()}, not_before=warmed_at, clock=clock)
    # THEN the profiler was started no sooner than the lead before the warm-up's end, and sampled from its end
    started = fakes["10.0.0.1_2200"]._started
    assert started is not None and warmed_at - 0.5 <= started < warmed_at
    assert outcome.info.hosts[0].start_time == pytest.approx(warmed_at, abs=1e-6)


def test_a_failed_watch_before_the_window_stops_every_host_and_is_raised(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN a caller's check (the demo: is the query alive?) that fails 0.6 s into a 2 s warm-up
    clock = ThreadedVirtualClock()
    began = clock.time()
    checks: list[float] = []

    def query_alive() -> None:
        checks.append(clock.time())
        if clock.time() - began > 0.6:
            raise ConfigError("app.err: the YSB app exited with code 137")

    scripts = {spec.label: FakeScript() for spec in _specs(2)}
    fakes: dict[str, FakeHost] = {}

    def factory(spec: HostSpec) -> FakeHost:
        fakes[spec.label] = FakeHost(spec, scripts[spec.label], clock=clock.time)
        return fakes[spec.label]

    request = run_request(5.0, inputs[0], inputs[1])
    options = RunOptions(
        analyze=False, transport_factory=factory, start_delay=0.2, stream=io.StringIO(), not_before=began + 2.0,
        watch=query_alive, clock=clock,
    )
    # WHEN profiled; THEN its error is raised, well before the window would have ended, once every host is
    # stopped and cleaned up, and no host sampled
    with pytest.raises(ConfigError, match="YSB app exited"):
        profile_cluster(_specs(2), request, tmp_path / "run", options)
    assert clock.time() - began < 4.0
    assert len(checks) >= 2
    for fake in fakes.values():
        assert fake.cleaned
        assert "signal INT" in fake.calls or "start" not in fake.calls
    info = rundir.read_run(tmp_path / "run")
    assert not info.complete and all(h.state != "ok" for h in info.hosts), info.hosts


def test_the_watch_is_not_called_once_the_window_started(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    checks: list[float] = []
    clock = ThreadedVirtualClock()
    outcome, fakes = _run(
        tmp_path, inputs, {"10.0.0.1_2200": FakeScript()}, duration=1.0, not_before=clock.time() + 1.0,
        watch=lambda: checks.append(clock.time()), clock=clock,
    )  # fmt: skip
    start_at = fakes["10.0.0.1_2200"]._request.start_at  # type: ignore[union-attr]
    assert outcome.complete and start_at is not None
    assert checks and max(checks) < start_at


def test_hosts_start_together_as_soon_as_every_profiler_is_attached(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    # GIVEN three hosts whose BPF compiles in 0.2-0.6 s (one with its clock 40 s ahead) and a start delay of 8 s
    scripts = {
        "10.0.0.1_2200": FakeScript(compile_seconds=0.2),
        "10.0.0.2_2201": FakeScript(compile_seconds=0.6, clock_offset=40.0),
        "10.0.0.3_2202": FakeScript(compile_seconds=0.4),
    }
    clock = ThreadedVirtualClock()
    began = clock.time()
    # WHEN profiled
    outcome, fakes = _run(tmp_path, inputs, scripts, start_delay=8.0, duration=0.5, clock=clock)
    # THEN the window began once the slowest was attached, not 8 s after the release: one start, confirmed
    # to every host in its own clock, after each one's compile, and recorded as the run's start
    latest = {fake._request.start_at for fake in fakes.values()}  # inspecting the fake
    confirmed = {fake.confirmed_start for fake in fakes.values()}
    assert len(latest) == 1 and len(confirmed) == 1 and None not in confirmed
    (start,) = confirmed
    assert start is not None and start < latest.pop() - 6.0  # the start file's time: to the millisecond
    for fake in fakes.values():
        assert fake._started is not None and start >= fake._started + fake.script.compile_seconds
    assert clock.time() - began < 5.0
    assert outcome.complete and not outcome.warnings
    assert outcome.info.start_time == pytest.approx(start, abs=1e-3)
    assert [h.start_time - (h.clock_offset or 0.0) for h in outcome.info.hosts] == [pytest.approx(start, abs=1e-6)] * 3
    log = (outcome.run_dir / "coordinator.log").read_text()
    assert "every profiler attached; sampling starts at" in log


def test_a_host_never_attached_keeps_the_others_only_until_the_latest_start(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN one host compiling for 3 s and a start delay of 1 s
    scripts = {"10.0.0.1_2200": FakeScript(compile_seconds=3.0), "10.0.0.2_2201": FakeScript()}
    outcome, fakes = _run(tmp_path, inputs, scripts, start_delay=1.0, duration=0.5, finish_grace=5.0)
    # THEN no start was confirmed: the ready host sampled from the latest start, the slow one when attached,
    # with the warning that names the fix
    latest = fakes["10.0.0.2_2201"]._request.start_at  # type: ignore[union-attr]
    assert all(fake.confirmed_start is None and "start file" not in fake.calls for fake in fakes.values())
    slow, ready = outcome.info.hosts
    assert ready.start_time == pytest.approx(latest, abs=1e-6) and slow.start_time > latest + 1.0
    assert outcome.complete
    assert [w.split(":")[0] for w in outcome.warnings] == ["10.0.0.1_2200"]
    assert "raise --start-delay" in outcome.warnings[0]


def test_a_host_failing_before_it_is_attached_does_not_hold_the_others(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    scripts = {"10.0.0.1_2200": FakeScript(deploy_error=HostUnreachable("cluster.txt:1: upload failed")),
               "10.0.0.2_2201": FakeScript(compile_seconds=0.2)}  # fmt: skip
    clock = ThreadedVirtualClock()
    began = clock.time()
    outcome, fakes = _run(tmp_path, inputs, scripts, start_delay=8.0, duration=0.5, clock=clock)
    failed, ok = outcome.info.hosts
    assert failed.state == "failed" and ok.state == "ok"
    assert fakes["10.0.0.2_2201"].confirmed_start is not None and clock.time() - began < 5.0


def test_a_start_file_not_written_leaves_that_host_at_the_latest_start_with_why(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN two hosts, the start file of one not writable (its link dropped at that moment)
    lost = TransportLost("10.0.0.1_2200: writing the start file on 10.0.0.1:2200 failed (fake)")
    scripts = {"10.0.0.1_2200": FakeScript(start_file_error=lost), "10.0.0.2_2201": FakeScript()}
    outcome, fakes = _run(tmp_path, inputs, scripts, start_delay=2.0, duration=0.5)
    # THEN the other started early, this one at the latest start, and the warning says why
    missed, early = outcome.info.hosts
    latest = fakes[missed.host]._request.start_at  # type: ignore[union-attr]
    assert early.start_time == pytest.approx(outcome.info.start_time, abs=1e-3)  # the start file: to the ms
    assert outcome.info.start_time < latest - 1.0
    assert missed.start_time == pytest.approx(latest, abs=1e-6)
    assert outcome.complete and len(outcome.warnings) == 1
    assert "the start did not reach it: 10.0.0.1_2200: writing the start file" in outcome.warnings[0]


def test_a_warm_up_longer_than_the_attachment_still_starts_at_its_end(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    # GIVEN a warm-up ending 1.2 s from now, hosts attached in 0.2 s and a start delay of 5 s
    clock = ThreadedVirtualClock()
    warmed_at = clock.time() + 1.2
    scripts = {spec.label: FakeScript(compile_seconds=0.2) for spec in _specs(2)}
    outcome, fakes = _run(tmp_path, inputs, scripts, start_delay=5.0, not_before=warmed_at, clock=clock)
    # THEN the start was brought forward to the warm-up's end, not before it
    assert [fake.confirmed_start for fake in fakes.values()] == [pytest.approx(warmed_at, abs=1e-3)] * 2
    assert outcome.info.start_time == warmed_at and outcome.complete
