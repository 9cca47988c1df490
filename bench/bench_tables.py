"""Time one Python worker's per-table path of the analysis: read a stack table and decide its stacks.

Two paths over the same tables of an archive (bench/make_archive.py --compact), alternating in rounds so
that both see the same machine load: the host agent's standard-library reader
(profiler/capture/stacktable.py read_table) with the tuple-per-stack decider (TaskDecider.table), and the
coordinator's numpy reader (coordinator/analysis/tableread.py) with the prefix-coded decider
(TaskDecider.arrays), which `coordinator analyze` uses. Each path has its own warmed decider (frames
matched once, as in a worker that has read a few files). CPU milliseconds per table (process time) and
the wall time; the sums of both paths are checked equal.

usage: .venv/bin/python bench/bench_tables.py [--archive DIR] [--tables N] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from coordinator.analysis.decide import TaskDecider
    from coordinator.analysis.tableread import read_table_arrays
    from profiler.capture.stacktable import read_table
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, default=Path("/tmp/taskprof-archive-tables"))
    parser.add_argument("--tables", type=int, default=300, help="tables read per round (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both paths, alternating (default 3)")
    args = parser.parse_args(argv)
    paths = sorted(args.archive.rglob("stacks.tpc"))[: args.tables]
    if not paths:
        print(f"{args.archive}: no stacks.tpc; generate it with bench/make_archive.py DIR --compact", file=sys.stderr)
        return 2
    profile = parse_profile((ROOT / "application_profiles" / "spark_structured_streaming.txt").read_text())
    paths_of = {
        "stdlib reader + tuple decider": (TaskDecider(Matcher(profile)), lambda d, p: d.table(read_table(p))),
        "numpy reader + prefix decider": (TaskDecider(Matcher(profile)), lambda d, p: d.arrays(read_table_arrays(p))),
    }
    results = {}
    for name, (decider, read) in paths_of.items():  # warm: frames matched, files in the page cache
        results[name] = [read(decider, path) for path in paths]
    old, new = results.values()
    assert old == new, "the two paths disagree"
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in paths_of}
    for _round in range(args.rounds):
        for name, (decider, read) in paths_of.items():
            cpu, wall = time.process_time(), time.perf_counter()
            for path in paths:
                read(decider, path)
            times[name].append(((time.process_time() - cpu) / len(paths), (time.perf_counter() - wall) / len(paths)))
    print(f"{len(paths)} tables of {args.archive}, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    for name, rounds in times.items():
        best_cpu = min(cpu for cpu, _wall in rounds) * 1e3
        best_wall = min(wall for _cpu, wall in rounds) * 1e3
        print(f"{name}: {best_cpu:.2f} ms CPU per table (best round), {best_wall:.2f} ms wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
