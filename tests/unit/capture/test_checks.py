"""profiler/capture/checks.py: the capture validator's pieces (the commands' view: test_hostile_inputs.py)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from profiler.capture.checks import BoundedInflater, open_regular, present, row_problem, text_problem
from profiler.errors import CaptureFormatError


def test_the_inflater_gives_exactly_what_is_asked_and_tells_the_end(tmp_path: Path) -> None:
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(b"abcdef" * 1000))
    with open_regular(path) as handle:
        stream = BoundedInflater(handle, str(path))
        assert stream.read(4) == b"abcd"
        rest = bytearray(5996)
        assert stream.read_into(memoryview(rest)) == 5996 and bytes(rest).endswith(b"abcdef")
        assert stream.at_end()


@pytest.mark.parametrize(
    "content, message",
    [
        (gzip.compress(b"x" * 100) + b"junk", "bytes after the gzip stream"),
        (gzip.compress(b"x" * 100) + gzip.compress(b"y"), "bytes after the gzip stream"),
        (gzip.compress(b"x" * 100)[:-6], "ends before its end"),
        (b"not gzip", "truncated or corrupt"),
    ],
)
def test_the_inflater_refuses_what_one_gzip_member_is_not(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "t.gz"
    path.write_bytes(content)
    with open_regular(path) as handle, pytest.raises(CaptureFormatError, match=message):
        stream = BoundedInflater(handle, str(path))
        stream.read(100)
        stream.at_end()


def test_more_than_asked_is_never_inflated(tmp_path: Path) -> None:
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(bytes(50 << 20)))
    with open_regular(path) as handle:
        stream = BoundedInflater(handle, str(path))
        assert stream.read(10) == bytes(10)
        assert not stream.at_end()  # one byte more is all it inflated to tell


def test_present_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    assert not present(tmp_path / "absent") and not present(tmp_path / "absent" / "below")
    (tmp_path / "file").write_text("x")
    assert present(tmp_path / "file")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    for name, kind in (("dir", "a directory"), ("fifo", "a FIFO"), ("link", "a symbolic link")):
        with pytest.raises(CaptureFormatError, match=f"{name}: {kind} where"):
            present(tmp_path / name)
        with pytest.raises(CaptureFormatError, match=f"{name}: "):
            open_regular(tmp_path / name).close()  # never blocks on the FIFO


def test_texts_and_rows_as_the_writer_makes_them() -> None:
    assert text_problem(["a", "b"], "frame name") is None
    assert "NUL" in (text_problem(["a", "b\x00"], "frame name") or "")
    assert "surrogate" in (text_problem(["\udc80"], "context name") or "")
    assert row_problem([0, 0, 1], [1, 2, 0], [0, 0, 0], 2) is None
    assert "listed twice" in (row_problem([0, 0], [1, 1], [0, 0], None) or "")
    assert "out of (interval, stack, context) order" in (row_problem([1, 0], [0, 0], [0, 0], None) or "")
    assert "past the window's 2 intervals" in (row_problem([0, 2], [0, 0], [0, 0], 2) or "")
