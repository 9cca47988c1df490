"""Time `coordinator analyze` (the PySpark pipeline) on a whole archive: local[2] and local[1].

Generates the archive with bench/make_archive.py when it is missing (100 runs × 8 hosts × 4
executors from real executor stacks, as stack tables, capture format 4, or with --form folded as
folded text; --quick: 10 runs), then, for each master, in a fresh Python process (so the JVM start-up
is really measured): Spark session start-up, the job (read, match, sum, write summary.csv and
unmatched.folded), samples/s, stack lines/s, distinct stacks/s, the JVM start-up share, the CPU
seconds of the whole process tree (the JVM, its Python workers and the driver) — on a shared machine
the CPU seconds say more than the wall time — and the peak RSS of the driver (getrusage), the JVM and
the Python workers (sampled every 0.25 s).

usage: .venv/bin/python bench/bench_pipeline.py [--quick] [--form tables|folded] [--archive DIR]
       [--masters local[2],local[1]]
results: docs/benchmarks/pipeline.md (with --write)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "docs" / "benchmarks" / "pipeline.md"


class TreeCpu:
    """CPU seconds and peak RSS of this process and all its descendants, sampled every 0.25 s
    (descendants come and go): the driver (this Python process, getrusage), the JVM and the Python workers."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._seen: dict[int, float] = {}
        self.peak_jvm = 0  # bytes
        self.peak_worker = 0  # bytes, the largest single Python worker
        self.peak_workers = 0  # bytes, all Python workers at one moment
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            workers = 0
            for process in self._me.children(recursive=True):
                try:
                    times = process.cpu_times()
                    self._seen[process.pid] = times.user + times.system
                    rss = process.memory_info().rss
                    if process.name() == "java":
                        self.peak_jvm = max(self.peak_jvm, rss)
                    else:
                        workers += rss
                        self.peak_worker = max(self.peak_worker, rss)
                except psutil.Error:
                    pass
            self.peak_workers = max(self.peak_workers, workers)
            self._stop.wait(0.25)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def total(self) -> float:
        own = self._me.cpu_times()
        return own.user + own.system + sum(self._seen.values())


def _mb(value: float) -> float:
    return round(value / 2**20, 1)


def one(master: str, archive: Path, out: Path) -> dict[str, object]:
    """Run in a fresh process: session start-up, then the analysis; numbers as a dict."""
    from coordinator.analysis.engines import analyze, spark_session

    runs = sorted(p for p in archive.iterdir() if (p / "run.json").is_file())
    lines = sum(map(stack_lines, stack_files(archive)))
    load_before = os.getloadavg()[0]
    with TreeCpu() as cpu:
        started = time.monotonic()
        with spark_session(master) as spark:
            session_seconds = time.monotonic() - started
            cpu_session = cpu.total()
            output = analyze(runs, out_dir=out, master=master, spark=spark)
            job_seconds = time.monotonic() - started - session_seconds
            time.sleep(0.3)  # one more CPU sample of the workers
            cpu_job = cpu.total() - cpu_session
    stats = output.stats
    return {
        "master": master,
        "runs": stats.runs,
        "hosts": stats.hosts,
        "pids": stats.pids,
        "stack_lines": lines,
        "samples": stats.samples,
        "distinct_stacks": stats.distinct_stacks,
        "session_seconds": round(session_seconds, 1),
        "job_seconds": round(job_seconds, 1),
        "total_seconds": round(session_seconds + job_seconds, 1),
        "startup_share": round(session_seconds / (session_seconds + job_seconds), 3),
        "samples_per_second": round(stats.samples / job_seconds),
        "lines_per_second": round(lines / job_seconds),
        "distinct_stacks_per_second": round(stats.distinct_stacks / job_seconds),
        "cpu_seconds_session": round(cpu_session, 1),
        "cpu_seconds_job": round(cpu_job, 1),
        "peak_rss_driver_mb": _mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        "peak_rss_jvm_mb": _mb(cpu.peak_jvm),
        "peak_rss_python_worker_mb": _mb(cpu.peak_worker),
        "peak_rss_python_workers_mb": _mb(cpu.peak_workers),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
    }


def stack_files(archive: Path) -> list[Path]:
    """Every executor's stacks file of the archive: stack tables (format 4) or folded text."""
    return sorted(archive.rglob("stacks.tpc")) + sorted(archive.rglob("stacks.folded"))


def stack_lines(path: Path) -> int:
    """Distinct stacks of one stacks file (its lines, for folded text)."""
    if path.suffix == ".tpc":  # the header says how many stacks the table has (docs/capture-format.md)
        import gzip
        import struct

        with gzip.open(path, "rb") as handle:
            _magic, _version, length = struct.unpack("<5sBI", handle.read(10))
            return int(json.loads(handle.read(length))["stacks"])
    with path.open(encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"Linux {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} CPUs ({model}), {memory:.0f} GiB, {system}"


def write_results(results: list[dict[str, object]], archive_facts: str, command: str) -> None:
    import pyspark

    header = (
        "| master | total s | JVM+session s | job s | start-up share | samples/s | stack lines/s |"
        " distinct stacks/s | CPU s (job) | peak RSS MB: driver / JVM / Python workers (largest) |"
        " load avg before/after |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in results:
        lines.append(
            f"| {r['master']} | {r['total_seconds']} | {r['session_seconds']} | {r['job_seconds']} |"
            f" {float(r['startup_share']) * 100:.0f} % | {int(r['samples_per_second']):,} |"  # type: ignore[call-overload]
            f" {int(r['lines_per_second']):,} | {int(r['distinct_stacks_per_second']):,} |"  # type: ignore[call-overload]
            f" {r['cpu_seconds_job']} | {r['peak_rss_driver_mb']} / {r['peak_rss_jvm_mb']} /"
            f" {r['peak_rss_python_workers_mb']} ({r['peak_rss_python_worker_mb']}) |"
            f" {r['load_before']} / {r['load_after']} |"
        )
    section = "\n".join(
        [
            f"## Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            "",
            f"- Machine: {machine()}; pyspark {pyspark.__version__}.",
            f"- Archive: {archive_facts}",
            f"- Command: `{command}`",
            "",
            *lines,
            "",
            "```json",
            json.dumps(results, indent=1),
            "```",
            "",
        ]
    )
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Pipeline benchmark\n\n"
    marker = "<!-- results -->"
    if marker in text:  # newest run first; earlier runs (the folded archive's figure) stay below
        head, _, earlier = text.partition(marker)
        text = f"{head}{marker}\n\n{section}{earlier.lstrip(chr(10)) and chr(10) + earlier.lstrip(chr(10))}"
    else:
        text += f"\n{marker}\n\n{section}"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path, default=None, help="archive directory (generated when missing)")
    parser.add_argument("--masters", default="local[2],local[1]")
    parser.add_argument("--quick", action="store_true", help="10 runs instead of 100")
    parser.add_argument(
        "--form", choices=("tables", "folded"), default="tables",
        help="the archive to generate when missing: stack tables (capture format 4, default) or folded text",
    )
    parser.add_argument("--write", action="store_true", help=f"write the results to {RESULTS.relative_to(ROOT)}")
    parser.add_argument("--one", metavar="MASTER", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("/tmp/taskprof-bench-analysis"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    archive = args.archive or Path(f"/tmp/taskprof-archive-{args.form}{'-quick' if args.quick else ''}")
    if args.one:
        print(json.dumps(one(args.one, archive, args.out)))
        return 0
    from bench.make_archive import make_archive

    if not archive.exists():
        facts = make_archive(archive, 10 if args.quick else 100, 8, 4, 0.6, 0.1, 1, compact=args.form == "tables")
        print(f"generated {archive}: {facts}")
    found = stack_files(archive)
    sizes = sum(p.stat().st_size for p in found) / 1e6
    tables = bool(found) and found[0].suffix == ".tpc"
    form = "stack tables (stacks.tpc, capture format 4)" if tables else "folded stacks"
    runs = sum(1 for p in archive.iterdir() if (p / "run.json").is_file())
    archive_facts = (
        f"{runs} runs, {len(found)} executor stack files, {sizes:.1f} MB of {form} "
        "(bench/make_archive.py from tests/data/spark_executor_real.folded,"
        f"{' --compact: each stack spread over 90 timeline intervals' if tables else ''})"
    )
    results = []
    for master in args.masters.split(","):
        command = [sys.executable, __file__, "--archive", str(archive.resolve()), "--one", master, "--out",
                   str(args.out.resolve())]
        # In this tree's directory: Spark starts its Python workers with `python -m`, which puts the working
        # directory first on their path, so elsewhere (another checkout) they would run that tree's code.
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(result))
        results.append(result)
    if args.write:
        shown = " ".join(["bench/bench_pipeline.py", *(argv if argv is not None else sys.argv[1:])])
        write_results(results, archive_facts, f".venv/bin/python {shown}")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
