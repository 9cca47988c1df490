"""Where the host agent's CPU goes in the window: `profiler run` under cProfile in every thread (the reader
thread, the symbol worker and the thread-name watcher included, which cProfile alone would miss), from
the window's start to the capture's writing (--whole-run: start-up and post-run too), then the functions
that took the most time, own time first (time waiting on a lock is wall time, not CPU).

usage: .venv/bin/python bench/profile_agent.py [--top 30] [--stats out.pstats] -- run --duration 60 --pid PID \
           --out /tmp/agent-profile --force --known-spes no_known_spes.txt
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def profiled(argv: list[str], window_only: bool) -> tuple[int, list[cProfile.Profile]]:
    """Run ``profiler`` with ``argv``, every thread under its own profiler; (exit code, profilers). With
    ``window_only`` each thread's profiler starts at the window's first call in it after begin_window()
    and the main thread's stops when the capture is written (start-up and post-run left out)."""
    from profiler.cli import main
    from profiler.run.runner import Runner
    from profiler.sampling.sampler import StackSampler

    profiles: dict[int, cProfile.Profile] = {}
    lock = threading.Lock()
    window = threading.Event()
    if not window_only:
        window.set()

    def hook(*_args: Any) -> None:
        if not window.is_set():
            return
        profile = cProfile.Profile()
        with lock:
            profiles[threading.get_ident()] = profile
        profile.enable()  # replaces this hook for the thread

    begin, write = StackSampler.begin_window, Runner._write_capture

    def begin_window(self: StackSampler) -> None:
        begin(self)
        window.set()

    def write_capture(self: Runner, *args: Any) -> None:
        main_profile = profiles.get(threading.get_ident())
        if window_only and main_profile is not None:
            main_profile.disable()
        write(self, *args)

    StackSampler.begin_window = begin_window  # type: ignore[method-assign]
    Runner._write_capture = write_capture  # type: ignore[method-assign]
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        for profile in profiles.values():
            profile.disable()
    return code, list(profiles.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--stats", type=Path, help="also write the merged stats here (pstats format)")
    parser.add_argument("--whole-run", action="store_true", help="start-up and post-run too, not only the window")
    parser.add_argument("profiler_args", nargs=argparse.REMAINDER, help="-- then profiler's arguments")
    args = parser.parse_args()
    argv = [a for a in args.profiler_args if a != "--"] if args.profiler_args[:1] == ["--"] else args.profiler_args
    code, profiles = profiled(argv, not args.whole_run)
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        try:
            stats.add(profile)
        except TypeError:  # a thread that never ran Python code
            continue
    if args.stats is not None:
        stats.dump_stats(str(args.stats))
    print(f"threads profiled: {len(profiles)}; total CPU in Python functions: {stats.total_tt:.2f} s")
    stats.sort_stats("tottime").print_stats(args.top)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
