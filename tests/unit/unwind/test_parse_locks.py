"""One target's slow or crafted parse holds up only itself (profiler/unwind/keylocks.py): the CFI loader locks
per process and per mapped file, the JVM names per JVM; each file and JVM is still parsed once however many
workers ask for it at once. Fakes stand for the files and JVMs; events, never sleeps, order the threads."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from profiler.files import procread
from profiler.unwind import cfi, hotspot
from profiler.unwind.hotspot import JvmNames, MethodNamer
from profiler.unwind.keylocks import KeyLocks

WAIT = 10.0  # seconds a test waits for an event before it fails (a hang, never a pass)


class _Gates:
    """Per key: set when a parse of it begins, and the gate it waits at (keys without one pass at once)."""

    def __init__(self, *blocked: str) -> None:
        self.began: dict[str, threading.Event] = {}
        self.gates = {key: threading.Event() for key in blocked}
        self.parsed: Counter[str] = Counter()
        self._lock = threading.Lock()

    def parse(self, key: str) -> None:
        with self._lock:
            self.parsed[key] += 1
            began = self.began.setdefault(key, threading.Event())
        began.set()
        gate = self.gates.get(key)
        if gate is not None:
            assert gate.wait(WAIT), f"{key}'s gate never opened"

    def wait_began(self, key: str) -> None:
        with self._lock:
            began = self.began.setdefault(key, threading.Event())
        assert began.wait(WAIT), f"{key}'s parse never began"


class _GatedLoader(cfi.CfiLoader):
    """A CfiLoader whose mapped files are names and whose parse waits at the name's gate."""

    def __init__(self, gates: _Gates, arrived: Callable[[str], None] = lambda path: None) -> None:
        super().__init__({b"cfi_mappings": None})  # no table has segments: nothing is written to the trie
        self._gates = gates
        self._arrived = arrived

    @contextmanager
    def _mapped_file(self, pid: int, mapping: cfi.ExecMapping) -> Iterator[tuple[tuple[Any, ...], cfi.ElfReader]]:
        self._arrived(mapping.path)
        yield ("file", mapping.path), lambda: None  # type: ignore[return-value, arg-type]

    def _parse(self, key: tuple[Any, ...], path: str, info: Any) -> cfi.ElfTable:
        self._gates.parse(path)
        return cfi.ElfTable(key, path)


@pytest.fixture
def maps_of(monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """pid -> the one file its fake /proc/PID/maps maps executable."""
    paths: dict[int, str] = {}

    def fake_maps(pid: int, root: str = "/proc") -> procread.Maps:
        line = f"7f0000000000-7f0000001000 r-xp 00000000 08:01 42 {paths[pid]}\n".encode()
        return procread.Maps(pid, root, chunks=[line])

    monkeypatch.setattr(procread, "maps", fake_maps)
    return paths


def _started(target: Callable[[], object]) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        target()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_a_blocked_load_of_one_process_leaves_another_process_loading(maps_of: dict[int, str]) -> None:
    # GIVEN pid 1 whose file's parse hangs (a crafted .eh_frame, a slow file system)
    gates = _Gates("/hostile.so")
    loader = _GatedLoader(gates)
    maps_of.update({1: "/hostile.so", 2: "/honest.so"})
    hostile, hostile_done = _started(lambda: loader.load_pid(1))
    gates.wait_began("/hostile.so")
    # WHEN pid 2 is loaded meanwhile, THEN its table is built while pid 1's parse still hangs
    _honest, honest_done = _started(lambda: loader.load_pid(2))
    assert honest_done.wait(WAIT), "pid 2's load waited for pid 1's parse"
    assert not hostile_done.is_set() and gates.parsed == Counter({"/hostile.so": 1, "/honest.so": 1})
    # and the refresh worker skips the process being loaded instead of queueing behind it
    assert loader.load_pid(1, wait=False) is True and gates.parsed["/hostile.so"] == 1
    gates.gates["/hostile.so"].set()
    hostile.join(WAIT)
    assert hostile_done.is_set() and set(loader.tables) == {("file", "/hostile.so"), ("file", "/honest.so")}


def test_a_file_mapped_by_many_processes_is_parsed_once_when_they_load_together(maps_of: dict[int, str]) -> None:
    # GIVEN four processes mapping one libjvm.so, loaded by four workers at once; the first parse held at its
    # gate until the other three have the file's identity in hand (they then wait for its lock, or, unlocked,
    # would find no table and parse it again)
    pids = (11, 12, 13, 14)
    arrivals = threading.Semaphore(0)
    gates = _Gates("/libjvm.so")
    loader = _GatedLoader(gates, arrived=lambda path: arrivals.release())
    maps_of.update(dict.fromkeys(pids, "/libjvm.so"))
    first, _ = _started(lambda: loader.load_pid(pids[0]))
    gates.wait_began("/libjvm.so")
    others = [_started(lambda pid=pid: loader.load_pid(pid))[0] for pid in pids[1:]]
    for _ in pids:
        assert arrivals.acquire(timeout=WAIT)
    # WHEN the parse ends
    gates.gates["/libjvm.so"].set()
    for thread in (first, *others):
        thread.join(WAIT)
        assert not thread.is_alive()
    # THEN it ran once, and every process got that one table
    assert gates.parsed == Counter({"/libjvm.so": 1}) and len(loader.tables) == 1
    assert len(loader._file_locks) == 0 and len(loader._pid_locks) == 0  # nothing kept once nobody waits


def test_tables_reserve_disjoint_rows_and_pages_in_any_order() -> None:
    # two tables of 3 and 2 rows: the second's page entries name its own rows (after the first's)
    pages = cfi.page_index([0x1000, 0x1010, 0x1120], 0)
    assert cfi.rebased(pages, 7) == cfi.page_index([0x1000, 0x1010, 0x1120], 7)


# ---------------------------------------------------------------- JVM names


@pytest.fixture
def namers(monkeypatch: pytest.MonkeyPatch) -> _Gates:
    """open_namer replaced: JVM N's vmStructs are read through gate "N" (only the gates made are waited at)."""
    gates = _Gates("1", "3")

    def fake_open_namer(pid: int) -> MethodNamer:
        gates.parse(str(pid))
        return MethodNamer(None, SimpleNamespace(code_cache=None))  # type: ignore[arg-type]

    monkeypatch.setattr(hotspot, "open_namer", fake_open_namer)
    return gates


def test_a_jvm_whose_vmstructs_read_hangs_leaves_other_jvms_attaching(namers: _Gates) -> None:
    jvms = JvmNames(lambda pid, layout, address: None)
    hostile, hostile_done = _started(lambda: jvms.attach(1))
    namers.wait_began("1")
    _honest, honest_done = _started(lambda: jvms.attach(2))
    assert honest_done.wait(WAIT), "JVM 2's attach waited for JVM 1's"
    assert not hostile_done.is_set() and set(jvms.namers) == {2}
    namers.gates["1"].set()
    hostile.join(WAIT)
    assert hostile_done.is_set() and set(jvms.namers) == {1, 2}


def test_one_jvm_attached_by_two_workers_at_once_is_read_once(namers: _Gates) -> None:
    # GIVEN the first attach of JVM 3 held inside its vmStructs read, and a second one called meanwhile
    jvms = JvmNames(lambda pid, layout, address: None)
    first, _ = _started(lambda: jvms.attach(3))
    namers.wait_began("3")
    calling = threading.Event()
    second, _ = _started(lambda: (calling.set(), jvms.attach(3)))
    assert calling.wait(WAIT)
    # WHEN the read ends, THEN the second found the namer the first made instead of reading again
    namers.gates["3"].set()
    for thread in (first, second):
        thread.join(WAIT)
        assert not thread.is_alive()
    assert namers.parsed == Counter({"3": 1}) and set(jvms.namers) == {3}


def test_key_locks_exclude_holders_of_one_key_only() -> None:
    locks = KeyLocks()
    with locks.hold("a") as held_a, locks.hold("b") as held_b:
        assert held_a and held_b and len(locks) == 2
        with locks.hold("a", blocking=False) as again:
            assert again is False
    assert len(locks) == 0
