"""Where the host agent's memory goes after the window: `profiler run` in this process, its VmRSS read
every 10 ms by a thread and binned by the post-run step running at that moment (the symbol cache of a
process opened, the kernel's symbols, naming and tabulating its stacks, writing, matching), then each
step's RSS when it began and its peak, in the order the steps first ran, and the distinct stacks of
each process named. The window itself is one line ("window"), start-up another. Each step's CPU
seconds (`process_time` between entering and leaving it, its inner steps not counted) are printed beside;
`--profile-post FILE` also runs cProfile over the post-run step (`Runner._write_capture`), saves its stats to
FILE and prints the functions with most own time.

``--window-breakdown`` also prints, when the window ends, what its structures hold (bench/window_memory.py:
per structure, per allocator, RSS and distinct stacks per tick, the growth per distinct stack);
``--tracemalloc N`` traces allocations from the window's start and prints the N largest sources still
held when it ends (slows the agent and inflates its RSS: for attribution, not for the RSS figures).

usage: .venv/bin/python bench/postrun_memory.py [--profile-post FILE] [--window-breakdown] [--tracemalloc 25] \
           -- run --duration 60 --pid PID --out /tmp/agent-memory --force --known-spes no_known_spes.txt
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
MB = 1e6


def vm_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Phases:
    """The step running now, and per step (in order of first run) the RSS it began at and its peak."""

    def __init__(self) -> None:
        self.now = "start-up"
        self.order: list[str] = []
        self.began: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.stacks: list[tuple[int, int]] = []  # (pid, distinct stacks) as named
        self.cpu: dict[str, float] = {}  # own CPU seconds per step (inner steps not counted)
        self._cpu_mark = time.process_time()
        self._stop = threading.Event()
        self._enter("start-up")

    def _enter(self, name: str) -> None:
        mark = time.process_time()
        self.cpu[self.now] = self.cpu.get(self.now, 0.0) + mark - self._cpu_mark
        self._cpu_mark = mark
        self.now = name
        if name not in self.began:
            self.order.append(name)
            self.began[name] = vm_rss()

    def watch(self) -> None:
        while not self._stop.wait(0.01):
            rss = vm_rss()
            self.peak[self.now] = max(self.peak.get(self.now, 0), rss)

    def stop(self) -> None:
        self._stop.set()

    def wrap(self, owner: Any, attr: str, name: str, after: str | None = None) -> None:
        """Label the time inside ``owner.attr`` as step ``name`` (and after it, ``after`` when given)."""
        original: Callable[..., Any] = getattr(owner, attr)

        @functools.wraps(original)
        def labelled(*args: Any, **kwargs: Any) -> Any:
            previous = self.now
            self._enter(name)
            try:
                return original(*args, **kwargs)
            finally:
                self.peak[name] = max(self.peak.get(name, 0), vm_rss())
                self._enter(after or previous)

        setattr(owner, attr, labelled)


def profile_post(runner_class: Any, stats_path: Path) -> None:
    """cProfile around ``runner_class._write_capture`` (the post-run step), stats saved to ``stats_path``."""
    original = runner_class._write_capture

    @functools.wraps(original)
    def profiled(*args: Any, **kwargs: Any) -> Any:
        profile = cProfile.Profile()
        try:
            return profile.runcall(original, *args, **kwargs)
        finally:
            profile.dump_stats(str(stats_path))
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(30)
            pstats.Stats(profile, stream=sys.stdout).sort_stats("cumulative").print_stats(45)

    runner_class._write_capture = profiled


def instrument(phases: Phases) -> None:
    from profiler.run import runner, write
    from profiler.sampling import collect, sampler
    from profiler.symbols import symbolprep

    phases.wrap(sampler.StackSampler, "begin_window", "begin window", after="window")
    phases.wrap(runner.Runner, "_write_capture", "post-run: other", after="after the capture")
    phases.wrap(
        symbolprep.SymbolPreparer, "symbols_for", "symbol cache of a process (perf map read)", after="post-run: other"
    )
    phases.wrap(collect, "KernelSymbols", "kernel symbols opened", after="post-run: other")
    tabulate = collect.tabulate_store

    def counted(store: Any, pid: int, *args: Any, **kwargs: Any) -> Any:
        table = tabulate(store, pid, *args, **kwargs)
        phases.stacks.append((pid, len(table.stacks)))
        return table

    collect.tabulate_store = counted
    phases.wrap(collect, "tabulate_store", "naming and tabulating stacks", after="post-run: other")
    phases.wrap(write, "write_table", "writing the stack table", after="post-run: other")
    phases.wrap(write, "match_table", "matching the table", after="post-run: other")
    phases.wrap(write, "write_results", "result rows, unmatched stacks", after="post-run: other")


def instrument_window(trace_top: int, phases: Phases) -> None:
    """At the window's end print its structures' sizes (and with ``trace_top``, tracemalloc's largest sources)."""
    import tracemalloc

    import window_memory

    from profiler.run import window as window_module
    from profiler.sampling import sampler as sampler_module

    ticks: list[window_memory.Tick] = []
    seen: dict[str, Any] = {}
    begin, stop = sampler_module.StackSampler.begin_window, sampler_module.StackSampler.stop
    tick = window_module.Window._tick

    def begin_window(self: Any) -> None:
        seen["sampler"], seen["baseline"], seen["start"] = self, vm_rss(), time.monotonic()
        if trace_top:
            tracemalloc.start(1)
        begin(self)

    def ticked(self: Any, interval: int) -> None:
        tick(self, interval)
        status, store = window_memory.proc_status(), seen["sampler"]._store
        ticks.append(window_memory.Tick(time.monotonic() - seen["start"], status["VmRSS"], status["RssAnon"],
                                        store.distinct_stacks, store.samples))

    def stopped(self: Any) -> None:
        window_peak = phases.peak.get("window", 0)  # VmRSS every 10 ms, before the breakdown allocates
        print(f"== window: peak VmRSS (10 ms samples) {window_peak / MB:.1f} MB, "
              f"{(window_peak - seen.get('baseline', 0)) / MB:+.1f} MB over its start", flush=True)
        if trace_top and tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            tracemalloc.stop()
            print(f"== tracemalloc: the {trace_top} largest sources held at the window's end")
            for stat in snapshot.statistics("lineno")[:trace_top]:
                print(f"{stat.size / MB:>8.2f} MB {stat.count:>9,} blocks  {stat.traceback[0]}")
        print(window_memory.report(self, ticks, seen.get("baseline", 0)), flush=True)
        stop(self)  # after: stop() turns the store's packed stacks back into addresses

    sampler_module.StackSampler.begin_window = begin_window
    window_module.Window._tick = ticked
    sampler_module.StackSampler.stop = stopped


def instrument_post_trace(trace_top: int) -> None:
    """tracemalloc from the post-run's start; the ``trace_top`` largest sources it still holds printed as each
    of its steps begins (what the steps before left behind) and its traced peak at the end."""
    import tracemalloc

    from profiler.run import runner, write

    def show(label: str) -> None:
        if not tracemalloc.is_tracing():
            return
        current, peak = tracemalloc.get_traced_memory()
        print(f"== tracemalloc {label}: {current / MB:.1f} MB held, {peak / MB:.1f} MB peak since the post-run began")
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:trace_top]:
            print(f"{stat.size / MB:>8.2f} MB {stat.count:>9,} blocks  {stat.traceback[0]}")

    def traced(owner: Any, attr: str, label: str, start: bool = False) -> None:
        original: Callable[..., Any] = getattr(owner, attr)

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if start:
                tracemalloc.start(1)
            show(f"before {label}")
            try:
                return original(*args, **kwargs)
            finally:
                show(f"after {label}")
                if start:
                    tracemalloc.stop()

        setattr(owner, attr, wrapped)

    traced(runner.Runner, "_write_capture", "the post-run", start=True)
    traced(write, "write_table", "writing the stack table")
    traced(write, "match_table", "matching the table")
    traced(write, "write_results", "result rows, unmatched stacks")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile-post", type=Path, metavar="FILE", help="cProfile the post-run step into FILE")
    parser.add_argument("--window-breakdown", action="store_true", help="print the window's structures at its end")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N", help="and the N largest allocation sources")
    parser.add_argument("--tracemalloc-post", type=int, default=0, metavar="N",
                        help="trace the post-run's allocations: the N largest sources held as each step begins")
    parser.add_argument("profiler_args", nargs=argparse.REMAINDER, help="-- then profiler's arguments")
    args = parser.parse_args()
    argv = [a for a in args.profiler_args if a != "--"] if args.profiler_args[:1] == ["--"] else args.profiler_args
    from profiler.cli import main as profiler_main

    phases = Phases()
    instrument(phases)
    if args.profile_post is not None:
        from profiler.run import runner

        profile_post(runner.Runner, args.profile_post)
    if args.window_breakdown or args.tracemalloc:
        sys.path.insert(0, str(REPO / "bench"))
        instrument_window(args.tracemalloc, phases)
    if args.tracemalloc_post:
        instrument_post_trace(args.tracemalloc_post)
    watcher = threading.Thread(target=phases.watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    try:
        code = profiler_main(argv)
    finally:
        phases.stop()
        watcher.join()
    print(f"profiler exit {code} after {time.monotonic() - start:.0f} s; distinct stacks per pid: {phases.stacks}")
    print(f"{'step':<45} {'RSS at start':>12} {'peak':>8} {'CPU s':>8}")
    for name in phases.order:
        began, peak, cpu = phases.began[name] / MB, phases.peak.get(name, 0) / MB, phases.cpu.get(name, 0.0)
        print(f"{name:<45} {began:>9.1f} MB {peak:>5.1f} MB {cpu:>8.2f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
