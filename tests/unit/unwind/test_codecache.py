"""profiler/unwind/codecache.py on a fake JVM memory: the segment-map lookup, compiled frames named only while
their compile id holds, and hostile vmStructs refused with a reason."""

from __future__ import annotations

import struct
from array import array

import pytest

from profiler.errors import VMStructsError
from profiler.unwind import codecache
from profiler.unwind.codecache import (
    COMPILE_ID_SHIFT,
    COMPILED_TAG,
    FREED,
    CodeCacheLayout,
    CodeHeap,
    CompiledNamer,
    compiled_pc,
    find_blob,
    read_code_cache,
)
from tests.fixtures.memory import FakeMemory

HEAP_LOW = 0x7F00_0000_0000
SEGMAP = 0x7E00_0000_0000
SHIFT = 7  # 128-byte segments
HEAPBLOCK = 16


def _layout(kind: int = -1) -> CodeCacheLayout:
    return CodeCacheLayout(
        low=HEAP_LOW,
        high=HEAP_LOW + (1 << 20),
        heaps=(CodeHeap(HEAP_LOW, HEAP_LOW + (1 << 20), SEGMAP),),
        segment_shift=SHIFT,
        heapblock_size=HEAPBLOCK,
        frame_size=0x1C,
        frame_complete=0x14,
        frame_complete_width=4,
        code=0x20,
        code_is_offset=False,
        kind=kind,
        name=0x60,
        kind_nmethod=1,
        kind_vtable=4,
        compile_id=0x130,
        method=0x70,
    )


def _blob(memory: FakeMemory, first_segment: int, segments: int, compile_id: int, method: int, name: bytes) -> int:
    """A blob over ``segments`` segments: the segment map's back-links as HotSpot writes them (0 at the
    block's first segment, then 1, 2, ... up to 0xFE and again)."""
    links = bytes([0] + [((i - 1) % 0xFE) + 1 for i in range(1, segments)])
    memory.write(SEGMAP + first_segment, links)
    blob = HEAP_LOW + (first_segment << SHIFT) + HEAPBLOCK
    name_address = 0x6000_0000 + first_segment * 32
    memory.write(name_address, name + b"\0")
    memory.write(blob, bytes(0x140))
    memory.write(blob + 0x60, struct.pack("<Q", name_address))
    memory.write(blob + 0x70, struct.pack("<Q", method))
    memory.write(blob + 0x130, struct.pack("<i", compile_id))
    return blob


def test_segment_map_back_links_lead_to_the_blob_from_any_of_its_pcs():
    memory = FakeMemory()
    blob = _blob(memory, 10, 700, 42, 0xABC0, b"nmethod")  # 700 segments: the links restart at 0xFE
    for segment in (10, 11, 264, 265, 709):
        pc = HEAP_LOW + (segment << SHIFT) + 5
        assert find_blob(memory, _layout(), pc) == blob, segment
    memory.write(SEGMAP + 710, b"\xff")  # a free segment
    assert find_blob(memory, _layout(), HEAP_LOW + (710 << SHIFT)) is None
    assert find_blob(memory, _layout(), HEAP_LOW - 8) is None  # outside every heap


def test_compiled_frame_is_named_only_while_its_compile_id_holds():
    memory = FakeMemory()
    _blob(memory, 3, 4, 77, 0x1000, b"nmethod")
    layout = _layout()
    pc = HEAP_LOW + (4 << SHIFT)
    stored = COMPILED_TAG | (77 << COMPILE_ID_SHIFT) | (pc - HEAP_LOW)
    assert compiled_pc(layout, stored) == (pc, 77)
    namer = CompiledNamer(memory, layout)
    assert namer.method_of(pc, 77) == 0x1000
    # WHEN the code is freed and its memory reused by another compilation of another method
    _blob(memory, 3, 4, 78, 0x2000, b"nmethod")
    # THEN a frame sampled under the old compile id is never named after the new code, and the new one is
    assert CompiledNamer(memory, layout).method_of(pc, 77) is None
    fresh = CompiledNamer(memory, layout)
    fresh.method_of(pc, 77)
    assert fresh.failures[(pc, 77)] == FREED
    assert namer.method_of(pc, 78) == 0x2000
    assert namer.method_of(pc, 77) == 0x1000  # read while alive: the name of its own time stays


def test_stubs_are_not_compiled_methods_and_kind_bytes_are_read_on_new_jdks():
    memory = FakeMemory()
    _blob(memory, 20, 2, 5, 0x3000, b"RuntimeStub")
    pc = HEAP_LOW + (20 << SHIFT) + 64
    assert CompiledNamer(memory, _layout()).method_of(pc, 5) is None
    blob = _blob(memory, 30, 2, 6, 0x4000, b"whatever")
    memory.write(blob + 0x38, b"\x01")  # CodeBlobKind::Nmethod at _kind (JDK 23+)
    assert CompiledNamer(memory, _layout(kind=0x38)).method_of(HEAP_LOW + (30 << SHIFT) + 64, 6) == 0x4000


FIELDS = {
    ("CodeCache", "_heaps"): 0x1000,
    ("CodeCache", "_low_bound"): 0x1010,
    ("CodeCache", "_high_bound"): 0x1018,
    ("GrowableArrayBase", "_len"): 0,
    ("GrowableArray<int>", "_data"): 8,
    ("CodeHeap", "_memory"): 8,
    ("CodeHeap", "_segmap"): 0x78,
    ("CodeHeap", "_log2_segment_size"): 0x100,
    ("VirtualSpace", "_low_boundary"): 0,
    ("VirtualSpace", "_high_boundary"): 8,
    ("VirtualSpace", "_low"): 0x10,
    ("CodeBlob", "_name"): 0x60,
    ("CodeBlob", "_frame_size"): 0x1C,
    ("CodeBlob", "_frame_complete_offset"): 0x14,
    ("CodeBlob", "_code_begin"): 0x20,
    ("CompiledMethod", "_method"): 0x70,
    ("nmethod", "_compile_id"): 0x130,
}


def _jvm_tables(heaps: int = 1, low: int = HEAP_LOW, high: int = HEAP_LOW + (1 << 20), shift: int = 7) -> FakeMemory:
    memory = FakeMemory()
    memory.write(0x1000, struct.pack("<Q", 0x2000))  # CodeCache::_heaps -> GrowableArray
    memory.write(0x1010, struct.pack("<QQ", low, high))
    memory.write(0x2000, struct.pack("<iiQ", heaps, heaps, 0x3000))
    for index in range(max(0, min(heaps, 8))):
        heap = 0x4000 + 0x200 * index
        memory.write(0x3000 + 8 * index, struct.pack("<Q", heap))
        memory.write(heap + 8, struct.pack("<QQ", low, high))
        memory.write(heap + 0x78 + 0x10, struct.pack("<Q", SEGMAP))
        memory.write(heap + 0x100, struct.pack("<i", shift))
    return memory


def test_vmstructs_give_the_code_cache_and_hostile_values_are_refused():
    layout = read_code_cache(_jvm_tables(), FIELDS, {}, {"HeapBlock": 16}, {})
    assert layout.heaps == (CodeHeap(HEAP_LOW, HEAP_LOW + (1 << 20), SEGMAP),)
    assert layout.kind == -1 and not layout.code_is_offset and layout.frame_complete_width == 4
    with pytest.raises(VMStructsError, match="heaps"):
        read_code_cache(_jvm_tables(heaps=100000), FIELDS, {}, {"HeapBlock": 16}, {})
    with pytest.raises(VMStructsError, match="2 GiB"):
        read_code_cache(_jvm_tables(high=HEAP_LOW + (1 << 40)), FIELDS, {}, {"HeapBlock": 16}, {})
    with pytest.raises(VMStructsError, match="segment"):
        read_code_cache(_jvm_tables(shift=40), FIELDS, {}, {"HeapBlock": 16}, {})
    with pytest.raises(VMStructsError, match="4 KiB"):
        read_code_cache(_jvm_tables(), {**FIELDS, ("nmethod", "_compile_id"): 1 << 40}, {}, {"HeapBlock": 16}, {})
    no_heaps = {k: v for k, v in FIELDS.items() if k[0] != "CodeHeap"}
    with pytest.raises(VMStructsError, match="lack"):
        read_code_cache(_jvm_tables(), no_heaps, {}, {"HeapBlock": 16}, {})
    odd_type = {("CodeBlob", "_frame_complete_offset"): "double"}
    with pytest.raises(VMStructsError, match="type"):
        read_code_cache(_jvm_tables(), FIELDS, odd_type, {"HeapBlock": 16}, {})
    assert codecache.MAX_HEAPS == 4  # struct jvm_t in profiler/unwind/hotspot_step.h holds as many


def test_inlined_scopes_come_from_the_pc_desc_at_or_after_the_pc():
    # GIVEN scopes data (UNSIGNED5 with the excluded zero byte of JDK 20+): scope 1 is the compiled
    # method (index 1), scope 4 a method inlined into it (index 2) whose sender is scope 1
    data = bytes([0]) + bytes([0 + 1, 1 + 1, 6 + 1]) + bytes([1 + 1, 2 + 1, 3 + 1])
    metadata = struct.pack("<QQ", 0x1000, 0x2000)
    scopes = codecache.NmethodScopes(0x5000, metadata, data, array("i", [10, 4, 50, 1]), excluded_bytes=1)
    # THEN a pc before the inlined call's PcDesc is in the inlined method, a return address exactly at a
    # PcDesc takes its scope, and a pc after the last PcDesc has no scope information
    assert codecache.scope_methods(scopes, 0x5000 + 7) == (0x2000, 0x1000)
    assert codecache.scope_methods(scopes, 0x5000 + 50) == (0x1000,)
    assert codecache.scope_methods(scopes, 0x5000 + 60) == ()
    # a sender offset that does not go down ends the chain (hostile or garbage data cannot loop)
    looping = codecache.NmethodScopes(
        0x5000, metadata, bytes([0, 1 + 1, 1 + 1, 1]), array("i", [0, 1]), excluded_bytes=1
    )
    assert codecache.scope_methods(looping, 0x5000) == (0x1000,)


def test_unsigned5_numbers_span_bytes_above_191():
    assert codecache.unsigned5(bytes([236, 1]), 0, 0) == (300, 2)
    assert codecache.unsigned5(bytes([5]), 0, 1) == (4, 1)
    with pytest.raises(ValueError):
        codecache.unsigned5(bytes([0]), 0, 1)  # the excluded byte
    with pytest.raises(ValueError):
        codecache.unsigned5(bytes([200]), 0, 0)  # cut short


def test_debug_information_of_the_nmethods_used_last_is_kept_and_a_dropped_one_is_read_again_if_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN three nmethods of method 0x1000, each with 0x2000 inlined before its PcDesc at offset 10, and a
    # namer that keeps the debug information of two
    memory = FakeMemory()
    blobs = [_blob(memory, first, 4, 70 + n, 0x1000, b"nmethod") for n, first in enumerate((3, 10, 20))]
    reads: list[int] = []

    def read_scopes(_memory: object, _layout: object, blob: int) -> codecache.NmethodScopes:
        reads.append(blob)
        metadata = struct.pack("<QQ", 0x1000, 0x2000)
        data = bytes([0]) + bytes([0 + 1, 1 + 1, 6 + 1]) + bytes([1 + 1, 2 + 1, 3 + 1])
        return codecache.NmethodScopes(blob + 64 - 7, metadata, data, array("i", [10, 4, 50, 1]), excluded_bytes=1)

    monkeypatch.setattr(codecache, "read_nmethod_scopes", read_scopes)
    monkeypatch.setattr(codecache, "SCOPES_KEPT", 2)
    namer = CompiledNamer(memory, _layout())
    inlined = (0x2000, 0x1000)
    # WHEN a pc of each is named, the first again in between (so the second is the least recently used)
    assert namer.methods_of(blobs[0] + 64, 70) == inlined
    assert namer.methods_of(blobs[1] + 64, 71) == inlined
    assert namer.methods_of(blobs[0] + 65, 70) == inlined
    assert namer.methods_of(blobs[2] + 64, 72) == inlined
    # THEN two are kept, the second one dropped; each was read once
    assert len(namer.scopes) == 2 and (blobs[1], 71) not in namer.scopes and reads == blobs
    # AND a new pc of the dropped one is named with its inlined method, read again
    assert namer.methods_of(blobs[1] + 66, 71) == inlined and reads[-1] == blobs[1]
    # AND once a dropped nmethod's code is freed and reused, its new pcs get its own method only
    namer.methods_of(blobs[0] + 67, 70)  # a new pc of the first: drops the third
    _blob(memory, 20, 4, 99, 0x3000, b"nmethod")
    assert namer.methods_of(blobs[2] + 66, 72) == (0x1000,)
    assert reads.count(blobs[2]) == 1


def _scope(sender: int, method_index: int, bci: int, values: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """One ScopeDesc as HotSpot writes it (UNSIGNED5 of JDK 20+, every number below 191 here): sender,
    method index, bci + 1, then its locals, expressions and monitors (0: serialized null)."""
    return bytes(number + 1 for number in (sender, method_index, bci + 1, *values))


def _nmethod_scopes(locals_at_safepoints: int, with_non_safepoint: bool) -> codecache.NmethodScopes:
    # GIVEN a compiled method (index 1) whose loop's safepoint poll at offset 100 has its locals
    # (``locals_at_safepoints``), a call at offset 40 into a method inlined (index 2), and, compiled with
    # DebugNonSafepoints, a non-safepoint PcDesc at offset 70 ending the code of a kernel inlined there (index 3)
    data = bytearray([0])
    outer = len(data)
    data += _scope(0, 1, 10, (locals_at_safepoints, 0, 0))
    call = len(data)
    data += _scope(outer, 2, 3, (locals_at_safepoints, 0, 0))
    pcs = [-1, 0, 40, call, 100, outer]
    if with_non_safepoint:
        outer_free = len(data)
        data += _scope(0, 1, 12)
        kernel = len(data)
        data += _scope(outer_free, 3, 5)
        pcs[4:4] = [70, kernel]
    metadata = struct.pack("<QQQ", 0x1000, 0x2000, 0x3000)
    dense = codecache.has_non_safepoints(bytes(data), array("i", pcs), 1)
    return codecache.NmethodScopes(0x5000, metadata, bytes(data), array("i", pcs), 1, dense)


def test_a_pc_without_a_pc_desc_of_its_own_borrows_the_next_one_and_is_approximate_unless_the_nmethod_is_dense():
    sparse = _nmethod_scopes(locals_at_safepoints=5, with_non_safepoint=False)
    assert not sparse.dense
    # THEN a return address (a PcDesc at the pc) is exact, a pc in the loop borrows the poll's scope 40 bytes on
    assert codecache.borrowed_bytes(sparse, 0x5000 + 40) == 0
    assert codecache.scope_methods(sparse, 0x5000 + 40) == (0x2000, 0x1000)
    assert codecache.scope_methods(sparse, 0x5000 + 60) == (0x1000,)
    assert codecache.borrowed_bytes(sparse, 0x5000 + 60) == 40
    assert codecache.borrowed_bytes(sparse, 0x5000 + 100) == 0  # the poll itself
    assert codecache.borrowed_bytes(sparse, 0x5000 + 130) == 0  # the nmethod's stubs: no scope to borrow
    # WHEN the same method is compiled with DebugNonSafepoints
    dense = _nmethod_scopes(locals_at_safepoints=5, with_non_safepoint=True)
    # THEN the kernel's pc gets its own scope, and every pc of the nmethod counts exact
    assert dense.dense
    assert codecache.scope_methods(dense, 0x5000 + 60) == (0x3000, 0x1000)
    assert codecache.borrowed_bytes(dense, 0x5000 + 60) == 0
    assert codecache.borrowed_bytes(dense, 0x5000 + 80) == 0


def test_only_a_scope_chain_without_any_value_makes_an_nmethod_dense():
    # a safepoint's chain keeps its live values: not dense, even when an inner scope has none
    data = bytearray([0])
    data += _scope(0, 1, 10, (0, 7, 0))  # the outer scope: an expression on the stack
    inner = len(data)
    data += _scope(1, 2, 3)  # an inlined scope without values, its sender the outer one
    assert not codecache.has_non_safepoints(bytes(data), array("i", [8, inner]), 1)
    # a chain with no value at all: a non-safepoint PcDesc (the sentinel's offset 0 is no scope)
    free = bytes([0]) + _scope(0, 1, 10) + _scope(1, 2, 3)
    assert codecache.has_non_safepoints(free, array("i", [-1, 0, 8, 7]), 1)
    # garbage (a number cut short, offsets past the data, a sender that does not go down) is never dense
    assert not codecache.has_non_safepoints(bytes([0, 200]), array("i", [0, 1]), 1)
    assert not codecache.has_non_safepoints(free, array("i", [0, 0, 4, 999]), 1)
    looping = bytes([0]) + _scope(1, 1, 1)
    assert not codecache.has_non_safepoints(looping, array("i", [0, 1]), 1)  # its sender is itself


def test_the_namer_marks_a_frame_named_from_a_borrowed_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = FakeMemory()
    blob = _blob(memory, 3, 4, 70, 0x1000, b"nmethod")
    sparse = _nmethod_scopes(locals_at_safepoints=5, with_non_safepoint=False)
    code_begin = blob + 64

    def read_scopes(_memory: object, _layout: object, _blob: int) -> codecache.NmethodScopes:
        return codecache.NmethodScopes(code_begin, sparse.metadata, sparse.scopes_data, sparse.pcs, 1, False)

    monkeypatch.setattr(codecache, "read_nmethod_scopes", read_scopes)
    namer = CompiledNamer(memory, _layout())
    assert namer.methods_of(code_begin + 40, 70) == (0x2000, 0x1000)  # a return address
    assert namer.methods_of(code_begin + 60, 70) == (0x1000,)  # in the loop
    assert namer.borrowed == {(code_begin + 60, 70): 40}


class CountingMemory(FakeMemory):
    """FakeMemory counting the reads of the segment map (one per back-link followed)."""

    def __init__(self) -> None:
        super().__init__()
        self.segmap_reads = 0

    def read(self, address: int, size: int) -> bytes:
        if SEGMAP <= address < SEGMAP + (1 << 20):
            self.segmap_reads += 1
        return super().read(address, size)


def test_a_new_pc_between_two_known_pcs_of_an_nmethod_skips_the_segment_map_and_is_named_the_same() -> None:
    # GIVEN an nmethod over 300 segments and a namer that found two of its pcs through the segment map
    memory = CountingMemory()
    blob = _blob(memory, 10, 300, 42, 0xABC0, b"nmethod")
    other = _blob(memory, 400, 4, 43, 0xDEF0, b"nmethod")
    namer = CompiledNamer(memory, _layout())
    low, high = blob + 64, blob + (250 << SHIFT)
    assert namer.method_of(low, 42) == 0xABC0 and namer.method_of(high, 42) == 0xABC0
    found = memory.segmap_reads
    # WHEN new pcs between them come (the leaf pcs of a hot method keep being new)
    for pc in range(low + 1, high, 997):
        assert namer.method_of(pc, 42) == 0xABC0
    # THEN none reads the segment map, while a pc beyond them, or of another compile id, still does
    assert memory.segmap_reads == found
    assert namer.method_of(high + 8, 42) == 0xABC0 and memory.segmap_reads > found
    before = memory.segmap_reads
    assert namer.method_of(other + 64, 43) == 0xDEF0 and memory.segmap_reads > before
    # AND a compile id the pc's blob does not hold is refused as before (the extent is the compile id's own)
    assert namer.method_of(low + 3, 44) is None and namer.failures[(low + 3, 44)] == codecache.FREED
    # AND a namer without the shortcut's memory names every one of those pcs alike
    fresh = CompiledNamer(memory, _layout())
    assert all(fresh.method_of(pc, 42) == 0xABC0 for pc in range(low + 1, high, 997))


@pytest.mark.parametrize("shuffled", [False, True])
def test_pc_descs_parsed_at_once_equal_the_entry_by_entry_parse(shuffled: bool) -> None:
    import random

    layout = codecache.ScopesLayout(False, {}, pc_desc_size=16, pc_offset=0, scope_offset=4, excluded_bytes=1)
    rng = random.Random(7)
    entries = sorted((rng.randrange(-1, 5000), rng.randrange(0, 1 << 20)) for _ in range(300))
    if shuffled:
        rng.shuffle(entries)
    raw = b"".join(struct.pack("<iiii", pc, scope, rng.randrange(1 << 20), rng.randrange(16)) for pc, scope in entries)
    expected = [number for pair in sorted(entries, key=lambda pair: pair[0]) for number in pair]  # stable
    assert codecache.pc_desc_pairs(raw + b"\x01\x02", layout).tolist() == expected  # a partial entry is no entry
    assert codecache.pc_desc_pairs(b"", layout).tolist() == []


def test_an_nmethods_density_is_decoded_only_when_a_pc_borrows_and_kept_when_its_scopes_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN two nmethods of the borrowed-scope test's layout and a namer that keeps one nmethod's scopes
    memory = FakeMemory()
    blobs = [_blob(memory, first, 4, 70 + n, 0x1000, b"nmethod") for n, first in enumerate((3, 10))]
    sparse = _nmethod_scopes(locals_at_safepoints=5, with_non_safepoint=False)
    decoded: list[bytes] = []
    real = codecache.has_non_safepoints

    def counting(data: bytes, pcs: array, excluded: int) -> bool:
        decoded.append(data)
        return real(data, pcs, excluded)

    def read_scopes(_memory: object, _layout: object, blob: int) -> codecache.NmethodScopes:
        return codecache.NmethodScopes(blob + 64, sparse.metadata, sparse.scopes_data, sparse.pcs, 1)

    monkeypatch.setattr(codecache, "has_non_safepoints", counting)
    monkeypatch.setattr(codecache, "read_nmethod_scopes", read_scopes)
    monkeypatch.setattr(codecache, "SCOPES_KEPT", 1)
    namer = CompiledNamer(memory, _layout())
    first = blobs[0] + 64
    # WHEN a return address (a PcDesc of its own) is named: exact, nothing decoded
    assert namer.methods_of(first + 40, 70) == (0x2000, 0x1000) and decoded == []
    # WHEN a pc in the loop borrows the poll's scope: decoded once, the borrowed bytes as before
    assert namer.methods_of(first + 60, 70) == (0x1000,) and len(decoded) == 1
    assert namer.borrowed[(first + 60, 70)] == 40
    # WHEN the other nmethod's scopes push these out, and another borrowing pc reads them again
    assert namer.methods_of(blobs[1] + 64 + 60, 71) == (0x1000,) and len(decoded) == 2
    assert namer.methods_of(first + 61, 70) == (0x1000,)
    # THEN the density found before is reused, not decoded again
    assert len(decoded) == 2 and namer.borrowed[(first + 61, 70)] == 39
