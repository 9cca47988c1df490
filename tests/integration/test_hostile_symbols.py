"""Tenants whose mappings are traps for a symbolizer that opens their paths (issue 46): one maps a file,
deletes it and leaves a FIFO named ``<path> (deleted)``; one maps a file under 80 nested directories (a
20 KB /proc/PID/maps line); one, in a container of its own (user and mount namespaces made with unshare),
runs code of a library whose path it then covers with an absolute link to a root-only library of the
host's. Beside them an honest JVM: the run ends on time with its capture, the JVM's frames are named, the
container's frames by its own library, never by root's, and each tenant gets at most one warning
(profiler/symbols/procsyms.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.capture.read import pid_stacks_file, read_meta, read_stack_counts
from tests.fixtures.hostile import give_to_tenant, tenant_ids

REPO = Path(__file__).resolve().parents[2]
TENANT_PYTHON = "/usr/bin/python3"  # the system's: the tenant cannot read root's virtualenv paths

# The tenant's program: map an ELF executable, set the trap, say READY, burn CPU (so it is sampled and
# its mappings are symbolized). argv: mode ("fifo", "deep" or "ctr"), its own directory; for "ctr", its
# library and root's (the link's target).
TENANT = r"""
import ctypes, mmap, os, shutil, subprocess, sys, time
mode, home = sys.argv[1], sys.argv[2]
os.chdir(home)
if mode == "ctr":
    os.mkdir("d")
    os.mkdir("over")
    shutil.copyfile(sys.argv[3], "d/libctr.so")
    library = ctypes.CDLL(os.path.abspath("d/libctr.so"))
    os.symlink(sys.argv[4], "over/libctr.so")
    subprocess.run(["mount", "--bind", "over", "d"], check=True)  # its path now an absolute link
    print("READY", flush=True)
    end = time.monotonic() + 300
    while time.monotonic() < end:
        library.tenant_burn(ctypes.c_long(2_000_000))
if mode == "deep":
    for _ in range(80):
        os.mkdir("d" * 250)
        os.chdir("d" * 250)
shutil.copyfile("/bin/true", "libtrap.so")
with open("libtrap.so", "rb") as handle:
    mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
if mode == "fifo":
    os.unlink("libtrap.so")
    os.mkfifo("libtrap.so (deleted)", 0o644)
print("READY", flush=True)
end = time.monotonic() + 300
while time.monotonic() < end:
    sum(range(1000))
"""


BURN = "long tenant_burn(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; return s; }\n"


def _library(source: str, path: Path, mode: int) -> Path:
    c_file = path.with_suffix(".c")
    c_file.write_text(source)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(path), str(c_file)], check=True, timeout=120)
    path.chmod(mode)
    return path


class Tenant:
    def __init__(self, mode: str, home: Path, *extra: str) -> None:
        uid, gid = tenant_ids()
        container = ["unshare", "--user", "--map-root-user", "--mount"] if mode == "ctr" else []
        self.process = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *container, TENANT_PYTHON, "-c",
             TENANT, mode, str(home), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.strip() == "READY", f"tenant {mode}: {line!r}"
        self.pid = self.process.pid

    def maps_line_of(self, name: str) -> str:
        return next(line for line in Path(f"/proc/{self.pid}/maps").read_text().splitlines() if name in line)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def tenants(tenant_area: Path) -> Iterator[dict[str, Tenant]]:
    started: dict[str, Tenant] = {}
    own = _library(BURN, tenant_area / "shared" / "libctr.so", 0o755)
    secret = BURN.replace("tenant_burn", "root_only_secret_function")
    roots = _library(secret, tenant_area / "root-only" / "libsecret.so", 0o600)
    try:
        for mode in ("fifo", "deep", "ctr"):
            home = tenant_area / "shared" / mode
            home.mkdir()
            give_to_tenant(home)
            started[mode] = Tenant(mode, home, *((str(own), str(roots)) if mode == "ctr" else ()))
        yield started
    finally:
        for tenant in started.values():
            tenant.kill()


def _profile(out: Path, *pids: int) -> tuple[subprocess.CompletedProcess[str], float]:
    argv = [sys.executable, "-m", "profiler", "run", "--duration", "8", "--out", str(out), "--force"]
    for pid in pids:
        argv += ["--pid", str(pid)]
    began = time.monotonic()
    # a FIFO opened by a symbolizer hangs the run for good: the timeout fails the test instead
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    return done, time.monotonic() - began


def test_symbolizer_traps_neither_hang_nor_crash_the_run(tenants, start_cpu_split_jvm, tmp_path: Path) -> None:
    # GIVEN the two trapped tenants (as nobody) and an honest JVM of root's
    fifo, deep, ctr = tenants["fifo"], tenants["deep"], tenants["ctr"]
    assert fifo.maps_line_of("libtrap.so").endswith("libtrap.so (deleted)")
    assert len(deep.maps_line_of("libtrap.so")) > 20_000
    assert Path(f"/proc/{ctr.pid}/root" + ctr.maps_line_of("libctr.so").split()[-1]).is_symlink()
    honest = start_cpu_split_jvm(threads=1)
    # WHEN root profiles the four for 8 s
    out = tmp_path / "cap"
    done, seconds = _profile(out, fifo.pid, deep.pid, ctr.pid, honest.pid)
    # THEN the run ended on time and wrote its capture
    assert done.returncode == 0, done.stderr[-2000:]
    assert seconds < 120, seconds
    meta = read_meta(out)
    # AND the honest JVM's Java and native frames are named (libjvm's and glibc's symbols)
    stacks = _stacks_text(out, honest.pid)
    for frame in ("com.example.CpuSplit::burn", "JavaThread::", "thread_native_entry", "start_thread;", ";clone3;"):
        assert frame in stacks, frame
    # AND the tenants were sampled and their own frames named (python's, read through map_files as they
    # run as nobody), with at most one warning each: none for the deleted file (its inode was read, never
    # the FIFO at its path), one naming the over-long maps line
    for tenant in (fifo, deep):
        assert "_PyEval_EvalFrameDefault" in _stacks_text(out, tenant.pid)
    # AND the container's frames are its library's, none of root's library behind the link
    contained = _stacks_text(out, ctr.pid)
    assert "tenant_burn" in contained and "root_only_secret" not in contained
    pids = (fifo.pid, deep.pid, ctr.pid)
    # (a tenant whose library was refused has its stacks cut in it: that line is the refusal's consequence,
    # said by the walker's health, whichever way the samples fell; it is not a second refusal)
    cut = "of stacks end at a native frame before the thread's start"
    of = {pid: [w for w in meta.warnings if w.startswith(f"pid {pid}:") and cut not in w] for pid in pids}
    assert of[fifo.pid] == [] and of[ctr.pid] == [], of
    # one line for the deep tenant's maps, from whichever reader met the long line first (the symbolizer's
    # or procread's: each file is warned about once)
    [warning] = of[deep.pid]
    assert f"/proc/{deep.pid}/maps:" in warning and "line" in warning and "\n" not in warning


def _stacks_text(out: Path, pid: int) -> str:
    path = pid_stacks_file(out, pid)
    assert path is not None, f"the capture holds no stacks of pid {pid}"
    return "\n".join(read_stack_counts(path))
