"""JavaThreadWatch (profiler/sampling/offcpu_java.py) without a JVM: the BPF maps are dicts that count
their writes (a fake in addition to the real JVMs of tests/integration/test_offcpu.py). A refresh writes
only the threads that changed, and a namer borrowed from the sampler is used, never closed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from profiler.sampling import offcpu_java
from profiler.sampling.offcpu_java import JavaThreadWatch
from profiler.unwind.javathreads import ThreadLayout

LAYOUT = ThreadLayout(
    thread_list=0x1000, list_length=8, list_threads=16, osthread=0x100, thread_id=0x10, last_java_sp=0x200,
    last_java_pc=0x208, last_java_fp=0x210, pending_monitor=0x300, waiting_monitor=0x308,
    interpreter=(0x7000, 0x8000), method_slot=-24,
)  # fmt: skip


class CountingTable(dict):  # type: ignore[type-arg]
    """A bcc table stand-in: keys and values are ctypes, stored as ints; every write counted."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def Leaf(self) -> Any:
        return SimpleNamespace()

    def __setitem__(self, key: Any, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key.value, getattr(value, "value", value))

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key.value)


class FakeMemory:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def jvm(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    threads = {11: 0xA000, 12: 0xB000}
    monkeypatch.setattr(offcpu_java, "thread_layout", lambda _layout: LAYOUT)
    monkeypatch.setattr(offcpu_java, "read_java_threads", lambda _memory, _layout: dict(threads))
    monkeypatch.setattr(offcpu_java, "host_tids", lambda _pid: None)
    return threads


def test_a_refresh_writes_only_what_changed_and_a_borrowed_namer_stays_open(jvm: dict[int, int]) -> None:
    # GIVEN a watch that borrows the sampler's namer of a JVM with two threads
    namer = SimpleNamespace(memory=FakeMemory(), layout=object())
    bpf = {b"java_layouts": CountingTable(), b"java_threads": CountingTable()}
    watch = JavaThreadWatch(bpf, borrow=lambda pid: namer if pid == 42 else None)
    assert watch.attach(42)
    threads = bpf[b"java_threads"]
    assert dict(threads) == jvm and threads.writes == 2
    # WHEN it refreshes with nothing changed, then with a thread gone and one new
    watch._refresh_pid(42)
    assert threads.writes == 2  # no rewrite of the unchanged entries
    del jvm[11]
    jvm[13] = 0xC000
    watch._refresh_pid(42)
    # THEN only the new thread was written and the gone one deleted
    assert dict(threads) == {12: 0xB000, 13: 0xC000} and threads.writes == 3
    # AND the view of a thread it does not know is the kernel's only
    assert watch.view_for(42)(99) == (0, 0) and watch.view_for(7)(12) == (0, 0)
    # AND the borrowed namer is the sampler's to close
    watch.detach(42)
    watch.close()
    assert not namer.memory.closed and dict(threads) == {}


def test_a_namer_the_watch_opened_is_closed_by_it(jvm: dict[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    namer = SimpleNamespace(memory=FakeMemory(), layout=object())
    monkeypatch.setattr(offcpu_java, "open_namer", lambda _pid: namer)
    watch = JavaThreadWatch(
        {b"java_layouts": CountingTable(), b"java_threads": CountingTable()}, borrow=lambda _p: None
    )
    assert watch.attach(42)
    watch.close()
    assert namer.memory.closed
