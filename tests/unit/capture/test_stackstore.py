"""The ring-buffer sampler's pure parts: record parsing, distinct-stack store, folding, perf-map versions,
counter deltas."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest

from profiler.capture.format import PidCounters
from profiler.capture.stackstore import (
    CUT_CFI_MISS,
    CUT_DEPTH,
    CUT_JAVA,
    CUT_NATIVE,
    CUT_NO_CFI,
    GAP_TAG,
    INTERPRETED_TAG,
    NO_UNLOADS,
    RECORD_HEADER,
    WALK_ENDS,
    WALK_HEADER,
    StackStore,
    parse_record,
    parse_walk_record,
    stack_bytes,
)
from profiler.capture.timeline import CounterReading, counter_deltas, rss_bytes
from profiler.symbols.frames import Frame
from profiler.symbols.perfmap_history import PerfMapHistory
from profiler.symbols.symbolize import STACK_NONE, StackFolder, gap_frame, raw_addresses, tabulate_store
from profiler.unwind.hotspot import NO_METHOD_SLOT, STALE


def raw(*addrs: int) -> bytes:
    return struct.pack(f"<{len(addrs)}Q", *addrs)


def record(user: bytes | int, kernel: bytes | int, depth: int = 4, time_ns: int = 5, comm: bytes = b"main") -> bytes:
    user_len = len(user) if isinstance(user, bytes) else user
    kernel_len = len(kernel) if isinstance(kernel, bytes) else kernel
    head = RECORD_HEADER.pack(10, 11, time_ns, user_len, kernel_len, comm.ljust(16, b"\0"))
    user_area = (user if isinstance(user, bytes) else b"").ljust(8 * depth, b"\0")
    kernel_area = (kernel if isinstance(kernel, bytes) else b"").ljust(8 * depth, b"\0")
    return head + user_area + kernel_area


def test_record_layout_matches_the_bpf_struct() -> None:
    # tgid, tid (4+4), time_ns (8), two s32 lengths, comm[16]: 40 bytes before the user array
    assert RECORD_HEADER.size == 40
    parsed = parse_record(record(raw(1, 2), raw(9), depth=4), user_depth=4)
    assert parsed == (10, 11, 5, b"main", raw(1, 2), raw(9))
    assert parse_record(record(-14, STACK_NONE), user_depth=4)[4:] == (-14, STACK_NONE)


def walk_record(
    frames: list[int], walked: int, kernel: bytes | int = STACK_NONE, end: int = 0, unloads: int = (1 << 64) - 1
) -> bytes:
    kernel_len = len(kernel) if isinstance(kernel, bytes) else kernel
    head = WALK_HEADER.pack(10, 11, 5, 8 * len(frames), kernel_len, b"w".ljust(16, b"\0"), walked, end, unloads, 0, 0)
    return head + raw(*frames) + (kernel if isinstance(kernel, bytes) else b"")


def test_walker_record_is_as_long_as_used_and_keeps_leaf_and_root_of_a_deep_stack() -> None:
    # 56-byte header (the 40 of the ring-buffer record, then frames walked, why the walk ended and the JVM's
    # unloaded-class count: all ones when the walker had none)
    assert WALK_HEADER.size == 64
    parsed = parse_walk_record(walk_record([1, 2], 2, raw(9)), 2, 4)
    assert parsed == (10, 11, 5, b"w", raw(1, 2), raw(9), 0, NO_UNLOADS)
    assert parse_walk_record(walk_record([1], 1, unloads=7), 2, 4)[7] == 7
    # GIVEN 13 frames walked (leaf 1 .. root 13) into 2 leaf slots and a ring of 4: the ring holds the
    # last four frames written at slot (i - 2) % 4, so frame 10 (i = 9) sits at ring slot 3
    ring = [None] * 4
    for index in range(2, 13):
        ring[(index - 2) % 4] = index + 1
    parsed = parse_walk_record(walk_record([1, 2, *ring], 13, end=1), 2, 4)  # type: ignore[list-item]
    # THEN leaf frames, one gap frame counting the 7 frames cut, the root-most four in walk order
    assert parsed[4] == raw(1, 2, GAP_TAG | 7, 10, 11, 12, 13)
    assert WALK_ENDS[parsed[6]] == "depth limit"
    assert parse_walk_record(walk_record([], 0, -14), 2, 4)[5] == -14


def test_raw_addresses_stop_at_the_first_zero() -> None:
    assert raw_addresses(raw(3, 4, 0, 7)) == (3, 4)
    assert raw_addresses(b"") == ()


def test_store_counts_per_interval_and_epoch_and_keeps_one_copy_of_each_stack() -> None:
    store = StackStore(interval_ns=10)
    store.begin(100)
    for time_ns in (100, 105, 109, 110, 125):
        store.add(1, 1, b"t", time_ns, raw(1, 2), STACK_NONE)
    store.add(1, 2, b"t", 131, bytes(raw(1, 2)), STACK_NONE, epoch=1)  # another thread, equal content
    store.add(2, 2, b"u", 90, raw(5), -14)  # before the origin: interval 0
    assert store.samples == 7 and store.distinct_stacks == 2  # threads of one name share their stacks
    assert store.stored_bytes == len(raw(1, 2)) + len(raw(5))
    by_interval = sorted((interval, count) for _key, interval, count in store.entries(1, epoch=0))
    assert by_interval == [(0, 3), (1, 1), (2, 1)]
    assert [(k.comm, i, c) for k, i, c in store.entries(1, epoch=1)] == [(b"t", 3, 1)]
    assert store.epochs(1) == [0, 1] and store.pids() == [1, 2]
    store.forget(1)
    assert store.pids() == [2]
    with pytest.raises(ValueError):
        StackStore(0)


def test_deep_stacks_share_their_root_chunks() -> None:
    # GIVEN 100 stacks 600 frames deep that differ only in their leaf frame
    root = list(range(1000, 1599))
    store = StackStore(interval_ns=10)
    news = [store.add(1, 1, b"t", 0, raw(leaf, *root), STACK_NONE) for leaf in range(1, 101)]
    assert all(news) and not store.add(1, 1, b"t", 0, raw(1, *root), STACK_NONE)
    # THEN chunks count from the root: 18 full chunks (576 root frames) held once, and per stack only its
    # leaf-most chunk (600 % 32 = 24 frames: the leaf and 23 root frames); 23,808 bytes instead of 480,000
    assert store.distinct_stacks == 100
    assert store.stored_bytes == 8 * 576 + 100 * 8 * 24
    stored = {key.user for key, _interval, _count in store.entries(1)}
    assert {stack_bytes(user) for user in stored} == {raw(leaf, *root) for leaf in range(1, 101)}  # type: ignore[arg-type]


def test_the_store_hands_each_new_user_chunk_out_once_with_the_process_of_its_first_stack() -> None:
    # GIVEN a store kept for the batches, and deep stacks of two processes sharing their root chunks
    root = list(range(1000, 1064))  # two full chunks
    store = StackStore(interval_ns=10)
    store.track_fresh = True
    store.add(1, 1, b"t", 0, raw(5, *root), raw(0xFFFF0001))  # 65 frames: the leaf chunk holds one frame
    store.add(1, 1, b"t", 1, raw(6, *root), STACK_NONE)
    store.add(2, 2, b"t", 2, raw(6, *root), STACK_NONE)  # the same addresses in another process
    store.add(1, 1, b"t", 3, raw(7), STACK_NONE)  # a short stack is one chunk
    store.add(1, 1, b"t", 4, raw(7), STACK_NONE)
    # WHEN the batches take them, two at a time
    first, second, third = store.take_fresh(2), store.take_fresh(2), store.take_fresh(2)
    # THEN every user chunk came out once (no kernel chunk), in the order stored, under its first process
    taken = [*first.chunks, *second.chunks, *third.chunks]
    assert taken == [(1, raw(5)), (1, raw(*root[:32])), (1, raw(*root[32:])), (1, raw(6)), (1, raw(7))]
    assert (first.stacks, second.stacks, third.stacks) == (4, 0, 0)  # 4 distinct keys were new at the first take
    assert store.fresh_left == 0
    # ... a known deep stack adds nothing, and after the window nothing is kept for batches
    store.add(1, 1, b"t", 5, raw(5, *root), STACK_NONE)
    assert store.fresh_left == 0
    store.stop_fresh()
    store.add(1, 1, b"t", 6, raw(8, *root), STACK_NONE)
    assert store.fresh_left == 0 and store.take_fresh(10).chunks == ()


def test_a_deep_stack_seen_again_is_the_stored_tuple_of_the_stored_chunks() -> None:
    root = list(range(1000, 1100))
    store = StackStore(interval_ns=10)
    store.add(1, 1, b"t", 0, raw(5, *root), STACK_NONE)
    store.add(1, 1, b"t", 0, raw(5, *root), STACK_NONE)
    store.add(1, 1, b"t", 0, raw(6, *root), STACK_NONE)
    users = [key.user for key, _interval, _count in store.entries(1)]
    assert len(users) == 2 and all(isinstance(user, tuple) for user in users)
    assert users[0][1:] == users[1][1:] and all(a is b for a, b in zip(users[0][1:], users[1][1:], strict=True))


class FakeSymbols:
    """Resolves from a dict; a JIT map switch renames the JIT addresses (as a perf-map epoch does)."""

    def __init__(self, native: dict[int, str], jit: dict[int, str]) -> None:
        self.native, self.jit = native, jit
        self.perf_map = None

    def set_perf_map(self, perf_map: object) -> None:
        self.perf_map = perf_map
        if isinstance(perf_map, dict):
            self.jit = perf_map

    def resolve(self, addr: int) -> Frame:
        if addr in self.native:
            return Frame(self.native[addr], "native")
        if addr in self.jit:
            return Frame(self.jit[addr], "jit")
        return Frame("[unknown]", "anon")


class FakeKernel:
    def resolve(self, addr: int) -> str:
        return f"k{addr}"


def test_folder_names_counts_and_measures_java_frames() -> None:
    symbols = FakeSymbols({1: "start_thread", 2: "JavaThread::run"}, {10: "a.B::m", 11: "Interpreter"})
    folder = StackFolder(symbols, FakeKernel(), depth=5, java_process=True)  # type: ignore[arg-type]
    # leaf first: compiled method, interpreter, then the thread's native start
    assert folder.fold(b"w", raw(10, 11, 2, 1), STACK_NONE, 3) == "w;start_thread;JavaThread::run;Interpreter;a.B::m"
    interpreted = folder.fold(b"w", raw(11, 11, 2, 1), raw(7, 8), 2)
    assert interpreted == "w;start_thread;JavaThread::run;Interpreter;Interpreter;k8_[k];k7_[k]"
    assert folder.fold(b"w", raw(99, 2), STACK_NONE, 1) == "w;JavaThread::run;[unknown]"
    assert folder.fold(b"w", -14, -14, 4) == "w;[lost user stack];[lost kernel stack]"
    counts = folder.health.counts
    assert counts["interpreted_only"] == 2  # only the stack whose Java frames are all Interpreter
    assert counts["java_frames"] == 3 * 2 + 2 * 2 + 1 and counts["java_frames_unresolved"] == 1
    assert counts["java_unwalkable"] == 1  # Java code, but the walk never reached a thread start
    assert counts["lost_user_stack"] == 4 and counts["lost_kernel_stack"] == 4
    assert counts["truncated"] == 0
    folder.fold(b"w", raw(2, 2, 2, 2, 2), STACK_NONE, 1)
    assert folder.health.counts["truncated"] == 1
    # a new perf-map epoch renames the same JIT address
    folder.use_perf_map({10: "c.D::n"})
    assert folder.fold(b"w", raw(10, 2, 1), STACK_NONE, 1) == "w;start_thread;JavaThread::run;c.D::n"


@pytest.fixture
def own_perf_map() -> Path:
    path = Path(f"/tmp/perf-{os.getpid()}.map")
    yield path
    path.unlink(missing_ok=True)


def test_perf_map_history_names_a_sample_with_the_version_after_it_then_the_one_before(
    tmp_path: Path, own_perf_map: Path
) -> None:
    history = PerfMapHistory(os.getpid(), tmp_path / "versions")
    own_perf_map.write_text("1000 10 old.A::m\n2000 10 gone.G::x\n")  # hexadecimal
    first = history.begin()
    history.finish(first, ok=True)
    between = history._starts[-1] + 1
    own_perf_map.write_text("1000 10 new.B::m\n")  # 1000 reused, 2000 freed
    second = history.begin()
    history.finish(second, ok=True)
    failed = history.begin()
    history.finish(failed, ok=False)
    assert history.snapshots == 2
    assert history.epoch_at(0) == 0 and history.epoch_at(between) == 1 and history.epoch_at(10**20) == 3
    early, late = history.map_for(0), history.map_for(1)
    assert early is not None and late is not None
    assert early.lookup(0x1005) == "old.A::m"
    assert late.lookup(0x1005) == "new.B::m"  # the version after the sample decides
    assert late.lookup(0x2005) == "gone.G::x"  # freed since: the version before still names it
    assert history.map_for(3).lookup(0x1005) == "new.B::m"  # a failed refresh: the last good version
    # an unchanged map is stored once
    third = history.begin()
    history.finish(third, ok=True)
    assert history.path_for(3) == history.path_for(1)
    history.discard()
    assert not any((tmp_path / "versions").iterdir())


def counters(cycles: float | None, seconds: float | None) -> PidCounters:
    return PidCounters(1, {}, cycles=cycles, cycles_estimated=True, cpu_seconds=seconds)


def test_counter_deltas_between_cumulative_readings() -> None:
    readings = [
        CounterReading.of(0, counters(100.0, 1.0)),
        CounterReading.of(1, counters(150.0, 1.5)),
        CounterReading.of(1, counters(180.0, 1.8)),  # a second reading of interval 1: the last counts
        CounterReading.of(3, counters(300.0, None)),  # interval 2 had no reading; seconds went missing
    ]
    rows = counter_deltas(readings)
    assert [(r.interval, r.cycles, r.cpu_seconds) for r in rows] == [
        (0, 100.0, 1.0),
        (1, 80.0, pytest.approx(0.8)),
        (3, 120.0, None),
    ]
    assert rss_bytes("Name:\tx\nVmRSS:\t  2048 kB\n") == 2 * 1024 * 1024 and rss_bytes("") == 0


class FakeNamer:
    """MethodNamer's interface: names for some Method*, a cause for the others."""

    def __init__(self, names: dict[int, str], failures: dict[int, str]) -> None:
        self.names, self.failures = names, failures

    def name(self, method: int, _generation: int | None = None) -> str | None:
        return self.names.get(method)

    def cause(self, method: int, _generation: int | None, default: str) -> str:
        return self.failures.get(method, default)


def walker_folder(symbols: FakeSymbols, depth: int, **options: Any) -> StackFolder:
    """A folder of the walker's stacks of one JVM, named by the fakes (``options``: StackFolder's)."""
    return StackFolder(symbols, FakeKernel(), depth, java_process=True, walker=True, **options)  # type: ignore[arg-type]


def test_walker_stacks_name_interpreted_frames_mark_gaps_and_count_causes() -> None:
    symbols = FakeSymbols({1: "start_thread", 2: "JavaThread::run", 3: "memcpy"}, {10: "a.B::m", 11: "Interpreter"})
    namer = FakeNamer({0x5000: "a.B::loop"}, {0x6000: STALE})
    folder = walker_folder(symbols, 6, methods=namer)
    # GIVEN leaf first: an interpreted frame named, one stale, an interpreter pc without Method*, the thread start
    stack = raw(INTERPRETED_TAG | 0x5000, INTERPRETED_TAG | 0x6000, 11, 2, 1)
    expected = "w;start_thread;JavaThread::run;Interpreter;Interpreter;a.B::loop [i]"
    assert folder.fold(b"w", stack, STACK_NONE, 2) == expected
    # a deep stack: leaf, gap, root
    deep = raw(10, GAP_TAG | 600, 2, 1)
    assert folder.fold(b"w", deep, STACK_NONE, 1) == f"w;start_thread;JavaThread::run;{gap_frame(600)};a.B::m"
    # walks that ended before any thread start: at a native frame, at a Java frame
    assert folder.fold(b"w", raw(10, 3), STACK_NONE, 4, walk_end=3) == "w;memcpy;a.B::m"
    folder.fold(b"w", raw(3, 10), STACK_NONE, 5, walk_end=2)
    fields = folder.stats_fields
    assert fields["interpreted_frames"] == 3 * 2 and fields["interpreted_named"] == 1 * 2
    assert fields["interpreted_unnamed"] == {STALE: 2, NO_METHOD_SLOT: 2}
    assert fields["stacks_cut"] == {CUT_DEPTH: 1, CUT_NATIVE: 4, CUT_JAVA: 5}
    assert fields["truncated"] == 1  # only the stack with a gap: a 6-frame stack is not cut by itself


def test_stacks_ending_at_a_native_frame_are_told_apart_by_the_unwind_tables() -> None:
    # GIVEN walks that ended at native frames: 3 in an ELF without .eh_frame, 4 in no FDE, 5 outermost by CFI
    symbols = FakeSymbols({3: "memcpy", 4: "asm_helper", 5: "weird", 1: "start_thread"}, {10: "a.B::m"})
    causes = {3: CUT_NO_CFI, 4: CUT_CFI_MISS}
    folder = walker_folder(symbols, 8, native_cause=causes.get)
    for outermost, count in ((3, 2), (4, 3), (5, 1)):
        folder.fold(b"w", raw(10, outermost), STACK_NONE, count)
    folder.fold(b"w", raw(10, 1), STACK_NONE, 7)  # reached the thread's start: not cut
    # THEN each has its cause; one the tables know nothing about stays "ended at a native frame"
    assert folder.stats_fields["stacks_cut"] == {CUT_NO_CFI: 2, CUT_CFI_MISS: 3, CUT_NATIVE: 1}


class CountingSymbols(FakeSymbols):
    """FakeSymbols that counts its lookups (no memo of its own: each call is a naming)."""

    def __init__(self, native: dict[int, str], jit: dict[int, str]) -> None:
        super().__init__(native, jit)
        self.lookups = 0

    def resolve(self, addr: int) -> Frame:
        self.lookups += 1
        return super().resolve(addr)


class MapsPerEpoch:
    """A perf-map history whose epochs' maps are given (PerfMapHistory.map_for)."""

    def __init__(self, maps: list[dict[int, str]]) -> None:
        self.maps = maps

    def map_for(self, epoch: int) -> dict[int, str]:
        return self.maps[epoch]


def test_each_value_is_named_once_per_epoch_and_a_stack_again_only_when_one_of_its_values_changed() -> None:
    # GIVEN JIT address 10 holding old.A::m in epoch 0 and new.B::m (code freed, address reused) from epoch 1 on;
    # stack S = (10, 2, 1) sampled in epochs 0, 2 and 3, and U = (10, 3, 1) only in epoch 1, where 10 changed
    symbols = CountingSymbols({1: "start_thread", 2: "JavaThread::run", 3: "Thread::call"}, {})
    folder = walker_folder(symbols, 8)
    old, new = {10: "old.A::m", 11: "c.C::n"}, {10: "new.B::m", 11: "c.C::n"}
    store = StackStore(interval_ns=10)
    s, u, v = raw(10, 2, 1), raw(10, 3, 1), raw(11, 2, 1)
    for epoch, user, count in ((0, s, 3), (1, u, 2), (2, s, 4), (3, s, 5), (3, s, 1), (3, v, 1)):
        for _ in range(count):
            store.add(7, 7, b"w", epoch * 10, user, STACK_NONE, epoch=epoch)
    # WHEN the store is tabulated epoch by epoch
    table = tabulate_store(store, 7, folder, MapsPerEpoch([old, new, new, new]), None)  # type: ignore[arg-type]
    # THEN S is named with the code of each sample's epoch: the rename in epoch 1 reached S in epoch 2,
    # although S was not sampled in epoch 1 and 10 named the same in epochs 1 and 2
    assert table.folded() == {
        "w;start_thread;JavaThread::run;old.A::m": 3,
        "w;start_thread;Thread::call;new.B::m": 2,
        "w;start_thread;JavaThread::run;new.B::m": 4 + 5 + 1,
        "w;start_thread;JavaThread::run;c.C::n": 1,
    }
    assert sorted(table.stack_counts().values()) == [1, 2, 3, 10]  # S renamed is one stack over epochs 2 and 3
    # and each distinct value was looked up once per epoch it occurs in (3 values in epochs 0-2, 4 in epoch 3
    # where S and V share 2 and 1), not once per sample, per interval or per stack
    assert symbols.lookups == 3 + 3 + 3 + 4
    assert folder.health.counts["java_frames"] == 16 and folder.health.counts["java_unwalkable"] == 0


class ModuleSymbols(CountingSymbols):
    """CountingSymbols whose native frames are symbols of a file (libjvm.so), as bcc names them."""

    def resolve(self, addr: int) -> Frame:
        frame = super().resolve(addr)
        return Frame(frame.name, "native", "libjvm.so") if frame.kind == "native" else frame


def test_gap_and_native_values_are_named_once_for_good_while_a_jit_value_is_renamed_in_a_later_epoch() -> None:
    # GIVEN native pcs 1 and 2 (symbols of libjvm.so), a gap of 40 frames and JIT address 10 renamed in epoch 2;
    # stack S = (10, gap, 2, 1) sampled in epochs 0-3, T = (11, 2, 1) in epoch 3 only
    symbols = ModuleSymbols({1: "start_thread", 2: "JavaThread::run"}, {})
    folder = walker_folder(symbols, 8)
    old, new = {10: "old.A::m", 11: "c.C::n"}, {10: "new.B::m", 11: "c.C::n"}
    store = StackStore(interval_ns=10)
    s, t = raw(10, GAP_TAG | 40, 2, 1), raw(11, 2, 1)
    for epoch, user in ((0, s), (1, s), (2, s), (3, s), (3, t)):
        store.add(7, 7, b"w", epoch * 10, user, STACK_NONE, epoch=epoch)
    # WHEN the store is tabulated epoch by epoch
    table = tabulate_store(store, 7, folder, MapsPerEpoch([old, old, new, new]), None)  # type: ignore[arg-type]
    # THEN the rename of 10 reaches S from epoch 2 on, the gap and native frames stay as they were
    cut = gap_frame(40)
    assert table.folded() == {
        f"w;start_thread;JavaThread::run;{cut};old.A::m": 2,
        f"w;start_thread;JavaThread::run;{cut};new.B::m": 2,
        "w;start_thread;JavaThread::run;c.C::n": 1,
    }
    # and the native pcs were looked up once in all (epoch 0), the JIT ones once per epoch they occur in
    # (10 in epochs 0-3, 11 in epoch 3); the gap is no lookup
    assert symbols.lookups == 2 + 4 + 1
    assert folder.health.counts["truncated"] == 4


def test_tabulating_gives_the_table_that_naming_every_epoch_afresh_gives() -> None:
    # GIVEN 40 stacks over 6 epochs whose JIT map renames a few addresses in some epochs
    store = StackStore(interval_ns=10)
    maps = [{a: f"m{a}.e{epoch if a % 5 == 0 and epoch % 2 else 0}::x" for a in range(10, 30)} for epoch in range(6)]
    for n in range(400):
        epoch, first = (n * 7) % 6, 10 + (n % 40) // 2
        store.add(7, 7, b"w", n, raw(first, 10 + n % 20, 2, 1), STACK_NONE, epoch=epoch)
    native = {1: "start_thread", 2: "JavaThread::run"}
    carried = StackFolder(FakeSymbols(native, {}), FakeKernel(), 8, True)  # type: ignore[arg-type]
    table = tabulate_store(store, 7, carried, MapsPerEpoch(maps), None)  # type: ignore[arg-type]
    # WHEN each epoch is named by a folder of its own (nothing carried over)
    expected: dict[str, int] = {}
    for epoch in store.epochs(7):
        folder = StackFolder(FakeSymbols(native, maps[epoch]), FakeKernel(), 8, True)  # type: ignore[arg-type]
        for key, _interval, count in store.entries(7, epoch):
            line = folder.fold(key.comm, key.user, key.kernel, count)
            expected[line] = expected.get(line, 0) + count
    # THEN the same stacks with the same counts
    assert table.folded() == expected


def test_packed_value_counts_add_up_and_the_last_field_never_wraps() -> None:
    from profiler.symbols.symbolize import VALUE_COUNTS, pack_counts, unpack_counts

    assert VALUE_COUNTS[-1] == "gap"  # unbounded: nothing above it to carry into
    first = [3, 0, 1, 2, 0, 1, 70, 7, 1, 0, 5, 1, 0]
    second = [1, 4, 0, 0, 9, 0, 0, 2, 0, 6, 0, 0, 2**40]
    assert len(first) == len(VALUE_COUNTS)
    assert unpack_counts(pack_counts(first) + pack_counts(second)) == [a + b for a, b in zip(first, second)]
