"""The Python UDFs of tests/workloads/pyspark_udf_stream.py: three functions of known work (50/30/20), each
measuring its own CPU with time.thread_time. The Python worker that runs them writes its running totals to
$UDF_TRUTH_DIR/PID.json (atomically, at most every TRUTH_EVERY seconds), so a test reads the truth of any
window from outside without the profiler's numbers. Imported by the workers (shipped with --py-files), so the
functions keep these qualnames in their frames."""

from __future__ import annotations

import json
import os
import time

SPENT = {"parse_alpha": 0.0, "enrich_beta": 0.0, "filter_gamma": 0.0}
TRUTH_EVERY = 0.05  # seconds between writes of the totals: the truth's lag at a window's ends
_written = [0.0]


def _spin(units: int) -> int:
    total = 0
    for i in range(units):
        total += i * i % 7
    return total


def _account(function: str, began: float) -> None:
    SPENT[function] += time.thread_time() - began
    now = time.monotonic()
    if now - _written[0] >= TRUTH_EVERY:
        _written[0] = now
        folder = os.environ["UDF_TRUTH_DIR"]
        path = os.path.join(folder, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(SPENT, handle)
        os.replace(path + ".tmp", path)


def parse_alpha(value: int) -> int:
    began = time.thread_time()
    result = _spin(10_000) + value
    _account("parse_alpha", began)
    return result


def enrich_beta(value: int) -> int:
    began = time.thread_time()
    result = _spin(6_000) + value
    _account("enrich_beta", began)
    return result


def filter_gamma(value: int) -> int:
    began = time.thread_time()
    result = _spin(4_000) + value
    _account("filter_gamma", began)
    return result
