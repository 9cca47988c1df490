"""Exec watcher: tells the scope analyzer within one poll which processes just exec'd (bcc)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Protocol

from ..bpf.compiler import compile_program
from ..errors import CapabilityError

BPF_SOURCE = Path(__file__).resolve().parent / "exec_watch.c"


class ExecSource(Protocol):
    """What the scope analyzer needs from an exec watcher (the tests substitute a fake)."""

    def start(self) -> None: ...

    def drain(self) -> tuple[list[int], bool]: ...

    def close(self) -> None: ...

    @property
    def prog_ids(self) -> list[int]:
        """Kernel ids of its BPF programs, for the profiler's own overhead accounting ([] if none)."""
        ...


def bpf_source() -> str:
    return BPF_SOURCE.read_text(encoding="utf-8")


class ExecWatcher:
    """Raw tracepoint sched:sched_process_exec -> ring buffer of tgids, read without blocking."""

    def __init__(self) -> None:
        self._bpf: Any = None
        self._pending: list[int] = []
        self._dropped_seen = 0

    def start(self) -> None:
        try:
            from bcc import BPF  # heavy import: only when the watcher really starts
        except ImportError as exc:
            raise CapabilityError(f"bcc not importable ({exc}); install python3-bpfcc, or run with polling") from None
        try:
            self._bpf = compile_program(BPF, bpf_source())
            self._bpf[b"exec_events"].open_ring_buffer(self._on_event)
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception on compile/attach failures
            self.close()
            raise CapabilityError(f"exec tracepoint unavailable ({exc}); falling back to polling") from None

    def _on_event(self, _ctx: Any, data: Any, _size: int) -> None:
        self._pending.append(ctypes.cast(data, ctypes.POINTER(ctypes.c_uint32)).contents.value)

    def drain(self) -> tuple[list[int], bool]:
        """The tgids that exec'd since the last drain (oldest first, no duplicates) and whether
        records were dropped (ring buffer full), in which case the caller should rescan /proc."""
        if self._bpf is None:
            return [], False
        self._bpf.ring_buffer_consume()
        pids = list(dict.fromkeys(self._pending))
        self._pending.clear()
        dropped_total = int(self._bpf[b"exec_dropped"][ctypes.c_int(0)].value)
        dropped = dropped_total > self._dropped_seen
        self._dropped_seen = dropped_total
        return pids, dropped

    @property
    def prog_ids(self) -> list[int]:
        if self._bpf is None:
            return []
        ids = []
        for fn in getattr(self._bpf, "funcs", {}).values():
            fd = getattr(fn, "fd", None)
            if fd is not None and fd >= 0:
                try:
                    ids.append(_prog_id(fd))
                except OSError:
                    pass
        return ids

    def close(self) -> None:
        """Detach and unload; safe to call twice."""
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            bpf.cleanup()


def _prog_id(fd: int) -> int:
    # /proc/self/fdinfo/<fd> of a BPF program carries "prog_id:"
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("prog_id:"):
            return int(line.split()[1])
    raise OSError(f"fd {fd} is not a BPF program")
