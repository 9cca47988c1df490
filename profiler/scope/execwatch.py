"""Process watcher: tells the scope analyzer within one poll which processes exec'd, were forked or exited
(bcc, three raw tracepoints), so a poll need not list /proc."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..bpf.compiler import compile_program
from ..bpf.pidns import own_pid_namespace
from ..errors import CapabilityError

BPF_SOURCE = Path(__file__).resolve().parent / "exec_watch.c"
RINGBUF_PAGES = 64  # 256 KiB: 10,000 records (24 bytes with the ring's header), 20,000 a second at a 0.5 s poll
EVENT_EXEC, EVENT_FORK, EVENT_EXIT = 1, 2, 3


class _Event(ctypes.Structure):  # struct proc_event_t of exec_watch.c
    _fields_ = [("kind", ctypes.c_uint32), ("tgid", ctypes.c_uint32), ("parent", ctypes.c_uint32)]


@dataclass
class ProcEvents:
    """What the watcher saw since the last drain, oldest first.

    ``forks_known``: every new process is in ``forks`` (the fork records carry the initial PID namespace's
    ids, so only an agent running there can use them); when False the caller lists /proc to find them.
    ``dropped``: records were lost (ring buffer full): the caller should rescan /proc."""

    execs: list[int] = field(default_factory=list)
    forks: list[tuple[int, int]] = field(default_factory=list)  # (child, parent)
    exits: list[int] = field(default_factory=list)
    dropped: bool = False
    forks_known: bool = False


class ExecSource(Protocol):
    """What the scope analyzer needs from an exec watcher (the tests substitute a fake)."""

    def start(self) -> None: ...

    def drain(self) -> ProcEvents: ...

    def close(self) -> None: ...

    @property
    def prog_ids(self) -> list[int]:
        """Kernel ids of its BPF programs, for the profiler's own overhead accounting ([] if none)."""
        ...


def bpf_source() -> str:
    return BPF_SOURCE.read_text(encoding="utf-8").replace("RINGBUF_PAGES", str(RINGBUF_PAGES))


def forks_usable() -> bool:
    """Whether fork records name processes as this agent's /proc does (it runs in the initial PID namespace)."""
    namespace = own_pid_namespace()
    return namespace is None or namespace.initial


class ExecWatcher:
    """Raw tracepoints sched_process_exec/fork/exit -> ring buffer of records, read without blocking."""

    def __init__(self) -> None:
        self._bpf: Any = None
        self._pending = ProcEvents()
        self._forks_known = forks_usable()
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

    def _on_event(self, _ctx: Any, data: Any, size: int) -> None:
        if size < ctypes.sizeof(_Event):
            return
        event = ctypes.cast(data, ctypes.POINTER(_Event)).contents
        if event.kind == EVENT_EXEC:
            self._pending.execs.append(event.tgid)
        elif event.kind == EVENT_FORK:
            if self._forks_known:
                self._pending.forks.append((event.tgid, event.parent))
        elif event.kind == EVENT_EXIT:
            self._pending.exits.append(event.tgid)

    def drain(self) -> ProcEvents:
        """The records since the last drain (see ProcEvents)."""
        if self._bpf is None:
            return ProcEvents()
        self._bpf.ring_buffer_consume()
        events, self._pending = self._pending, ProcEvents()
        events.forks_known = self._forks_known
        dropped_total = int(self._bpf[b"exec_dropped"][ctypes.c_int(0)].value)
        events.dropped = dropped_total > self._dropped_seen
        self._dropped_seen = dropped_total
        return events

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
