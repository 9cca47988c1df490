"""The one stat-line parser: a target's comm may imitate the fields that follow it."""

from __future__ import annotations

import os

import pytest

from profiler.files import procstat


def stat_line(comm: str, state: str = "S", start: int = 4242, utime: int = 7, stime: int = 5) -> str:
    fields = [state, "1", "100", "100", "0", "-1", "4194560", "30", "0", "2", "0", str(utime), str(stime)]
    fields += ["0", "0", "20", "0", "1", "0", str(start), "1000", "50"]
    return f"123 ({comm}) " + " ".join(fields) + "\n"


@pytest.mark.parametrize(
    "comm",
    [
        "java",
        "a) S (b) c",
        ")",
        "(",
        "x) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 999",
        "",
        "tab\there",
        "new\nline",
    ],
)
def test_fields_come_after_the_last_parenthesis(comm: str) -> None:
    line = procstat.split_stat(stat_line(comm))
    assert line is not None
    assert line.comm == comm
    assert line.state == "S"
    assert line.count(procstat.PPID) == 1
    assert line.count(procstat.MINFLT) == 30 and line.count(procstat.MAJFLT) == 2
    assert line.count(procstat.UTIME) == 7 and line.count(procstat.STIME) == 5
    assert line.count(procstat.STARTTIME) == 4242


def test_bytes_that_are_not_utf8_still_split() -> None:
    raw = stat_line("ok").replace("(ok)", "(\udcff\udcfe)").encode("utf-8", "surrogateescape")
    line = procstat.split_stat(raw)
    assert line is not None and line.count(procstat.STARTTIME) == 4242


@pytest.mark.parametrize("text", ["", "123", "123 (java", "123 java) S", "123 (java)", "123 (java)   \n"])
def test_malformed_lines_are_none(text: str) -> None:
    assert procstat.split_stat(text) is None


def test_short_or_non_numeric_fields_count_as_missing() -> None:
    line = procstat.split_stat("1 (x) S 0 1 2")
    assert line is not None and line.state == "S"
    assert line.count(procstat.PPID) == 0
    assert line.count(procstat.STARTTIME) is None
    assert procstat.split_stat("1 (x) S -1 ²").count(procstat.PPID) is None  # type: ignore[union-attr]
    with pytest.raises(IndexError):
        line.field(2)


def test_our_own_stat_line() -> None:
    with open(f"/proc/{os.getpid()}/stat", "rb") as handle:
        line = procstat.split_stat(handle.read())
    assert line is not None and line.state == "R"
    assert line.count(procstat.PPID) == os.getppid()
    assert (line.count(procstat.STARTTIME) or 0) > 0
