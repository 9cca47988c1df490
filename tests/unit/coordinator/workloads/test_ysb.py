"""Pure parts of the YSB application and the demo: campaign mapping, progress parsing, RESP encoding,
the demo's process selection."""

from __future__ import annotations

import pytest

from coordinator.workloads.ysb.campaigns import ad_campaign_mapping, campaign_ids
from coordinator.workloads.ysb.engines import spark_known_spes as demo_known_spes
from coordinator.workloads.ysb.redis import encode_command
from coordinator.workloads.ysb.spark import BatchProgress, parse_progress, resolve_sink, sustained_throughput
from profiler.errors import ConfigError


def test_mapping_is_deterministic_and_shaped_like_ysb() -> None:
    mapping = ad_campaign_mapping(campaigns=7, ads_per_campaign=3)
    assert mapping == ad_campaign_mapping(campaigns=7, ads_per_campaign=3)
    assert len(mapping) == 21
    assert len({m.ad_id for m in mapping}) == 21
    assert {m.campaign_id for m in mapping} == set(campaign_ids(7))
    assert all(len(m.ad_id) == 36 and m.ad_id.count("-") == 4 for m in mapping)
    with pytest.raises(ValueError):
        ad_campaign_mapping(0, 1)


def test_parse_progress_skips_noise_and_malformed_lines() -> None:
    stdout = "\n".join(
        [
            "some warning",
            'PROGRESS {"batch": 0, "input_rows": 0, "trigger_ms": 5000, "processed_rows_per_s": 0.0}',
            "PROGRESS {not json",
            'PROGRESS {"batch": 1, "input_rows": 20000, "trigger_ms": 800, "processed_rows_per_s": 25000.0,'
            ' "input_rows_per_s": 19000.0, "timestamp": "t"}',
            "READY",
            'PROGRESS {"input_rows": 5}',
        ]
    )
    batches = parse_progress(stdout)
    assert [b.batch for b in batches] == [0, 1]
    assert batches[1] == BatchProgress(1, "t", 20000, 19000.0, 25000.0, 800)
    # rows over busy time: 20000 rows in 5.8 s
    assert sustained_throughput(batches) == pytest.approx(20000 / 5.8)
    assert sustained_throughput([]) == 0.0


def test_encode_command_is_resp_bulk_strings() -> None:
    assert encode_command("HSET", "k", 12, b"\xff") == b"*4\r\n$4\r\nHSET\r\n$1\r\nk\r\n$2\r\n12\r\n$1\r\n\xff\r\n"


def test_resolve_sink_rejects_unknown() -> None:
    assert resolve_sink("file") == "file"
    with pytest.raises(ConfigError):
        resolve_sink("kafka")


def test_demo_known_spes_selects_only_the_demo_processes() -> None:
    text = demo_known_spes(master_port=7077, driver_port=40000)
    lines = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    executor = next(line for line in lines if line[2] == "executor")
    assert executor[1] == "workload"
    assert executor[4] == "arg=spark://CoarseGrainedScheduler@127.0.0.1:40000"
    assert {line[1] for line in lines if line[2] != "executor"} == {"managing"}


def test_teardown_runs_every_step_when_one_fails() -> None:
    from coordinator.workloads.processes import stop_in_order

    stopped: list[str] = []

    def broker() -> None:
        stopped.append("broker")
        raise RuntimeError("broker would not stop")

    # GIVEN a query, a broker that fails to stop and a cluster WHEN torn down THEN the cluster still stops
    with pytest.raises(RuntimeError, match="broker would not stop"):
        stop_in_order(lambda: stopped.append("query"), None, broker, lambda: stopped.append("cluster"))
    assert stopped == ["query", "broker", "cluster"]
