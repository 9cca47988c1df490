"""YSB's latency per window, read back from Redis: the wall-clock time of a 10 s window's last update
(``time_updated``, set by every write of the window's hash) minus the window's end in event time."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coordinator.workloads.ysb.redis import RespClient

WINDOW_PREFIX = "ysb:window:"
TIME_UPDATED = "time_updated"
# The longest decimal epoch-millisecond value read back (13 digits until the year 2286); longer is not a time.
_MAX_DIGITS = 15
# HMGET commands sent before their replies are read (one round trip per batch, not per window).
_PIPELINE = 500


def _decimal(text: str) -> bool:
    """ASCII digits only, at most _MAX_DIGITS of them (str.isdigit alone takes any script's digits)."""
    return text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS


@dataclass(frozen=True)
class WindowLatency:
    """Latency per window over the windows that closed inside the profiled window (milliseconds)."""

    windows: int  # windows whose end lies in the profiled window and whose hash holds time_updated
    median_ms: float
    p95_ms: float  # nearest rank
    max_ms: float
    min_ms: float
    detail: str = ""


def window_start_of(key: str, prefix: str = WINDOW_PREFIX) -> int | None:
    """The window start (epoch ms) a window key ``ysb:window:<campaign>:<start ms>`` names; None for any
    other key."""
    if not key.startswith(prefix):
        return None
    _, _, start = key[len(prefix):].rpartition(":")
    return int(start) if _decimal(start) else None


def closing_inside(start_ms: int, window_ms: int, start: float, end: float) -> bool:
    """Whether the window starting at ``start_ms`` ends inside the profiled window ``(start, end]`` (unix s)."""
    return start * 1000 < start_ms + window_ms <= end * 1000


def parse_millis(raw: object) -> int | None:
    """A Redis field holding epoch milliseconds (decimal digits) as an int; None when absent or not one."""
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", errors="replace")
    if not isinstance(raw, str) or not _decimal(raw):
        return None
    return int(raw)


def window_latencies(updates: Iterable[tuple[int, object]], window_ms: int, start: float, end: float) -> list[int]:
    """Pure: (window start ms, its raw time_updated) pairs in; the latency (ms, time_updated minus the window's
    end) of each window that ends inside ``(start, end]`` and holds a time_updated, out."""
    latencies = []
    for window_start, raw in updates:
        updated = parse_millis(raw)
        if updated is not None and closing_inside(window_start, window_ms, start, end):
            latencies.append(updated - (window_start + window_ms))
    return latencies


def summarize(latencies: Sequence[int], detail: str = "") -> WindowLatency | None:
    """Pure: count, median, p95 (nearest rank), max and min of the latencies; None without any."""
    if not latencies:
        return None
    ordered = sorted(latencies)
    rank = max(1, math.ceil(0.95 * len(ordered)))
    return WindowLatency(
        len(ordered), float(statistics.median(ordered)), float(ordered[rank - 1]), float(ordered[-1]),
        float(ordered[0]), detail,
    )


def read_window_latency(
    client: RespClient, window_ms: int, start: float, end: float, how: str
) -> WindowLatency | None:
    """The latency summary of the windows in Redis that closed inside ``(start, end]``: their keys by SCAN,
    filtered by the start each key names, then only those windows' time_updated (HMGET, pipelined)."""
    starts = {}
    for key in client.keys(WINDOW_PREFIX + "*"):
        window_start = window_start_of(key)
        if window_start is not None and closing_inside(window_start, window_ms, start, end):
            starts[key] = window_start
    keys = sorted(starts)
    updates: list[tuple[int, object]] = []
    for first in range(0, len(keys), _PIPELINE):
        batch = keys[first:first + _PIPELINE]
        replies = client.pipeline([("HMGET", key, TIME_UPDATED) for key in batch])
        for key, reply in zip(batch, replies):
            raw = reply[0] if isinstance(reply, list) and reply else None
            updates.append((starts[key], raw))
    detail = (
        f"YSB's latency per {window_ms / 1000:g} s window: the wall-clock time of the window's last update in "
        f"Redis (time_updated, set by each write of the window) minus the window's end in event time, over the "
        f"windows (per campaign) that closed inside the profiled window; {how}"
    )
    return summarize(window_latencies(updates, window_ms, start, end), detail)
