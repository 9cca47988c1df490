"""The order of `coordinator demo`'s steps (the real profile_cluster over a scripted FakeHost; no processes):
the profiler starts during the query's warm-up, its window beginning at the warm-up's end as before while
the query is watched; a campaign's level is analysed once its query is stopped."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.commands import demo
from coordinator.commands.demo import DemoCommand
from coordinator.remote import session
from coordinator.remote.hosts import RunRequest
from coordinator.remote.session import RunOptions
from coordinator.workloads.ysb.engines import WindowResult
from profiler.errors import ConfigError
from profiler.files.outputs import MARKER
from tests.fixtures.fake_host import FakeHost, FakeScript


class _Engine:
    """A running query that says when the demo waited on, checked and counted it."""

    spe = "spark-structured-streaming"
    profile = "application_profiles/spark_structured_streaming.txt"
    events_source = "the generator"

    log_dir = Path("/nonexistent")

    def __init__(self, dies_at: float | None = None, steps: list[str] | None = None) -> None:
        self.dies_at = dies_at
        self.steps = steps if steps is not None else []  # what happened to the cluster and its query, in order
        self.ready_at: float | None = None
        self.processing: list[tuple[float, float]] = []  # (when, seconds) of each wait_processing
        self.checks: list[float] = []
        self.windows: list[tuple[float, float]] = []

    def wait_ready(self, timeout: float) -> None:
        self.ready_at = time.time()

    def wait_processing(self, seconds: float) -> None:
        self.processing.append((time.time(), seconds))
        time.sleep(seconds)

    def check_running(self) -> None:
        self.checks.append(time.time())
        if self.dies_at is not None and time.time() >= self.dies_at:
            raise ConfigError("app.err: the YSB app exited with code 137 while running")

    def workload_pids(self) -> list[int]:
        return [1234]

    def known_spes(self) -> str:
        return "spark workload executor org.apache.spark.executor.CoarseGrainedExecutorBackend\n"

    def window(self, start: float, end: float) -> WindowResult:
        self.windows.append((start, end))
        self.steps.append("window")
        return WindowResult(3, "10 s windows", 300, "throughput 600 events/s", 3)

    def count_events(self, start: float, end: float) -> None:
        return None

    def describe(self) -> str:
        return "a fake cluster"

    def restart_query(self, rate: int) -> None:
        self.steps.append(f"query restarted at {rate}")

    def __enter__(self) -> _Engine:
        self.steps.append("cluster started")
        return self

    def __exit__(self, *exc: object) -> None:
        self.steps.append("cluster stopped")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    return parser.parse_args([*argv, "--quiet"])


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch) -> list[FakeHost]:
    """profile_cluster as the demo calls it, over a FakeHost whose BPF compiles in 0.3 s; a 0.2 s start delay."""
    made: list[FakeHost] = []
    real = session.profile_cluster

    def factory(spec: session.HostSpec) -> FakeHost:
        made.append(FakeHost(spec, FakeScript(compile_seconds=0.3)))
        return made[-1]

    def profile_cluster(hosts: object, request: RunRequest, out: Path, options: RunOptions) -> object:
        return real(hosts, request, out, replace(options, transport_factory=factory))  # type: ignore[arg-type]

    monkeypatch.setattr(session, "profile_cluster", profile_cluster)
    monkeypatch.setattr(session, "DEFAULT_START_DELAY", 0.2)
    return made


def _prepared(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    demo._prepare_out(out, force=False)
    return out


def test_the_profiler_starts_during_the_warm_up_and_samples_from_its_end(
    tmp_path: Path, hosts: list[FakeHost]
) -> None:
    # GIVEN a 1.5 s warm-up and a 0.5 s window
    engine = _Engine()
    args = _args("--warmup", "1.5", "--duration", "0.5")
    # WHEN the demo profiles its running query
    outcome, window, elapsed = DemoCommand.profile_running(args, _prepared(tmp_path), engine, tmp_path, 1000)  # type: ignore[arg-type]
    # THEN the host's profiler was deployed and started during the warm-up, not after it
    assert engine.ready_at is not None and engine.processing == []
    warmed_at = engine.ready_at + 1.5
    (host,) = hosts
    assert host._started is not None and host._started < warmed_at - 1.0  # inspecting the fake
    # AND the window is the same as before: it begins at the warm-up's end and lasts --duration
    started = outcome.info.hosts[0].start_time
    assert started == pytest.approx(warmed_at, abs=0.05)
    assert engine.windows == [(started, outcome.info.hosts[0].end_time)]
    assert elapsed == pytest.approx(0.5, abs=1e-6) and window.events == 300
    # AND the query was watched all through the warm-up, and checked again after the window
    during = [t for t in engine.checks if t < warmed_at]
    assert len(during) >= 2 and during[-1] > warmed_at - 1.1
    assert engine.checks[-1] >= outcome.info.hosts[0].end_time - 0.05


def test_a_cpu_warm_up_ends_before_the_profiler_starts(
    tmp_path: Path, hosts: list[FakeHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN --warmup-cpu, whose end is known only when it comes
    warmed: list[float] = []
    monkeypatch.setattr(demo, "warm_up_cpu", lambda engine, seconds, say: warmed.append(time.time()))
    engine = _Engine()
    args = _args("--warmup", "0.3", "--warmup-cpu", "5", "--duration", "0.3")
    outcome, _, _ = DemoCommand.profile_running(args, _prepared(tmp_path), engine, tmp_path, 1000)  # type: ignore[arg-type]
    # THEN the wall-clock and the CPU warm-up came first, then the profiler's start and its delay
    assert [seconds for _, seconds in engine.processing] == [0.3] and len(warmed) == 1
    (host,) = hosts
    assert host._started is not None and host._started >= warmed[0]
    assert outcome.info.hosts[0].start_time >= warmed[0] + 0.2


def test_a_query_that_dies_in_the_warm_up_fails_the_demo_and_leaves_no_run(
    tmp_path: Path, hosts: list[FakeHost]
) -> None:
    # GIVEN a query that dies 0.5 s into a 30 s warm-up
    engine = _Engine(dies_at=time.time() + 0.5)
    out = _prepared(tmp_path)
    began = time.monotonic()
    # WHEN profiled; THEN the query's error, within seconds, the host stopped and cleaned up
    with pytest.raises(ConfigError, match="YSB app exited"):
        DemoCommand.profile_running(_args("--warmup", "30", "--duration", "5"), out, engine, tmp_path, 1000)  # type: ignore[arg-type]
    assert time.monotonic() - began < 5.0
    assert all(host.cleaned for host in hosts)
    # AND the run directory is back to what the demo prepared: the failed demo's logs may go beside the marker
    assert [p.name for p in out.iterdir()] == [MARKER]


def test_a_campaign_analyses_each_level_once_its_query_is_stopped(
    tmp_path: Path, hosts: list[FakeHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a campaign of two rates on one (fake) cluster, and an analysis that says when it ran
    steps: list[str] = []
    engine = _Engine(steps=steps)
    monkeypatch.setitem(demo_engines(), "spark-str", lambda options, log_dir: engine)

    def analyze_run(outcome: session.ProfileOutcome) -> session.ProfileOutcome:
        steps.append(f"analysed {outcome.run_dir.name}")
        return outcome

    monkeypatch.setattr(session, "analyze_run", analyze_run)
    args = _args("--spe", "spark-str", "--rates", "1000,2000", "--warmup", "0.3", "--duration", "0.3")
    # WHEN the levels are profiled
    levels, exit_code = demo._campaign_engine(args, tmp_path / "campaign", "spark-str", [1000, 2000])
    # THEN the first level is analysed once its query is stopped (beside the next one's start-up), the last
    # once the cluster is stopped: never beside a query at full rate
    assert exit_code == 0 and [level.name for level in levels] == ["spark-str-1000", "spark-str-2000"]
    assert steps == [
        "cluster started", "window", "query restarted at 2000", "analysed spark-str-1000", "window",
        "cluster stopped", "analysed spark-str-2000",
    ]  # fmt: skip


def demo_engines() -> dict[str, object]:
    from coordinator.workloads.ysb.engines import ENGINES

    return ENGINES  # type: ignore[return-value]
