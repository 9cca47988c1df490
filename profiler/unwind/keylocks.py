"""One lock per key (a process, a mapped file), so that one target's slow or crafted parse holds up only the
callers that want the same thing, never another target's. Entries live only while someone holds or waits for
them: memory follows the callers at once, not the keys ever seen."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

N = TypeVar("N")


class KeyLocks:
    """``with locks.hold(key):`` excludes the other holders of ``key`` only."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # held for dict updates only, never across a caller's work
        self._entries: dict[Hashable, tuple[threading.Lock, int]] = {}  # key -> (its lock, holders and waiters)

    def _enter(self, key: Hashable) -> threading.Lock:
        with self._guard:
            lock, users = self._entries.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._entries[key] = (lock, users + 1)
            return lock

    def _leave(self, key: Hashable) -> None:
        with self._guard:
            lock, users = self._entries[key]
            if users == 1:
                del self._entries[key]
            else:
                self._entries[key] = (lock, users - 1)

    @contextmanager
    def hold(self, key: Hashable, blocking: bool = True) -> Iterator[bool]:
        """Hold ``key``'s lock for the block; yields False (the block runs without it) when ``blocking`` is
        False and someone else holds it."""
        lock = self._enter(key)
        try:
            acquired = lock.acquire(blocking)
            try:
                yield acquired
            finally:
                if acquired:
                    lock.release()
        finally:
            self._leave(key)

    def __len__(self) -> int:
        """Keys held or waited for now."""
        with self._guard:
            return len(self._entries)


class AttachedProcesses(Generic[N]):
    """Per-process namers (a JVM's, a CPython's), each opened at most once: ``attach`` holds that process's lock,
    never one for all, so a process whose memory or files are slow or crafted holds up only itself; a process
    that cannot be opened has its reason in ``errors``. Subclasses write ``_attach`` (open, publish, keep)."""

    def __init__(self) -> None:
        self.namers: dict[int, N] = {}
        self.errors: dict[int, str] = {}  # pid -> why it has no namer
        self._lock = threading.Lock()  # the tables only, never across an open
        self._attach_locks = KeyLocks()

    def attach(self, pid: int) -> bool:
        """Open ``pid``'s namer and publish what the walker needs; False (reason in errors) when it cannot."""
        with self._attach_locks.hold(pid):
            with self._lock:
                if pid in self.namers:
                    return True
            return self._attach(pid)

    def _attach(self, pid: int) -> bool:
        raise NotImplementedError

    def _open(self, pid: int, opener: Callable[[int], N], refused: type[Exception]) -> N | None:
        """``opener(pid)``, or None with the reason in ``errors`` when the process is not one we can read."""
        try:
            return opener(pid)
        except (refused, OSError) as exc:
            self.errors[pid] = str(exc)
            return None
