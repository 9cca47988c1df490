"""Events read from a real Spark Structured Streaming driver equal what the query itself reports."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from profiler.capture.format import ProcessInfo
from profiler.engines.events import SOURCE_NONE, EventCounter

# A local-mode driver: rate source, 1 s micro-batches, a listener that prints each progress: batch id,
# rows, and when the batch's work (its SQL execution) ended: trigger start + triggerExecution minus
# the commit that follows the execution. "ready" once a batch with rows has completed.
DRIVER = r'''
import sys, time
from datetime import datetime
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

spark = (SparkSession.builder.master("local[2]").appName("events-test")
         .config("spark.ui.port", sys.argv[1]).config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
announced = []

class Progress(StreamingQueryListener):
    def onQueryStarted(self, event): pass
    def onQueryIdle(self, event): pass
    def onQueryTerminated(self, event): pass
    def onQueryProgress(self, event):
        p = event.progress
        started = datetime.strptime(p.timestamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        durations = dict(p.durationMs)
        ended = started + (durations.get("triggerExecution", 0) - durations.get("commitOffsets", 0)) / 1000.0
        print(f"progress {ended:.3f} {p.batchId} {p.numInputRows}", flush=True)
        if p.numInputRows > 0 and not announced:
            announced.append(1)
            print("ready", flush=True)

spark.streams.addListener(Progress())
query = (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
         .selectExpr("value % 7 AS k", "timestamp")
         .writeStream.format("noop").trigger(processingTime="1 second").start())
sys.stdin.read()
query.stop()
spark.stop()
'''


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _driver_jvm(parent: int, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children(recursive=True):
            try:
                if "org.apache.spark.deploy.SparkSubmit" in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError("no SparkSubmit JVM under the PySpark driver")


def _progress_after(lines: list[str], end: float | None) -> bool:
    return end is not None and any(
        float(line.split()[1]) > end for line in list(lines) if line.startswith("progress")
    )


def test_spark_rows_from_rest_api_match_query_progress(tmp_path: Path) -> None:
    # GIVEN a running Structured Streaming query in a local-mode PySpark driver
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    lines: list[str] = []
    ready = threading.Event()
    process = subprocess.Popen(
        [sys.executable, str(script), str(_free_port())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, start_new_session=True,
    )

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.strip())
            if line.startswith("ready"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(150), f"driver not ready: {lines[-5:]} rc={process.poll()}"
        jvm = _driver_jvm(process.pid)
        now = time.time()
        driver = ProcessInfo(
            pid=jvm.pid, role="workload", engine="spark", kind="local-driver", user="root",
            cmdline=" ".join(jvm.cmdline())[:300], first_seen=now - 30, last_seen=now,
        )
        counter = EventCounter(poll_seconds=2.0)
        # WHEN the counter reads the driver's metrics over a window of several micro-batches
        counter.start([driver])
        # 6 s: ~6 one-second micro-batches inside the window for the test's >= 2 (10 s gave ~10; issue 48)
        time.sleep(6)
        events = counter.finish(time.time())
        # the progress of every batch that finished inside the window has arrived once one from after it has
        # (the driver prints them in order)
        deadline = time.monotonic() + 60
        while not _progress_after(lines, events.window_end) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()

    # THEN the count equals the query's own numInputRows of the batches reported inside the window,
    # within one micro-batch
    progress = [(float(f[1]), int(f[3])) for f in (line.split() for line in lines if line.startswith("progress"))]
    assert events.window_start is not None and events.window_end is not None
    inside = [rows for at, rows in progress if events.window_start <= at <= events.window_end]
    before = [rows for at, rows in progress if at < events.window_start][-1:]
    after = [rows for at, rows in progress if at > events.window_end][:1]
    expected = sum(inside)
    # The two clocks of a batch's end (SQL execution end vs. trigger start + durations) differ by
    # milliseconds, so a batch ending right at an edge may land on the other side: one edge batch.
    bound = max(inside + before + after)
    assert events.source.startswith("spark-rest:http://127.0.0.1:"), events
    assert events.count is not None and events.count > 0, (events.detail, progress)
    assert expected > 0 and len(inside) >= 2, progress
    assert abs(events.count - expected) <= bound, (events, inside, before, after)
    print(f"events from the REST API: {events.count}, from the query progress: {expected} ({len(inside)} batches)")
    assert "micro-batch" in events.detail


def test_no_engine_process_gives_none_with_reason() -> None:
    now = time.time()
    executor = ProcessInfo(
        pid=os.getpid(), role="workload", engine="spark", kind="executor", user="root",
        cmdline="java org.apache.spark.executor.CoarseGrainedExecutorBackend", first_seen=now, last_seen=now,
    )
    counter = EventCounter(poll_seconds=0.5)
    counter.start([executor])
    events = counter.finish(time.time())
    assert events.count is None and events.source == SOURCE_NONE
    assert "--events" in events.detail
