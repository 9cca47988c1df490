"""The readers of a target's maps and ELF bytes (profiler/symbols/procsyms.py, elfsyms.py) fuzzed for a bounded
time: any bytes give mappings or symbols, or the refusal procsyms catches, never another exception."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.symbols import elfsyms, procsyms
from profiler.symbols.procsyms import parse_maps_stream
from tests.unit.symbols.test_procsyms import HONEST, NAMES, STT_FUNC, chunked, make_elf, name_at, reader

SEED_ELF = make_elf(
    [(name_at(b"start_thread"), 0x1000, 0x100, STT_FUNC), (name_at(b"clone3"), 0x2000, 0, STT_FUNC)],
    NAMES,
    build_id=b"\x12" * 20,
    dynsym=[(name_at(b"clone3"), 0x2000, 0x10, STT_FUNC)],
)


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEED_ELF) - 1), st.integers(0, 255)), max_size=12))
def test_a_mutated_elf_is_read_or_refused_never_anything_else(flips: list[tuple[int, int]]) -> None:
    image = bytearray(SEED_ELF)
    for at, value in flips:
        image[at] = value
    try:
        symbols = reader(bytes(image))
    except (ValueError, struct.error):
        return  # what procsyms catches: no symbols for that file
    for vaddr in (0x1000, 0x2000, 0x2005):
        name = symbols.lookup(vaddr)
        assert name is None or len(name.encode()) <= elfsyms.NAME_MAX_BYTES * 4


@settings(max_examples=300, deadline=2000)
@given(st.binary(max_size=3000), st.integers(1, 600))
def test_any_maps_bytes_give_mappings_or_nothing(data: bytes, size: int) -> None:
    read = parse_maps_stream(chunked(HONEST + data + b"\n" + HONEST, size))
    assert len(read.mappings) >= 3 and all(m.start < m.end or m.is_vdso for m in read.mappings)
    assert all(len(m.name) <= procsyms.MODULE_NAME_MAX for m in read.mappings)
