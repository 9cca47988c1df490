"""The health panel's lines computed from stacks alone (pure functions)."""

from __future__ import annotations

from coordinator.report.health import JIT_WARN, warmup_health


def _executor(jit: int, other: int) -> dict[str, int]:
    return {
        "C2 CompilerThread0;Compile::Compile;PhaseIdealLoop::build_and_optimize": jit // 2,
        "C1 CompilerThre;Compilation::compile": jit - jit // 2,
        "Executor task l;java/lang/Thread.run;ysb/Query.filter": other,
    }


def test_a_jit_share_above_the_threshold_warns_with_its_counts_and_the_way_out() -> None:
    lines = warmup_health({"node1": {10: _executor(12, 88)}}, {"node1": frozenset({10})})
    assert len(lines) == 1
    assert lines[0].level == "warn" and lines[0].topic == "JIT"
    assert "12.0% of the workload processes' samples (12 of 100)" in lines[0].text
    assert "not their steady state" in lines[0].text and "--warmup" in lines[0].text


def test_a_small_jit_share_is_ok_and_only_workload_processes_count() -> None:
    stacks = {
        "node1": {10: _executor(2, 98), 99: _executor(500, 0)},  # 99: a driver compiling a lot
        "node2": {20: _executor(3, 97)},
    }
    lines = warmup_health(stacks, {"node1": frozenset({10}), "node2": frozenset({20})})
    assert [(line.level, line.topic) for line in lines] == [("ok", "JIT")]
    assert "2.5% of the workload processes' samples (5 of 200)" in lines[0].text


def test_the_threshold_itself_is_still_ok() -> None:
    at = round(JIT_WARN * 1000)
    assert warmup_health({"n": {1: _executor(at, 1000 - at)}}, {"n": frozenset({1})})[0].level == "ok"
    assert warmup_health({"n": {1: _executor(at + 1, 999 - at)}}, {"n": frozenset({1})})[0].level == "warn"


def test_no_compiler_thread_in_the_stacks_is_no_line() -> None:
    assert warmup_health({"node1": {10: _executor(0, 50)}}, {"node1": frozenset({10})}) == []
    assert warmup_health({"node1": {10: _executor(40, 50)}}, {"node1": frozenset()}) == []
