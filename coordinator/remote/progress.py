"""Progress while a run is under way: one line per host (rich live table on a terminal, plain lines
otherwise, nothing when quiet)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import IO, Any


@dataclass(frozen=True)
class HostProgress:
    """What one host is doing now (coordinator view)."""

    host: str
    phase: str = "queued"  # queued, connecting, deploying, ready, starting, waiting, sampling, writing,
    # stopping, fetching, done, partial, failed, reconnecting
    elapsed: float | None = None
    remaining: float | None = None
    samples: int | None = None
    processes: int | None = None
    message: str = ""

    def line(self) -> str:
        parts = [f"{self.host}: {self.phase}"]
        if self.elapsed is not None and self.phase in ("sampling", "writing", "stopping"):
            parts.append(f"{self.elapsed:.0f} s")
            if self.remaining is not None:
                parts.append(f"{self.remaining:.0f} s left")
        if self.processes is not None:
            parts.append(f"{self.processes} processes")
        if self.samples is not None:
            parts.append(f"{self.samples} samples")
        if self.message:
            parts.append(self.message)
        return ", ".join(parts)


class ProgressBoard:
    """Thread-safe per-host state; workers update it, one renderer shows it."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._rows = {host: HostProgress(host) for host in hosts}
        self._order = list(hosts)
        self.version = 0

    def update(self, host: str, **changes: Any) -> None:
        with self._lock:
            self._rows[host] = replace(self._rows[host], **changes)
            self.version += 1

    def rows(self) -> list[HostProgress]:
        with self._lock:
            return [self._rows[host] for host in self._order]


class Renderer:
    """Base: does nothing (quiet)."""

    def start(self) -> None: ...

    def refresh(self, board: ProgressBoard) -> None: ...

    def note(self, text: str) -> None: ...

    def stop(self, board: ProgressBoard) -> None: ...


class PlainRenderer(Renderer):
    """One line per host whenever its phase or message changes, and a heartbeat every ``every`` s."""

    def __init__(self, stream: IO[str] | None = None, every: float = 10.0, owns_stream: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.every = every
        self.owns_stream = owns_stream
        self._shown: dict[str, tuple[str, str]] = {}
        self._last_heartbeat = time.monotonic()

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def refresh(self, board: ProgressBoard) -> None:
        heartbeat = time.monotonic() - self._last_heartbeat >= self.every
        if heartbeat:
            self._last_heartbeat = time.monotonic()
        for row in board.rows():
            key = (row.phase, row.message)
            if self._shown.get(row.host) != key or (heartbeat and row.phase in ("sampling", "waiting")):
                self._shown[row.host] = key
                self._print(row.line())

    def note(self, text: str) -> None:
        self._print(text)

    def stop(self, board: ProgressBoard) -> None:
        self.refresh(board)
        if self.owns_stream:
            self.stream.flush()
            self.stream.close()


class RichRenderer(Renderer):
    """A live table on a terminal."""

    def __init__(self, stream: IO[str] | None = None, owns_stream: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        self.stream = stream
        self.owns_stream = owns_stream
        self.console = Console(file=stream) if stream is not None else Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)

    def _table(self, board: ProgressBoard) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, pad_edge=False)
        for column in ("host", "state", "elapsed", "left", "processes", "samples", ""):
            table.add_column(column)
        for row in board.rows():
            style = {"failed": "red", "partial": "yellow", "done": "green"}.get(row.phase, "")
            # Host labels and messages come from files and remote hosts: never read them as rich markup.
            table.add_row(
                Text(row.host),
                f"[{style}]{row.phase}[/]" if style else row.phase,
                "" if row.elapsed is None else f"{row.elapsed:.0f} s",
                "" if row.remaining is None else f"{row.remaining:.0f} s",
                "" if row.processes is None else str(row.processes),
                "" if row.samples is None else str(row.samples),
                Text(row.message),
            )
        return table

    def start(self) -> None:
        self.live.start()

    def refresh(self, board: ProgressBoard) -> None:
        self.live.update(self._table(board))

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def stop(self, board: ProgressBoard) -> None:
        self.live.update(self._table(board))
        self.live.stop()
        if self.owns_stream and self.stream is not None:
            self.stream.close()


def _private_stderr() -> IO[str]:
    """A duplicate of file descriptor 2: Spark's start-up points fd 2 at its log file for a while,
    and progress lines must still reach the terminal."""
    try:
        return os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")
    except (AttributeError, OSError, ValueError):  # a replaced sys.stderr (tests) has no descriptor
        return sys.stderr


def make_renderer(enabled: bool, stream: IO[str] | None = None) -> Renderer:
    if not enabled:
        return Renderer()
    if stream is not None:
        return PlainRenderer(stream)
    target = _private_stderr()
    owned = target is not sys.stderr
    if target.isatty():
        try:
            return RichRenderer(target, owns_stream=owned)
        except ImportError:
            pass
    return PlainRenderer(target, owns_stream=owned)
