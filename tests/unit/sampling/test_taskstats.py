"""The taskstats exit-record parser on handmade netlink datagrams (no socket needed)."""

from __future__ import annotations

import struct

import pytest

from profiler.sampling.taskstats import (
    GENL_ID_CTRL,
    ParseCounts,
    ThreadExit,
    parse_error,
    parse_exit_buffer,
    parse_family_id,
)
from tests.fixtures.taskstats import RECORD_BYTES, attribute, exit_message, stats_record

FAMILY = 0x1B


def parse(buffer: bytes) -> tuple[list[ThreadExit], ParseCounts]:
    counts = ParseCounts()
    return parse_exit_buffer(buffer, FAMILY, counts), counts


def test_a_thread_record_gives_its_lifetime_totals() -> None:
    record = stats_record(
        12, 10, cpu_ns=2_500_000_000, minflt=7, majflt=2, voluntary=30, involuntary=4, utime_us=1, stime_us=1
    )
    exits, counts = parse(exit_message(FAMILY, 12, record))
    assert exits == [ThreadExit(12, 10, 2_500_000_000, 7, 2, 34, 5_000_000)]
    assert counts.records == 1 and not counts.skipped


def test_without_delay_accounting_cpu_is_utime_plus_stime() -> None:
    exits, _ = parse(exit_message(FAMILY, 5, stats_record(5, 5, utime_us=300, stime_us=200)))
    assert exits[0].cpu_ns == 500_000


def test_interleaved_threads_and_group_aggregates_keep_the_threads_only() -> None:
    # GIVEN three datagram messages: two threads of 10, then 10's leader with the group aggregate,
    # with a thread of 20 in between
    buffer = (
        exit_message(FAMILY, 11, stats_record(11, 10, cpu_ns=100))
        + exit_message(FAMILY, 21, stats_record(21, 20, cpu_ns=200))
        + exit_message(
            FAMILY, 10, stats_record(10, 10, cpu_ns=300), tgid_aggregate=(10, stats_record(0, 10, cpu_ns=600))
        )
    )
    exits, counts = parse(buffer)
    assert [(e.tid, e.tgid, e.cpu_ns) for e in exits] == [(11, 10, 100), (21, 20, 200), (10, 10, 300)]
    assert counts.records == 3 and not counts.skipped


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (stats_record(3, 3, size=200), "short record"),
        (b"\x0d", "short record"),
        (stats_record(3, 3, version=11), "unknown version 11"),
        (stats_record(3, 3, version=0), "unknown version 0"),
    ],
)
def test_short_and_old_records_are_skipped_and_counted(record: bytes, reason: str) -> None:
    exits, counts = parse(exit_message(FAMILY, 3, record))
    assert exits == [] and counts.skipped == {reason: 1}


def test_an_oversized_record_of_a_newer_version_reads_the_known_prefix() -> None:
    record = stats_record(4, 4, version=17, cpu_ns=9, size=RECORD_BYTES + 96)
    exits, counts = parse(exit_message(FAMILY, 4, record))
    assert [(e.tid, e.cpu_ns) for e in exits] == [(4, 9)] and counts.records == 1


def test_wrong_family_and_mismatched_pid_are_skipped() -> None:
    foreign, counts = parse(exit_message(FAMILY + 1, 4, stats_record(4, 4)))
    assert foreign == [] and counts.skipped == {"not a taskstats message": 1}
    liar, counts = parse(exit_message(FAMILY, 5, stats_record(4, 4)))
    assert liar == [] and counts.skipped == {"pid attribute disagrees with its record": 1}


@pytest.mark.parametrize("cut", [3, 15, 17, 30, 100, 300])
def test_truncated_datagrams_never_raise(cut: int) -> None:
    buffer = exit_message(FAMILY, 4, stats_record(4, 4)) + exit_message(FAMILY, 5, stats_record(5, 4))
    exits, _ = parse(buffer[:cut])
    assert exits == []
    lying_length = bytearray(buffer)
    struct.pack_into("=I", lying_length, 0, 1 << 30)  # a header claiming more than was received
    assert parse(bytes(lying_length)) == ([], ParseCounts())


def test_family_id_and_error_answers() -> None:
    body = struct.pack("=BBH", 1, 2, 0) + attribute(2, b"TASKSTATS\0") + attribute(1, struct.pack("=H", FAMILY))
    answer = struct.pack("=IHHII", 16 + len(body), GENL_ID_CTRL, 0, 1, 0) + body
    assert parse_family_id(answer) == FAMILY
    error = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -1) + b"\0" * 16
    assert parse_family_id(error) is None and parse_error(error) == 1
