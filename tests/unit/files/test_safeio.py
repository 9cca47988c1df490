"""profiler/files/safeio.py on this test process's own files: links, FIFOs, oversized files and foreign owners
are refused with a one-line warning, never followed or waited on; files are created as a given user."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.files import safeio

PID = os.getpid()


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    """A directory this process sees as /<something>: paths are given as the target sees them."""
    safeio.take_warnings()
    yield tmp_path
    safeio.take_warnings()


def test_a_regular_file_of_the_owner_is_read(in_tmp: Path) -> None:
    (in_tmp / "map").write_bytes(b"1000 10 a.B::c\n")
    assert safeio.read_in_root(PID, str(in_tmp / "map"), 1 << 20) == b"1000 10 a.B::c\n"
    assert safeio.take_warnings() == []


def test_a_link_is_refused_with_a_warning_naming_pid_and_path(in_tmp: Path) -> None:
    secret = in_tmp / "secret"
    secret.write_text("root only")
    (in_tmp / "map").symlink_to(secret)
    with pytest.raises(safeio.UnsafeFile, match="symbolic link"):
        safeio.read_in_root(PID, str(in_tmp / "map"), 1 << 20)
    [warning] = safeio.take_warnings()
    assert warning.startswith(f"pid {PID}: /proc/{PID}/root{in_tmp}/map: a symbolic link") and "\n" not in warning


def test_a_fifo_is_refused_at_once_never_waited_on(in_tmp: Path) -> None:
    os.mkfifo(in_tmp / "map")
    began = time.monotonic()
    with pytest.raises(safeio.UnsafeFile, match="a FIFO, not a regular file"):
        safeio.read_in_root(PID, str(in_tmp / "map"), 1 << 20)
    assert time.monotonic() - began < 1.0


def test_a_device_and_a_directory_are_refused(in_tmp: Path) -> None:
    with pytest.raises(safeio.UnsafeFile, match="a device"):
        safeio.read_in_root(PID, "/dev/null", 1 << 20, owners=None)
    with pytest.raises(safeio.UnsafeFile, match="not a regular file"):
        safeio.read_in_root(PID, str(in_tmp), 1 << 20)


def test_an_oversized_file_is_refused_before_it_is_read(in_tmp: Path) -> None:
    with open(in_tmp / "map", "wb") as handle:
        handle.truncate(10 << 20)
    with pytest.raises(safeio.UnsafeFile, match="10485760 bytes, over the limit of 1048576"):
        safeio.read_in_root(PID, str(in_tmp / "map"), 1 << 20)


def test_a_file_of_another_owner_is_refused(in_tmp: Path) -> None:
    (in_tmp / "map").write_text("x")
    with pytest.raises(safeio.UnsafeFile, match=f"owned by uid {os.geteuid()}"):
        safeio.read_in_root(PID, str(in_tmp / "map"), 1 << 20, owners=[12345])


def test_a_link_in_the_middle_stays_inside_the_root(in_tmp: Path) -> None:
    # GIVEN a process whose root is in_tmp (as a container's is) and a link there pointing to "/etc"
    (in_tmp / "etc").mkdir()
    (in_tmp / "etc" / "passwd").write_text("the container's own\n")
    (in_tmp / "tmp").symlink_to("/etc")
    root_fd = os.open(in_tmp, os.O_PATH | os.O_DIRECTORY)
    try:
        # WHEN a path through the link is opened inside that root
        fd = safeio.open_beneath(root_fd, str(in_tmp), "/tmp/passwd", os.O_RDONLY | os.O_NOFOLLOW)
    finally:
        os.close(root_fd)
    # THEN the link resolved inside the root, never to the host's /etc/passwd
    with os.fdopen(fd) as handle:
        assert handle.read() == "the container's own\n"


def test_bounded_reader_refuses_reads_outside_the_file(in_tmp: Path) -> None:
    (in_tmp / "elf").write_bytes(b"x" * 100)
    fd = os.open(in_tmp / "elf", os.O_RDONLY)
    try:
        reader = safeio.BoundedReader.of(fd)
        assert reader.read_at(90, 10) == b"x" * 10
        for offset, size in ((0, 1 << 60), (95, 10), (-1, 2)):
            with pytest.raises(ValueError, match="outside the file"):
                reader.read_at(offset, size)
    finally:
        os.close(fd)


def test_a_socket_path_must_be_a_socket_not_a_link(in_tmp: Path) -> None:
    (in_tmp / "sock").symlink_to("/run/some-root-daemon.sock")
    with pytest.raises(safeio.UnsafeFile, match="symbolic link"):
        safeio.socket_in_root(PID, str(in_tmp / "sock"))
    (in_tmp / "file").write_text("")
    with pytest.raises(safeio.UnsafeFile, match="not a socket"):
        safeio.socket_in_root(PID, str(in_tmp / "file"))


# ---------------------------------------------------------------- bounds of hostile content


def test_a_perf_map_of_too_many_lines_is_refused(in_tmp: Path) -> None:
    from profiler.symbols import perfmap

    path = Path(f"/tmp/perf-{PID}.map")
    try:
        path.write_bytes(b"1 1 x\n" * (perfmap.PERF_MAP_MAX_LINES + 1))
        assert perfmap.read_perf_map(PID) is None
        [warning] = safeio.take_warnings()
        assert warning.startswith(f"pid {PID}: ") and f"over the limit of {perfmap.PERF_MAP_MAX_LINES}" in warning
        path.write_bytes(b"1000 10 a.B::c\n" + b"2000 10 " + b"x" * 5000 + b"\n")
        perf_map = perfmap.read_perf_map(PID)
        assert perf_map is not None and len(perf_map) == 1  # the 5,000-character line skipped
    finally:
        path.unlink(missing_ok=True)


def test_thread_print_keeps_names_short_and_skips_kilobyte_lines() -> None:
    from profiler.scope.threadnames import THREAD_NAME_MAX, parse_thread_print

    text = f'"{"N" * 10240}" #1 nid=0x10 runnable\n"{"M" * 1000}" #2 nid=0x11 runnable\n'
    assert parse_thread_print(text) == {0x11: "M" * THREAD_NAME_MAX}


def test_crafted_elf_headers_raise_instead_of_allocating(in_tmp: Path) -> None:
    import struct

    from profiler.unwind import ehframe
    from profiler.unwind.vmstructs import TABLE_SYMBOLS, elf_symbols

    # an ELF header whose section table claims 65535 sections of 65535 bytes far past the file's end
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", header, 18, 62)
    struct.pack_into("<QQ", header, 0x20, 64, 1 << 40)
    struct.pack_into("<HHHHH", header, 0x36, 56, 0, 0xFFFF, 0xFFFF, 1)
    (in_tmp / "libjvm.so").write_bytes(bytes(header))
    fd = os.open(in_tmp / "libjvm.so", os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="outside the file"):
            elf_symbols("libjvm.so", safeio.BoundedReader.of(fd), TABLE_SYMBOLS)
        with open(in_tmp / "libjvm.so", "rb") as handle, pytest.raises(ValueError, match="outside the file"):
            ehframe.read_elf_file(handle)
    finally:
        os.close(fd)
