"""Tenants that size their own /proc files (issue 46), as ``nobody``, beside an honest JVM: a command line of
32 MiB, and a process of more threads than the agent's cap (lowered for the run). The root agent reads each
through procread's caps: the run ends on time, its memory stays small, the honest JVM is profiled and each
tenant gets one warning line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.capture.format import RunMeta
from profiler.capture.read import pid_stacks_file, read_meta, read_overhead, read_stack_counts
from profiler.files import procread
from tests.fixtures.hostile import tenant_ids

REPO = Path(__file__).resolve().parents[2]
HUGE_CMDLINE = 32 << 20
DURATION = 8
MEMORY_LIMIT = 250 << 20
THREADS = 600
THREADS_CAP = 256  # procread.THREADS_MAX for the run: below the tenant's threads, without 16k of them


def _as_tenant(*argv: str) -> list[str]:
    uid, gid = tenant_ids()
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv]


# The tenant points its own argv at 32 MiB of its memory: prctl(PR_SET_MM, PR_SET_MM_MAP) needs no
# privilege when the executable stays (exec cannot: the kernel caps arguments at 6 MiB)
HUGE_ARGV = """
import ctypes, mmap, sys, time
size = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
stat = open("/proc/self/stat", "rb").read().rsplit(b")", 1)[1].split()
field = lambda number: int(stat[number - 3])  # proc(5)'s numbering
# private: the kernel reads a command line only from anonymous memory (FOLL_ANON), not shmem
memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
arg = b"x" * ((128 << 10) - 1) + b"\\0"
for offset in range(0, size, len(arg)):
    memory[offset : offset + len(arg)] = arg[: size - offset]
memory[size - 1 : size] = b"\\0"
start = ctypes.addressof(ctypes.c_char.from_buffer(memory))
libc.sbrk.restype = ctypes.c_void_p
names = ("start_code end_code start_data end_data start_brk brk start_stack arg_start arg_end env_start env_end auxv")
class MmMap(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in names.split()] + [
        ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]
mm_map = MmMap(field(26), field(27), field(45), field(46), field(47), libc.sbrk(0), field(28), start,
               start + size, field(50), field(51), 0, 0, 0xFFFFFFFF)
if libc.prctl(35, 14, ctypes.byref(mm_map), ctypes.sizeof(mm_map), 0) != 0:  # PR_SET_MM, PR_SET_MM_MAP
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_MM_MAP)")
print("READY", flush=True)
time.sleep(300)
"""


def _stop(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


@pytest.fixture
def huge_cmdline() -> Iterator[int]:
    """A process of ``nobody`` whose command line is 32 MiB (HUGE_ARGV)."""
    process = subprocess.Popen(
        _as_tenant(sys.executable, "-c", HUGE_ARGV, str(HUGE_CMDLINE)), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "READY\n"
        with open(f"/proc/{process.pid}/cmdline", "rb") as handle:
            assert len(handle.read(HUGE_CMDLINE + 1)) == HUGE_CMDLINE
        yield process.pid
    finally:
        _stop(process)


@pytest.fixture
def many_threads() -> Iterator[int]:
    """A process of ``nobody`` with THREADS threads besides its main one."""
    code = (
        "import threading, time\n"
        f"for _ in range({THREADS}): threading.Thread(target=time.sleep, args=(300,), daemon=True).start()\n"
        "print('READY', flush=True); time.sleep(300)\n"
    )
    process = subprocess.Popen(
        _as_tenant(sys.executable, "-c", code), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "READY\n"
        assert len(os.listdir(f"/proc/{process.pid}/task")) == THREADS + 1
        yield process.pid
    finally:
        _stop(process)


def _profile(out: Path, *pids: int, threads_max: int | None = None) -> RunMeta:
    """``profiler run`` of ``pids`` for DURATION seconds (the scope scans every process of the host), with
    procread.THREADS_MAX set to ``threads_max`` in the agent's process when given (a test's lowering of the
    constant, read by procread at each listing: no second default); asserts that the run ended normally and
    on time, and returns its meta.json."""
    args = ["run", "--duration", str(DURATION), "--out", str(out), "--force"]
    for pid in pids:
        args += ["--pid", str(pid)]
    argv = [sys.executable, "-m", "profiler", *args]
    if threads_max is not None:
        argv = [sys.executable, "-c", (
            "import sys\nfrom profiler.files import procread\nfrom profiler.cli import main\n"
            f"procread.THREADS_MAX = {threads_max}\nsys.exit(main({args!r}))\n"
        )]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-2000:]
    meta = read_meta(out)
    assert meta.stopped_by == "duration" and meta.end_time - meta.start_time < DURATION + 5, meta
    assert elapsed < 180, elapsed
    return meta


def _only_the_tenant_warned(out: Path, meta: RunMeta, tenant: int, warning: str, honest: int) -> None:
    """The tenant got the one warning line ``warning`` (naming the cap it reached); the honest JVM none, and
    it was profiled, its Java frames named."""
    assert [w for w in meta.warnings if w.startswith(f"pid {tenant}: ")] == [warning], meta.warnings
    assert not [w for w in meta.warnings if w.startswith(f"pid {honest}: ")], meta.warnings
    stacks = pid_stacks_file(out, honest)
    assert stacks is not None and "com.example.CpuSplit::burn" in "\n".join(read_stack_counts(stacks))


def test_tenants_sizing_their_proc_files_cost_the_agent_nothing_and_one_warning_each(
    huge_cmdline: int, many_threads: int, start_cpu_split_jvm, tmp_path: Path
) -> None:
    # GIVEN a tenant whose command line is 32 MiB (found by the scope's scan of every process), a tenant
    # process of 601 threads, profiled (its threads are listed: one reading of each), the agent's cap at 256
    # threads a process, and an honest JVM (one run for both tenants: a run each cost ~13 s of the suite's
    # budget, issue 48)
    honest = start_cpu_split_jvm(threads=1)
    # WHEN root profiles the honest JVM and the threaded tenant, scanning the host for engine processes
    out = tmp_path / "cap"
    # THEN the run ended normally and on time
    meta = _profile(out, honest.pid, many_threads, threads_max=THREADS_CAP)
    # AND the agent's memory stayed small (the whole command line would cost +581 MiB per read)
    overhead = read_overhead(out)
    assert overhead is not None and 0 < overhead.peak_rss_bytes < MEMORY_LIMIT, overhead
    # AND each tenant got one warning line, naming the cap it reached; the honest JVM (under the threads cap)
    # none, its Java frames named
    cmdline_warning = (
        f"pid {huge_cmdline}: /proc/{huge_cmdline}/cmdline: more than {procread.CMDLINE_MAX_BYTES} bytes "
        f"(CMDLINE_MAX_BYTES); only the first {procread.CMDLINE_MAX_BYTES} read"
    )
    _only_the_tenant_warned(out, meta, huge_cmdline, cmdline_warning, honest.pid)
    threads_warning = (
        f"pid {many_threads}: /proc/{many_threads}/task: more than {THREADS_CAP} threads (THREADS_MAX); "
        f"only the first {THREADS_CAP} read"
    )
    _only_the_tenant_warned(out, meta, many_threads, threads_warning, honest.pid)
