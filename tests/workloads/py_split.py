"""A CPython workload of known measured work for the Python frames' tests: three functions burn CPU in the
ratio 50/30/20, each measuring its own CPU with time.thread_time. stdin: "reset" zeroes the measures,
"shares" prints them as one JSON line; "ready" is printed once the loop runs."""

from __future__ import annotations

import json
import sys
import threading
import time

SPENT = {"parse_alpha": 0.0, "enrich_beta": 0.0, "filter_gamma": 0.0}
LOCK = threading.Lock()


def _spin(units: int) -> int:
    total = 0
    for i in range(units):
        total += i * i % 7
    return total


def parse_alpha() -> int:
    began = time.thread_time()
    result = _spin(5000)
    with LOCK:
        SPENT["parse_alpha"] += time.thread_time() - began
    return result


def enrich_beta() -> int:
    began = time.thread_time()
    result = _spin(3000)
    with LOCK:
        SPENT["enrich_beta"] += time.thread_time() - began
    return result


def filter_gamma() -> int:
    began = time.thread_time()
    result = _spin(2000)
    with LOCK:
        SPENT["filter_gamma"] += time.thread_time() - began
    return result


def burn_forever() -> None:
    while True:
        parse_alpha()
        enrich_beta()
        filter_gamma()


def serve_commands() -> None:
    for line in sys.stdin:
        command = line.strip()
        with LOCK:
            if command == "reset":
                for name in SPENT:
                    SPENT[name] = 0.0
                print("reset", flush=True)
            elif command == "shares":
                print(json.dumps(SPENT), flush=True)


if __name__ == "__main__":
    threading.Thread(target=serve_commands, daemon=True).start()
    print("ready", flush=True)
    burn_forever()
