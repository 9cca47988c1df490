"""A PySpark Structured Streaming query whose Python UDFs are py_udf_split's three functions: a
rate-micro-batch source (a fixed number of rows per batch: no backlog piles up while the app starts, as a
rate source's rows per second would), the three UDFs on every row (one BatchEvalPython: each row runs the
three in turn), a noop sink. READY once a batch has run rows through them; it stops by itself after --seconds.

Usage: spark-submit --py-files py_udf_split.py pyspark_udf_stream.py [--seconds N] [--rows-per-batch N]
"""

from __future__ import annotations

import argparse
import sys
import time

import py_udf_split
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120.0, help="stop by itself after this long")
    parser.add_argument("--rows-per-batch", type=int, default=1500, help="rows of each micro-batch (~1.5 ms each)")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("udf-stream").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    udfs = [F.udf(f, "long") for f in (py_udf_split.parse_alpha, py_udf_split.enrich_beta, py_udf_split.filter_gamma)]
    rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch).load()
    query = (
        rows.select(*(udf(F.col("value")).alias(f"out{index}") for index, udf in enumerate(udfs)))
        .writeStream.format("noop")
        .start()
    )
    deadline = time.monotonic() + args.seconds
    ready = False
    while time.monotonic() < deadline and query.isActive:
        progress = query.lastProgress
        if not ready and progress is not None and progress["numInputRows"] > 0:
            print(f"READY batch {progress['batchId']} python {sys.version.split()[0]}", flush=True)
            ready = True
        time.sleep(0.2)
    query.stop()
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
