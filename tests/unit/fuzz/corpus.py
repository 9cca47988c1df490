"""Seeds, mutations and settings shared by the fuzz tests (see this package's docstring)."""

from __future__ import annotations

import os
import struct
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parents[2] / "data" / "fuzz"
LONG_EXAMPLES = int(os.environ.get("SPE_FUZZ_EXAMPLES", "0"))
# In the suite: 150 examples a parser, derandomized (the same inputs on every run, so CI is reproducible),
# all the fuzz tests together well under 60 s on 2 shared cores.
SUITE_EXAMPLES = 150


def fuzz_settings(examples: int = SUITE_EXAMPLES, deadline_seconds: float = 2.0) -> settings:
    """The settings of one fuzz test: ``examples`` derandomized, or SPE_FUZZ_EXAMPLES random ones."""
    if LONG_EXAMPLES:
        deadline_seconds = float(os.environ.get("SPE_FUZZ_SECONDS", deadline_seconds))
    return settings(
        max_examples=LONG_EXAMPLES or examples,
        deadline=timedelta(seconds=deadline_seconds),
        derandomize=not LONG_EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def seed(name: str) -> bytes:
    return (DATA / name).read_bytes()


_INTERESTING = (0, 1, 20, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes], max_edits: int = 8) -> bytes:
    """One of ``seeds`` with up to ``max_edits`` edits: a byte set, a run cut out, bytes inserted, or a
    32-bit field overwritten with a boundary value (lengths, offsets and counts are such fields)."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, max_edits))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=32))
            continue
        at = draw(st.integers(0, len(data) - 1))
        edit = draw(st.integers(0, 3))
        if edit == 0:
            data[at] = draw(st.integers(0, 255))
        elif edit == 1:
            del data[at : at + draw(st.integers(1, 256))]
        elif edit == 2:
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
        else:
            value = draw(st.sampled_from((*_INTERESTING, len(data), len(data) - at)))
            data[at : at + 4] = struct.pack("<I", value & 0xFFFFFFFF)
    return bytes(data)


def corpus(seeds: list[bytes], max_random: int = 2048) -> st.SearchStrategy[bytes]:
    """Mutated seeds most of the time, random bytes otherwise."""
    return st.one_of(mutated(seeds), mutated(seeds), mutated(seeds), st.binary(max_size=max_random))
