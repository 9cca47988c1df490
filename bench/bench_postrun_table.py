"""The host agent's post-run step on a synthetic 900 s window of deep stacks: the stack store named into
a stack table (profiler.symbols.symbolize.tabulate_store), written (gzip) and matched by frame id, with its time
and the peak RSS it adds (getrusage and VmHWM of a fresh process before the step; VmHWM per phase, reset
at each phase's start through /proc/self/clear_refs).

The window is issue 29's: 130,000 samples over 90 intervals of 10 s, 15 perf-map epochs, ~22,000 distinct
user stacks 60-200 frames deep (``--depth``) drawn from ~8,800 distinct frames, a tenth with a kernel part,
Spark task contexts on a third. Names come from an in-memory resolver, so bcc's own lookups (the same
before and after issue 29) are not in the figure.

``--native 0.3`` makes that share of the frame pool native code (symbols of libjvm.so, never renamed by a
perf map); 0, the default, gives the table digest of the runs in docs/benchmarks/capture.md.

usage: .venv/bin/python bench/bench_postrun_table.py [--samples 130000] [--stacks 22000] [--depth 60,200]
       [--native 0]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import resource
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler.capture.folded import format_folded
from profiler.capture.stackstore import StackStore
from profiler.capture.stacktable import write_table
from profiler.defaults import DEFAULT_PROFILE, data_file
from profiler.files.atomic import atomic_write_chunks, atomic_write_text
from profiler.matching.appprofile import load_profile
from profiler.matching.matcher import Matcher, match_table
from profiler.symbols.frames import Frame
from profiler.symbols.symbolize import StackFolder, tabulate_store

SECOND = 10**9
FRAMES = 8_800


class PoolSymbols:
    """Addresses 0x1000 * (i + 1) name frame i of a fixed pool of Java-like names."""

    def __init__(self, native: float = 0.0) -> None:
        self.native = int(native * FRAMES)  # frames 0..native-1 are symbols of a file (libjvm.so), never renamed
        packages = ["org.apache.spark.sql.execution", "com.fasterxml.jackson.databind", "scala.collection", "java.util"]
        self.names = [f"{packages[i % 4]}.C{i // 7}::m{i}" for i in range(FRAMES)]
        self._memo: dict[int, Frame] = {}  # as FrameMemo: one Frame per address until the perf map changes

    def resolve(self, addr: int) -> Frame:
        frame = self._memo.get(addr)
        if frame is None:
            index = (addr >> 12) - 1
            kind, module = ("native", "libjvm.so") if index < self.native else ("jit", "")
            frame = self._memo[addr] = Frame(self.names[index], kind, module)
        return frame

    def set_perf_map(self, perf_map: object) -> None:
        self._memo = {addr: frame for addr, frame in self._memo.items() if frame.kind == "native"}

    def close(self) -> None:
        pass


class EveryEpochRenamed:
    """A perf-map history whose every epoch has its own map: each stack is named again per epoch, as with a
    JVM whose map was refreshed every minute."""

    def map_for(self, epoch: int) -> None:
        return None


class KernelNames:
    def resolve(self, addr: int) -> str:
        return f"k{addr >> 12}"


class Phases:
    """CPU s, wall s and peak RSS (VmHWM, reset through /proc/self/clear_refs at each phase's start) per phase."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start_hwm = reset_hwm()
        cpu, wall = time.process_time(), time.monotonic()
        yield
        self.rows[name] = {
            "cpu_s": round(time.process_time() - cpu, 2),
            "wall_s": round(time.monotonic() - wall, 2),
            "start_mb": round(start_hwm / 1e6, 1),
            "peak_mb": round(vm_hwm() / 1e6, 1),
        }


def reset_hwm() -> int:
    """Reset VmHWM to the current RSS (Linux >= 4.0); returns it."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return vm_hwm()


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def fill(store: StackStore, args: argparse.Namespace, rng: random.Random) -> None:
    low, high = (int(x) for x in args.depth.split(","))
    roots = [[rng.randrange(FRAMES) for _ in range(high)] for _ in range(20)]
    stacks = []
    for _ in range(args.stacks):
        depth = rng.randint(low, high)
        frames = rng.choice(roots)[: depth // 2] + [rng.randrange(FRAMES) for _ in range(depth - depth // 2)]
        user = struct.pack(f"<{depth}Q", *((f + 1) << 12 for f in reversed(frames)))
        kernel = struct.pack("<3Q", *((rng.randrange(500) + 1) << 12 for _ in range(3))) if rng.random() < 0.1 else -1
        stacks.append((user, kernel))
    weights = [1 / (i + 1) ** 0.8 for i in range(len(stacks))]
    picks = rng.choices(range(len(stacks)), weights, k=args.samples)
    store.begin(0)
    for n, index in enumerate(picks):
        time_ns = n * 900 * SECOND // args.samples
        user, kernel = stacks[index]
        context = f"Executor task launch worker for task {n % 40}.0 in stage {n // 4000}.0 (TID {n // 40})"
        store.add(4242, 1, b"Executor task launch worker", time_ns, user, kernel, epoch=time_ns // (60 * SECOND),
                  context=context if index % 3 == 0 else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=130_000)
    parser.add_argument("--stacks", type=int, default=22_000)
    parser.add_argument("--depth", default="60,200", help="user stack depth range (60,200)")
    parser.add_argument("--native", type=float, default=0.0, help="share of the frames that are native (0)")
    args = parser.parse_args(argv)
    store = StackStore(10 * SECOND)
    fill(store, args, random.Random(29))
    distinct = store.distinct_stacks
    before_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before_hwm = vm_hwm()
    started = time.process_time()
    wall = time.monotonic()
    phases = Phases()
    with phases.phase("naming and tabulating"):
        folder = StackFolder(PoolSymbols(args.native), KernelNames(), 1024, True, walker=True)
        table = tabulate_store(store, 4242, folder, EveryEpochRenamed(), 89)  # type: ignore[arg-type]
        store.forget(4242)
    with tempfile.TemporaryDirectory() as scratch, phases.phase("writing the table"):
        path = Path(scratch) / "stacks.tpc"
        write_table(path, table, atomic_write_chunks)
        size = path.stat().st_size
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]  # the same samples give the same bytes
    with phases.phase("matching"):
        result = match_table(Matcher(load_profile(data_file(DEFAULT_PROFILE))), table)
    with tempfile.TemporaryDirectory() as scratch, phases.phase("unmatched stacks"):
        unmatched_path = Path(scratch) / "unmatched.folded"
        atomic_write_text(unmatched_path, format_folded(result.unmatched))
        unmatched_bytes = unmatched_path.stat().st_size
    print(json.dumps({
        "samples": args.samples,
        "distinct_stacks_stored": distinct,
        "table_stacks": len(table.stacks),
        "table_frames": len(table.names),
        "frame_references": sum(map(len, table.stacks)),
        "rows": len(table.counts),
        "file_bytes": size,
        "file_sha256": digest,
        "matched_samples": result.total_samples,
        "unmatched_stacks": len(result.unmatched),
        "unmatched_bytes": unmatched_bytes,
        "post_run_cpu_seconds": round(time.process_time() - started, 2),
        "post_run_wall_seconds": round(time.monotonic() - wall, 2),
        "peak_rss_before_mb": round(before_rss / 1e6, 1),
        # the post-run peak: the phases' (clear_refs resets getrusage's peak with VmHWM)
        "vm_hwm_after_mb": max(round(before_hwm / 1e6, 1), *(row["peak_mb"] for row in phases.rows.values())),
        "vm_hwm_before_mb": round(before_hwm / 1e6, 1),
        "phases": phases.rows,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
