"""The coordinator's numpy table reader (tableread) and the decider's prefix-coded path give exactly what the
host agent's standard-library reader and the tuple-per-stack decider give: the same stacks, rows, sums and
the same error for every damaged file."""

from __future__ import annotations

import random
import struct
from collections import Counter

import pytest

from coordinator.analysis.decide import TaskDecider
from coordinator.analysis.tableread import decode_table_arrays
from profiler.capture.stacktable import (
    THREAD,
    StackTable,
    StackTableBuilder,
    decode_table,
    encode_table,
    table_from_folded,
)
from profiler.errors import CaptureFormatError
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher
from tests.unit.coordinator.analysis.test_decide import PROFILE, _real_table

# Frames some of which match tasks of the profile below (several tasks on one frame, too).
FRAMES = ["Alpha.run", "Beta.read", "Gamma.parse", "Shared.both", "plain.a", "plain.b", "plain.c", "k_[k]"]
SMALL_PROFILE = """\
A: Alpha.run, Shared.b
B: Beta.read, Shared.bo
C: re:Gamma\\.p.rse
"""


def _random_table(seed: int) -> StackTable:
    """Stacks that share roots at random depths (the prefix coding's hard cases), over a few intervals,
    some rows with a context."""
    rng = random.Random(seed)
    builder = StackTableBuilder()
    roots = [builder.frame(f"thread-{n}", THREAD) for n in range(3)]
    stacks: list[tuple[int, ...]] = []
    for _ in range(rng.randint(1, 60)):
        if stacks and rng.random() < 0.7:
            base = rng.choice(stacks)
            base = base[: rng.randint(1, len(base))]
        else:
            base = (rng.choice(roots),)
        frames = [builder.frame(*rng.choice([(name, "jit"), (name, "native", "libx.so")])) for name in
                  rng.choices(FRAMES, k=rng.randint(0, 12))]
        stacks.append(base + tuple(frames))
    for stack in stacks:
        for _ in range(rng.randint(1, 3)):
            context = rng.choice([None, None, "Executor task launch worker for task 1.0 (TID 7)"])
            builder.add(rng.randint(0, 5), builder.stack(stack), context, rng.randint(1, 1000))
    return builder.build()


def _same_table(raw: bytes) -> None:
    """Both readers refuse ``raw`` with the same message, or read the same table from it."""
    try:
        expected = decode_table(raw, "x.tpc")
    except CaptureFormatError as exc:
        with pytest.raises(CaptureFormatError) as caught:
            decode_table_arrays(raw, "x.tpc")
        assert str(caught.value) == str(exc)
        return
    got = decode_table_arrays(raw, "x.tpc")
    assert got.stacks() == list(expected.stacks)
    assert (got.header.names, got.header.kinds, got.header.modules, got.header.contexts, got.header.timeline) == (
        expected.names, expected.kinds, expected.modules, expected.contexts, expected.timeline)
    for name in ("intervals", "stack_ids", "context_ids", "counts"):
        assert getattr(got, name).tolist() == list(getattr(expected, name)), name


def test_both_readers_read_real_and_random_tables_alike() -> None:
    for table in [_real_table(101), *(_random_table(seed) for seed in range(40))]:
        _same_table(encode_table(table))


def test_both_readers_refuse_every_damaged_table_alike() -> None:
    # GIVEN tables with bytes of their arrays overwritten at random (ids, prefixes, lengths, counts)
    rng = random.Random(7)
    for seed in range(60):
        raw = bytearray(encode_table(_random_table(seed)))
        header_end = 10 + struct.unpack_from("<I", raw, 6)[0]
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(header_end, len(raw))
            raw[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        # THEN both readers give the same table or the same one-line error
        _same_table(bytes(raw))


@pytest.mark.parametrize(
    "prefixes, lengths, suffixes, message",
    [
        ([0, 3], [2, 1], [0, 1, 1], "stack 1 shares more frames than the stack before it has"),
        ([1, 0], [1, 1], [0, 1], "stack 0 shares more frames than the stack before it has"),
        ([0, 0], [2, 2], [0, 1, 1], "stack 1 shares more frames than the stack before it has"),
        ([0, 0], [1, 1], [0, 1, 1], "stack frames left over after the last stack"),
        ([0, 1], [2, 1], [0, 1, 9], "a stack names a frame the table does not have"),
    ],
)
def test_hand_made_prefix_codings_are_refused_alike(prefixes, lengths, suffixes, message) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a two-stack table whose prefix coding is replaced by a hostile one
    raw = bytearray(encode_table(table_from_folded(Counter({"t;a": 1, "t;b": 2}))))
    header_end = 10 + struct.unpack_from("<I", raw, 6)[0]
    header = raw[10:header_end].replace(b'"stack_frames":3', f'"stack_frames":{len(suffixes)}'.encode())
    rows = raw[header_end + 4 * (4 + 3) :]
    coded = struct.pack(f"<{2 + 2 + len(suffixes)}I", *prefixes, *lengths, *suffixes)
    bad = bytes(raw[:6]) + struct.pack("<I", len(header)) + bytes(header) + coded + bytes(rows)
    # THEN both readers refuse it with the same message
    with pytest.raises(CaptureFormatError, match=message):
        decode_table_arrays(bad, "x.tpc")
    _same_table(bad)


def test_the_prefix_coded_decider_sums_as_the_tuple_decider() -> None:
    # GIVEN real-derived and random tables, under the real profile and one where frames match several tasks
    for profile in (PROFILE, SMALL_PROFILE):
        tables = [_real_table(102)] if profile == PROFILE else [_random_table(seed) for seed in range(40)]
        by_tuples = TaskDecider(Matcher(parse_profile(profile)))
        by_prefix = TaskDecider(Matcher(parse_profile(profile)))
        for table in tables:
            arrays = decode_table_arrays(encode_table(table), "x.tpc")
            # WHEN both decide the whole window and sub-windows
            for window in (None, (1, 3), (4, 4), (9, 20)):
                # THEN samples, multi-task samples, unmatched stacks and fingerprints are the same
                assert by_prefix.arrays(arrays, window) == by_tuples.table(table, window)
        assert any(by_tuples.table(table).multi for table in tables)
