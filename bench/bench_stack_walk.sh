#!/bin/bash
# Interleaved A/B of the two user-stack walks (--stack-walk bpf, our walker; kernel, bpf_get_stack) on one
# running JVM: per 20 s window, the profiler's process CPU and BPF time from overhead.json, and samples.
# Numbers in docs/benchmarks/overhead.md.
#
# usage (root): bench/bench_stack_walk.sh PID [ROUNDS]
set -euo pipefail
pid=$1
rounds=${2:-4}
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "# matches nothing: only --pid is sampled\nbench  workload  none  no.such.MainClass\n" > "$work/known.txt"
printf "Work: CpuSplit\n" > "$work/profile.txt"
echo "# pid $pid; $(uptime)"
for round in $(seq "$rounds"); do
  for mode in bpf kernel; do
    out=$work/$mode-$round
    (cd "$repo" && "$python" -m profiler run --duration 20 --out "$out" --force --pid "$pid" --stack-walk "$mode" \
      --known-spes "$work/known.txt" --profile "$work/profile.txt" --no-exec-watch > /dev/null 2>&1)
    "$python" - "$out" "$mode" "$round" <<'PY'
import glob, json, sys
out, mode, rnd = sys.argv[1:]
overhead = json.load(open(f"{out}/overhead.json"))
meta = json.load(open(f"{out}/meta.json"))
samples = sum(json.load(open(f))["samples"] for f in glob.glob(f"{out}/pids/*/sampler.json"))
seconds = meta["end_time"] - meta["start_time"]
bpf_s = (overhead["bpf_run_time_ns"] or 0) / 1e9
print(f"{rnd} {mode:6} samples={samples} profiler_cpu={100 * overhead['profiler_cpu_seconds'] / seconds:.2f}%core "
      f"bpf={100 * bpf_s / seconds:.3f}%core bpf_us_per_sample={1e6 * bpf_s / max(1, samples):.1f}")
PY
  done
done
echo "# $(uptime)"
