"""A tenant whose mapped code sits in crafted ELF files (issue 46, the parsers' class), as ``nobody``,
beside an honest JVM: one file's ``.eh_frame`` is the bomb of the issue (every FDE pointing at a CIE of
its own: 2 GiB and 10 CPU-s before the bounds), the other's ``.symtab`` names a string table of 33 MiB
without an end (quadratic before). A thread of the tenant spins inside each file, so the walker's unwind
tables and the symbolizer's tables of both are read during the run. The run ends on time, the agent stays
under 250 MB, the honest JVM is profiled, and one line names each refusal."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from profiler.capture.read import pid_stacks_file, read_meta, read_overhead, read_stack_counts
from profiler.symbols import elfsyms
from tests.fixtures.hostile import give_to_tenant, tenant_ids
from tests.unit.fuzz import crafted

REPO = Path(__file__).resolve().parents[2]
TENANT_PYTHON = "/usr/bin/python3"  # the system's: the tenant cannot read root's virtualenv paths
DURATION = 8
MEMORY_LIMIT = 250 << 20
SPIN = b"\xeb\xfe" * 8  # jmp . : a thread that enters it burns CPU inside the crafted file for good
CODE_AT = 64 + 56  # the first section's offset in crafted.elf_image (after the header and one PT_LOAD)

# The tenant: map each file read+exec (as a loader would), start a thread spinning in its code, say READY.
TENANT = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
code_at = int(sys.argv[1])
for path in sys.argv[2:]:
    fd = os.open(path, os.O_RDONLY)
    base = libc.mmap(None, os.fstat(fd).st_size, 1 | 4, 2, fd, 0)  # PROT_READ|PROT_EXEC, MAP_PRIVATE
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap {path}")
    spin = ctypes.CFUNCTYPE(None)(base + code_at)  # a foreign call: the GIL is released while it spins
    threading.Thread(target=spin, daemon=True).start()
print("READY", flush=True)
time.sleep(300)
"""


def _bomb_image() -> bytes:
    """The issue's 7 MiB .eh_frame, in an ELF whose loadable code is SPIN."""
    bomb = crafted.eh_frame_distinct_cies(180_000, 8192)
    return crafted.elf_image(
        [(".text", 1, SPIN, CODE_AT, 0, 0), (".eh_frame", 1, bomb, 0x200000, 0, 0)], code=(CODE_AT, len(SPIN))
    )


def _strtab_image() -> bytes:
    """A .symtab whose every symbol names another offset of one string table over STRTAB_MAX_BYTES, with a
    single NUL at its end (each name read to its NUL: quadratic), in an ELF whose loadable code is SPIN."""
    size = elfsyms.STRTAB_MAX_BYTES + (1 << 20)
    strings = b"A" * (size - 1) + b"\0"
    table = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", (index * 7919) % (size - 1), 0x12, 0, 1, CODE_AT, len(SPIN)) for index in range(20_000)
    )
    return crafted.elf_image(
        [(".text", 1, SPIN, CODE_AT, 0, 0), (".symtab", 2, table, 0, 3, 24), (".strtab", 3, strings, 0, 0, 0)],
        code=(CODE_AT, len(SPIN)),
    )


@pytest.fixture
def crafted_tenant(tenant_area: Path) -> Iterator[tuple[int, Path, Path]]:
    """(pid, bomb, strtab): the tenant's process, spinning in both crafted files it maps."""
    home = tenant_area / "shared" / "parsers"
    home.mkdir()
    bomb, strtab = home / "libbomb.so", home / "libstrtab.so"
    bomb.write_bytes(_bomb_image())
    strtab.write_bytes(_strtab_image())
    for path in (home, bomb, strtab):
        give_to_tenant(path)
    uid, gid = tenant_ids()
    process = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", TENANT_PYTHON, "-c", TENANT,
         str(CODE_AT), str(bomb), str(strtab)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "READY"
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "r-xp 00000000 " in maps and str(bomb) in maps and str(strtab) in maps, maps
        yield process.pid, bomb, strtab
    finally:
        process.kill()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


@dataclass
class Profiled:
    pid: int  # the crafted tenant's
    honest: int  # the honest JVM's
    out: Path
    done: subprocess.CompletedProcess[str]
    elapsed: float


@pytest.fixture
def profiled(crafted_tenant: tuple[int, Path, Path], start_cpu_split_jvm, tmp_path: Path) -> Profiled:
    """One short ``profiler run`` of the crafted tenant (as nobody) beside an honest JVM of root's."""
    pid, _bomb, _strtab = crafted_tenant
    honest = start_cpu_split_jvm(threads=1)
    out = tmp_path / "cap"
    argv = [sys.executable, "-m", "profiler", "run", "--duration", str(DURATION), "--out", str(out), "--force",
            "--pid", str(honest.pid), "--pid", str(pid)]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
    return Profiled(pid, honest.pid, out, done, time.monotonic() - began)


def test_crafted_unwind_and_symbol_tables_cost_nothing_and_each_refusal_is_one_line(profiled: Profiled) -> None:
    pid, out = profiled.pid, profiled.out
    # THEN the run ended normally and on time
    assert profiled.done.returncode == 0, profiled.done.stderr[-2000:]
    meta = read_meta(out)
    assert meta.stopped_by == "duration" and meta.end_time - meta.start_time < DURATION + 5, meta
    assert profiled.elapsed < 120, profiled.elapsed
    # AND the agent's memory stayed small (the bomb alone took 1.5-2 GiB before its bounds)
    overhead = read_overhead(out)
    assert overhead is not None and 0 < overhead.peak_rss_bytes < MEMORY_LIMIT, overhead
    # AND one line names the symbol table's names over their bound
    refused_names = [w for w in meta.warnings if w.startswith(f"pid {pid}: /proc/{pid}/map_files/") and ".symtab" in w]
    assert len(refused_names) == 1 and "over the limits" in refused_names[0], meta.warnings
    # AND the honest JVM was profiled, its Java frames named, without a warning of its own
    stacks = pid_stacks_file(out, profiled.honest)
    assert stacks is not None and "com.example.CpuSplit::burn" in "\n".join(read_stack_counts(stacks))
    assert not [w for w in meta.warnings if w.startswith(f"pid {profiled.honest}: ")], meta.warnings
    # AND the .eh_frame bomb's refusal is one line of the run (checked on the same run: a second run of its
    # own cost ~14 s of the suite's budget, issue 48)
    refused_cfi = [w for w in meta.warnings if "libbomb.so: unwind table refused" in w]
    assert len(refused_cfi) == 1 and "\n" not in refused_cfi[0], meta.warnings
