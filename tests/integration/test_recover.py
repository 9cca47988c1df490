"""`profiler recover` on a real run killed with SIGKILL: the real sampler (eBPF) writes its checkpoint
journal while sampling a real JVM; the profiler is killed, then the JVM exits too, so recovery must name
its frames offline (saved maps + ELF files for native code, the Java names the journal saved and saved
perf-map versions for Java code), or
the JVM runs on and recovery names them the live way (bcc, and its perf map dumped once more).

Prints one `FIGURE` line (pytest -s); docs/reliability.md quotes it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from profiler.capture import format as capture
from profiler.capture.checkpoint import checkpoint_dir, journal_path
from profiler.capture.journal import read_journal
from profiler.capture.read import read_meta, read_sampler_stats
from profiler.cli import main as profiler_main
from tests.fixtures.captures import folded_text
from tests.fixtures.jvm import CpuSplitJvm
from tests.fixtures.leaks import bpf_programs_held_by

REPO = Path(__file__).resolve().parents[2]
MAX_STACK = Path("/proc/sys/kernel/perf_event_max_stack")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout, f"{what} not within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - began


def status_of(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def checkpoints_in(out: Path) -> int:
    try:
        return len(read_journal(journal_path(out).read_bytes()).checkpoints)
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("jvm_exits", [True, False], ids=["jvm-gone", "jvm-alive"])
def test_killed_run_recovered(start_cpu_split_jvm: Callable[..., CpuSplitJvm], tmp_path: Path, jvm_exits: bool) -> None:
    jvm = start_cpu_split_jvm(threads=1, warmup_ms=500)
    profile = tmp_path / "profile.txt"
    profile.write_text("Burn: burnAlpha, burnBeta, burnGamma\n")
    known = tmp_path / "known_spes.txt"
    known.write_text("testengine workload nothing taskprof-test-matches-no-process\n")
    out, status = tmp_path / "cap", tmp_path / "status.json"
    max_stack_before = MAX_STACK.read_text()
    # GIVEN a 60 s run with a checkpoint every 2 s, sampling the JVM
    args = ["run", "--duration", "60", "--out", str(out), "--pid", str(jvm.pid), "--profile", str(profile),
            "--known-spes", str(known), "--checkpoint", "2", "--perf-map-refresh", "2",
            "--status-file", str(status)]  # fmt: skip
    profiler = subprocess.Popen([sys.executable, "-m", "profiler", *args], cwd=REPO)
    try:
        wait_for(lambda: status_of(status).get("state") == "sampling", 120, "sampling")
        wait_for(lambda: checkpoints_in(out) >= 3, 60, "three checkpoints")
        # WHEN the profiler is killed with SIGKILL (then the JVM exits too, or runs on)
        samples_at_kill = int(status_of(status).get("samples") or 0)
        elapsed_at_kill = float(status_of(status).get("elapsed") or 0)
        killed_at = time.time()
        profiler.send_signal(signal.SIGKILL)
        profiler.wait(30)
    finally:
        if profiler.poll() is None:
            profiler.kill()
            profiler.wait(30)
    if jvm_exits:
        jvm.kill()
    assert psutil.pid_exists(jvm.pid) != jvm_exits and not (out / capture.META_FILE).exists()
    assert bpf_programs_held_by({profiler.pid}) == [] and MAX_STACK.read_text() == max_stack_before
    journal_bytes = journal_path(out).stat().st_size
    # THEN `profiler recover` writes a capture marked recovered, up to the last checkpoint
    began = time.monotonic()
    assert profiler_main(["recover", str(out), "--quiet"]) == 0
    recover_s = time.monotonic() - began
    meta = read_meta(out)
    assert meta.stopped_by == "recovered" and any(w.startswith("recovered from checkpoint") for w in meta.warnings)
    window = meta.end_time - meta.start_time
    assert window >= 2.0 and meta.end_time <= killed_at, (window, meta.end_time - killed_at)
    stats = read_sampler_stats(out, jvm.pid)
    assert stats is not None
    recovered = stats.samples
    # samples up to the last checkpoint: the status's count scaled to the recovered window (±2 s of 99 Hz)
    assert 0 < recovered <= samples_at_kill + 200
    assert recovered >= samples_at_kill * window / max(elapsed_at_kill, window) - 200
    # AND the JVM's frames are named: Java methods from the saved perf maps (and, alive, one dumped now),
    # native ones from the ELF files (gone) or by bcc (alive)
    folded = folded_text(out, jvm.pid)
    lines = [line.rsplit(" ", 1) for line in folded.splitlines()]
    total = sum(int(count) for _stack, count in lines)
    burn = sum(int(count) for stack, count in lines if "com.example.CpuSplit::burn" in stack)
    native = sum(int(count) for stack, count in lines if "thread_native_entry" in stack or "JavaThread::" in stack)
    unknown = sum(int(count) for stack, count in lines if "[unknown]" in stack)
    assert burn > 0.5 * total and native > 0.5 * total, folded[:2000]
    # compiled frames walked by the HotSpot unwinder are named from the names the journal saved
    assert stats.compiled_frames > 0 and stats.compiled_named >= 0.9 * stats.compiled_frames, stats
    rows = (out / capture.result_file_name(meta.host)).read_text()
    assert "Burn" in rows
    assert not checkpoint_dir(out).exists()
    print(
        f"FIGURE recover-{'offline' if jvm_exits else 'live'}: samples_at_kill={samples_at_kill}, "
        f"elapsed_at_kill_s={elapsed_at_kill:.1f}, "
        f"recovered_window_s={window:.1f}, samples_recovered={recovered}, burn_named={burn}, "
        f"native_named={native}, unknown_stacks={unknown}, journal_bytes={journal_bytes}, recover_s={recover_s:.1f}"
    )
