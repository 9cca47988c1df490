"""Native frames named in batches during the window (profiler/symbols/batches.py): the capture of the same
samples is byte for byte the one a single pass after the window gives, and a process that exits keeps
the native names its batches found."""

from __future__ import annotations

import struct

from profiler.capture.stackstore import INTERPRETED_TAG, StackStore
from profiler.capture.stacktable import StackTable, encode_table
from profiler.symbols.batches import WindowSymbols
from profiler.symbols.frames import Frame, FrameMemo
from profiler.symbols.symbolize import StackFolder, tabulate_store

PID = 7
NATIVE_LOW = 0x400000  # addresses from here on are in a file (libfake.so); below: JIT code


class FakeProcessSymbols(FrameMemo):
    """A process's symbolizer: its files' answers while the process runs, nothing once it is gone."""

    def __init__(self, alive: bool = True) -> None:
        self._memo: dict[int, Frame] = {}
        self.alive = alive
        self.resolved: list[int] = []
        self.closed = False

    def _resolve(self, addr: int) -> Frame:
        self.resolved.append(addr)
        if not self.alive:
            return Frame("[unknown]", "unknown")
        if addr >= NATIVE_LOW:
            return Frame(f"native_{addr:x}", "native", "libfake.so")
        return Frame(f"Jit::m{addr:x}", "jit")

    def close(self) -> None:
        self.closed = True


class FakeKernel:
    """/proc/kallsyms's names, memoized as KernelSymbols does."""

    def __init__(self) -> None:
        self.resolved: list[int] = []
        self.names: dict[int, str] = {}
        self.closed = False

    def resolve(self, addr: int) -> str:
        if addr not in self.names:
            self.resolved.append(addr)
            self.names[addr] = f"ksym_{addr & 0xFFFF:x}"
        return self.names[addr]

    def close(self) -> None:
        self.closed = True


def stack(*addrs: int) -> bytes:
    return struct.pack(f"<{len(addrs)}Q", *addrs)


def sample_stream() -> list[tuple[int, bytes, bytes | int, str | None]]:
    """(time s, user stack leaf first, kernel stack or -1, context): 40 samples of 17 distinct stacks,
    natives shared between stacks, JIT frames, a kernel part on some, contexts on some."""
    samples = []
    for n in range(40):
        leaf = NATIVE_LOW + 0x10 * (n % 4) if n % 3 else 0x2000 + 0x10 * (n % 5)
        user = stack(leaf, NATIVE_LOW + 0x900 + 0x10 * (n % 3), NATIVE_LOW + 0xF00)
        kernel: bytes | int = stack(0xFFFF0000 + n % 2) if n % 4 == 0 else -1
        samples.append((n, user, kernel, "task 1" if n % 6 == 0 else None))
    return samples


def tabulate(store: StackStore, symbols: FakeProcessSymbols, kernel: FakeKernel) -> StackTable:
    return tabulate_store(store, PID, StackFolder(symbols, kernel, 127, True), None, None)


def run_window(batch_every: int | None, limit: int = 3) -> tuple[StackStore, WindowSymbols | None, FakeKernel]:
    """The samples filed as the reader would, with a batch after every ``batch_every`` of them (None: none)."""
    store = StackStore(10 * 10**9)
    store.begin(0)
    store.track_fresh = batch_every is not None
    kernel = FakeKernel()
    prepared = FakeProcessSymbols()  # the cache the sampler keeps for the process (symbolprep's)
    window = WindowSymbols(lambda pid: prepared, walker=False) if batch_every else None
    for number, (time_s, user, kernel_stack, context) in enumerate(sample_stream(), 1):
        store.add(PID, PID, b"worker", time_s * 10**9, user, kernel_stack, 0, context=context)
        if window is not None and batch_every and number % batch_every == 0:
            window.name_batch(store.take_fresh(limit))
    return store, window, kernel


def test_batches_leave_the_capture_byte_for_byte_the_same_and_the_post_run_pass_names_no_native_frame() -> None:
    # GIVEN the same sample stream, once named after the window only and once in batches of 3 stacks
    reference_store, _none, reference_kernel = run_window(None)
    reference = tabulate(reference_store, FakeProcessSymbols(), reference_kernel)
    store, window, kernel = run_window(batch_every=4)
    assert window is not None
    while store.fresh_left:  # the last batches, as at the end
        window.name_batch(store.take_fresh(3))
    prepared = window.used[PID]
    assert isinstance(prepared, FakeProcessSymbols)
    looked_up = len(prepared.resolved)
    # WHEN the pass after the window adopts the batches' names into the fresh cache of the live process
    end_symbols = FakeProcessSymbols()
    window.adopt_into(PID, end_symbols)
    table = tabulate(store, end_symbols, kernel)
    # THEN the table is the same bytes, and that pass resolved JIT addresses only (natives came from the batches)
    assert encode_table(table) == encode_table(reference)
    assert end_symbols.resolved and all(addr < NATIVE_LOW for addr in end_symbols.resolved)
    assert window.stacks_named == store.distinct_stacks == 17
    # ... and the batches asked bcc once per distinct pc (13 of them), not once per stack that holds it
    assert looked_up == len(set(prepared.resolved)) == 13
    assert window.used == {} and not prepared.closed  # the prepared cache is its owner's to free


def test_a_process_that_exits_mid_window_keeps_the_native_names_its_batches_found() -> None:
    # GIVEN a process whose samples were batched while it ran, and which is gone when the window ends
    store, window, kernel = run_window(batch_every=1, limit=100)
    assert window is not None
    gone = FakeProcessSymbols(alive=False)  # a fresh cache of a process that is gone names nothing
    window.adopt_into(PID, gone)
    # WHEN its stacks are named after the window
    table = tabulate(store, gone, kernel)
    # THEN its native frames have their names (only its JIT frames, named after the window, are lost) ...
    names = set(table.names)
    assert "native_400f00" in names and "native_400900" in names
    # ... where a single pass after the window (the behaviour before batches) loses them all
    store_after, _none, kernel_after = run_window(None)
    lost = tabulate(store_after, FakeProcessSymbols(alive=False), kernel_after)
    assert not any(name.startswith("native_") for name in lost.names)


def test_a_batch_skips_tagged_walker_values_and_a_process_without_a_cache() -> None:
    # GIVEN a walker stack (an interpreted frame's tagged Method* beside pcs) and a process no cache opens for
    store = StackStore(10 * 10**9)
    store.begin(0)
    store.track_fresh = True
    store.add(PID, PID, b"worker", 1, stack(INTERPRETED_TAG | 0x1234, NATIVE_LOW + 0x10), -1)
    store.add(99, 99, b"worker", 2, stack(NATIVE_LOW + 0x20), -1)
    opened: dict[int, FakeProcessSymbols] = {}

    def open_symbols(pid: int) -> FakeProcessSymbols | None:
        if pid == 99:
            return None  # exited before its first batch
        opened[pid] = FakeProcessSymbols()
        return opened[pid]

    window = WindowSymbols(open_symbols, walker=True)
    # WHEN a batch runs
    assert window.name_batch(store.take_fresh(10)) == 2
    # THEN only the pc was resolved, and the process without a cache is left to the pass after the window
    assert opened[PID].resolved == [NATIVE_LOW + 0x10]
    assert 99 not in window.used
    window.close()
    assert window.used == {} and not opened[PID].closed


def test_the_memo_of_a_batch_keeps_file_symbols_only_and_stops_at_its_bound(monkeypatch: object) -> None:
    import profiler.symbols.frames as frames

    symbols = FakeProcessSymbols()
    symbols.resolve_native(0x2000)  # JIT: named later with its epoch's perf map
    symbols.resolve_native(NATIVE_LOW)
    assert list(symbols._memo) == [NATIVE_LOW]
    monkeypatch.setattr(frames, "MEMO_LIMIT", 1)  # type: ignore[attr-defined]
    symbols.resolve_native(NATIVE_LOW + 8)
    assert list(symbols._memo) == [NATIVE_LOW]


def test_a_live_process_cache_names_in_a_batch_only_pcs_in_a_file_mapping() -> None:
    from profiler.symbols.procsyms import ExecMapping, MapsRead, ProcessSymbols

    # GIVEN a process's cache whose executable file mappings are two ranges (its files stubbed out)
    mappings = [ExecMapping(0x1000, 0x2000, 0, "/a.so", "a.so"), ExecMapping(0x5000, 0x6000, 0, "/b.so", "b.so")]
    symbols = ProcessSymbols(PID, maps=MapsRead(mappings), files=_NoFiles())
    asked: list[int] = []

    def resolve(addr: int) -> Frame:
        asked.append(addr)
        return Frame(f"f{addr:x}", "native", "libfake.so")

    symbols._resolve = resolve  # type: ignore[method-assign]
    # WHEN a batch names pcs inside, between, before and after them
    for addr in (0x1000, 0x1FFF, 0x2000, 0x4FFF, 0x5800, 0x6000, 0x10, 0x9000):
        symbols.resolve_native(addr)
    # THEN only the pcs in a file were looked up (JIT code and stubs are named after the window)
    assert asked == [0x1000, 0x1FFF, 0x5800]
    assert [symbols._in_file(a) for a in (0x0FFF, 0x1000, 0x2000, 0x5FFF, 0x6000)] == [False, True, False, True, False]


class _NoFiles:
    """A process whose files cannot be opened (procsyms.MappedFiles' interface)."""

    def key(self, pid: int, mapping: object) -> None:
        return None

    def symbols(self, pid: int, mapping: object, key: object) -> None:
        raise AssertionError("no file is opened without a key")
