"""`profiler doctor` on this real host: as root, as an unprivileged user, and with real JVMs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.sampling.counters import CounterGroup

KEYS = {"check", "status", "detail", "fix"}
IDLE = (
    "public class Idle { public static void main(String[] a) throws Exception {"
    ' System.out.println("ready"); System.out.flush(); System.in.read(); } }\n'
)


def _doctor(*prefix: str) -> tuple[int, list[dict[str, str]]]:
    out = subprocess.run(
        [*prefix, sys.executable, "-m", "profiler", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def jvms(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Two idle JVMs: (pid without PreserveFramePointer, pid with it and with DebugNonSafepoints)."""
    source = tmp_path / "Idle.java"
    source.write_text(IDLE)
    started = []
    try:
        dns = ["-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"]
        for flags in (["-XX:-PreserveFramePointer"], ["-XX:+PreserveFramePointer", *dns]):
            java = subprocess.Popen(
                ["java", *flags, "-Xmx32m", str(source)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            started.append(java)
        for java in started:
            assert java.stdout is not None and java.stdout.readline().strip() == "ready"
        yield started[0].pid, started[1].pid
    finally:
        for java in started:
            if java.stdin is not None:
                java.stdin.close()
            java.wait(timeout=30)


def test_doctor_as_root_names_jvms_without_frame_pointers(jvms: tuple[int, int]) -> None:
    without, with_pfp = jvms
    code, checks = _doctor()
    assert code == 0, checks
    assert all(set(check) == KEYS for check in checks)
    rows = {check["check"]: check for check in checks}
    assert "jcmd" not in rows  # no jcmd program is ever run (docs/security.md rule 4)
    assert all(check["status"] in ("ok", "warn", "fail") for check in checks)
    assert all(check["fix"] for check in checks if check["status"] != "ok"), "every problem needs a fix"
    for name in (
        "privileges",
        "bcc",
        "btf",
        "sampling-clock",
        "tracepoint:sched_process_exec",
        "tracepoint:sock_send_length",
        "tracepoint:sock_recv_length",
        "taskstats-exits",
    ):
        assert rows[name]["status"] == "ok", rows[name]
    # the PMU row agrees with what the counters themselves find
    has_cycles = CounterGroup().probe()["cycles"] == "ok"
    assert (rows["pmu-events"]["status"] == "warn") is not has_cycles
    if not has_cycles:
        assert "cycles" in rows["pmu-events"]["detail"] and "estimated" in rows["pmu-events"]["detail"]
    # this kernel has no kprobes (CONFIG_KPROBES off)
    kprobes = Path("/sys/bus/event_source/devices/kprobe").exists()
    assert rows["kprobes"]["status"] == ("ok" if kprobes else "warn")
    frame_pointers = rows["jvm-frame-pointers"]
    # the JVM without the flag is walked by the HotSpot unwinder (its vmStructs readable): no restart asked
    assert frame_pointers["status"] == "ok", frame_pointers
    assert "walked by the HotSpot unwinder" in frame_pointers["detail"]
    assert f"{with_pfp} (" not in frame_pointers["detail"] and f"{without} (" not in frame_pointers["detail"]
    # the JVM started without DebugNonSafepoints is named, with the opt-in and the flag as the fix (issue 51)
    inlining = rows["jvm-exact-inlining"]
    assert inlining["status"] == "warn" and f"{without} (" in inlining["detail"], inlining
    assert f"{with_pfp} (" not in inlining["detail"] and "--exact-inlining" in inlining["fix"], inlining


def test_doctor_unprivileged_fails_with_the_missing_capability() -> None:
    code, checks = _doctor("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all")
    rows = {check["check"]: check for check in checks}
    assert code != 0
    assert rows["privileges"]["status"] == "fail" and "CAP_BPF" in rows["privileges"]["detail"]
    assert rows["sampling-clock"]["status"] == "fail"


def test_doctor_table_output() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "profiler", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].split()[:2] == ["privileges", "ok"]
    assert "fix:" in out.stdout and "can be profiled" in out.stdout
