"""The status file the coordinator polls while a run goes on."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..files import atomic

STATUS_INTERVAL = 1.0


class StatusWriter:
    """The status file the coordinator polls (JSON, rewritten atomically)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.state = "starting"
        self.started = time.time()
        self.window_start: float | None = None
        self.duration = 0.0
        self.error: str | None = None
        self.processes = 0
        self.count_samples: Callable[[], int | None] = lambda: None
        self._last = 0.0

    def update(self, state: str | None = None, force: bool = False, error: str | None = None) -> None:
        if state is not None:
            self.state = state
        if error is not None:
            self.error = error
        now = time.time()
        if self.path is None or (not force and state is None and now - self._last < STATUS_INTERVAL):
            return
        self._last = now
        elapsed = now - self.window_start if self.window_start else 0.0
        payload = {
            "state": self.state,
            "pid": os.getpid(),
            "elapsed": round(elapsed, 3),
            "remaining": round(max(0.0, self.duration - elapsed), 3) if self.window_start else self.duration,
            "processes": self.processes,
            "samples": self.samples(),
            "error": self.error,
            "time": now,
        }
        self._write(self.path, json.dumps(payload) + "\n")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Best effort: a status that cannot be written must never end the run. On a full disk the new
        copy has no room, but the old file's page does: overwrite it in place (a reader may catch it
        half-written and polls again), so "failed: no space left" still reaches the coordinator."""
        try:
            # 0644: a coordinator logged in as a non-root user (sudo) reads it over SFTP
            atomic.atomic_write_text(path, text, mode=0o644)
            return
        except OSError:
            pass
        try:
            with open(path, "r+", encoding="utf-8") as handle:
                handle.write(text)
                handle.truncate()
        except OSError:
            pass

    def samples(self) -> int | None:
        """Samples so far (None when the sampler cannot say); never raises."""
        try:
            return self.count_samples()
        except Exception:  # noqa: BLE001 - progress is best effort
            return None
