"""The YSB PySpark application, run with spark-submit; prints READY, then one PROGRESS JSON line per
micro-batch (from StreamingQueryProgress), then DONE.

usage: spark-submit [--jars ysb-redis-sink.jar] app.py --rate N --duration S --checkpoint DIR
                    (--redis-port P | --file-sink DIR) [--campaigns 100] [--partitions 2]
                    [--kafka-bootstrap HOST:PORT --kafka-topic T] [--window state|sink] [--udf sql|python]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

from pyspark.sql import SparkSession

from coordinator.workloads.ysb.pipeline import (
    SinkSpec,
    build_ysb,
    build_ysb_continuous,
    start_continuous_query,
    start_query,
    start_realtime_query,
)
from coordinator.workloads.ysb.pyudfs import UDFS
from profiler.argtypes import positive_int


def progress_line(progress: dict[str, Any]) -> str:
    """The fields of one StreamingQueryProgress the runner and the benchmarks read."""
    durations = progress.get("durationMs") or {}
    compact = {
        "batch": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "input_rows": progress.get("numInputRows", 0),
        "input_rows_per_s": progress.get("inputRowsPerSecond", 0.0),
        "processed_rows_per_s": progress.get("processedRowsPerSecond", 0.0),
        "trigger_ms": durations.get("triggerExecution", 0),
    }
    return "PROGRESS " + json.dumps(compact, sort_keys=True)


def is_ready(input_rows: int, rows_per_batch: float, kafka: object) -> bool:
    """READY after the first micro-batch with input rows; reading Kafka, after the first one that is no
    longer catching up: the events produced while the first batches compiled their code wait in the
    topic, and the batches that drain them are start-up, not the steady state the demo profiles."""
    if input_rows <= 0:
        return False
    return kafka is None or input_rows <= 3 * rows_per_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ysb-app")
    parser.add_argument("--rate", type=positive_int, default=20_000, help="generated events per second")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after S seconds (0: until SIGTERM)")
    parser.add_argument("--campaigns", type=positive_int, default=100)
    parser.add_argument("--ads-per-campaign", type=positive_int, default=10)
    parser.add_argument("--partitions", type=positive_int, default=2, help="generator partitions")
    parser.add_argument("--trigger", type=float, default=1.0, help="micro-batch interval in s (0: back to back)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--continuous", action="store_true", help="Continuous Processing (epochs of --trigger s)")
    mode.add_argument(
        "--realtime", action="store_true",
        help="Real-time Mode (batches of --trigger s, at least 5; Kafka only; the window in the Redis sink)",
    )
    parser.add_argument(
        "--window", choices=("state", "sink"), default="state",
        help="micro-batches: the 10 s window in Spark's stateful operator (state) or in the Redis sink (sink)",
    )
    parser.add_argument(
        "--udf", choices=UDFS, default="sql",
        help="micro-batches: deserialize, filter and projection as SQL expressions or as a Python UDF (python)",
    )
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--kafka-bootstrap", metavar="HOST:PORT", help="read the events from Kafka, not the generator")
    parser.add_argument("--kafka-topic", default="ysb", help="the topic of --kafka-bootstrap (ysb)")
    sink = parser.add_mutually_exclusive_group(required=True)
    sink.add_argument("--redis-port", type=positive_int)
    sink.add_argument("--file-sink", metavar="DIR")
    args = parser.parse_args(argv)

    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))

    spark = SparkSession.builder.appName("ysb").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    kafka = (args.kafka_bootstrap, args.kafka_topic) if args.kafka_bootstrap else None
    spec = SinkSpec("redis", redis_port=args.redis_port) if args.redis_port else SinkSpec("file", path=args.file_sink)
    batch_seconds = args.trigger if args.trigger > 0 else 1.0
    if args.continuous:
        rows = build_ysb_continuous(
            spark, args.rate, args.campaigns, args.ads_per_campaign, args.partitions, kafka=kafka
        )
        query = start_continuous_query(rows, spec, args.checkpoint, batch_seconds)
    elif args.realtime:
        rows = build_ysb(
            spark, args.rate, args.campaigns, args.ads_per_campaign, args.partitions, kafka=kafka, window="sink"
        )
        query = start_realtime_query(spark, rows, spec, args.checkpoint, batch_seconds)
    else:
        rows = build_ysb(
            spark, args.rate, args.campaigns, args.ads_per_campaign, args.partitions, batch_seconds, kafka=kafka,
            window=args.window, udf=args.udf,
        )
        query = start_query(rows, spec, args.checkpoint, args.trigger, window=args.window)

    deadline = time.monotonic() + args.duration if args.duration > 0 else float("inf")
    last_batch = -1
    ready = False
    try:
        while not stopping["flag"] and time.monotonic() < deadline:
            if query.exception() is not None:
                print(f"FAILED {query.exception()}", flush=True)
                return 1
            # every batch since the last look (several may finish within one sleep): the demo places
            # each one in the window by its times, and a Kafka batch's records by its predecessor's
            for progress in query.recentProgress:
                if progress.get("batchId", -1) <= last_batch:
                    continue
                last_batch = progress["batchId"]
                print(progress_line(progress), flush=True)
                if not ready and is_ready(progress.get("numInputRows", 0), args.rate * batch_seconds, kafka):
                    ready = True
                    print("READY", flush=True)
            time.sleep(0.5)
    finally:
        query.stop()
        spark.stop()
        print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
