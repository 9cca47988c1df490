"""A tenant's code mapped from a FUSE file system whose server stops answering (issue 46: a stat or an open
of /proc/PID/map_files/<range> waited for the server for good). A real FUSE mount (served by this test on
/dev/fuse, tests/fixtures/fuseserver.py), a real process of ``nobody`` mapping its file read+exec: while
the server answers, the file is refused as FUSE; once it holds every request, the agent waits
MAP_FILE_DEADLINE at most, then refuses that process's mapped files at once."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.files import safeio
from tests.fixtures.fuseserver import FuseServer
from tests.fixtures.hostile import tenant_ids
from tests.fixtures.privileges import SYSTEM_PYTHON, requires

pytestmark = requires("root", "fuse", "setpriv", "system-python")

MAPPER = r"""
import mmap, sys, time
with open(sys.argv[1], "rb") as handle:
    mapped = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
print("READY", flush=True)
time.sleep(120)
"""


@pytest.fixture
def fuse_tenant(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FuseServer, int, int, int]]:
    """(server, pid, start, end): a process of nobody mapping the FUSE file at [start, end)."""
    monkeypatch.setattr(safeio, "_stuck", 0)
    safeio.forget_slow_files()
    safeio.take_warnings()
    mountpoint = Path(tempfile.mkdtemp(prefix="fuse-", dir="/var/tmp"))
    uid, gid = tenant_ids()
    server = FuseServer(mountpoint, b"\x7fELF" + bytes(8188)).__enter__()
    process = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", SYSTEM_PYTHON, "-c", MAPPER,
         str(server.path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "READY"
        line = next(line for line in Path(f"/proc/{process.pid}/maps").read_text().splitlines() if "lib.so" in line)
        start, end = (int(part, 16) for part in line.split()[0].split("-"))
        yield server, process.pid, start, end
    finally:
        process.kill()
        server.__exit__(None, None, None)  # the connection ends: the process's held requests fail, it exits
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()
        safeio.forget_slow_files()
        safeio.take_warnings()
        os.rmdir(mountpoint)


def test_a_mapping_on_a_fuse_server_that_holds_its_requests_costs_one_deadline(
    fuse_tenant: tuple[FuseServer, int, int, int],
) -> None:
    server, pid, start, end = fuse_tenant
    shown = f"/proc/{pid}/map_files/{start:x}-{end:x}"
    # GIVEN the server answering: the file is refused as FUSE (its later reads would have no deadline)
    with pytest.raises(safeio.UnsafeFile, match="on a FUSE file system"):
        safeio.open_map_file(pid, start, end)
    assert [w.split(": ", 2)[2] for w in safeio.take_warnings()] == [
        "on a FUSE file system (its server may hold every read); not read"
    ]
    # WHEN the server holds every request from now on and the agent stats the mapped file
    server.hold()
    began = time.monotonic()
    with pytest.raises(safeio.UnsafeFile, match="no answer within"):
        safeio.stat_map_file(pid, start, end)
    waited = time.monotonic() - began
    # THEN the agent waited the deadline, not the server; the server did get the request (it was real)
    assert safeio.MAP_FILE_DEADLINE <= waited < safeio.MAP_FILE_DEADLINE + 3, waited
    assert server.held_requests, "the stat never reached the FUSE server"
    # AND the process's other touches are refused at once, with one warning line naming PID and path
    began = time.monotonic()
    with pytest.raises(safeio.UnsafeFile, match="did not answer before"):
        safeio.open_map_file(pid, start, end)
    with pytest.raises(safeio.UnsafeFile, match="did not answer before"):
        safeio.open_mapped(pid, start, end, str(server.path))
    assert time.monotonic() - began < 0.5
    warnings = safeio.take_warnings()
    assert warnings[0].startswith(f"pid {pid}: {shown}: no answer within") and "\n" not in warnings[0], warnings
