"""The common start of a cluster's window: ``--start-at`` is the latest start, and the start file
(``--start-file``) that the coordinator writes once every host's programs are compiled and attached brings
it forward, so hosts begin together as soon as all of them are ready instead of after a fixed delay.

The file holds one Unix time (this host's clock) and a newline. It can only move the start earlier, never
past ``--start-at``: a start file that never comes (a lost link, a host that never got ready, a coordinator
gone) leaves the fixed start of old. Its directory is the coordinator's private work directory; it is read
all the same as what it is, a file someone else wrote: no link followed, a regular file, a few bytes.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable
from pathlib import Path

START_FILE_POLL = 0.05  # seconds between two looks at the start file while waiting
START_FILE_BYTES = 64  # a Unix time with decimals and a newline fits many times over


def read_start_file(path: Path) -> float | None:
    """The start the file says (seconds since the epoch), or None while it is absent, not whole (no newline
    yet), not a regular file, a link, or not a finite number."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # absent, or a link (ELOOP)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, START_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > START_FILE_BYTES or not raw.endswith(b"\n"):
        return None
    try:
        value = float(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def wait_for_start(
    latest: float, start_file: Path | None, clock: Callable[[], float], wait: Callable[[float], bool]
) -> tuple[bool, float | None]:
    """Wait until the start: the time the start file gives, or ``latest`` (``--start-at``), whichever is
    earlier; a time already past starts at once. ``wait(seconds)`` sleeps and says whether a stop was
    requested. Returns (stopped, the start file's time or None when none came in time)."""
    planned = latest
    given: float | None = None
    while True:
        now = clock()
        if now >= planned:
            return False, given
        if start_file is not None and given is None:
            given = read_start_file(start_file)
            if given is not None:
                planned = min(latest, given)
                continue
            step = min(START_FILE_POLL, planned - now)
        else:
            step = planned - now
        if wait(step):
            return True, given
