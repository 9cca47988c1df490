"""The doctor's pure checks: statuses, fixes and the exit code."""

from __future__ import annotations

from pathlib import Path

from profiler.commands.doctor import (
    FAIL,
    OK,
    WARN,
    Check,
    exact_inlining_check,
    exit_code,
    format_table,
    frame_pointer_check,
    headers_check,
    max_stack_check,
    paranoid_check,
    pmu_check,
    privilege_check,
)

ALL_CAPS = (1 << 41) - 1


def test_privileges() -> None:
    assert privilege_check(0, ALL_CAPS).status == OK
    assert privilege_check(1000, (1 << 38) | (1 << 39)).status == OK
    check = privilege_check(1000, 1 << 38)
    assert check.status == FAIL and "CAP_BPF" in check.detail and "CAP_PERFMON" not in check.detail and check.fix
    assert "CAP_BPF and CAP_PERFMON" in privilege_check(1000, 0).detail


def test_headers(tmp_path: Path) -> None:
    other = tmp_path / "linux-headers-6.1.0-56-amd64"
    (other / "include").mkdir(parents=True)
    build = tmp_path / "build"
    build.symlink_to(other)
    check = headers_check("6.18.44-fc", build, tmp_path / "kheaders.tar.xz")
    assert check.status == WARN and "another kernel version" in check.fix and "6.1.0-56-amd64" in check.detail
    assert headers_check("6.1.0-56-amd64", build, tmp_path / "x").status == OK
    assert headers_check("6.1.0", tmp_path / "none", tmp_path / "x").status == FAIL
    (tmp_path / "kheaders.tar.xz").write_bytes(b"")
    assert headers_check("6.1.0", tmp_path / "none", tmp_path / "kheaders.tar.xz").status == OK


def test_sysctls() -> None:
    assert max_stack_check(127).status == OK and "--stack-walk kernel" in max_stack_check(127).detail
    assert max_stack_check(64).status == WARN and max_stack_check(1024).status == OK
    assert max_stack_check(None).status == WARN
    assert paranoid_check(2, privileged=True).status == OK
    assert paranoid_check(2, privileged=False).status == FAIL
    assert paranoid_check(1, privileged=False).status == OK


def test_pmu_without_hardware_counters_warns_with_estimate() -> None:
    probe = {"cycles": "ENOENT: no hardware PMU event cycles on this CPU/VM", "task-clock": "ok", "page-faults": "ok"}
    check = pmu_check(probe)
    assert check.status == WARN and "estimated" in check.detail and "unsupported (ENOENT): cycles" in check.detail
    assert pmu_check({"cycles": "ok", "task-clock": "ok"}).status == OK
    assert pmu_check({"cycles": "ok", "task-clock": "ok", "stalled-cycles-backend": "ENOENT: x"}).status == WARN
    assert pmu_check({"cycles": "ok", "task-clock": "EACCES: no"}).status == FAIL


def test_frame_pointers() -> None:
    assert frame_pointer_check([]).status == OK
    assert frame_pointer_check([(1, "Worker", True)]).status == OK
    check = frame_pointer_check([(1, "Worker", True), (2, "CoarseGrainedExecutorBackend", False)])
    assert check.status == WARN and "2 (CoarseGrainedExecutorBackend)" in check.detail and "1 (" not in check.detail
    assert "PreserveFramePointer" in check.fix
    # a JVM without the flag whose code cache the HotSpot unwinder reads needs no restart
    walked = frame_pointer_check([(1, "Worker", True), (2, "CoarseGrainedExecutorBackend", False)], walkable={2})
    assert walked.status == OK and "1 without it walked by the HotSpot unwinder" in walked.detail


def test_jvms_without_debug_non_safepoints_are_named_with_the_opt_in_and_the_flag() -> None:
    assert exact_inlining_check([], {}).status == OK
    jvms = [(1, "Worker", True), (2, "CoarseGrainedExecutorBackend", False), (3, "Odd", False)]
    check = exact_inlining_check(jvms, {1: True, 2: False})
    assert check.status == WARN and "1 of 3 JVM(s) without DebugNonSafepoints: 2 (CoarseGrainedExecutorBackend)" in (
        check.detail
    )
    assert "charged to their caller" in check.detail and "1 unreadable" in check.detail
    assert "--exact-inlining" in check.fix and "-XX:+DebugNonSafepoints" in check.fix
    exact = exact_inlining_check(jvms[:1], {1: True})
    assert exact.status == OK and exact.detail == "1 JVM(s) run with DebugNonSafepoints"


def test_exit_code_and_table() -> None:
    checks = [Check("a", OK, "fine"), Check("b", WARN, "meh", "do x")]
    assert exit_code(checks) == 0
    assert "fix: do x" in format_table(checks) and "can be profiled" in format_table(checks)
    checks.append(Check("c", FAIL, "broken", "do y"))
    assert exit_code(checks) == 1 and "cannot work" in format_table(checks)


def test_thread_names_need_uprobes_and_the_symbol() -> None:
    from profiler.commands.doctor import thread_names_check

    assert thread_names_check(True, "/jdk/lib/server/libjvm.so", True).status == "ok"
    stripped = thread_names_check(True, "/jdk/lib/server/libjvm.so", False)
    assert stripped.status == "warn" and "stripped" in stripped.detail and ".symtab" in stripped.fix
    assert thread_names_check(False, None, None).status == "warn"
    assert thread_names_check(True, None, None).status == "ok"


def test_taskstats_row_warns_only_where_proc_counters_would_lose_exits() -> None:
    from profiler.commands.doctor import taskstats_check

    assert taskstats_check("", uses_proc=True).status == OK
    lost = taskstats_check("taskstats unavailable (registering needs CAP_NET_ADMIN)", uses_proc=True)
    assert lost.status == WARN and "CAP_NET_ADMIN" in lost.detail and "--counters perf" in lost.fix
    assert taskstats_check("taskstats unavailable (x)", uses_proc=False).status == OK  # perf events: not needed


def test_python_frames_row_names_the_cpython_versions() -> None:
    from profiler.commands.doctor import python_frames_check
    from profiler.unwind.cpython import supported_versions

    row = python_frames_check(supported_versions())
    assert row.status == "ok" and "CPython 3.11, 3.13 frames named" in row.detail
    assert python_frames_check([]).status == "warn"
