"""The unwind-table cache's effect on a whole `profiler run --pid <CpuSplit JVM> --duration 6`: runs in order with
the cache off (parsed as before), cold (an empty directory), warm twice and off again; per run the first sample,
the agent's CPU until then, the preparation's and the agent's CPU in the window (overhead.json), the whole
command's CPU and wall time, and the cache's entries. The first run (cache off) only fills a fresh compile cache.
Needs root and a JDK; on a shared machine run under the heavy lock:

usage: flock /tmp/spe-heavy.lock .venv/bin/python bench/bench_table_cache.py
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROUNDS = ("prime (compile cache)", "off", "cold", "warm", "warm", "off")


def one_run(label: str, pid: int, scratch: Path, index: int) -> dict[str, object]:
    cfi = scratch / "cfi"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SPE_TASKPROF_BPF_CACHE": str(scratch / "bpf"),
        "PYTHONPYCACHEPREFIX": str(scratch / "pycache"),
        "SPE_TASKPROF_CFI_CACHE": str(cfi) if label in ("cold", "warm") else "off",
    }
    out = scratch / f"run-{index}"
    load = Path("/proc/loadavg").read_text().split()[0]
    before, began = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    argv = [sys.executable, "-m", "profiler", "run", "--pid", str(pid), "--duration", "6", "--out", str(out), "--force"]
    completed = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise SystemExit(f"bench_table_cache: profiler run exited {completed.returncode}: {completed.stderr[-400:]}")
    overhead = json.loads((out / "overhead.json").read_text())
    components = {entry["component"]: entry["cpu_seconds"] for entry in overhead.get("cpu_by_component") or ()}
    entries = sorted(cfi.glob("*.cfi")) if cfi.exists() else []
    return {
        "run": label,
        "load1": load,
        "first_sample_s": overhead.get("first_sample_at"),
        "first_sample_cpu_s": overhead.get("first_sample_cpu_seconds"),
        "preparation_cpu_s": components.get("preparation", 0.0),
        "window_cpu_s": overhead.get("profiler_cpu_seconds"),
        "command_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
        "wall_s": round(time.monotonic() - began, 2),
        "cache_entries": len(entries),
        "cache_bytes": sum(path.stat().st_size for path in entries),
    }


def main() -> int:
    if os.geteuid() != 0:
        print("bench_table_cache: needs root (BPF); run with sudo", file=sys.stderr)
        return 2
    from tests.fixtures.jvm import compile_workloads, start_cpu_split

    with tempfile.TemporaryDirectory(prefix="table-cache-") as scratch_name:
        scratch = Path(scratch_name)
        jvm = start_cpu_split(compile_workloads(scratch / "classes"), threads=2)
        try:
            for index, label in enumerate(ROUNDS):
                print(json.dumps(one_run(label, jvm.pid, scratch, index)), flush=True)
        finally:
            jvm.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
