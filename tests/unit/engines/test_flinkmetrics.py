"""Flink's metrics over the window, against a simulated JobManager whose metric cache refreshes lazily
(tests/fixtures/flink_rest.py): counts at the window's exact ends, their uncertainty, and the
per-vertex busy/back-pressured/idle time."""

from __future__ import annotations

import math
import threading

import pytest

from profiler.capture.format import VertexWindow
from profiler.engines.flinkmetrics import (
    BASE_POLL_SECONDS,
    FlinkJobManager,
    FlinkRestError,
    Point,
    counter_change,
    metric_sums,
    parse_duration_ms,
    parse_task_thread,
    source_operator_metrics,
    update_interval_of,
    vertex_cpu,
    vertex_of_thread,
)
from tests.fixtures.flink_rest import BASE, JID, SOURCE, SOURCE_OPERATOR, WINDOW, FakeJobManager, VirtualClock, drive


def _manager(fake: FakeJobManager, clock: VirtualClock) -> FlinkJobManager:
    manager = FlinkJobManager(BASE, fake, clock=clock)
    manager.configure()
    return manager


def _count(fake: FakeJobManager, clock: VirtualClock, start: float, end: float, after: float = 12.0,
           others: object = None) -> tuple[float, float, FlinkJobManager]:
    """Poll from ``start`` (the first reading, as the profiler's start does) until ``after`` seconds
    past ``end``; the source count over [start, end] and its uncertainty."""
    manager = _manager(fake, clock)
    clock.now = start
    drive(manager, clock, end + after, others)  # type: ignore[arg-type]
    found = manager.source_count(JID, start, end)
    assert found is not None
    estimate, metrics = found
    assert metrics == [SOURCE_OPERATOR]
    return estimate.value, estimate.uncertainty, manager


def _refreshed_before_the_window(fake: FakeJobManager, clock: VirtualClock, cache_age: float) -> None:
    """Another client refreshed the JobManager's metric cache ``cache_age`` seconds before the window (1000)."""
    clock.now = 1000.0 - cache_age
    fake(f"{BASE}/jobs/{JID}/vertices/{SOURCE}/subtasks/metrics?get=numRecordsOut&agg=sum")


def _assert_near_truth(
    fake: FakeJobManager, value: float, uncertainty: float, start: float, end: float, rel: float, slack: float = 200.0
) -> float:
    """The count over [start, end] is the source's true one within ``rel`` and within three of its
    uncertainties (plus ``slack`` records); returns the truth."""
    truth = fake.emitted(end) - fake.emitted(start)
    assert value == pytest.approx(truth, rel=rel), (value, truth, uncertainty)
    assert abs(value - truth) <= 3 * uncertainty + slack, (value, truth, uncertainty)
    return float(truth)


def test_parsing_of_the_rest_answers() -> None:
    assert source_operator_metrics([{"id": "numRecordsOut"}, {"id": "Source__Kafka_Source.numRecordsOut"},
                                    {"id": "Source__Kafka_Source.numRecordsOutPerSecond"}]) == [
        "Source__Kafka_Source.numRecordsOut"]
    assert metric_sums([{"id": "a", "sum": 2.0}, {"id": "busy", "sum": "NaN"}, {"id": "b", "sum": "7"},
                        {"id": "c"}, "junk"]) == {"a": 2.0, "b": 7.0}
    assert update_interval_of([{"key": "metrics.fetcher.update-interval", "value": "2000"}]) == 2.0
    assert update_interval_of([{"key": "rest.port", "value": "8081"}]) is None
    assert parse_duration_ms("10 s") == 10_000 and parse_duration_ms("500ms") == 500
    with pytest.raises(FlinkRestError):
        parse_duration_ms("soon")


def test_counter_change_is_exact_for_a_steady_rate_and_uncertain_where_the_rate_changes() -> None:
    steady = [Point(100.0, 0.02, 1000.0), Point(110.0, 0.02, 3000.0), Point(120.0, 0.02, 5000.0)]
    estimate = counter_change(steady, 105.0, 118.0)
    assert estimate is not None
    assert estimate.value == pytest.approx(2600.0)
    assert estimate.uncertainty < 10 and estimate.extrapolated == 0.0
    # The rate doubles after 110 s: the ends inside the segments get the bend as their uncertainty.
    bent = [Point(100.0, 0.02, 1000.0), Point(110.0, 0.02, 3000.0), Point(120.0, 0.02, 7000.0)]
    estimate = counter_change(bent, 105.0, 115.0)
    assert estimate is not None and estimate.uncertainty > 300
    # Beyond the last refresh the mean rate carries on, and the distance is reported.
    estimate = counter_change(steady, 105.0, 125.0)
    assert estimate is not None and estimate.extrapolated == pytest.approx(5.0)
    assert counter_change(steady[:1], 100.0, 110.0) is None


def test_polling_brackets_each_refresh_within_a_fast_poll_and_never_triggers_more_often() -> None:
    # GIVEN a JobManager with the default 10 s update interval
    clock = VirtualClock()
    fake = FakeJobManager(clock)
    manager = _manager(fake, clock)
    # WHEN it is polled for a minute
    drive(manager, clock, clock.now + 60)
    # THEN it refreshed every interval (plus the time to notice), each refresh timed by the fetch's
    # start and seen within 0.15 s of it, with fewer than two readings a second (one metric request
    # per vertex each)
    starts = [r.trigger or 0.0 for r in manager.refreshes]
    assert len(starts) == 6, starts
    assert all(10.0 <= b - a <= 10.1 for a, b in zip(starts, starts[1:])), starts
    assert all(r.upper - (r.trigger or 0.0) < 0.15 for r in manager.refreshes), manager.refreshes
    assert len(fake.metric_requests) < 2 * 60 * 2 / BASE_POLL_SECONDS, len(fake.metric_requests)


@pytest.mark.parametrize("cache_age", [0.0, 3.0, 9.5, 600.0])
def test_window_count_is_exact_whatever_the_age_of_the_cache_at_the_start(cache_age: float) -> None:
    # GIVEN a 20,000 records/s source and a cache last refreshed ``cache_age`` seconds before the
    # window by someone else (600 s: nobody asked for ten minutes)
    clock = VirtualClock(500.0)
    fake = FakeJobManager(clock)
    _refreshed_before_the_window(fake, clock, cache_age)
    # WHEN a 30 s window starting at 1000 is counted
    value, uncertainty, _ = _count(fake, clock, 1000.0, 1030.0)
    # THEN the count is the true one within 0.5 % (a stale reading was off by up to 10 s of records)
    _assert_near_truth(fake, value, uncertainty, 1000.0, 1030.0, rel=0.005)


def test_window_count_with_another_client_refreshing_the_cache_at_its_own_times() -> None:
    # GIVEN a dashboard asking for metrics every 2.3 s, so the refreshes are not ours to time
    clock = VirtualClock(990.0)
    fake = FakeJobManager(clock)
    asked = [990.0]

    def dashboard(until: float) -> None:
        while asked[-1] + 2.3 < until:
            asked.append(asked[-1] + 2.3)
            clock.now = asked[-1]
            fake(f"{BASE}/jobs/{JID}/vertices/{WINDOW}/subtasks/metrics?get=numRecordsIn&agg=sum")

    # WHEN a 40 s window is counted; THEN within 1 %, and the uncertainty says how far it may be off
    value, uncertainty, manager = _count(fake, clock, 1000.0, 1040.0, others=dashboard)
    _assert_near_truth(fake, value, uncertainty, 1000.0, 1040.0, rel=0.01)
    assert all(r.trigger is not None for r in manager.refreshes)  # timed by the JobManager's own stamp


@pytest.mark.parametrize("cache_age", [3.0, 600.0])
def test_without_the_jobmanagers_fetch_stamp_the_readings_bracket_each_refresh(cache_age: float) -> None:
    # GIVEN a JobManager whose back-pressure endpoint gives no end-timestamp (older Flink)
    clock = VirtualClock(500.0)
    fake = FakeJobManager(clock, stamps=False)
    _refreshed_before_the_window(fake, clock, cache_age)
    # WHEN a 30 s window is counted; THEN within 0.5 % still, every refresh bracketed by readings
    value, uncertainty, manager = _count(fake, clock, 1000.0, 1030.0)
    _assert_near_truth(fake, value, uncertainty, 1000.0, 1030.0, rel=0.005)
    assert all(r.trigger is None and r.spread < 0.15 for r in manager.refreshes), manager.refreshes


def test_a_varying_rate_is_followed_and_its_uncertainty_is_larger() -> None:
    # GIVEN a source whose rate swings between 15,000 and 25,000 records/s with a 40 s period
    clock = VirtualClock(1000.0)
    period = 40.0
    fake = FakeJobManager(clock, records=lambda t: 20_000 * t + 5_000 * period / (2 * math.pi)
                          * (1 - math.cos(2 * math.pi * t / period)))
    # WHEN a window that ends half-way between two refreshes is counted
    value, uncertainty, _ = _count(fake, clock, 1000.0, 1025.0)
    # THEN the estimate stays within a few percent and within about 3 uncertainties of the truth
    truth = _assert_near_truth(fake, value, uncertainty, 1000.0, 1025.0, rel=0.03, slack=0.0)
    assert uncertainty > 0.005 * truth, (value, truth, uncertainty)


def test_taskmanagers_answering_one_fetch_at_different_moments_make_one_refresh() -> None:
    # GIVEN two TaskManagers whose values reach the cache 0.4 s apart (a fast poll sees the first only)
    clock = VirtualClock()
    fake = FakeJobManager(clock, visible_delay=(0.05, 0.45))
    value, _, manager = _count(fake, clock, 1000.0, 1030.0)
    # THEN each fetch is one refresh, seen complete, and the count is right
    starts = [r.lower for r in manager.refreshes]
    assert all(b - a > 9.5 for a, b in zip(starts, starts[1:])), starts
    assert value == pytest.approx(fake.emitted(1030.0) - fake.emitted(1000.0), rel=0.005)


def test_a_reading_that_straddles_a_fetch_start_is_not_taken_for_the_previous_fetch() -> None:
    # GIVEN requests that take 5 ms and TaskManagers that answer a fetch within 3-4 ms: the reading
    # whose first request starts a fetch already shows its values for the second vertex
    clock = VirtualClock()
    fake = FakeJobManager(clock, capture_delay=0.001, visible_delay=(0.003, 0.004), request_seconds=0.005)
    value, _, manager = _count(fake, clock, 1000.0, 1030.0)
    # THEN every refresh holds values of one fetch only (the window vertex reads what the source sent)
    for refresh in manager.refreshes:
        sent = refresh.values[(JID, SOURCE, SOURCE_OPERATOR)]
        read = refresh.values[(JID, WINDOW, "numRecordsIn")]
        assert sent == read, refresh
    assert value == pytest.approx(fake.emitted(1030.0) - fake.emitted(1000.0), rel=0.005)


def test_vertex_windows_give_records_and_busy_idle_per_second() -> None:
    clock = VirtualClock(1000.0)
    fake = FakeJobManager(clock, busy_share=0.3)
    manager = _manager(fake, clock)
    drive(manager, clock, 1045.0)
    windows = {w.vertex: w for w in manager.vertex_windows(1000.0, 1030.0)}
    source, window = windows[SOURCE], windows[WINDOW]
    assert (source.name, source.source, source.parallelism) == ("Source: GenSource -> ToKeyed", True, 2)
    assert window.name == "WindowSum -> Discard: Writer" and not window.source
    assert source.source_records == pytest.approx(600_000, rel=0.005)
    assert window.records_in == pytest.approx(600_000, rel=0.005)
    assert window.records_in_uncertainty is not None and window.records_in_uncertainty < 6000
    for vertex in (source, window):
        assert vertex.busy_ms_per_s == pytest.approx(300, rel=0.01)
        assert vertex.idle_ms_per_s == pytest.approx(700, rel=0.01)
        assert vertex.backpressured_ms_per_s == pytest.approx(0, abs=0.01)
    assert window.job_name == "rate-window"


def test_a_job_that_starts_inside_the_window_counts_from_zero() -> None:
    clock = VirtualClock(1000.0)
    fake = FakeJobManager(clock, job_start=1012.0)
    manager = _manager(fake, clock)
    drive(manager, clock, 1045.0)
    found = manager.source_count(JID, 1000.0, 1030.0)
    assert found is not None
    assert found[0].value == pytest.approx(18 * 20_000, rel=0.02)


def test_an_unreachable_jobmanager_leaves_errors_and_the_thread_backs_off() -> None:
    clock = VirtualClock()
    fake = FakeJobManager(clock, reachable=False)
    manager = FlinkJobManager(BASE, fake)
    stop = threading.Event()
    thread = threading.Thread(target=manager.run, args=(stop,))
    thread.start()
    stop.wait(0.3)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert manager.failures == 1 and "Connection refused" in manager.errors[-1]
    assert manager.refreshes == []


def test_task_threads_map_to_their_vertex_from_full_names_and_from_the_kernels_prefix() -> None:
    vertices = ["Source: GenSource -> ToKeyed", "WindowSum -> Discard: Writer", "Map", "Map -> Filter"]
    parsed = parse_task_thread("WindowSum -> Discard: Writer (2/4)#1")
    assert parsed is not None and (parsed.chain, parsed.subtask, parsed.parallelism, parsed.attempt) == (
        "WindowSum -> Discard: Writer", 2, 4, 1)
    assert parse_task_thread("Flink Netty Server (0) Thread 0") is None
    assert vertex_of_thread("Source: GenSource -> ToKeyed (1/2)#0", vertices) == "Source: GenSource -> ToKeyed"
    # The stacks' root frame is the kernel's comm: 15 characters (issue 22: "Source: GenSour")
    assert vertex_of_thread("Source: GenSour", vertices) == "Source: GenSource -> ToKeyed"
    assert vertex_of_thread("WindowSum -> Di", vertices) == "WindowSum -> Discard: Writer"
    assert vertex_of_thread("Map (1/2)#0", vertices) == "Map"  # short names are whole
    assert vertex_of_thread("Map -> Filter (", vertices) == "Map -> Filter"
    assert vertex_of_thread("GC Thread#0", vertices) is None
    assert vertex_of_thread("Source: GenSour", ["Source: GenSource -> A", "Source: GenSource -> B"]) is None


def test_vertex_cpu_is_the_sampled_on_cpu_time_per_subtask_beside_flinks_busy_time() -> None:
    # GIVEN two vertices of parallelism 2, a 10 s window at 99 Hz, and samples per thread name as the
    # stacks' root frames give them (15-character comms, or full names with issue 18's thread names)
    source = VertexWindow("j", "job", "v1", "Source: GenSource -> ToKeyed", 2, True, busy_ms_per_s=300.0)
    window = VertexWindow("j", "job", "v2", "WindowSum -> Discard: Writer", 2, False, busy_ms_per_s=500.0)
    samples = {"Source: GenSour": 594, "WindowSum -> Discard: Writer (1/2)#0": 99, "WindowSum -> Di": 99,
               "GC Thread#0": 500}
    # WHEN they are put together
    found = {v.window.name: v for v in vertex_cpu(samples, [source, window], 99.0, 10.0)}
    # THEN the source's threads were on CPU 300 ms per second each, the window's 100 (busy 500: waiting)
    assert found[source.name].samples == 594 and found[source.name].on_cpu_ms_per_s == pytest.approx(300.0)
    assert found[window.name].samples == 198 and found[window.name].on_cpu_ms_per_s == pytest.approx(100.0)
