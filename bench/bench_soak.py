"""Soak test of the demo's YSB: does it reach a steady state? Runs the query as `coordinator demo` does
(same engine classes, no profiler) and records every 10 s, per executor JVM: the share of its CPU
spent in the JIT compiler threads (C1/C2 thread times from /proc), heap in use, old generation and
loaded classes (jstat); the driver's heap and old generation; events processed; the load average.

usage: .venv/bin/python bench/bench_soak.py [--spe spark-str] [--duration 1800] [--quick] [--write]
results: docs/benchmarks/soak.md and docs/benchmarks/soak-<spe>.csv (with --write)

Steady state means: after the warm-up the JIT share stays small (goal: at most 5 % of executor CPU),
the old generation of driver and executors does not grow from minute to minute, and throughput holds.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.workloads.ysb import jvmstats  # noqa: E402
from coordinator.workloads.ysb.engines import DEFAULT_ENGINE, ENGINES  # noqa: E402
from coordinator.workloads.ysb.spark import YsbOptions  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "soak.md"


@dataclass(frozen=True)
class Sample:
    """One interval of the soak run; per-JVM numbers are means (heap) or pooled (JIT) over executors."""

    t: float  # seconds since the query was ready (end of the interval)
    load: float
    jit_share: float | None  # compiler-thread CPU / executor CPU in the interval
    executor_cpu: float  # executor CPU seconds in the interval, all executors
    executor_heap_mb: float
    executor_old_mb: float
    executor_classes: int
    driver_heap_mb: float
    driver_old_mb: float
    driver_full_gcs: int
    events: int | None
    events_per_s: float | None


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def soak(spe: str, duration: float, interval: float, options: YsbOptions, log_dir: Path) -> list[Sample]:
    say = print
    samples: list[Sample] = []
    with ENGINES[spe](options, log_dir) as engine:
        engine.wait_ready(900)
        executors = engine.workload_pids()
        drivers = engine.managing_pids()
        say(f"soak: {spe} ready; executors {executors}, driver {drivers}; {duration:.0f} s")
        before = {pid: jvmstats.thread_cpu(pid) for pid in executors}
        ready = time.time()
        last = ready
        while time.time() - ready < duration:
            engine.wait_processing(interval)
            now = time.time()
            after = {pid: jvmstats.thread_cpu(pid) for pid in executors}
            compiler = sum(jvmstats.compiler_seconds_between(before[p], after[p]) for p in executors)
            total = sum(after[p].total_seconds - before[p].total_seconds for p in executors)
            before = after
            heaps = [h for h in map(jvmstats.heap_reading, executors) if h is not None]
            driver = next((h for h in map(jvmstats.heap_reading, drivers) if h is not None), None)
            window = engine.window(last, now)
            sample = Sample(
                t=round(now - ready, 1),
                load=os.getloadavg()[0],
                jit_share=compiler / total if total > 0 else None,
                executor_cpu=round(total, 2),
                executor_heap_mb=round(_mean([h.heap_used_mb for h in heaps]), 1),
                executor_old_mb=round(_mean([h.old_used_mb for h in heaps]), 1),
                executor_classes=int(_mean([float(h.loaded_classes) for h in heaps])),
                driver_heap_mb=round(driver.heap_used_mb, 1) if driver else 0.0,
                driver_old_mb=round(driver.old_used_mb, 1) if driver else 0.0,
                driver_full_gcs=driver.full_gcs if driver else 0,
                events=window.events,
                events_per_s=round(window.events / (now - last), 1) if window.events is not None else None,
            )
            last = now
            samples.append(sample)
            jit = "-" if sample.jit_share is None else f"{100 * sample.jit_share:.1f} %"
            say(
                f"soak: t={sample.t:6.0f} s load {sample.load:4.1f} JIT {jit:>7} exec CPU {total:5.1f} s "
                f"heap exec {sample.executor_heap_mb:6.0f} MB (old {sample.executor_old_mb:5.0f}) "
                f"driver {sample.driver_heap_mb:5.0f} MB (old {sample.driver_old_mb:5.0f}) "
                f"classes {sample.executor_classes} events/s {sample.events_per_s}"
            )
    return samples


def per_minute(samples: list[Sample]) -> list[dict[str, float | str]]:
    """Minute rows: pooled JIT share (weighted by CPU), max old generations, events/s."""
    rows = []
    for minute in range(int(max((s.t for s in samples), default=0) // 60) + 1):
        group = [s for s in samples if minute * 60 < s.t <= (minute + 1) * 60]
        if not group:
            continue
        cpu = sum(s.executor_cpu for s in group)
        jit = sum((s.jit_share or 0.0) * s.executor_cpu for s in group)
        events = [s.events for s in group if s.events is not None]
        span = group[-1].t - (group[0].t - (group[1].t - group[0].t if len(group) > 1 else 10.0))
        rows.append(
            {
                "minute": minute + 1,
                "load": round(_mean([s.load for s in group]), 1),
                "jit_pct": round(100 * jit / cpu, 1) if cpu else "-",
                "exec_cpu_s": round(cpu, 1),
                "exec_old_mb": max(s.executor_old_mb for s in group),
                "exec_heap_mb": max(s.executor_heap_mb for s in group),
                "exec_classes": group[-1].executor_classes,
                "driver_old_mb": max(s.driver_old_mb for s in group),
                "driver_heap_mb": max(s.driver_heap_mb for s in group),
                "events_per_s": round(sum(events) / span) if events and span > 0 else "-",
            }
        )
    return rows


def verdict(samples: list[Sample], warmup: float) -> dict[str, float | None]:
    """After ``warmup`` s: pooled JIT share, old-generation growth (MB/min, first vs last third), events/s."""
    steady = [s for s in samples if s.t > warmup]
    if not steady:
        return {}
    cpu = sum(s.executor_cpu for s in steady)
    third = max(1, len(steady) // 3)
    minutes = max(1e-9, (steady[-1].t - steady[0].t) / 60.0)

    def growth(values: list[float]) -> float:
        return (max(values[-third:]) - max(values[:third])) / minutes

    events = [s.events for s in steady if s.events is not None]
    first_start = steady[0].t - (steady[1].t - steady[0].t if len(steady) > 1 else 10.0)
    return {
        "jit_pct": 100 * sum((s.jit_share or 0.0) * s.executor_cpu for s in steady) / cpu if cpu else None,
        "jit_pct_max_10s": 100 * max((s.jit_share or 0.0) for s in steady),
        "exec_old_growth_mb_per_min": growth([s.executor_old_mb for s in steady]),
        "driver_old_growth_mb_per_min": growth([s.driver_old_mb for s in steady]),
        "events_per_s": sum(events) / (steady[-1].t - first_start) if events and steady[-1].t > first_start else None,
        "driver_full_gcs": float(steady[-1].driver_full_gcs),
    }


def write_results(spe: str, args: argparse.Namespace, samples: list[Sample], started: str) -> None:
    csv_path = RESULTS.with_name(f"soak-{spe}.csv")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(asdict(samples[0])))
    writer.writeheader()
    for sample in samples:
        writer.writerow(asdict(sample))
    csv_path.write_text(buffer.getvalue())
    result = verdict(samples, args.warmup)
    minutes = per_minute(samples)
    lines = [
        f"## {spe}: {args.duration:.0f} s at {args.rate} events/s ({started})",
        "",
        f"`bench/bench_soak.py --spe {spe} --duration {args.duration:.0f} --rate {args.rate} "
        f"--campaigns {args.campaigns}`; {platform.node()}, {os.cpu_count()} CPUs, shared with other jobs. "
        f"Every 10 s in [{csv_path.name}]({csv_path.name}); per minute below.",
        "",
        f"After {args.warmup:.0f} s of warm-up: JIT {result.get('jit_pct') or 0:.1f} % of executor CPU "
        f"(worst 10 s: {result.get('jit_pct_max_10s') or 0:.1f} %); old generation growth: executors "
        f"{result.get('exec_old_growth_mb_per_min') or 0:+.1f} MB/min, driver "
        f"{result.get('driver_old_growth_mb_per_min') or 0:+.1f} MB/min; "
        f"{result.get('events_per_s') or 0:.0f} events/s processed; driver full GCs: "
        f"{result.get('driver_full_gcs') or 0:.0f}.",
        "",
        "| minute | load | JIT % | executor CPU s | executor old MB | executor heap MB | classes | "
        "driver old MB | driver heap MB | events/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in minutes:
        lines.append("| " + " | ".join(str(row[k]) for k in row) + " |")
    section = "\n".join(lines) + "\n"
    header = RESULTS.read_text() if RESULTS.exists() else ""
    marker = f"## {spe}:"
    if marker in header:
        header = header[: header.index(marker)].rstrip() + "\n\n"
    RESULTS.write_text((header or "# Soak: the demo's YSB in steady state\n\n") + section)
    print(f"wrote {RESULTS} and {csv_path}")


def soak_keeping_logs(spe: str, duration: float, interval: float, options: YsbOptions) -> list[Sample]:
    """soak(); the workload's logs are removed after a good run and named after a failed one."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    try:
        samples = soak(spe, duration, interval, options, scratch / "workload")
    except BaseException:
        print(f"soak: the workload failed; its logs are in {scratch / 'workload'}", file=sys.stderr)
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spe", choices=sorted(ENGINES), default=DEFAULT_ENGINE)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds after the query is ready (1800)")
    parser.add_argument("--warmup", type=float, default=300.0, help="seconds not counted in the verdict (300)")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--campaigns", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="300 s, verdict after 120 s")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 300.0, 120.0
    options = YsbOptions(rate=args.rate, campaigns=args.campaigns, executors=2, executor_cores=1)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    samples = soak_keeping_logs(args.spe, args.duration, args.interval, options)
    print(verdict(samples, args.warmup))
    if args.write and samples:
        write_results(args.spe, args, samples, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
