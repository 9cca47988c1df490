"""User stacks held packed during the window (profiler/capture/packedchunks.py): a store that packs them holds
the same stacks, hands the journal and the batches the same bytes and, after end_window(), tabulates to the
same table as one that never packed; in far fewer bytes."""

from __future__ import annotations

import random
import struct

import pytest

from profiler.capture.journal import encode_stacks
from profiler.capture.packedchunks import PackedChunks
from profiler.capture.stackstore import GAP_TAG, INTERPRETED_TAG, StackStore, StoreDelta
from profiler.capture.stacktable import encode_table
from profiler.symbols.frames import Frame
from profiler.symbols.symbolize import StackFolder, tabulate_store

STACK_NONE = -1


def raw(*addrs: int) -> bytes:
    return struct.pack(f"<{len(addrs)}Q", *addrs)


def sample_stream(seed: int) -> list[tuple[int, int, bytes | int, bytes | int, str | None]]:
    """(tgid, time, user, kernel, context): deep stacks with shared roots and random leaves (some 500 values
    deep, some exactly a chunk, short, empty, with a zero, tagged values, an errno), repeated ones too."""
    rng = random.Random(seed)
    root = [0x7F0000001000 + 16 * n for n in range(300)]
    methods = [INTERPRETED_TAG | (0x800000000 + 64 * n) for n in range(40)]
    samples: list[tuple[int, int, bytes | int, bytes | int, str | None]] = []
    for n in range(600):
        shape = n % 7
        if shape == 0 and samples:
            samples.append(samples[rng.randrange(len(samples))])  # an earlier sample again
            continue
        depth = rng.choice((1, 5, 31, 32, 33, 64, 150, 200))
        leaf = [
            rng.choice(methods) if rng.random() < 0.6 else 0x7F0000200000 + 8 * rng.randrange(500) for _ in range(depth)
        ]
        user: bytes | int = raw(*leaf, *root[: rng.randrange(300)])
        if shape == 1:
            user = raw(*leaf[:3], 0, *leaf[3:])
        elif shape == 2:
            user = b"" if n % 2 else -14
        elif shape == 3:
            user = raw(*leaf[:2], GAP_TAG | 77, *root[:100])
        kernel: bytes | int = raw(0xFFFFFFFF81000000 + n % 3, 0xFFFFFFFF81001000) if n % 4 == 0 else STACK_NONE
        samples.append((1 + n % 2, n * 10**8, user, kernel, f"task {n % 5}" if n % 3 == 0 else None))
    return samples


def fill(
    packed: PackedChunks | None, seed: int = 1
) -> tuple[StackStore, list[StoreDelta], list[list[tuple[int, bytes]]]]:
    """The stream filed into a store (packed or not), deltas and batches taken every 100 samples."""
    store = StackStore(interval_ns=10**9)
    store.begin(0)
    store.track_deltas = store.track_fresh = True
    if packed is not None:
        store.pack_user_stacks(packed)
    deltas, batches = [], []
    for n, (tgid, time_ns, user, kernel, context) in enumerate(sample_stream(seed), 1):
        store.add(tgid, tgid, b"worker", time_ns, user, kernel, n % 3, context=context)
        if n % 100 == 0:
            deltas.append(store.take_delta())
            batches.append(list(store.take_fresh(10**6).chunks))
    store.end_window()
    return store, deltas, batches


class NamedValues:
    """Names every value by itself (a FrameMemo stand-in): equal tables mean equal values in equal stacks."""

    perf_map = None

    def set_perf_map(self, _perf_map: object) -> None:
        pass

    def resolve(self, addr: int) -> Frame:
        return Frame(f"f{addr:x}", "native", "lib.so")


class Kernel:
    def resolve(self, addr: int) -> str:
        return f"k{addr:x}"


def table_bytes(store: StackStore, tgid: int) -> bytes:
    folder = StackFolder(NamedValues(), Kernel(), 127, True)  # type: ignore[arg-type]
    return encode_table(tabulate_store(store, tgid, folder, None, None))


@pytest.mark.parametrize("chunk_hash", [hash, lambda part: len(part) % 3], ids=["hash", "colliding hash"])
def test_a_packed_store_holds_hands_out_and_tabulates_what_an_unpacked_one_does(chunk_hash: object) -> None:
    # GIVEN the same samples filed into a store that packs user stacks and one that does not (and, in the
    # second case, a hash under which nearly every chunk collides with another)
    plain, plain_deltas, plain_batches = fill(None)
    packed, packed_deltas, packed_batches = fill(PackedChunks(chunk_hash))  # type: ignore[arg-type]
    # THEN the journal got the same bytes, the batches the same chunks of the same processes ...
    assert [encode_stacks(d) for d in packed_deltas] == [encode_stacks(d) for d in plain_deltas]
    assert packed_batches == plain_batches
    # ... and after the window the store holds the same keys (same ids) and counts, chunks shared alike
    assert packed._key_list == plain._key_list and packed._keys == plain._keys
    assert packed._counts == plain._counts and packed.stored_bytes == plain.stored_bytes
    assert len(packed._chunks) == len(plain._chunks) and len(packed._deep) == len(plain._deep)
    for tgid in plain.pids():
        assert table_bytes(packed, tgid) == table_bytes(plain, tgid)


def test_packed_chunks_give_their_addresses_back_and_hold_a_fraction_of_them() -> None:
    chunks = PackedChunks()
    root = [0x7F0000001000 + 16 * (n % 50) for n in range(32)]
    parts = [raw(*root), raw(*root[:5]), raw(), raw(INTERPRETED_TAG | 8, GAP_TAG | 3, 0, 2**64 - 1)]
    found = [chunks.find(part) for part in parts]
    assert all(new for _packed, new in found) and [chunks.find(part) for part in parts] == [
        (p, False) for p, _ in found
    ]
    assert [chunks.expand(packed) for packed, _new in found] == parts and len(chunks) == 4
    # a chunk of 32 values that uses values seen before costs 5 + 2 * 32 bytes, not 256
    again = raw(*reversed(root))
    before = chunks.held_bytes
    chunks.find(again)
    assert chunks.held_bytes - before == 5 + 2 * 32


def test_a_chunk_whose_values_the_full_table_has_no_room_for_is_held_as_its_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import profiler.capture.packedchunks as packedchunks

    monkeypatch.setattr(packedchunks, "MAX_VALUES", 3)
    chunks = PackedChunks()
    known, _new = chunks.find(raw(1, 2, 3))  # the table is full now
    wide = raw(1, 4, 2)
    packed, new = chunks.find(wide)
    assert new and len(packed) == 5 + 8 * 3 and chunks.expand(packed) == wide
    assert chunks.find(wide) == (packed, False) and chunks.expand(known) == raw(1, 2, 3)
    narrow, _ = chunks.find(raw(3, 2))
    assert len(narrow) == 5 + 2 * 2 and chunks.expand(narrow) == raw(3, 2)


def test_a_packed_store_refuses_to_start_packing_after_samples() -> None:
    store = StackStore(interval_ns=10)
    store.add(1, 1, b"w", 0, raw(1), STACK_NONE)
    with pytest.raises(RuntimeError):
        store.pack_user_stacks()


def test_a_store_whose_value_table_fills_up_still_gives_the_same_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    import profiler.capture.packedchunks as packedchunks

    monkeypatch.setattr(packedchunks, "MAX_VALUES", 50)  # most chunks then held as addresses
    plain, plain_deltas, plain_batches = fill(None, seed=2)
    packed, packed_deltas, packed_batches = fill(PackedChunks(), seed=2)
    assert [encode_stacks(d) for d in packed_deltas] == [encode_stacks(d) for d in plain_deltas]
    assert packed_batches == plain_batches and packed._key_list == plain._key_list
    for tgid in plain.pids():
        assert table_bytes(packed, tgid) == table_bytes(plain, tgid)


def test_a_deep_stack_seen_lately_is_found_again_whole_and_the_memory_of_them_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import profiler.capture.stackstore as stackstore

    monkeypatch.setattr(stackstore, "RECENT_STACKS", 2)
    store = StackStore(interval_ns=10)
    store.pack_user_stacks()
    stacks = [raw(n, *range(1000, 1100)) for n in range(1, 4)]
    stored = [store._intern_user(user)[0] for user in stacks]
    assert len(store._recent) == 1  # cleared when the third came
    assert store._intern_user(stacks[2]) == (stored[2], False)  # found whole
    assert store._intern_user(stacks[0]) == (stored[0], False)  # found by its chunks, remembered again
    assert len(store._recent) == 2


class CountingChunks(PackedChunks):
    """PackedChunks that counts the chunks it expands (the real packing underneath)."""

    def __init__(self) -> None:
        super().__init__()
        self.expanded: list[bytes] = []

    def expand(self, packed: bytes) -> bytes:
        self.expanded.append(packed)
        return super().expand(packed)


def test_a_delta_expands_each_packed_chunk_once_however_many_new_stacks_share_it() -> None:
    # GIVEN a packed store holding 50 deep stacks that share their 8 root-side chunks and differ at the leaf
    chunks = CountingChunks()
    store = StackStore(interval_ns=10**9)
    store.begin(0)
    store.track_deltas = True
    store.pack_user_stacks(chunks)
    root = [0x7F0000001000 + 16 * n for n in range(256)]
    stacks = [raw(0x7F0000200000 + n, *root) for n in range(50)]
    for n, user in enumerate(stacks):
        store.add(1, 1, b"worker", n, user, STACK_NONE)
    # WHEN the journal takes its delta
    delta = store.take_delta()
    # THEN it has every stack's addresses, and expanded 8 + 50 chunks, not 50 x 9
    assert [key.user for _key_id, key in delta.keys] == stacks
    assert len(chunks.expanded) == len(set(chunks.expanded)) == 8 + 50
