"""The loader's pure pieces: /proc/PID/maps parsing, load bias, the page index and the trie blocks."""

from __future__ import annotations

import bisect
import random

import pytest

from profiler.unwind import cfi
from profiler.unwind.cfi import ExecMapping, aligned_blocks, load_bias, page_index, parse_maps
from profiler.unwind.ehframe import CFA_RSP, CFA_UNSUPPORTED, Rule

MAPS = """\
55d1c0a00000-55d1c0a01000 r--p 00000000 08:01 1234 /usr/bin/fpless
55d1c0a01000-55d1c0a02000 r-xp 00001000 08:01 1234 /usr/bin/fpless
7f3a00000000-7f3a00021000 rw-p 00000000 00:00 0
7f3a10028000-7f3a101bd000 r-xp 00028000 08:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7f3a20000000-7f3a20001000 r-xp 00000000 08:01 77 /tmp/gone.so (deleted)
7f3a30000000-7f3a30010000 rwxp 00000000 00:00 0
7ffc5a9f0000-7ffc5a9f2000 r-xp 00000000 00:00 0                          [vdso]
"""


def test_parse_maps_keeps_executable_files_and_the_vdso() -> None:
    assert parse_maps(MAPS) == [
        ExecMapping(0x55D1C0A01000, 0x55D1C0A02000, 0x1000, "/usr/bin/fpless"),
        ExecMapping(0x7F3A10028000, 0x7F3A101BD000, 0x28000, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
        ExecMapping(0x7FFC5A9F0000, 0x7FFC5A9F2000, 0, "[vdso]"),
    ]


def test_load_bias_from_the_executable_segment() -> None:
    # libc: PT_LOAD R-X at file offset 0x28000, virtual address 0x28000, mapped at 0x7f3a10028000
    segments = ((0x28000, 0x28000, 0x195000),)
    mapping = ExecMapping(0x7F3A10028000, 0x7F3A101BD000, 0x28000, "libc.so.6")
    assert load_bias(segments, mapping) == 0x7F3A10000000
    # a non-PIE executable whose segment's vaddr differs from its offset
    assert load_bias(((0x1000, 0x401000, 0x2000),), ExecMapping(0x401000, 0x403000, 0x1000, "a.out")) == 0
    assert load_bias(((0x1000, 0x401000, 0x2000),), ExecMapping(0x500000, 0x501000, 0x9000, "a.out")) is None


def test_aligned_blocks_cover_the_range_exactly() -> None:
    rng = random.Random(7)
    for _ in range(200):
        start = rng.randrange(0, 1 << 47) & ~0xFFF
        end = start + rng.randrange(1, 1 << 30) * 0x1000
        blocks = aligned_blocks(start, end)
        covered = start
        for address, bits in blocks:
            size = 1 << (64 - bits)
            assert address == covered and address % size == 0
            covered += size
        assert covered == end
        assert len(blocks) <= 2 * 64


def test_page_index_finds_the_covering_row_like_a_search_of_the_whole_table() -> None:
    rng = random.Random(3)
    addresses = sorted(rng.sample(range(0x1000, 0x9000), 900))
    packed = page_index(addresses, first_row=500)
    pages = [cfi.PAGE.unpack_from(packed, offset) for offset in range(0, len(packed), cfi.PAGE.size)]
    low = addresses[0]
    for pc in range(low, addresses[-1] + 1, 7):
        first, count = pages[(pc - low) >> cfi.PAGE_SHIFT]
        in_page = addresses[first - 500 : first - 500 + count]
        found = first - 500 + bisect.bisect_right(in_page, pc) - 1
        assert found == bisect.bisect_right(addresses, pc) - 1
        assert count <= cfi.MAX_ROWS_PER_PAGE


def test_page_index_refuses_a_page_the_bpf_search_cannot_finish() -> None:
    with pytest.raises(ValueError):
        page_index(list(range(0x1000, 0x1000 + 200)), first_row=0)


def test_pack_rows_marks_rules_that_do_not_fit_as_unsupported() -> None:
    packed = cfi.pack_rows([0x10, 0x20, 0x30], [Rule(CFA_RSP, 16, -16), Rule(CFA_RSP, 70000), Rule(CFA_RSP, 8, -12)])
    rows = [cfi.ROW.unpack_from(packed, offset) for offset in range(0, len(packed), cfi.ROW.size)]
    assert rows == [(0x10, 16, CFA_RSP, -2), (0x20, 0, CFA_UNSUPPORTED, 0), (0x30, 0, CFA_UNSUPPORTED, 0)]
