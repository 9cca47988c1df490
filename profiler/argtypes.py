"""Validating argparse types shared by every subcommand of both CLIs (bcc tools' positive_int habit)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Number = TypeVar("Number", int, float)


def bounded(
    convert: Callable[[str], Number],
    low: Number | None = None,
    high: Number | None = None,
    what: str = "",
    exclusive: bool = False,
) -> Callable[[str], Number]:
    """A type that parses with ``convert`` and accepts ``low <= value <= high`` (either bound optional;
    ``exclusive``: ``low < value < high``). Every bounded number of both CLIs is one of these."""
    noun = "a whole number" if convert is int else "a number"

    def parse(text: str) -> Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}{what and ' of ' + what}") from None
        if value != value:  # NaN passes every comparison below
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}{what and ' of ' + what}")
        below = low is not None and (value <= low if exclusive else value < low)
        above = high is not None and (value >= high if exclusive else value > high)
        if below or above:
            if high is None:
                rule = f"{'>' if exclusive else '>='} {low}"
            elif low is None:
                rule = f"{'<' if exclusive else '<='} {high}"
            else:
                rule = f"between {low} and {high}{' (exclusive)' if exclusive else ''}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}{what and ' ' + what}")
        return value

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def positive_float(text: str) -> float:
    value = bounded(float, 0.0)(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


positive_int = bounded(int, 1)
non_negative_int = bounded(int, 0)
seconds_into_window = bounded(float, 0.0, what="seconds into the window")
frequency = bounded(int, 1, 10000, "Hz (99 is the default)")
# Every command's --duration (profiler run, coordinator profile, coordinator demo): a millisecond to a week.
duration = bounded(float, 0.001, 7 * 24 * 3600.0, "seconds")
# --interval (timeline slice) and --perf-map-refresh of profiler run and coordinator profile.
interval = bounded(float, 0.1, 3600.0, "seconds")
perf_map_refresh = bounded(float, 0.0, 86400.0, "seconds")
# --off-cpu-min-block: blocks shorter than this are not summed (0 keeps all; a minute is the most that means anything).
min_block_ms = bounded(float, 0.0, 60000.0, "milliseconds")


def checkpoint_period(text: str) -> float:
    """--checkpoint of profiler run and coordinator profile: 0 (none) or half a second to a day."""
    value = bounded(float, 0.0, 86400.0, "seconds")(text)
    if 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"{text!r}: use 0 (no checkpoints) or at least 0.5 seconds")
    return value


LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def label(text: str) -> tuple[str, str]:
    """``key=value`` experiment factor (run.json, a summary.csv column); the value is free text on one line."""
    key, sep, value = text.partition("=")
    if not sep or not LABEL_KEY.match(key):
        raise argparse.ArgumentTypeError(f"{text!r}: write key=value, key of letters, digits, '_', '.', '-'")
    if len(value) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise argparse.ArgumentTypeError(f"{text!r}: the value must be one line of at most 200 printable characters")
    return key, value


def existing_path(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    return path


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a readable file")
    return path
