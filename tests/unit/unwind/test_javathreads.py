"""A JVM's thread list read for the off-CPU tracer (profiler/unwind/javathreads.py): the offsets taken from
vmStructs, the list read from hostile memory, the last Java frame named."""

from __future__ import annotations

import os
import struct

import pytest

from profiler.errors import VMStructsError
from profiler.unwind.javathreads import (
    JAVA_INTERPRETED,
    MAX_JAVA_THREADS,
    host_tids,
    java_frame_name,
    read_java_threads,
    thread_layout,
)
from profiler.unwind.vmstructs import VMLayout
from tests.fixtures.memory import FakeMemory

LIST_POINTER = 0x7F00_0000_1000  # ThreadsSMRSupport::_java_thread_list (a static)
LIST = 0x7F00_0000_2000
ARRAY = 0x7F00_0000_3000
FIELDS_17 = {
    ("ThreadsSMRSupport", "_java_thread_list"): LIST_POINTER,
    ("ThreadsList", "_length"): 4,
    ("ThreadsList", "_threads"): 0x10,
    ("JavaThread", "_osthread"): 0x230,
    ("OSThread", "_thread_id"): 0xD0,
    ("JavaThread", "_anchor"): 0x290,
    ("JavaFrameAnchor", "_last_Java_sp"): 0,
    ("JavaFrameAnchor", "_last_Java_pc"): 8,
    ("JavaFrameAnchor", "_last_Java_fp"): 0x10,
    ("JavaThread", "_current_pending_monitor"): 0x308,
    ("JavaThread", "_current_waiting_monitor"): 0x318,
}


class JvmMemory(FakeMemory):
    pid = 4242


def _vm_layout(fields: dict[tuple[str, str], int]) -> VMLayout:
    return VMLayout(fields=fields, sizes={}, interpreter=(0x1000, 0x2000), method_slot=-24, method_slot_source="t")


def _jvm(threads: list[tuple[int, int]], length: int | None = None) -> JvmMemory:
    """A thread list of (JavaThread address, tid) as a JDK 17 lays it out."""
    memory = JvmMemory()
    memory.write(LIST_POINTER, struct.pack("<Q", LIST))
    memory.write(LIST + 4, struct.pack("<I", len(threads) if length is None else length))
    memory.write(LIST + 0x10, struct.pack("<Q", ARRAY))
    for index, (java_thread, tid) in enumerate(threads):
        memory.write(ARRAY + 8 * index, struct.pack("<Q", java_thread))
        osthread = java_thread + 0x4000
        memory.write(java_thread + 0x230, struct.pack("<Q", osthread))
        memory.write(osthread + 0xD0, struct.pack("<i", tid))
    return memory


def test_layout_takes_either_jdks_osthread_field_and_adds_the_anchor() -> None:
    layout = thread_layout(_vm_layout(FIELDS_17))
    assert layout is not None
    anchor = (layout.last_java_sp, layout.last_java_pc, layout.last_java_fp)
    assert (layout.osthread, *anchor) == (0x230, 0x290, 0x298, 0x2A0)
    jdk25 = dict(FIELDS_17)
    jdk25[("Thread", "_osthread")] = jdk25.pop(("JavaThread", "_osthread"))
    assert thread_layout(_vm_layout(jdk25)) == layout
    # a JDK without one of the fields, or with an absurd offset, is not followed
    assert thread_layout(_vm_layout({k: v for k, v in FIELDS_17.items() if k[1] != "_current_waiting_monitor"})) is None
    assert thread_layout(_vm_layout({**FIELDS_17, ("JavaThread", "_anchor"): 1 << 40})) is None


def test_thread_list_maps_tids_to_java_threads_and_skips_threads_going_away() -> None:
    layout = thread_layout(_vm_layout(FIELDS_17))
    assert layout is not None
    memory = _jvm([(0x7F00_1000_0000, 101), (0x7F00_2000_0000, 102)])
    memory.write(ARRAY + 16, struct.pack("<Q", 0x7F00_3000_0000))  # a third whose JavaThread is unmapped
    memory.write(LIST + 4, struct.pack("<I", 3))
    assert read_java_threads(memory, layout) == {101: 0x7F00_1000_0000, 102: 0x7F00_2000_0000}  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [MAX_JAVA_THREADS + 1, 0xFFFF_FFFF])
def test_an_absurd_thread_list_is_an_error_not_a_huge_read(length: int) -> None:
    layout = thread_layout(_vm_layout(FIELDS_17))
    assert layout is not None
    with pytest.raises(VMStructsError, match="absurd vmStructs"):
        read_java_threads(_jvm([], length=length), layout)  # type: ignore[arg-type]


def test_an_unreadable_thread_list_is_an_error() -> None:
    layout = thread_layout(_vm_layout(FIELDS_17))
    assert layout is not None
    with pytest.raises(VMStructsError, match="pid 4242: reading the JVM's thread list failed"):
        read_java_threads(JvmMemory(), layout)  # type: ignore[arg-type]


class FakeNamer:
    def __init__(self) -> None:
        self.memory = JvmMemory()
        self.compiled = None

    def name(self, method: int, generation: int | None = None) -> str | None:
        return {0x5000: "java.lang.Thread::sleep"}.get(method)


def test_last_java_frame_interpreted_is_named_and_marked_compiled_without_code_cache_is_not() -> None:
    namer = FakeNamer()
    assert java_frame_name(namer, 0x5000 | JAVA_INTERPRETED) == "java.lang.Thread::sleep [i]"  # type: ignore[arg-type]
    assert java_frame_name(namer, 0x6000 | JAVA_INTERPRETED) is None  # type: ignore[arg-type]  (stale)
    assert java_frame_name(namer, 0x7F00_0000_5000) is None  # type: ignore[arg-type]
    assert java_frame_name(namer, 0) is None  # type: ignore[arg-type]


def test_thread_ids_of_our_own_pid_namespace_need_no_mapping_and_a_gone_process_maps_none() -> None:
    assert host_tids(os.getpid()) is None
    assert host_tids(2**22 + 1) == {}  # above pid_max: no such process
