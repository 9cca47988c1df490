"""CPU of filing deep samples into the stack store, user stacks packed (as the sampler's window holds them)
or not: 3,000 distinct stacks of 300 values drawn from 3,000 pcs (200 shared root values), filed once (every
stack new) and again (every stack known), untraced, in alternating rounds; then the checkpoint journal's
delta of those stacks taken (its cost per new stack).

usage: .venv/bin/python bench/bench_stackstore_cpu.py [--rounds N]
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.capture.stackstore import StackStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (unpacked, packed) (2)")
    args = parser.parse_args(argv)
    rng = random.Random(1)
    pcs = [rng.randrange(1 << 40) for _ in range(3000)]
    root = [rng.choice(pcs) for _ in range(200)]
    pool = [struct.pack("<300Q", *([rng.choice(pcs) for _ in range(100)] + root)) for _ in range(3000)]
    for _round in range(args.rounds):
        for packed in (False, True):
            store = StackStore(10**10)
            store.begin(0)
            store.track_deltas = True
            if packed:
                store.pack_user_stacks()
            figures = []
            for phase in ("new", "known"):
                samples = [bytes(bytearray(user)) for user in pool]  # each record arrives as new bytes
                began = time.process_time()
                for n, user in enumerate(samples):
                    store.add(1, 1, b"worker", n * 10**7, user, -1)
                figures.append(f"{phase} {(time.process_time() - began) / len(samples) * 1e6:.1f} us")
            began = time.process_time()
            store.take_delta()
            figures.append(f"journal delta {(time.process_time() - began) / len(pool) * 1e6:.1f} us")
            print(f"{'packed' if packed else 'unpacked':<9} per sample: {', '.join(figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
