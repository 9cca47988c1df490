"""The report's latency note: YSB's latency per window (the ``latency_*`` fields of events.json that
`coordinator demo` writes), shown beside the events and the cycles per event."""

from __future__ import annotations

from collections.abc import Iterable

from profiler.capture.format import EventCount


def _seconds(milliseconds: float | None) -> str:
    return "?" if milliseconds is None else f"{milliseconds / 1000:.2f} s"


def latency_note(counts: Iterable[EventCount | None]) -> tuple[str, str]:
    """Pure: the hosts' event counts in; one line of YSB's latency per window and its detail (how it was
    measured) out, from the first count that has one; ("", "") when none has."""
    for count in counts:
        if count is None or not count.latency_windows:
            continue
        text = (
            f"Latency per 10 s window (its last update in Redis minus its end): median "
            f"{_seconds(count.latency_median_ms)}, p95 {_seconds(count.latency_p95_ms)}, max "
            f"{_seconds(count.latency_max_ms)}, min {_seconds(count.latency_min_ms)} over the "
            f"{count.latency_windows} windows that closed in the profiled window"
        )
        return text, count.latency_detail
    return "", ""
