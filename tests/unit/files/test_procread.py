"""procread: every cap of the bounded /proc reader, on fake /proc trees (tests/fixtures/fakeproc.py) and on
this process's own /proc."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from profiler.files import procread, safeio
from tests.fixtures.fakeproc import FakeProc

PID = 4242


@pytest.fixture
def fake(tmp_path: Path) -> FakeProc:
    safeio.take_warnings()  # another test's are not this one's
    proc = FakeProc(tmp_path)
    proc.process(PID)
    return proc


def write(fake: FakeProc, name: str, content: bytes) -> Path:
    path = fake.root / str(PID) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def status_text(uids: str = "1000\t1000\t1000\t1000", gids: str = "100\t100\t100\t100", extra: str = "") -> bytes:
    head = f"Name:\tjava\nUmask:\t0022\nUid:\t{uids}\nGid:\t{gids}\n{extra}"
    return f"{head}NSpid:\t{PID}\t7\nSigCgt:\t0000000000000004\n".encode()


def test_cmdline_within_the_cap_is_read_whole(fake: FakeProc) -> None:
    write(fake, "cmdline", b"java\0-cp\0/a b\0Main\0")
    line = procread.cmdline(PID, root=str(fake.root))
    assert line == procread.Cmdline(("java", "-cp", "/a b", "Main"), False)
    assert safeio.take_warnings() == []


def test_cmdline_past_the_cap_keeps_the_start_and_warns_once(fake: FakeProc) -> None:
    # GIVEN a command line of 3 MiB (a tenant's PR_SET_MM_MAP can make it gigabytes)
    arg = b"x" * (128 << 10)
    write(fake, "cmdline", b"java\0" + (arg + b"\0") * 24)
    # WHEN it is read twice
    first = procread.cmdline(PID, root=str(fake.root))
    second = procread.cmdline(PID, root=str(fake.root))
    # THEN only CMDLINE_MAX_BYTES are kept, flagged, with one warning naming the cap
    assert first is not None and first.capped and first == second
    assert sum(len(a) + 1 for a in first.args) - 1 == procread.CMDLINE_MAX_BYTES
    assert first.args[0] == "java"
    warnings = safeio.take_warnings()
    assert len(warnings) == 1
    assert f"pid {PID}:" in warnings[0] and "CMDLINE_MAX_BYTES" in warnings[0] and "/cmdline" in warnings[0]


def test_a_file_of_exactly_the_cap_is_not_capped(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procread, "CMDLINE_MAX_BYTES", 8)
    write(fake, "cmdline", b"java\0ab\0")
    assert procread.cmdline(PID, root=str(fake.root)) == procread.Cmdline(("java", "ab"), False)
    write(fake, "cmdline", b"java\0abc\0")
    assert procread.cmdline(PID, root=str(fake.root)) == procread.Cmdline(("java", "abc"), True)


def test_kernel_threads_and_vanished_processes_have_no_cmdline(fake: FakeProc) -> None:
    write(fake, "cmdline", b"")
    assert procread.cmdline(PID, root=str(fake.root)) is None
    assert procread.cmdline(PID + 1, root=str(fake.root)) is None
    assert procread.environ(PID + 1, root=str(fake.root)) == {}
    assert procread.status(PID + 1, root=str(fake.root)) is None
    assert procread.task_ids(PID + 1, root=str(fake.root)) is None
    assert list(procread.maps(PID + 1, root=str(fake.root))) == []


def test_links_are_not_followed(fake: FakeProc, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's\0secret\0")
    (fake.root / str(PID) / "cmdline").symlink_to(secret)
    (fake.root / str(PID) / "environ").symlink_to(secret)
    assert procread.cmdline(PID, root=str(fake.root)) is None
    assert procread.environ(PID, root=str(fake.root)) == {}


def test_a_fifo_is_not_waited_on(fake: FakeProc) -> None:
    os.mkfifo(fake.root / str(PID) / "cmdline")
    assert procread.cmdline(PID, root=str(fake.root)) is None  # O_NONBLOCK: no writer, nothing read


def test_environ_keeps_only_the_names_asked_for_and_drops_a_variable_cut_by_the_cap(
    fake: FakeProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(fake, "environ", b"HOME=/root\0SPARK_HOME=/opt/spark\0MASTER=yarn\0")
    assert procread.environ(PID, ("MASTER", "SPARK_HOME"), root=str(fake.root)) == {
        "SPARK_HOME": "/opt/spark",
        "MASTER": "yarn",
    }
    monkeypatch.setattr(procread, "ENVIRON_MAX_BYTES", len(b"HOME=/root\0SPARK_HOME=/opt/spark\0MAS"))
    # MASTER=yarn is cut to "MAS": neither name nor value is trusted
    assert procread.environ(PID, root=str(fake.root)) == {"HOME": "/root", "SPARK_HOME": "/opt/spark"}
    assert any("ENVIRON_MAX_BYTES" in warning for warning in safeio.take_warnings())


def test_status_skips_an_overlong_line_and_keeps_the_rest(fake: FakeProc) -> None:
    groups = "Groups:\t" + " ".join(str(g) for g in range(5000)) + "\n"  # a user in thousands of groups
    write(fake, "status", status_text(extra=groups))
    fields = procread.status(PID, root=str(fake.root))
    assert fields is not None
    assert "Groups" not in fields and fields["NSpid"] == f"{PID}\t7" and fields["SigCgt"] == "0000000000000004"
    assert procread.status_field(PID, "NSpid", root=str(fake.root)) == f"{PID}\t7"
    assert any("STATUS_MAX line" in warning for warning in safeio.take_warnings())


def test_status_lines_are_capped(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    write(fake, "status", b"".join(f"Key{n}:\t{n}\n".encode() for n in range(10_000)))
    fields = procread.status(PID, root=str(fake.root))
    assert fields is not None and len(fields) == procread.STATUS_MAX_LINES
    assert any("STATUS_MAX lines" in warning for warning in safeio.take_warnings())


def test_maps_are_capped_in_lines(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procread, "MAPS_MAX_MAPPINGS", 100)
    line = "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/libc.so.6\n"
    write(fake, "maps", (line * 1000).encode())
    maps = procread.maps(PID, root=str(fake.root))
    lines = list(maps)
    assert len(lines) == 100 and lines[0] == line.rstrip("\n") and maps.capped
    warnings = safeio.take_warnings()
    assert len(warnings) == 1 and "more than 100 mappings (MAPS_MAX_MAPPINGS)" in warnings[0]


def test_a_mapping_of_a_very_long_path_is_skipped_not_kept(fake: FakeProc) -> None:
    # a mapping under ~80 nested directories gives a 20 KB maps line
    deep = "/" + "/".join(["d" * 250] * 80) + "/lib.so"
    before = "1000-2000 r-xp 00000000 08:01 1 /usr/lib/jvm/lib/server/libjvm.so"
    after = "3000-4000 r-xp 00000000 08:01 2 /usr/lib/libc.so.6"
    write(fake, "maps", f"{before}\n5000-6000 r-xp 00000000 08:01 3 {deep}\n{after}\n".encode())
    maps = procread.maps(PID, root=str(fake.root))
    assert list(maps) == [before, after] and maps.capped
    # AS entries (the symbolizer's view) it keeps its range and its file's name, not its path
    entries = list(procread.maps(PID, root=str(fake.root)).entries())
    assert [entry.whole for entry in entries] == [True, False, True]
    cut = entries[1].text
    assert cut.startswith(b"5000-6000 r-xp") and cut.endswith(b"/lib.so")
    assert len(cut) == procread.MAPS_LINE_HEAD + 1 + procread.MAPS_LINE_TAIL
    warnings = safeio.take_warnings()
    assert len(warnings) == 1 and f"up to {len(deep) + 32} bytes" in warnings[0]
    assert "MAPS_LINE_MAX_BYTES" in warnings[0] and "\n" not in warnings[0]


def test_maps_are_capped_in_bytes_and_a_cut_line_is_not_kept(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procread, "MAPS_MAX_BYTES", 150)
    line = "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/libc.so.6\n"  # 70 bytes
    write(fake, "maps", (line * 1000).encode())
    maps = procread.maps(PID, root=str(fake.root))
    assert list(maps) == [line.rstrip("\n")] * 2 and maps.capped and maps.cut == "MAPS_MAX_BYTES"
    assert safeio.take_warnings() == [
        f"pid {PID}: {fake.root}/{PID}/maps: more than 150 bytes (MAPS_MAX_BYTES); only the first 150 read"
    ]


def test_a_reader_that_stops_early_still_names_the_long_lines_it_met(fake: FakeProc) -> None:
    long_line = "1000-2000 r-xp 00000000 08:01 1 /" + "d/" * 5000 + "x.so"
    write(fake, "maps", f"{long_line}\n3000-4000 r-xp 00000000 08:01 2 /usr/lib/libjvm.so\n".encode())
    found = next(line for line in procread.maps(PID, root=str(fake.root)) if line.endswith("/libjvm.so"))
    assert found.startswith("3000-4000")
    warnings = safeio.take_warnings()
    assert len(warnings) == 1 and "1 line(s) of up to" in warnings[0]


def test_maps_without_a_final_newline_and_lines_across_reads(fake: FakeProc) -> None:
    lines = [f"{n:x}-{n + 1:x} r-xp 00000000 08:01 {n} /lib/{'x' * (n % 3000)}.so" for n in range(200)]
    write(fake, "maps", "\n".join(lines).encode())  # 300 KB: lines cross the 64 KiB reads
    maps = procread.maps(PID, root=str(fake.root))
    assert list(maps) == lines and not maps.capped


def test_threads_are_capped_per_process(fake: FakeProc) -> None:
    for tid in range(PID, PID + 50):
        fake.thread(PID, tid)
    assert procread.task_ids(PID, root=str(fake.root)) == list(range(PID, PID + 50))
    assert safeio.take_warnings() == []
    capped = procread.task_ids(PID, max_threads=20, root=str(fake.root))
    assert capped is not None and len(capped) == 20 and set(capped) <= set(range(PID, PID + 50))
    warnings = safeio.take_warnings()
    assert len(warnings) == 1 and "THREADS_MAX" in warnings[0] and "more than 20 threads" in warnings[0]


def test_the_threads_cap_is_read_when_threads_are_listed(fake: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    # the callers (perf counters, /proc counters, a namespaced JVM's threads) pass no cap: THREADS_MAX,
    # as it is when they list, is the one that holds (it once was bound when the module loaded)
    for tid in range(PID, PID + 50):
        fake.thread(PID, tid)
    monkeypatch.setattr(procread, "THREADS_MAX", 10)
    capped = procread.task_ids(PID, root=str(fake.root))
    assert capped is not None and len(capped) == 10
    assert safeio.take_warnings() == [
        f"pid {PID}: {fake.root}/{PID}/task: more than 10 threads (THREADS_MAX); only the first 10 read"
    ]


def test_comm_is_capped(fake: FakeProc) -> None:
    write(fake, "comm", b"java\n")
    assert procread.comm(PID, root=str(fake.root)) == "java"
    write(fake, "comm", b"y" * 1000)
    assert procread.comm(PID, root=str(fake.root)) == "y" * procread.COMM_MAX_BYTES


def test_owner_is_the_real_uid(fake: FakeProc) -> None:
    write(fake, "status", status_text())
    assert procread.owner(PID, root=str(fake.root)) == (1000, 100)


@pytest.mark.parametrize(
    ("uids", "gids"),
    [("1000\t0\t0\t0", "100\t100\t100\t100"), ("1000\t1000\t1000\t1000", "100\t0\t0\t0")],
    ids=["setuid-root", "setgid-root"],
)
def test_a_setuid_program_has_no_owner(fake: FakeProc, uids: str, gids: str) -> None:
    # a setuid-root program with a java-looking argv would pass for a root JVM if the owner were the euid
    write(fake, "status", status_text(uids, gids))
    with pytest.raises(safeio.UnsafeFile, match="a setuid program"):
        procread.owner(PID, root=str(fake.root))
    assert any("setuid" in warning for warning in safeio.take_warnings())


def test_owner_of_a_process_gone(fake: FakeProc) -> None:
    with pytest.raises(FileNotFoundError):
        procread.owner(PID + 1, root=str(fake.root))


def test_this_process_through_the_real_proc() -> None:
    line = procread.cmdline(os.getpid())
    assert line is not None and not line.capped and line.args[0] == sys.orig_argv[0]
    assert procread.owner(os.getpid()) == safeio.owner(os.getpid()) == (os.getuid(), os.getgid())
    assert procread.environ(os.getpid(), ("PATH",)) == {"PATH": os.environ["PATH"]}
    tids = procread.task_ids(os.getpid())
    assert tids is not None and os.getpid() in tids
    assert any(line.endswith("]") or "/" in line for line in procread.maps(os.getpid()))
