"""After the compiles, LLVM's code pages are dropped from the profiler (real bcc, real LLVM): the RSS
falls, and a compile after the drop still works (the pages come back from the file); and the compile cache:
a second start loads the program without compiling and it works, a damaged or refused entry is compiled again;
and the walker's walk is verified once per tail-call chain, not again in the programs that start it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
sys.path.append("/usr/lib/python3/dist-packages")
from bcc import BPF
from profiler.bpf.compiler import compile_program, release_compiler_pages

def rss_file_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])

TEXT = "int probe(struct bpf_perf_event_data *ctx) { return 0; }"
first = compile_program(BPF, "#include <uapi/linux/bpf_perf_event.h>\n" + TEXT)
first.load_func(b"probe", BPF.PERF_EVENT)
before = rss_file_kb()
released = release_compiler_pages()
after = rss_file_kb()
second = compile_program(BPF, "#include <uapi/linux/bpf_perf_event.h>\n" + TEXT.replace("return 0", "return 1"))
fd = second.load_func(b"probe", BPF.PERF_EVENT).fd
print(json.dumps({"before": before, "after": after, "released": released, "fd": fd}))
"""


def test_llvm_pages_dropped_and_a_later_compile_still_works(repo_root):
    # GIVEN a process that compiled and loaded a BPF program; WHEN LLVM's pages are released and
    # another program is compiled
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=repo_root, capture_output=True, text=True, timeout=300, check=True,
        env={**os.environ, "SPE_TASKPROF_BPF_CACHE": "off"},  # both programs really compiled
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # THEN tens of MB of file-backed RSS went, and the second program compiled and loaded
    assert result["released"] > 50 * 2**20, result
    assert result["before"] - result["after"] > 30 * 1024, result
    assert result["fd"] > 0


EXEC_SCRIPT = r"""
import json, os, sys
sys.path.append("/usr/lib/python3/dist-packages")
from bcc import BPF
from profiler.bpf.compiler import compile_program
from profiler.files import safeio
from profiler.scope.execwatch import bpf_source

program = compile_program(BPF, bpf_source())
events = []
program[b"exec_events"].open_ring_buffer(lambda _ctx, data, size: events.append(size))
os.spawnv(os.P_WAIT, "/bin/true", ["/bin/true"])
program.ring_buffer_consume()
dropped = int(program[b"exec_dropped"][0].value)
print(json.dumps({"class": type(program).__name__, "module": bool(program.module), "events": len(events),
                  "dropped": dropped, "warnings": safeio.take_warnings()}))
program.cleanup()
"""

WALKER_SCRIPT = r"""
import json, subprocess, sys, time
sys.path.append("/usr/lib/python3/dist-packages")
from profiler.sampling.offcpu import OffCpuTracer
from profiler.sampling.sampler import StackSampler

def verified_insns(function):
    with open(f"/proc/self/fdinfo/{function.fd}") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("verified_insns:"))

busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
sampler = StackSampler()
sampler.share_walker(OffCpuTracer().bpf_text())
try:
    sampler.start()
    sampler.add_pid(busy.pid)
    time.sleep(1)  # ~99 samples of the busy process at 99 Hz for the test's > 20 (3 s gave ~300; issue 48)
    sampler.stop()
    verified = {name.decode(): verified_insns(fn) for name, fn in sampler._bpf.funcs.items()}
    print(json.dumps({"class": type(sampler._bpf).__name__, "walk": sampler.stack_walk,
                      "offcpu_walker": sampler.program.offcpu_walker, "verified": verified,
                      "samples": sampler.sample_count(busy.pid)}))
finally:
    sampler.close()
    busy.kill()
    busy.wait()
"""


def _run(script: str, repo_root, cache_dir) -> dict:
    env = {**os.environ, "PYTHONPATH": str(repo_root), "SPE_TASKPROF_BPF_CACHE": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=repo_root, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_warm_start_loads_the_cached_program_and_it_works(repo_root, tmp_path):
    cache_dir = tmp_path / "bpf"
    # GIVEN a first start that compiled the exec watch (and stored it)
    cold = _run(EXEC_SCRIPT, repo_root, cache_dir)
    assert cold["class"] == "RecordingBPF" and cold["module"] and cold["events"] >= 1, cold
    (entry,) = cache_dir.iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600 and cache_dir.stat().st_mode & 0o777 == 0o700
    # WHEN the next start finds it
    warm = _run(EXEC_SCRIPT, repo_root, cache_dir)
    # THEN no compile ran (no bcc module), the autoloaded tracepoint delivers events and the table reads
    assert warm == {"class": "CachedBPF", "module": False, "events": warm["events"], "dropped": 0, "warnings": []}
    assert warm["events"] >= 1


def test_a_damaged_or_refused_entry_is_compiled_again_with_one_line(repo_root, tmp_path):
    cache_dir = tmp_path / "bpf"
    _run(EXEC_SCRIPT, repo_root, cache_dir)
    (entry,) = cache_dir.iterdir()
    # GIVEN an entry cut in half
    entry.write_bytes(entry.read_bytes()[:100])
    damaged = _run(EXEC_SCRIPT, repo_root, cache_dir)
    assert damaged["class"] == "RecordingBPF" and damaged["events"] >= 1, damaged
    assert len(damaged["warnings"]) == 1 and "unusable (" in damaged["warnings"][0], damaged
    assert _run(EXEC_SCRIPT, repo_root, cache_dir)["class"] == "CachedBPF"  # written again by that compile
    # GIVEN an entry whose program the verifier refuses (a lone `exit`: R0 never set)
    payload = json.loads(entry.read_bytes())
    payload["functions"][0]["insns"] = base64.b64encode(bytes([0x95, 0, 0, 0, 0, 0, 0, 0])).decode()
    entry.write_text(json.dumps(payload))
    refused = _run(EXEC_SCRIPT, repo_root, cache_dir)
    assert refused["class"] == "RecordingBPF" and refused["events"] >= 1, refused
    assert len(refused["warnings"]) == 1 and "refused (" in refused["warnings"][0], refused
    assert _run(EXEC_SCRIPT, repo_root, cache_dir)["class"] == "CachedBPF"


def test_the_walker_loaded_from_the_cache_samples(repo_root, tmp_path):
    cache_dir = tmp_path / "bpf"
    # GIVEN the stack walker compiled once; WHEN a second sampler starts from the cache
    cold = _run(WALKER_SCRIPT, repo_root, cache_dir)
    warm = _run(WALKER_SCRIPT, repo_root, cache_dir)
    # THEN both walked a busy process's stacks with the walker and its tail call, the second without a compile
    assert cold["class"] == "RecordingBPF" and warm["class"] == "CachedBPF", (cold, warm)
    assert cold["walk"] == warm["walk"] == "bpf" and cold["offcpu_walker"] and warm["offcpu_walker"]
    assert cold["samples"] > 20 and warm["samples"] > 20, (cold, warm)
    # AND the kernel verified the walk once per chain: the programs that start a walk (the sample's, the
    # switch-out's) only tail-call it, each checked in a few per cent of the instructions of the walk
    verified = warm["verified"]
    assert verified["on_cpu_clock"] * 10 < verified["walk_more"], verified
    assert verified["raw_tracepoint__sched_switch"] * 10 < verified["offcpu_walk_more"], verified
