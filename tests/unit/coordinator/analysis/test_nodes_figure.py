"""The nodes figure of `coordinator demo --hosts 1,2,4` without hosts or Spark: runs on 1..16 hosts analysed
together (in-process engine) and drawn by the hosts label; the demo's --hosts arguments; the window's
events from the driver's progress."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coordinator.analysis.campaign import campaign_rows, figure_data, summary_label_columns
from coordinator.analysis.engines import analyze
from coordinator.analysis.rows import read_summary
from coordinator.commands._demo_hosts import HOSTS_LABEL, check_hosts_options, host_counts
from coordinator.workloads.ysb.engines import SparkStructuredYsb
from coordinator.workloads.ysb.spark import BatchProgress, YsbOptions
from profiler.errors import ConfigError
from tests.fixtures.captures import GC_STACK, JSON_STACK, KAFKA_STACK, PidSpec, write_run_dir

EVENTS = 40_000  # the window's events: the query's count, the same number in every host's events.json
PER_HOST_CYCLES = 1.0e9


def _run_on(tmp_path: Path, hosts: int) -> Path:
    """A run on ``hosts`` hosts, each with one executor doing the same work (half Kafka, a quarter each
    Deserialize and GC): the cluster does ``hosts`` times the work for the same events."""
    executor = {KAFKA_STACK: 50, JSON_STACK: 25, GC_STACK: 25}
    return write_run_dir(
        tmp_path / "runs" / f"hosts-{hosts}",
        f"hosts-{hosts}",
        {f"node{i}": [PidSpec(100 + i, executor, cycles=PER_HOST_CYCLES)] for i in range(1, hosts + 1)},
        labels={HOSTS_LABEL: str(hosts), "spe": "spark-structured-streaming", "workload": "ysb"},
        events={f"node{i}": EVENTS for i in range(1, hosts + 1)},
    )


def test_nodes_figure_is_cluster_cycles_per_event_by_hosts(tmp_path: Path) -> None:
    # GIVEN runs on 1, 2, 4 and 16 hosts (text order would put 16 before 2), analysed together
    runs = [_run_on(tmp_path, n) for n in (16, 1, 4, 2)]
    output = analyze(runs, out_dir=tmp_path / "campaign", engine="in-process")
    summary = read_summary(output.summary_csv)

    # WHEN the campaign rows and the figure's data are made by the hosts label
    rows = campaign_rows(summary, summary_label_columns(list(summary[0])))
    figure = figure_data(rows, HOSTS_LABEL, "spe")

    # THEN the x axis is the number of hosts, in numeric order
    assert figure["by"] == HOSTS_LABEL and figure["numeric"]
    assert figure["xs"] == ["1", "2", "4", "16"]
    assert figure["tasks"] == ["Kafka", "Deserialize", "GC", "unmatched"]
    # AND each point is the cluster row: every host's cycles over the events counted once (not once per
    # host), so the same work per host costs n times the cycles per event on n hosts
    cpe = {(p["task"], p["xValue"]): p["cpe"] for p in figure["points"]}
    for hosts in (1.0, 2.0, 4.0, 16.0):
        assert cpe[("Kafka", hosts)] == pytest.approx(hosts * PER_HOST_CYCLES * 0.5 / EVENTS)
        assert cpe[("Deserialize", hosts)] == pytest.approx(hosts * PER_HOST_CYCLES * 0.25 / EVENTS)
        assert cpe[("*", hosts)] == pytest.approx(hosts * PER_HOST_CYCLES / EVENTS)
    # AND the host rows of a run add up to its cluster row, task by task
    for task in ("Kafka", "Deserialize", "GC"):
        host_rows = [r for r in summary if r["run"] == "hosts-4" and r["task"] == task and r["pid"] == "*"]
        cluster = next(r for r in host_rows if r["host"] == "*")
        assert sum(float(r["cycles"]) for r in host_rows if r["host"] != "*") == pytest.approx(float(cluster["cycles"]))


def _demo_args(*words: str) -> argparse.Namespace:
    from coordinator.commands.demo import DemoCommand

    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    return parser.parse_args(list(words))


def test_demo_hosts_arguments() -> None:
    assert host_counts("4,1, 2") == [1, 2, 4]
    assert _demo_args("--hosts", "1,2,4").hosts == [1, 2, 4]
    assert _demo_args().hosts is None
    for bad in ("1,1", "0", "17", "a", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            host_counts(bad)
    # what --hosts does not spread yet is refused before anything starts, naming the option
    for words, option in (
        (["--spe", "flink"], "--spe"),
        (["--rates", "1000,2000"], "--rates"),
        (["--source", "kafka"], "--source"),
        (["--sink", "redis"], "--sink"),
        (["--off-cpu"], "--off-cpu"),
    ):
        with pytest.raises(ConfigError, match=option):
            check_hosts_options(_demo_args("--hosts", "1,2", *words))


class _Progress:
    """A query's run reduced to its micro-batches' progress."""

    def __init__(self, batches: list[BatchProgress]) -> None:
        self.batches = batches

    def progress(self) -> list[BatchProgress]:
        return self.batches


def _batch(number: int, began: float, rows: int) -> BatchProgress:
    stamp = datetime.fromtimestamp(began, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    return BatchProgress(number, stamp, rows, 0.0, 0.0, 1500)


def test_spark_str_counts_the_window_from_the_drivers_progress(tmp_path: Path) -> None:
    # GIVEN micro-batches beginning every 2 s from t = 100, each 1.5 s long, reading 1000, 1100, ... rows
    # (on --hosts no agent has the driver, so the demo writes this count into every host's events.json)
    engine = SparkStructuredYsb(YsbOptions(), tmp_path)
    engine.ysb = _Progress([_batch(b, 100.0 + 2 * b, 1000 + 100 * b) for b in range(5)])  # type: ignore[assignment]
    # WHEN the window is [101, 106]: the batches that finished in it began at 100, 102 and 104
    counted = engine.count_events(101.0, 106.0)
    # THEN their rows, by the profiler's REST rule (finish time), with the window and the source
    assert counted is not None and counted.count == 1000 + 1100 + 1200
    assert (counted.source, counted.window_start, counted.window_end) == ("spark-progress", 101.0, 106.0)
    assert "3 micro-batches" in counted.detail
    assert engine.count_events(200.0, 210.0) is None  # no batch finished: the profiler's count stands
    engine.ysb = None
