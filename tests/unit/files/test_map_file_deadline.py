"""safeio's touches of a target's mapped files (stat, open) bounded in time, with fakes for the file system:
one that never answers (a FUSE server that holds its requests) and one that answers but is FUSE."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.files import safeio

PID = 4242
DEADLINE = 0.3


@pytest.fixture
def image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file that stands for every /proc/PID/map_files link; the slow marks and warnings start empty."""
    path = tmp_path / "libfake.so"
    path.write_bytes(b"\x7fELF" + b"\0" * 60)
    monkeypatch.setattr(safeio, "_stat", lambda shown: os.stat(path))
    monkeypatch.setattr(safeio, "_open", lambda shown, flags: os.open(path, flags))
    monkeypatch.setattr(safeio, "MAP_FILE_DEADLINE", DEADLINE)
    monkeypatch.setattr(safeio, "_stuck", 0)
    safeio.forget_slow_files()
    safeio.take_warnings()
    yield path
    safeio.forget_slow_files()
    safeio.take_warnings()


def test_an_answering_local_file_is_opened(image: Path) -> None:
    fd, info = safeio.open_map_file(PID, 0x1000, 0x2000, device="fd:01")
    try:
        assert (info.st_ino, info.st_size) == (image.stat().st_ino, 64)
    finally:
        os.close(fd)
    assert safeio.stat_map_file(PID, 0x1000, 0x2000).st_ino == image.stat().st_ino
    assert safeio.take_warnings() == []


def test_a_file_system_that_never_answers_costs_one_deadline_then_nothing(
    image: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a file system whose stat blocks until the test lets it go (a FUSE server holding GETATTR)
    release = threading.Event()
    calls: list[str] = []

    def blocked(shown: str) -> os.stat_result:
        calls.append(shown)
        release.wait(30)
        return os.stat(image)

    monkeypatch.setattr(safeio, "_stat", blocked)
    try:
        # WHEN a mapped file of it is opened
        began = time.monotonic()
        with pytest.raises(safeio.UnsafeFile, match=f"no answer within {DEADLINE:g} s"):
            safeio.open_map_file(PID, 0x1000, 0x2000, device="0:77")
        # THEN the caller waited the deadline, not the file system
        assert DEADLINE <= time.monotonic() - began < DEADLINE + 2
        # AND the next files of that process or device are refused at once, the file system not asked again
        began = time.monotonic()
        with pytest.raises(safeio.UnsafeFile, match="did not answer before"):
            safeio.stat_map_file(PID, 0x3000, 0x4000)
        with pytest.raises(safeio.UnsafeFile, match="did not answer before"):
            safeio.open_map_file(PID + 1, 0x1000, 0x2000, device="0:77")
        assert time.monotonic() - began < DEADLINE and len(calls) == 1
        # AND one warning line for the file that blocked, naming PID and path
        warnings = safeio.take_warnings()
        assert warnings[0] == (
            f"pid {PID}: /proc/{PID}/map_files/1000-2000: no answer within {DEADLINE:g} s (a file system "
            "that blocks: FUSE?); not read"
        )
        # AND another process on another device (a file system that answers) is still read
        monkeypatch.setattr(safeio, "_stat", lambda shown: os.stat(image))
        fd, _info = safeio.open_map_file(PID + 2, 0x1000, 0x2000, device="fd:01")
        os.close(fd)
    finally:
        release.set()


def test_an_fd_opened_after_the_caller_gave_up_is_closed(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN an open that answers only after the deadline
    opened: list[int] = []

    def late_open(shown: str, flags: int) -> int:
        time.sleep(DEADLINE * 2)
        opened.append(os.open(image, flags))
        return opened[-1]

    monkeypatch.setattr(safeio, "_open", late_open)
    with pytest.raises(safeio.UnsafeFile, match="no answer"):
        safeio.open_mapped(PID, 0x1000, 0x2000, "/lib/libfake.so")
    # THEN once the late answer comes, its fd is closed by the worker (no fd leaks per slow file)
    deadline = time.monotonic() + 5
    while not opened and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    assert opened
    with pytest.raises(OSError):
        os.fstat(opened[0])


def test_too_many_workers_left_waiting_stop_every_mapped_file(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(safeio, "_stuck", safeio.MAP_FILE_STUCK_MAX)
    with pytest.raises(safeio.UnsafeFile, match="MAP_FILE_STUCK_MAX"):
        safeio.open_map_file(PID, 0x1000, 0x2000)


def test_a_file_on_fuse_is_refused_even_when_it_answers(image: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # its reads come later, without a deadline: the server could hold those instead
    monkeypatch.setattr(safeio, "_fs_type", lambda fd: safeio.FUSE_SUPER_MAGIC)
    with pytest.raises(safeio.UnsafeFile, match="on a FUSE file system"):
        safeio.open_map_file(PID, 0x1000, 0x2000)
    with pytest.raises(safeio.UnsafeFile, match="on a FUSE file system"):
        safeio.open_mapped(PID, 0x1000, 0x2000, "/lib/libfake.so")


def test_the_file_systems_type_is_read_from_the_fd(image: Path) -> None:
    fd = os.open(image, os.O_RDONLY)
    try:
        assert safeio._fs_type(fd) not in (None, safeio.FUSE_SUPER_MAGIC)
    finally:
        os.close(fd)
