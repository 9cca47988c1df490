"""`coordinator demo --udf python`: YSB's deserialize, filter and projection as a Python UDF (docs/demo.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from coordinator.commands.demo import DemoCommand
from coordinator.workloads.ysb import pyudfs
from coordinator.workloads.ysb.engines import PYTHON_WORKER_SPES, SparkStructuredYsb
from coordinator.workloads.ysb.spark import YsbOptions, check_udf, python_udf_conf
from profiler.errors import ConfigError
from profiler.scope.spes import parse_known_spes
from tests.unit.coordinator.workloads.test_demo_offcpu import profiled_with


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    return parser


def test_sql_stays_the_default() -> None:
    assert _parser().parse_args([]).udf == "sql" == YsbOptions().udf
    assert _parser().parse_args(["--udf", "python"]).udf == "python"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--udf", "pandas"])  # no pandas or pyarrow in the venv


@pytest.mark.parametrize("spe", ["spark-cp", "spark-rtm", "flink"])
def test_python_udfs_only_on_structured_streaming(spe: str) -> None:
    with pytest.raises(ConfigError, match="only with --spe spark-str"):
        check_udf("python", spe)
    assert check_udf("sql", spe) == "sql"
    assert check_udf("python", "spark-str") == "python"


def test_demo_refuses_before_anything_starts(tmp_path: Path) -> None:
    args = _parser().parse_args(["--spe", "flink", "--udf", "python", "--out", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match="--udf python"):
        DemoCommand().run(args)
    args = _parser().parse_args(["--hosts", "1", "--udf", "python", "--out", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match="not with --hosts"):
        DemoCommand().run(args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("argv", "label"), [(["--udf", "python"], "python"), ([], None)])
def test_the_run_is_labelled_with_its_udf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], label: str | None
) -> None:
    seen = profiled_with(argv, tmp_path, monkeypatch)
    assert [options.labels.get("udf") for _, options in seen] == [label]


def test_the_workers_import_the_udf_from_this_tree_and_get_pickles() -> None:
    assert python_udf_conf(YsbOptions()) == {}
    conf = python_udf_conf(YsbOptions(udf="python"))
    root = str(Path(pyudfs.__file__).resolve().parents[3])
    assert conf["spark.executorEnv.PYTHONPATH"].split(":")[0] == root
    assert conf["spark.sql.execution.pythonUDF.arrow.enabled"] == "false"


def test_the_python_workers_are_in_the_scope_only_with_a_python_udf(tmp_path: Path) -> None:
    def kinds(udf: str) -> set[str]:
        engine = SparkStructuredYsb(YsbOptions(udf=udf), tmp_path)
        return {spe.kind for spe in parse_known_spes(engine.known_spes(), "demo")}

    assert "python-worker" not in kinds("sql")
    assert {"python-worker", "executor"} <= kinds("python")
    assert {spe.pattern for spe in parse_known_spes(PYTHON_WORKER_SPES, "demo")} == {"pyspark.daemon", "pyspark.worker"}


def test_the_udf_keeps_the_views_projected() -> None:
    view = {"ad_id": "a1", "event_type": "view", "event_time": "1700000000123", "user_id": "u"}
    assert pyudfs.view_of(json.dumps(view)) == ("a1", 1700000000123)
    assert pyudfs.view_of(json.dumps(view | {"event_type": "click"})) is None
