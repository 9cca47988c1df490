"""YSB's latency per window: window keys, the windows that closed in the profiled window, the summary,
the read-back from Redis (a fake client), the demo's clause and its events.json fields."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from coordinator.commands._demo_counts import latency_clause
from coordinator.workloads.ysb.latency import (
    WindowLatency,
    closing_inside,
    parse_millis,
    read_window_latency,
    summarize,
    window_latencies,
    window_start_of,
)
from coordinator.workloads.ysb.redis import RespValue, encode_command
from profiler.capture.format import EventCount, write_events
from profiler.capture.read import read_events

WINDOW_MS = 10_000
# a profiled window from 1,700,000,005 s to 1,700,000,025 s: the windows ending at ...010 and ...020 s close in it
START, END = 1_700_000_005.0, 1_700_000_025.0


def test_window_start_of_reads_the_start_from_the_key_only() -> None:
    assert window_start_of("ysb:window:0f1e-2d3c:1700000000000") == 1_700_000_000_000
    assert window_start_of("ysb:window:a:b:1700000000000") == 1_700_000_000_000  # a campaign with a colon
    for key in ("ysb:campaign:x:1700000000000", "ysb:window:x:", "ysb:window:x:-5", "ysb:window:x:17e12",
                "ysb:window:x:" + "9" * 16, "ysb:window:x:\uff11\uff12"):
        assert window_start_of(key) is None, key


def test_a_window_closes_inside_when_its_end_lies_in_the_profiled_window() -> None:
    assert closing_inside(1_700_000_000_000, WINDOW_MS, START, END)  # ends at ...010
    assert closing_inside(1_700_000_015_000, WINDOW_MS, START, END)  # ends at ...025, the last instant
    assert not closing_inside(1_699_999_995_000, WINDOW_MS, START, END)  # ends at ...005: before (exclusive)
    assert not closing_inside(1_700_000_020_000, WINDOW_MS, START, END)  # ends at ...030: still open


def test_parse_millis_takes_decimal_epoch_milliseconds_only() -> None:
    assert parse_millis(b"1700000012345") == 1_700_000_012_345 and parse_millis("17") == 17
    for raw in (None, b"", b"-1", b"1.5", b"12x", b"9" * 16, "\u0661\u0662", 1700, [b"1"]):
        assert parse_millis(raw) is None, raw


def test_window_latencies_are_the_last_update_minus_the_window_end() -> None:
    # GIVEN windows ending at ...010 s and ...020 s updated 2.5 s and 0.25 s after, one still open,
    # one already closed before the profiled window, one without time_updated, one with garbage
    updates = [
        (1_700_000_000_000, b"1700000012500"),
        (1_700_000_010_000, b"1700000020250"),
        (1_700_000_020_000, b"1700000031000"),  # ends at ...030: outside
        (1_699_999_990_000, b"1700000001000"),  # ends at ...000: outside
        (1_700_000_000_000, None),
        (1_700_000_010_000, b"soon"),
        (1_700_000_000_000, b"1700000009900"),  # its last update before its end: -100 ms, kept as measured
    ]
    # THEN only the windows closing inside count, each its own latency in ms
    assert window_latencies(updates, WINDOW_MS, START, END) == [2500, 250, -100]


def test_summary_is_count_median_nearest_rank_p95_max_and_min() -> None:
    latencies = list(range(1, 101))  # 1..100 ms, shuffled order must not matter
    summary = summarize(latencies[::-1], "how")
    assert summary == WindowLatency(100, 50.5, 95.0, 100.0, 1.0, "how")
    assert summarize([]) is None
    assert summarize([700]) == WindowLatency(1, 700.0, 700.0, 700.0, 700.0, "")
    assert summarize([3, 1, 2]) == WindowLatency(3, 2.0, 3.0, 3.0, 1.0, "")


class FakeRedis:
    """The two calls read_window_latency makes, over a dict of hashes; counts the round trips."""

    def __init__(self, hashes: dict[str, dict[str, str]]) -> None:
        self.hashes = hashes
        self.round_trips = 0
        self.asked: list[str] = []

    def keys(self, pattern: str) -> list[str]:
        assert pattern == "ysb:window:*"
        self.round_trips += 1
        return [key for key in self.hashes if key.startswith("ysb:window:")]

    def pipeline(self, commands: Sequence[Sequence[str | bytes | int]]) -> list[RespValue]:
        self.round_trips += 1
        replies: list[RespValue] = []
        for name, key, field in commands:
            assert name == "HMGET" and isinstance(key, str) and isinstance(field, str)
            self.asked.append(key)
            value = self.hashes.get(key, {}).get(field)
            replies.append([value.encode() if value is not None else None])
        return replies


def test_read_window_latency_asks_only_for_the_windows_closing_inside() -> None:
    # GIVEN 600 campaigns' windows in Redis over four window starts (the sink's keys), and other keys
    hashes: dict[str, dict[str, str]] = {"ysb:campaign:c0": {"1700000000000": "k"}}
    for campaign in range(600):
        for start_ms, latency in ((1_699_999_990_000, 9), (1_700_000_000_000, 1000 + campaign),
                                  (1_700_000_010_000, 3000), (1_700_000_020_000, 7)):
            hashes[f"ysb:window:c{campaign}:{start_ms}"] = {
                "events": "5", "time_updated": str(start_ms + WINDOW_MS + latency)}
    hashes["ysb:window:c0:1700000010000"].pop("time_updated")  # an older sink's window: left out
    client = FakeRedis(hashes)
    # WHEN the latency of the windows closing in (START, END] is read
    summary = read_window_latency(client, WINDOW_MS, START, END, "read at once")  # type: ignore[arg-type]
    # THEN only those windows were fetched, pipelined (SCAN, then 1,200 HMGETs in 3 round trips)
    assert len(client.asked) == 1200 and all(k.endswith(("1700000000000", "1700000010000")) for k in client.asked)
    assert client.round_trips == 1 + 3
    assert summary is not None and summary.windows == 1199
    assert summary.min_ms == 1000 and summary.max_ms == 3000 and summary.p95_ms == 3000
    assert summary.median_ms == 1599 and "read at once" in summary.detail and "time_updated" in summary.detail
    # AND without any window closing inside there is no summary
    assert read_window_latency(FakeRedis({}), WINDOW_MS, START, END, "") is None  # type: ignore[arg-type]


def test_encode_command_is_what_a_pipeline_sends_per_command() -> None:
    assert encode_command("HMGET", "k", "time_updated") == b"*3\r\n$5\r\nHMGET\r\n$1\r\nk\r\n$12\r\ntime_updated\r\n"


def test_the_demo_line_and_events_json_carry_the_latency(tmp_path: Path) -> None:
    latency = WindowLatency(200, 2412.0, 4800.0, 5021.0, 310.0, "how it was read")
    assert latency_clause(latency) == (
        "; latency per 10 s window median 2.41 s, p95 4.80 s, max 5.02 s (min 0.31 s, 200 windows)"
    )
    assert latency_clause(None) == ""
    # events.json keeps the fields, and an older file without them still reads (None)
    write_events(tmp_path, EventCount(10, "s", latency_windows=200, latency_median_ms=2412.0, latency_p95_ms=4800.0,
                                      latency_max_ms=5021.0, latency_min_ms=310.0, latency_detail="how"))
    counted = read_events(tmp_path)
    assert counted is not None and counted.latency_windows == 200 and counted.latency_p95_ms == 4800.0
    (tmp_path / "events.json").write_text('{"count": 10, "source": "s"}')
    older = read_events(tmp_path)
    assert older is not None and older.latency_windows is None and older.latency_detail == ""
    (tmp_path / "events.json").write_text('{"count": 10, "source": "s", "latency_windows": "many"}')
    with pytest.raises(Exception, match="latency_windows"):
        read_events(tmp_path)
