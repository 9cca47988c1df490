"""One lock per key (a process, a mapped file), so that one target's slow or crafted parse holds up only the
callers that want the same thing, never another target's. Entries live only while someone holds or waits for
them: memory follows the callers at once, not the keys ever seen."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager


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
