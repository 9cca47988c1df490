"""Off-CPU stacks taken by the sampler's walker (issue 50): the blocks that carry a walked stack, the walked
records read back in walk order, and the walker's program with the off-CPU one compiled in (or refused)."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest

from profiler.capture.stackstore import GAP_TAG, walk_order
from profiler.sampling.offcpu import STACK_WALKED, RawBlock, name_blocks, walked_reader
from profiler.sampling.program import OFFCPU_LEAF_SLOTS, OFFCPU_ROOT_SLOTS, SamplerProgram


def test_a_walked_block_is_named_by_its_walked_stack_and_the_task_frames_above_the_wait() -> None:
    kernel = {0x901: "futex_wait"}
    walked = {0xABC1: ["__futex_abstimed_wait_common", "Unsafe_Park", "jdk.internal.misc.Unsafe::park",
                       "com.example.Job::waitParked [i]", "com.example.Job::run", "start_thread"]}  # fmt: skip
    java = {0x5000: "jdk.internal.misc.Unsafe::park"}
    blocks = [
        RawBlock(7, STACK_WALKED, 2, 1, "worker", 4_000_000, 2, java_state=1, java_frame=0x5000, walked_stack=0xABC1),
        RawBlock(7, STACK_WALKED, 2, 1, "worker", 1_000_000, 1, java_state=1, walked_stack=0xDEAD),  # not stored
    ]
    entries = name_blocks(
        blocks, {2: (0x901,)}.get, lambda _a: pytest.fail("a walked stack is not named by address"),
        kernel.__getitem__, java.get, walked_names=walked.get,
    )  # fmt: skip
    by_stack = {e.stack: e for e in entries}
    # the walk reached the thread's start: the last Java frame is not added again below it
    whole = "worker;start_thread;com.example.Job::run;com.example.Job::waitParked [i];jdk.internal.misc.Unsafe::park;"
    assert by_stack[whole + "Unsafe_Park;__futex_abstimed_wait_common;futex_wait_[k]"].cause == "park"
    assert by_stack["worker;[lost user stack];futex_wait_[k]"].blocked_ns == 1_000_000


def _record(frames: list[int], walked: int, unloads: int) -> Any:
    slots = [0] * (OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS)
    slots[: len(frames)] = frames
    return SimpleNamespace(walked=walked, walk_end=0, jvm_unloads=unloads, frames=slots)


class _Table(dict):  # type: ignore[type-arg]
    @staticmethod
    def Key(value: int) -> int:  # bcc's spelling
        return value


def test_walked_records_are_read_in_walk_order_with_the_cut_between_leaf_and_root() -> None:
    slots = OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS
    deep = slots + 5  # the ring wrapped: its oldest five slots hold the last five frames walked
    leaf = list(range(1, OFFCPU_LEAF_SLOTS + 1))
    ring_in_walk = list(range(1000, 1000 + OFFCPU_ROOT_SLOTS + 5))[-OFFCPU_ROOT_SLOTS:]
    start = (deep - OFFCPU_LEAF_SLOTS) % OFFCPU_ROOT_SLOTS
    ring = ring_in_walk[-start:] + ring_in_walk[:-start]  # as the BPF ring holds them
    table = _Table({1: _record([7, 8, 9], 3, 42), 2: _record(leaf + ring, deep, (1 << 64) - 1)})
    read = walked_reader(table)
    assert read(1) == ((7, 8, 9), 42)
    values, generation = read(2)  # type: ignore[misc]
    assert generation is None
    assert values == (*leaf, GAP_TAG | 5, *ring_in_walk)
    assert read(3) is None


def test_walk_order_leaves_a_stack_that_fits_alone() -> None:
    raw = struct.pack("<3Q", 1, 2, 3)
    assert walk_order(raw, 3, 2, 2) == raw


class _Progs(dict):  # type: ignore[type-arg]
    """A program array by index (bcc's keys are ctypes values)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key.value, value.value)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key.value)


class _FakeBpf:
    RAW_TRACEPOINT, PERF_EVENT = 17, 7

    def __init__(self, text: bytes) -> None:
        if b"OFFCPU_WALKER" in text and self.refuse:
            raise Exception("Failed to load BPF program b'raw_tracepoint__sched_switch': Permission denied")
        self.text = text
        self.loaded: list[bytes] = []
        self.tables: dict[bytes, dict[Any, Any]] = {b"walk_progs": _Progs(), b"offcpu_walk_progs": _Progs()}

    refuse = False

    def load_func(self, name: bytes, kind: int) -> Any:
        self.loaded.append(name)
        return SimpleNamespace(fd=len(self.loaded))

    def __getitem__(self, name: bytes) -> dict[Any, Any]:
        return self.tables[name]

    def cleanup(self) -> None:
        pass


def _program() -> tuple[SamplerProgram, list[str]]:
    warnings: list[str] = []
    program = SamplerProgram(warnings, 49, None, 16384, None, "auto", "auto")
    program.offcpu_text = "// offcpu_trace.c\n"
    return program, warnings


def test_the_walkers_program_carries_the_off_cpu_program_and_its_tail_call() -> None:
    program, warnings = _program()
    bpf = program.load(type("Bpf", (_FakeBpf,), {}))
    assert program.offcpu_walker and not warnings
    assert b"#define OFFCPU_WALKER 1" in bpf.text and bpf.text.endswith(b"// offcpu_trace.c\n")
    assert bpf.loaded == [b"walk_more", b"on_cpu_clock", b"offcpu_walk_more"]
    assert bpf.tables[b"offcpu_walk_progs"] == {0: 3}
    program.drop_tail_calls(bpf)  # both chains emptied before the program is freed
    assert bpf.tables[b"offcpu_walk_progs"] == {} and bpf.tables[b"walk_progs"] == {}


def test_a_refused_off_cpu_walk_leaves_the_walker_alone_with_one_warning() -> None:
    program, warnings = _program()
    bpf = program.load(type("Refusing", (_FakeBpf,), {"refuse": True}))
    assert not program.offcpu_walker and program.offcpu_text is None
    assert b"OFFCPU_WALKER" not in bpf.text and b"offcpu_walk_more" not in bpf.loaded
    assert len(warnings) == 1 and "off-CPU stacks by the walker unavailable" in warnings[0], warnings
