"""Post-run cost of keeping the thread ids per blocked stack (offcpu_threads.json, summary.csv offcpu_threads).

Synthetic, pure Python (no BPF): a process of THREADS threads, each blocked under STACKS_PER_THREAD of
STACKS stacks. Times (CPU seconds of this process) the host agent's naming (name_blocks), the capture's
write (write_offcpu) and the analysis's read and per-task split (read_pid_offcpu, match_offcpu and, where
the tree has it, match_offcpu_threads) of the tree given by --tree; run it on main's tree and this one,
interleaved, to compare. Prints one JSON line per round.

usage: .venv/bin/python bench/bench_offcpu_threads.py --tree DIR [--threads N] [--stacks N] [--per-thread N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(step: Callable[[], Any]) -> tuple[Any, float]:
    start = time.process_time()
    result = step()
    return result, time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, required=True, help="the checkout whose profiler/ is measured")
    parser.add_argument("--threads", type=int, default=2000)
    parser.add_argument("--stacks", type=int, default=2000)
    parser.add_argument("--per-thread", type=int, default=20)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.tree.resolve()))
    from profiler.capture import format as capture
    from profiler.capture.read import read_pid_offcpu
    from profiler.matching import matcher as matching
    from profiler.matching.appprofile import parse_profile
    from profiler.sampling.offcpu import RawBlock, name_blocks

    rng = random.Random(42)
    stacks = {i + 1: (0x1000 + i % 50, 0x2000 + i) for i in range(args.stacks)}
    kernel = {1_000_000 + i: ("futex_wait" if i % 2 else "ep_poll") for i in range(2)}
    stacks.update({1_000_000 + i: (1_000_000 + i,) for i in range(2)})
    names = {a: f"com.example.Op{a % 50}.run" for a in range(0x1000, 0x1000 + 50)}
    names.update({a: f"com.example.Leaf{a}" for a in range(0x2000, 0x2000 + args.stacks)})
    blocks = [
        RawBlock(7, stack, 1_000_000 + stack % 2, 1, f"worker-{tid % 8}", rng.randrange(10**6, 10**8), 3, tid=tid)
        for tid in range(100, 100 + args.threads)
        for stack in rng.sample(range(1, args.stacks + 1), args.per_thread)
    ]
    profile = parse_profile("".join(f"Op{i}: com.example.Op{i}.run\n" for i in range(0, 50, 5)))
    match = matching.Matcher(profile)
    entries, naming = _timed(lambda: name_blocks(blocks, stacks.get, names.__getitem__, kernel.__getitem__))
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        _none, writing = _timed(lambda: capture.write_offcpu(out, 7, entries))
        read, reading = _timed(lambda: read_pid_offcpu(out, 7))
        _tasks, splitting = _timed(lambda: matching.match_offcpu(match, read))
        counting = 0.0
        if hasattr(matching, "match_offcpu_threads"):
            _threads, counting = _timed(lambda: matching.match_offcpu_threads(match, read))
        sizes = {path.name: path.stat().st_size for path in (out / "pids" / "7").iterdir()}
    print(json.dumps({
        "tree": str(args.tree), "blocks": len(blocks), "lines": len(read or []), "name_s": round(naming, 3),
        "write_s": round(writing, 3), "read_s": round(reading, 3), "match_s": round(splitting, 3),
        "threads_s": round(counting, 3), "bytes": sizes,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
