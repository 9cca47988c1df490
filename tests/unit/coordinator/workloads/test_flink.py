"""Pure parts of the local Flink cluster and the Flink YSB demo: the config written, the demo's process
selection, the job's own event count from its Redis windows."""

from __future__ import annotations

import atexit
from pathlib import Path

import pytest

from coordinator.workloads import flinkcluster
from coordinator.workloads.flinkcluster import (
    JOBMANAGER_MAIN_CLASS,
    TASKMANAGER_MAIN_CLASS,
    LocalFlinkCluster,
    _shipped_java_opts,
)
from coordinator.workloads.ysb.flink import (
    FlinkYsbEngine,
    events_between,
    flink_known_spes,
    taskmanager_java_options,
    windows_fired_at,
)
from coordinator.workloads.ysb.spark import YsbOptions
from profiler.errors import ConfigError
from profiler.scope.spes import classify, default_known_spes_path, load_known_spes, parse_known_spes

JAVA = ["/usr/lib/jvm/java-17-openjdk-amd64/bin/java", "-Xmx301989882", "-XX:+PreserveFramePointer",
        "-classpath", "/x/lib/flink-dist-2.3.0.jar"]


def test_config_has_frame_pointers_loopback_and_our_ports(tmp_path: Path) -> None:
    cluster = LocalFlinkCluster(log_dir=tmp_path, taskmanager_java_options="-XX:CompileCommandFile=/c")
    cluster._tmp = tmp_path
    cluster.rest_port, cluster.rpc_port = 40001, 40002
    config = cluster.config()
    assert config["env.java.opts.taskmanager"] == "-XX:+PreserveFramePointer -XX:CompileCommandFile=/c"
    assert config["env.java.opts.jobmanager"] == "-XX:+PreserveFramePointer"
    assert (config["rest.port"], config["jobmanager.rpc.port"]) == ("40001", "40002")
    assert {config[k] for k in ("rest.address", "rest.bind-address", "taskmanager.host", "jobmanager.bind-host")} == {
        "127.0.0.1"}
    assert config["taskmanager.numberOfTaskSlots"] == "1" and config["parallelism.default"] == "2"
    assert config["env.log.dir"] == str(tmp_path)
    assert config["cluster.registration.error-delay"] == "1 s"  # the TaskManagers start beside the JobManager


def test_taskmanagers_are_spawned_before_the_jobmanager_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a cluster whose processes and waits are recorded instead of run
    cluster = LocalFlinkCluster(taskmanagers=2, log_dir=tmp_path)
    steps: list[str] = []
    cluster._home = tmp_path
    monkeypatch.setattr(cluster, "_write_conf", lambda home: tmp_path / "conf")
    monkeypatch.setattr(cluster, "_spawn", lambda role, log: steps.append(role))
    monkeypatch.setattr(cluster, "_wait_rest", lambda: steps.append("rest up"))
    monkeypatch.setattr(cluster, "wait_for_taskmanagers", lambda count: steps.append(f"{count} registered"))
    monkeypatch.setattr(flinkcluster, "java_home", lambda: tmp_path)
    # WHEN it starts
    cluster.start()
    atexit.unregister(cluster.stop)
    # THEN both TaskManagers start beside the JobManager, and the waits come after
    assert steps == ["jobmanager", "taskmanager", "taskmanager", "rest up", "2 registered"]


def test_shipped_java_opts_are_read_from_the_nested_config() -> None:
    text = "env:\n  java:\n    opts:\n      all: --add-exports=a=b --add-opens=java.base/java.lang=ALL-UNNAMED\n"
    assert _shipped_java_opts(text) == "--add-exports=a=b --add-opens=java.base/java.lang=ALL-UNNAMED"
    assert _shipped_java_opts("parallelism:\n  default: 1\n") == ""


def test_default_known_spes_classify_flink_2_processes() -> None:
    kinds = load_known_spes(default_known_spes_path())
    taskmanager = classify(JAVA + [TASKMANAGER_MAIN_CLASS, "--configDir", "/c", "-D", "x=y"], kinds)
    jobmanager = classify(JAVA + [JOBMANAGER_MAIN_CLASS, "--configDir", "/c"], kinds)
    python_worker = classify(["/usr/bin/python3", "-m", "pyflink.fn_execution.beam.beam_boot", "--id=1"], kinds)
    assert taskmanager is not None and (taskmanager.engine, taskmanager.role) == ("flink", "workload")
    assert jobmanager is not None and (jobmanager.engine, jobmanager.role) == ("flink", "managing")
    assert python_worker is not None and (python_worker.role, python_worker.kind) == ("workload", "python-worker")


def test_demo_known_spes_select_only_the_demo_cluster() -> None:
    kinds = parse_known_spes(flink_known_spes(Path("/tmp/flink-local-1/conf")), "demo")
    ours = classify(JAVA + [TASKMANAGER_MAIN_CLASS, "--configDir", "/tmp/flink-local-1/conf"], kinds)
    other = classify(JAVA + [TASKMANAGER_MAIN_CLASS, "--configDir", "/opt/flink/conf"], kinds)
    jobmanager = classify(JAVA + [JOBMANAGER_MAIN_CLASS, "--configDir", "/tmp/flink-local-1/conf"], kinds)
    assert ours is not None and ours.role == "workload"
    assert other is None
    assert jobmanager is not None and jobmanager.role == "managing"


def test_events_between_counts_views_times_three_by_the_overlap_of_each_window() -> None:
    views = {
        "ysb:window:c1:1000000": 100,  # [1000, 1010) s
        "ysb:window:c2:1000000": 200,
        "ysb:window:c1:1010000": 300,  # [1010, 1020) s
        "ysb:window:c1:1020000": 999,  # outside
        "ysb:window:bad": 5,
    }
    # half of the first window, all of the second
    assert events_between(views, 1005.0, 1020.0) == 3 * (300 * 0.5 + 300)


def test_taskmanager_java_options_write_a_command_file(tmp_path: Path) -> None:
    option = taskmanager_java_options(tmp_path)
    path = Path(option.split("=", 1)[1])
    assert option.startswith("-XX:CompileCommandFile=") and path.parent == tmp_path
    assert path.read_text() == "dontinline ysb.*::*\n"


def test_the_flink_engine_refuses_the_file_sink_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Redis only"):
        FlinkYsbEngine(YsbOptions(sink="file"), tmp_path)


def test_the_jobs_count_is_read_once_the_last_overlapping_window_has_fired() -> None:
    # a window ending inside [100, 110) needs the window [100, 110): fired 1 s after 110, read 2 s later
    assert windows_fired_at(100.5) == windows_fired_at(109.9) == 113.0
    # ending on a window's boundary, no event of [100, 110) is in it
    assert windows_fired_at(100.0) == 103.0
    # 2 s after the last window fires (its end + 1 s): the old rule's (end + 13 s) least margin, an end just past 100
    assert windows_fired_at(109.999) - (110.0 + 1.0) == 2.0 == 100.0 + 13.0 - (110.0 + 1.0)
