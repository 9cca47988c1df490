"""The one reading of a /proc/PID[/task/TID]/stat line (proc(5)).

The command name (field 2) is the target's own: it may hold spaces, parentheses and ") S 1 2", so it
runs from the first '(' to the LAST ')', and the numbered fields are those after that last ')'. Every
reader of a stat line in both packages goes through ``split_stat``; field numbers are proc(5)'s (the
pid is field 1)."""

from __future__ import annotations

from dataclasses import dataclass

STATE = 3
PPID = 4
MINFLT = 10
MAJFLT = 12
UTIME = 14
STIME = 15
STARTTIME = 22


def parse_count(text: str) -> int | None:
    """A non-negative decimal of a /proc file; None otherwise (ASCII digits only: str.isdigit also
    accepts '²')."""
    return int(text) if text.isascii() and text.isdigit() else None


@dataclass(frozen=True)
class StatLine:
    comm: str
    fields: tuple[str, ...]  # field 3 (state) onwards

    def field(self, number: int) -> str:
        """proc(5)'s field ``number`` (3 or above); IndexError when the line is shorter."""
        if number < STATE:
            raise IndexError(f"stat field {number} comes before the command name's end")
        return self.fields[number - STATE]

    def count(self, number: int) -> int | None:
        """Field ``number`` as a non-negative integer; None when missing or not a number."""
        try:
            return parse_count(self.field(number))
        except IndexError:
            return None

    @property
    def state(self) -> str:
        return self.fields[0]


def split_stat(text: str | bytes) -> StatLine | None:
    """The comm and the fields after it; None when the line has no '(' ... ')' or no state after it."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    fields = tuple(text[close_at + 1 :].split())
    if not fields:
        return None
    return StatLine(text[open_at + 1 : close_at], fields)


__all__ = ["MAJFLT", "MINFLT", "PPID", "STARTTIME", "STATE", "STIME", "UTIME", "StatLine", "parse_count", "split_stat"]
