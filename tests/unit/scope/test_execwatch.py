"""The process watcher's records as user space reads them (no BPF: the ring buffer's callback fed by hand)."""

from __future__ import annotations

import ctypes

import pytest

from profiler.scope.execwatch import EVENT_EXEC, EVENT_EXIT, EVENT_FORK, ExecWatcher, _Event, bpf_source


def feed(watcher: ExecWatcher, kind: int, tgid: int, parent: int = 0, size: int | None = None) -> None:
    event = _Event(kind, tgid, parent)
    watcher._on_event(None, ctypes.addressof(event), ctypes.sizeof(event) if size is None else size)


class DropCounter:
    """bcc's one-entry array exec_dropped, indexed by a ctypes int."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __getitem__(self, index: ctypes.c_int) -> ctypes.c_uint64:
        assert index.value == 0
        return ctypes.c_uint64(self.value)


class FakeBpf:
    """What drain() asks of bcc's BPF: consume the ring buffer (done by the feeds) and read the drop counter."""

    def __init__(self) -> None:
        self.dropped = 0

    def ring_buffer_consume(self) -> None:
        pass

    def __getitem__(self, name: bytes) -> DropCounter:
        assert name == b"exec_dropped"
        return DropCounter(self.dropped)


@pytest.mark.parametrize("forks_known", [True, False])
def test_records_are_sorted_by_kind_and_forks_kept_only_when_usable(forks_known: bool) -> None:
    watcher = ExecWatcher()
    watcher._forks_known = forks_known
    bpf = FakeBpf()
    watcher._bpf = bpf
    feed(watcher, EVENT_FORK, 200, 100)
    feed(watcher, EVENT_EXEC, 200)
    feed(watcher, EVENT_EXIT, 150)
    feed(watcher, EVENT_EXEC, 999, size=4)  # a short record (an older program's layout) is not read
    events = watcher.drain()
    assert events.execs == [200] and events.exits == [150] and not events.dropped
    assert events.forks == ([(200, 100)] if forks_known else []) and events.forks_known is forks_known
    # THEN a drain takes the records once; a rise of the drop counter says a rescan is due, once
    bpf.dropped = 3
    again = watcher.drain()
    assert (again.execs, again.forks, again.exits, again.dropped) == ([], [], [], True)
    assert watcher.drain().dropped is False
    watcher._bpf = None


def test_the_program_text_has_its_ring_size_and_the_three_tracepoints() -> None:
    text = bpf_source()
    assert "RINGBUF_PAGES" not in text
    for tracepoint in ("sched_process_exec", "sched_process_fork", "sched_process_exit"):
        assert f"RAW_TRACEPOINT_PROBE({tracepoint})" in text
