"""`coordinator demo --spark-window state|sink`: where Spark STR keeps YSB's 10 s windows (docs/demo.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from coordinator.commands.demo import DemoCommand
from coordinator.workloads.ysb.spark import SPARK_WINDOWS, YsbOptions, check_spark_window
from profiler.errors import ConfigError
from tests.unit.coordinator.workloads.test_demo_offcpu import profiled_with


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    return parser


def test_the_default_stays_spark_s_stateful_window() -> None:
    assert _parser().parse_args([]).spark_window == "state" == YsbOptions().spark_window
    assert _parser().parse_args(["--spark-window", "sink"]).spark_window == "sink"
    assert SPARK_WINDOWS == ("state", "sink")
    with pytest.raises(SystemExit):
        _parser().parse_args(["--spark-window", "operator"])


@pytest.mark.parametrize(
    ("window", "spe", "sink"),
    [
        ("sink", "spark-cp", "auto"), ("sink", "flink", "auto"), ("sink", "spark-str", "file"),
        ("redis", "spark-str", "auto"),
    ],
)
def test_the_sink_window_is_for_spark_str_into_redis_only(window: str, spe: str, sink: str) -> None:
    with pytest.raises(ConfigError):
        check_spark_window(window, spe, sink)


def test_other_choices_pass() -> None:
    assert check_spark_window("sink", "spark-str", "redis") == "sink"
    assert check_spark_window("sink", "spark-str", "auto") == "sink"
    for spe in ("spark-str", "spark-cp", "flink"):
        assert check_spark_window("state", spe, "file") == "state"


def test_demo_refuses_the_sink_window_before_anything_starts(tmp_path: Path) -> None:
    args = _parser().parse_args(["--spe", "flink", "--spark-window", "sink", "--out", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match="only with --spe spark-str"):
        DemoCommand().run(args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("argv", "label"), [(["--spark-window", "sink"], "sink"), ([], None)])
def test_the_run_is_labelled_with_a_sink_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], label: str | None
) -> None:
    # the label keeps the two kinds of runs apart in summary.csv, reports and campaigns
    seen = profiled_with(argv, tmp_path, monkeypatch)
    assert [options.labels.get("spark_window") for _, options in seen] == [label]


def test_the_query_refuses_a_sink_window_without_redis(tmp_path: Path) -> None:
    from coordinator.workloads.ysb.spark import YsbRun

    class _Cluster:
        tmp_dir = tmp_path

        def submit(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("nothing may start")

    with pytest.raises(ConfigError, match="--spark-window sink"):
        YsbRun(_Cluster(), YsbOptions(sink="file", spark_window="sink")).start()  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
