"""The agent's CPU by component: its threads' CPU read at the window's start, each poll and its end."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from profiler.capture.format import OVERHEAD_FILE, ComponentCpu, Overhead, write_overhead
from profiler.capture.read import read_overhead
from profiler.errors import CaptureFormatError
from profiler.run.threadcpu import ThreadCpu, component_of, split_components, thread_cpu_seconds


@dataclass
class FakeThread:
    name: str
    native_id: int | None


def test_thread_names_map_to_components() -> None:
    assert component_of("ringbuf-reader") == "reading"
    assert component_of("prepare-4242") == "preparation" and component_of("cfi-loader") == "preparation"
    assert component_of("symbol-prep") == "naming" and component_of("thread-names") == "naming"
    assert component_of("MainThread") == "window" and component_of("Thread-7") == "other"


def test_threads_count_from_the_windows_start_and_one_born_later_from_zero() -> None:
    # GIVEN a reader thread at 5 s before the window, then a preparation worker born in it
    cpu = {1: 5.0, 2: 1.0}
    threads = [FakeThread("ringbuf-reader", 1), FakeThread("MainThread", 2)]
    watch = ThreadCpu(read=cpu.get, threads=lambda: list(threads))
    watch.begin()
    cpu[1], cpu[2] = 5.5, 1.25
    threads.append(FakeThread("prepare-77", 3))
    cpu[3] = 0.75
    watch.sample()
    # WHEN the worker ends (no reading any more) and the reader goes on
    threads.pop()
    del cpu[3]
    cpu[1] = 6.0
    watch.sample()
    # THEN each counts its window's CPU, the gone worker its last reading
    assert watch.by_component() == {"reading": 1.0, "window": 0.25, "preparation": 0.75}


def test_a_reused_tid_under_another_name_is_another_thread() -> None:
    cpu = {9: 2.0}
    threads = [FakeThread("prepare-1", 9)]
    watch = ThreadCpu(read=cpu.get, threads=lambda: list(threads))
    watch.begin()
    cpu[9] = 2.5
    watch.sample()
    threads[0] = FakeThread("symbol-prep", 9)
    cpu[9] = 0.25
    watch.sample()
    assert watch.by_component() == {"preparation": 0.5, "naming": 0.25}


def test_the_runner_thread_is_split_and_the_rest_of_the_process_is_other() -> None:
    threads = {"window": 1.0, "reading": 0.5, "naming": 0.25}
    parts = {"scope": 0.5, "naming": 0.125, "checkpoint": 0.0}
    found = split_components(threads, total=2.5, runner_parts=parts)
    assert found == (
        ComponentCpu("naming", 0.375), ComponentCpu("other", 0.75), ComponentCpu("reading", 0.5),
        ComponentCpu("scope", 0.5), ComponentCpu("window", 0.375),
    )  # fmt: skip
    assert sum(part.cpu_seconds for part in found) == pytest.approx(2.5)


def test_a_real_busy_thread_is_read_from_proc() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    busy = threading.Thread(target=spin, name="ringbuf-reader", daemon=True)
    busy.start()
    try:
        assert busy.native_id is not None
        before = thread_cpu_seconds(busy.native_id)
        assert before is not None
        watch = ThreadCpu()
        watch.begin()
        began = time.monotonic()
        # until the thread has had 0.1 CPU-s by /proc itself (a loaded host gives it less of each second)
        while (thread_cpu_seconds(busy.native_id) or 0.0) - before < 0.1 and time.monotonic() - began < 20:
            time.sleep(0.02)
        watch.sample()
        elapsed = time.monotonic() - began
    finally:
        stop.set()
        busy.join()
    assert 0.05 <= watch.by_component().get("reading", 0.0) <= elapsed + 0.05
    assert thread_cpu_seconds(2**22 + 1) is None  # no such thread


def test_overhead_json_keeps_the_components_and_refuses_a_crafted_list(tmp_path: Path) -> None:
    parts = (ComponentCpu("reading", 0.5), ComponentCpu("scope", 0.25))
    write_overhead(tmp_path, Overhead(profiler_cpu_seconds=0.75, cpu_by_component=parts))
    overhead = read_overhead(tmp_path)
    assert overhead is not None and overhead.cpu_by_component == parts
    for crafted in ({"reading": 1}, [{"component": "x", "cpu_seconds": 1}] * 65, [{"component": 3, "cpu_seconds": 1}]):
        (tmp_path / OVERHEAD_FILE).write_text(json.dumps({"cpu_by_component": crafted}))
        with pytest.raises(CaptureFormatError, match="overhead.json"):
            read_overhead(tmp_path)
