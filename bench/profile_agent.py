"""Where the host agent's CPU goes: `profiler run` under cProfile in every thread (the reader thread, the
symbol worker and the thread-name watcher included, which cProfile alone would miss), then the functions
that took the most CPU, own time first.

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


def profiled(argv: list[str]) -> tuple[int, list[cProfile.Profile]]:
    """Run ``profiler`` with ``argv``, every thread under its own profiler; (exit code, profilers)."""
    from profiler.cli import main

    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start_in_thread(*_args: Any) -> None:
        profile = cProfile.Profile()
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook for the thread

    threading.setprofile(start_in_thread)
    main_profile = cProfile.Profile()
    profiles.append(main_profile)
    main_profile.enable()
    try:
        code = main(argv)
    finally:
        main_profile.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
    return code, profiles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--stats", type=Path, help="also write the merged stats here (pstats format)")
    parser.add_argument("profiler_args", nargs=argparse.REMAINDER, help="-- then profiler's arguments")
    args = parser.parse_args()
    argv = [a for a in args.profiler_args if a != "--"] if args.profiler_args[:1] == ["--"] else args.profiler_args
    code, profiles = profiled(argv)
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
