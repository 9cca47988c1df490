"""Fuzzing what a JVM writes for the agent: perf maps (profiler/symbols/perfmap.py) and attach replies
(profiler/scope/attach.py), plus the plain regression cases their fuzzing and issue 46 found."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from profiler.scope.attach import ATTACH_REPLY_MAX_BYTES, AttachError, parse_attach_reply
from profiler.symbols.perfmap import PerfMap, PerfMapEntry, parse_perf_map
from tests.unit.fuzz.corpus import DATA, corpus, fuzz_settings

PERF_MAP_SEEDS = [path.read_bytes() for path in sorted(DATA.glob("perf_map_*.map"))] + [
    b"7f1234000000 40 Interpreter\n0x7f1234000100 0x80 long com.example.A.b(long)\n7f1234000120 10 stub\n"
]
REPLY_SEEDS = [path.read_bytes() for path in sorted(DATA.glob("attach_reply_*.bin"))] + [
    b"0\nreturn code: 0\n",
    b"-1\n",
    b"0\nCommand executed successfully\n",
]


def _brute_force(entries: list[PerfMapEntry], address: int) -> str | None:
    covering = [entry for entry in entries if entry.start <= address < entry.start + entry.size]
    return max(covering, key=lambda entry: entry.order).name if covering else None


@fuzz_settings()
@given(corpus(PERF_MAP_SEEDS))
def test_perf_map_text(raw: bytes) -> None:
    perf_map = parse_perf_map(raw.decode("utf-8", "replace").splitlines())
    for line in raw.decode("utf-8", "replace").splitlines()[:20]:
        try:
            address = int(line.split(" ", 1)[0], 16)
        except ValueError:
            continue
        perf_map.lookup(address)  # never raises


entry = st.builds(
    PerfMapEntry,
    start=st.integers(0, 300),
    size=st.integers(1, 80),
    name=st.sampled_from(["a", "b", "c", "d"]),
    order=st.just(0),
)


@fuzz_settings()
@given(st.lists(entry, max_size=16), st.lists(st.integers(-2, 400), max_size=40))
def test_perf_map_lookup_is_the_latest_line_covering_the_address(
    drawn: list[PerfMapEntry], addresses: list[int]
) -> None:
    entries = [PerfMapEntry(e.start, e.size, f"{e.name}{order}", order) for order, e in enumerate(drawn)]
    perf_map = PerfMap(entries)
    assert len(perf_map) == len(entries)
    for address in addresses:
        assert perf_map.lookup(address) == _brute_force(entries, address)


def test_an_entry_covering_everything_leaves_lookups_one_search() -> None:
    # issue 46: one line of size 2**60 made every lookup scan every line before it (60 ms each, 400 k lines)
    lines = ["0 fffffffffffffff huge"] + [f"{0x10000 + 64 * i:x} 40 m{i}" for i in range(30_000)]
    perf_map = parse_perf_map(lines)
    began = time.thread_time()
    names = [perf_map.lookup(0x10000 + 64 * 29_000 + 8 * k) for k in range(2000)]
    assert time.thread_time() - began < 0.5
    assert names[0] == "m29000" and names[-1] == "m29249" and perf_map.lookup(0x8) == "huge"


@fuzz_settings()
@given(corpus(REPLY_SEEDS))
def test_attach_reply(reply: bytes) -> None:
    try:
        status, output = parse_attach_reply(1234, reply)
    except AttachError:
        return
    assert isinstance(status, int) and isinstance(output, str)


def test_an_attach_status_line_of_digits_is_no_status() -> None:
    # 8 MiB of digits: int() of it raised ValueError (past 4300 digits), not AttachError
    reply = b"1" * (ATTACH_REPLY_MAX_BYTES - 1) + b"\n"
    try:
        parse_attach_reply(1234, reply)
    except AttachError as exc:
        assert "refused" in str(exc)
    else:
        raise AssertionError("a status of 8 M digits was taken")
    assert parse_attach_reply(1234, b" -1 \nout") == (-1, "out")


def test_the_recorded_seeds_parse() -> None:
    assert len(parse_perf_map(PERF_MAP_SEEDS[0].decode().splitlines())) == 200
    status, output = parse_attach_reply(1234, REPLY_SEEDS[0])
    assert status == 0 and "OpenJDK" in output
