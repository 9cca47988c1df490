"""The order of a Spark demo's start-up (fakes, no processes): the Worker's JVM is spawned before the
Master's web UI and election are waited on, and the app is submitted before the Worker registers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from coordinator.workloads import sparkcluster
from coordinator.workloads.sparkcluster import LocalSparkCluster, SparkClusterError, WorkerHost, WorkerProcess
from coordinator.workloads.ysb.engines import SparkStructuredYsb
from coordinator.workloads.ysb.spark import YsbOptions


class _Recording(LocalSparkCluster):
    """A cluster whose steps only say that they ran; ``fail`` names a step that raises."""

    def __init__(self, steps: list[str], fail: str = "", **fields: Any) -> None:
        super().__init__(**fields)
        self.steps = steps
        self.fail = fail

    def _step(self, name: str) -> None:
        self.steps.append(name)
        if name == self.fail:
            raise SparkClusterError(f"{name} failed")

    def make_scratch(self, log_dir: Path | None, prefix: str) -> None:
        pass

    def _build_env(self) -> dict[str, str]:
        return {}

    def _start_master(self) -> None:
        self._master = cast("subprocess.Popen[bytes]", object())
        self._step("master url")

    def _spawn_worker(self, cores: int, memory: str, host: WorkerHost | None = None) -> WorkerProcess:
        self._step("worker spawned" if host is None else f"worker spawned in {host.address}")
        process = cast("subprocess.Popen[bytes]", object())
        worker = WorkerProcess(process, Path("worker1.log"), Path("worker1"), cores, memory)
        self.workers.append(worker)
        return worker

    def _wait_master_ready(self) -> None:
        self._step("master alive")

    def _wait_worker_ui(self, worker: WorkerProcess) -> None:
        self._step("worker ui")

    def wait_for_workers(self, count: int, timeout: float | None = None) -> None:
        self._step("worker registered" if count == 1 else f"{count} workers registered")

    def stop(self) -> None:
        self.steps.append("stopped")
        self._master = None


@pytest.fixture(autouse=True)
def _no_atexit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparkcluster.atexit, "register", lambda fn: None)


def test_worker_spawned_before_the_master_is_waited_on() -> None:
    # GIVEN a cluster WHEN started THEN the Worker's JVM starts right after the Master's URL is known
    steps: list[str] = []
    _Recording(steps).start()
    assert steps == ["master url", "worker spawned", "master alive", "worker ui", "worker registered"]


def test_start_without_wait_returns_once_the_master_is_alive() -> None:
    # GIVEN a cluster started without waiting WHEN started THEN the Worker is waited on only by wait_started()
    steps: list[str] = []
    cluster = _Recording(steps).start(wait=False)
    assert steps == ["master url", "worker spawned", "master alive"]
    cluster.wait_started()
    assert steps[3:] == ["worker ui", "worker registered"]


def test_a_worker_that_never_registers_stops_the_cluster() -> None:
    # GIVEN a Worker that never registers WHEN waited on THEN the error stands and everything is stopped
    steps: list[str] = []
    cluster = _Recording(steps, fail="worker registered").start(wait=False)
    with pytest.raises(SparkClusterError):
        cluster.wait_started()
    assert steps[-1] == "stopped"


class _Run:
    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def start(self) -> None:
        self.steps.append("app submitted")

    def stop(self) -> None:
        self.steps.append("app stopped")


def test_the_app_is_submitted_before_the_worker_registers(tmp_path: Path) -> None:
    # GIVEN the Spark YSB engine WHEN started THEN the driver starts beside the Worker, which is waited on last
    steps: list[str] = []
    engine = SparkStructuredYsb(YsbOptions(), tmp_path)
    engine.cluster = _Recording(steps)
    engine._new_run = lambda: _Run(steps)  # type: ignore[method-assign,assignment,return-value]
    engine.start()
    assert steps == [
        "master url", "worker spawned", "master alive", "app submitted", "worker ui", "worker registered",
    ]


def test_a_failed_start_stops_the_app_and_the_cluster(tmp_path: Path) -> None:
    # GIVEN a Worker that never registers WHEN the engine starts THEN its app and cluster are stopped
    steps: list[str] = []
    engine = SparkStructuredYsb(YsbOptions(), tmp_path)
    engine.cluster = _Recording(steps, fail="worker registered")
    engine._new_run = lambda: _Run(steps)  # type: ignore[method-assign,assignment,return-value]
    with pytest.raises(SparkClusterError):
        engine.start()
    assert "app stopped" in steps and steps[-1] == "stopped"


class _Feed:
    """A Kafka feed that says when its broker and its producer started."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def start(self, produce: bool = True) -> None:
        self.steps.append("broker and topic" + (" and producer" if produce else ""))

    def start_producer(self) -> None:
        self.steps.append("producer")

    def stop(self) -> None:
        self.steps.append("feed stopped")


def test_reading_kafka_the_producer_starts_beside_the_driver(tmp_path: Path) -> None:
    # GIVEN the Spark YSB engine reading Kafka WHEN started THEN the topic exists before the app is submitted,
    # the producer starts after it (the query reads from the latest offsets), the Worker is waited on last
    steps: list[str] = []
    engine = SparkStructuredYsb(YsbOptions(), tmp_path)
    engine.cluster = _Recording(steps)
    engine.kafka = _Feed(steps)  # type: ignore[assignment]
    engine._new_run = lambda: _Run(steps)  # type: ignore[method-assign,assignment,return-value]
    engine.start()
    assert steps == [
        "master url", "worker spawned", "master alive", "broker and topic", "app submitted", "producer",
        "worker ui", "worker registered",
    ]


def test_one_worker_per_host_all_spawned_before_the_master_is_waited_on() -> None:
    # GIVEN a cluster spread over three hosts (coordinator demo --hosts 3) WHEN started THEN a Worker
    # starts in each host right after the Master's URL is known, and all three are waited on together
    steps: list[str] = []
    hosts = [WorkerHost(f"10.213.1.{i}", ("nsenter", "-t", str(i))) for i in (11, 12, 13)]
    _Recording(steps, worker_hosts=hosts, bind_address="10.213.1.1").start()
    spawned = [f"worker spawned in 10.213.1.{i}" for i in (11, 12, 13)]
    assert steps == ["master url", *spawned, "master alive", *["worker ui"] * 3, "3 workers registered"]
