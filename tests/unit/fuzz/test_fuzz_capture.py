"""Fuzzing the capture readers (profiler/capture/: called only, their validation is the capture room's):
they return or raise the project's own errors (CaptureFormatError, JournalError), never another
exception, within the deadline."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given

from profiler.capture.folded import iter_folded
from profiler.capture.journal import Checkpoint, JournalError, encode_checkpoint, encode_header, read_journal
from profiler.capture.offcpu import parse_offcpu_lines
from profiler.capture.stackstore import StoreDelta
from profiler.capture.stacktable import decode_table, encode_table, table_from_folded
from profiler.errors import ProfilerError
from tests.unit.fuzz.corpus import corpus, fuzz_settings

DATA = Path(__file__).resolve().parents[2] / "data"
OWN_ERRORS = (ProfilerError, JournalError)


def _head(path: Path, lines: int) -> bytes:
    return b"".join(path.read_bytes().splitlines(keepends=True)[:lines])


FOLDED_SEEDS = [_head(DATA / "spark_executor_real.folded", 30), _head(DATA / "kafka" / "flink_kafka_ysb.folded", 30)]
OFFCPU_SEEDS = [
    _head(DATA / "offcpu" / "flink_ysb.offcpu.folded", 30),
    _head(DATA / "offcpu" / "spark_ysb.offcpu.folded", 30),
]
JOURNAL_SEEDS = [
    encode_header({"pid": 1})
    + encode_checkpoint(
        Checkpoint(1.0, StoreDelta(contexts=((1, "Executor task launch worker-0"),)), {"processes": []})
    )
    + encode_checkpoint(Checkpoint(2.0, StoreDelta(), {"processes": [{"pid": 7}]}))
]


def _table_seed() -> bytes:
    folded = {}
    for line in FOLDED_SEEDS[0].decode().splitlines()[:10]:
        stack, _, count = line.rpartition(" ")
        folded[stack] = int(count)
    return encode_table(table_from_folded(folded))


TABLE_SEEDS = [_table_seed()]


@fuzz_settings()
@given(corpus(FOLDED_SEEDS))
def test_folded_lines(raw: bytes) -> None:
    try:
        for stack, count in iter_folded(raw.decode("utf-8", "replace").splitlines(), "fuzz.folded"):
            assert count >= 0 and stack
    except OWN_ERRORS:
        pass


@fuzz_settings()
@given(corpus(OFFCPU_SEEDS))
def test_offcpu_lines(raw: bytes) -> None:
    try:
        list(parse_offcpu_lines(raw.decode("utf-8", "replace").splitlines(), "fuzz.offcpu.folded"))
    except OWN_ERRORS:
        pass


def test_offcpu_count_of_5000_digits_is_a_format_error() -> None:
    with pytest.raises(ProfilerError):
        list(parse_offcpu_lines(["lock " + "9" * 5000 + " 1 a;b"], "fuzz.offcpu.folded"))


@fuzz_settings()
@given(corpus(JOURNAL_SEEDS))
def test_checkpoint_journal(raw: bytes) -> None:
    try:
        read = read_journal(raw)
    except OWN_ERRORS:
        return
    assert all(isinstance(checkpoint.time, float) for checkpoint in read.checkpoints)


@fuzz_settings()
@given(corpus(TABLE_SEEDS))
def test_stack_table(raw: bytes) -> None:
    try:
        decode_table(raw, "fuzz/stacks.tpc")
    except OWN_ERRORS:
        pass
