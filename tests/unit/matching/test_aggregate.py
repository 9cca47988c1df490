"""Pre-aggregation rows (Algorithm 1, lines 22-24) and the statistics behind share_ci95."""

from __future__ import annotations

import math

import pytest

from profiler.capture.format import RESULT_COLUMNS, CounterValue, NetStats, PidCounters, ProcessInfo, format_result_csv
from profiler.matching.aggregate import aggregate_host, aggregate_pid
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher, match_stacks
from profiler.matching.stats import share_ci95, two_proportion_z, wilson_interval

MATCHER = Matcher(parse_profile("Kafka: KafkaConsumer\nWindow: HashAggregateExec\nGC: GC Thread\n"))
# GIVEN three stacks with known counts: 5 Kafka, 3 Window, 2 unmatched; GC gets none
STACKS = {
    "Executor task;KafkaConsumer.poll": 5,
    "Executor task;HashAggregateExec.doExecute": 3,
    "Executor task;Foo.bar": 2,
}


def process(pid: int, role: str = "workload") -> ProcessInfo:
    return ProcessInfo(pid, role, "spark", "executor", "spark", "java ...", 0.0, 10.0)


def counters(pid: int, cycles: float | None, estimated: bool = False, instructions: float | None = None) -> PidCounters:
    events = {"task-clock": CounterValue(4e9, True, 1, 1)}
    events["instructions"] = (
        CounterValue(instructions, True, 1, 1) if instructions is not None else CounterValue(None, False, note="no PMU")
    )
    return PidCounters(pid, events, cycles, estimated, 2.0e9 if estimated else None, cpu_seconds=4.0)


def by_task(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["task"]: row for row in rows}


def test_shares_and_cycles_of_three_stacks() -> None:
    result = match_stacks(MATCHER, STACKS)
    pid_counters = counters(42, 1.0e9, instructions=2.5e9)
    rows = aggregate_pid("h1", process(42), result, pid_counters, NetStats(42, 100, 200, 10, 20))
    assert [row["task"] for row in rows] == ["Kafka", "Window", "GC", "unmatched", "*"]
    assert all(list(row) == list(RESULT_COLUMNS) for row in rows)
    tasks = by_task(rows)
    expected = {"Kafka": (5, 0.5), "Window": (3, 0.3), "GC": (0, 0.0), "unmatched": (2, 0.2)}
    for task, (samples, share) in expected.items():
        row = tasks[task]
        assert row["samples"] == samples
        assert row["share"] == pytest.approx(share, abs=1e-12)
        assert row["cycles"] == pytest.approx(share * 1.0e9, abs=1e-3)
        assert row["cpu_seconds"] == pytest.approx(share * 4.0, abs=1e-12)
        assert row["share_ci95"] == pytest.approx(share_ci95(samples, 10))
        assert row["cycles_estimated"] is False
        assert (row["host"], row["pid"], row["role"], row["engine"]) == ("h1", 42, "workload", "spark")
        # per-PID measurements only on the * row
        assert row["instructions"] is None and row["ipc"] is None and row["bytes_sent"] is None
    total = tasks["*"]
    assert total["samples"] == 10 and total["share"] == 1.0
    assert total["cycles"] == 1.0e9 and total["cpu_seconds"] == 4.0
    assert total["instructions"] == 2.5e9 and total["ipc"] == pytest.approx(2.5)
    assert (total["bytes_sent"], total["bytes_received"]) == (100, 200)
    assert (total["bytes_sent_external"], total["bytes_received_external"]) == (10, 20)
    assert sum(float(tasks[t]["cycles"]) for t in expected) == pytest.approx(1.0e9)  # type: ignore[arg-type]


def test_unsupported_and_missing_measurements_are_none_never_zero() -> None:
    result = match_stacks(MATCHER, STACKS)
    rows = by_task(aggregate_pid("h", process(7), result, counters(7, 8.0e9, estimated=True), None))
    assert rows["Kafka"]["cycles"] == pytest.approx(4.0e9)
    assert rows["Kafka"]["cycles_estimated"] is True
    assert rows["*"]["instructions"] is None and rows["*"]["ipc"] is None
    assert rows["*"]["bytes_sent"] is None
    no_counters = by_task(aggregate_pid("h", process(7), result, None, None))
    assert no_counters["Kafka"]["cycles"] is None and no_counters["Kafka"]["cpu_seconds"] is None
    assert no_counters["Kafka"]["cycles_estimated"] is None
    assert no_counters["Kafka"]["share"] == 0.5
    no_cycles = by_task(aggregate_pid("h", process(7), result, counters(7, None), None))
    assert no_cycles["Kafka"]["cycles"] is None and no_cycles["Kafka"]["cpu_seconds"] == 2.0
    # measured cycles but instructions unsupported: IPC unknown, not 0
    assert by_task(aggregate_pid("h", process(7), result, counters(7, 1e9), None))["*"]["ipc"] is None


def test_pid_without_samples_has_zero_rows_without_shares() -> None:
    rows = aggregate_pid("h", process(9), match_stacks(MATCHER, {}), counters(9, 1e9), None)
    assert [row["samples"] for row in rows] == [0, 0, 0, 0, 0]
    assert all(row["share"] is None and row["cycles"] is None for row in rows[:-1])
    assert rows[-1]["cycles"] == 1e9


def test_host_rows_ordered_by_pid_managing_only_totals() -> None:
    result = match_stacks(MATCHER, STACKS)
    procs = [process(30), process(5, role="managing"), process(12)]
    rows = aggregate_host(
        "h",
        procs,
        {30: result, 12: match_stacks(MATCHER, {"GC Thread#0;x": 4}), 5: result},
        {30: counters(30, 1e9), 5: counters(5, 3e8)},
        {5: NetStats(5, 1, 2)},
    )
    assert [(row["pid"], row["task"]) for row in rows] == [
        (5, "*"),
        (12, "Kafka"), (12, "Window"), (12, "GC"), (12, "unmatched"), (12, "*"),
        (30, "Kafka"), (30, "Window"), (30, "GC"), (30, "unmatched"), (30, "*"),
    ]
    assert rows[0]["cycles"] == 3e8 and rows[0]["samples"] is None and rows[0]["bytes_sent"] == 1
    csv_text = format_result_csv(rows)
    assert csv_text.splitlines()[0] == ",".join(RESULT_COLUMNS)
    assert aggregate_host("h", procs, {}, {}, {})[1]["task"] == "*"  # deterministic without results


@pytest.mark.parametrize(
    "k, n, low, high",
    [
        # reference values of the Wilson score interval (z = 1.96)
        (5, 10, 0.2366, 0.7634),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (1, 100, 0.0018, 0.0545),
        (500, 1000, 0.4691, 0.5309),
    ],
)
def test_wilson_interval(k: int, n: int, low: float, high: float) -> None:
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)
    assert share_ci95(k, n) == pytest.approx((high - low) / 2, abs=1e-4)


def test_share_ci95_edges() -> None:
    assert share_ci95(0, 0) == 0.0
    assert share_ci95(3, 7) > share_ci95(300, 700) > share_ci95(30000, 70000) > 0
    with pytest.raises(ValueError):
        share_ci95(5, 4)
    with pytest.raises(ValueError):
        share_ci95(-1, 4)


def test_two_proportion_z() -> None:
    z, p = two_proportion_z(60, 100, 40, 100)
    assert z == pytest.approx(2.8284, abs=1e-4)
    assert p == pytest.approx(math.erfc(2.8284271 / math.sqrt(2)), abs=1e-6)
    z, p = two_proportion_z(40, 100, 60, 100)
    assert z < 0 and p == pytest.approx(0.004678, abs=1e-5)
    assert two_proportion_z(0, 0, 1, 2) == (0.0, 1.0)
    assert two_proportion_z(0, 10, 0, 20) == (0.0, 1.0)
    assert two_proportion_z(50, 100, 50, 100) == (0.0, 1.0)
