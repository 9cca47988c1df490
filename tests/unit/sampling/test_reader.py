"""The ring buffer reader's record of the first sample (overhead.json's first_sample_at)."""

from __future__ import annotations

import os
import threading

from profiler.sampling.reader import RingReader, first_sample_of


class NoRing:
    def ring_buffer_consume(self) -> None:
        pass


class Jvms:
    namers: dict[int, object] = {}

    def poll_unloads(self) -> None:
        pass


class Symbols:
    def epoch_at(self, tgid: int, time_ns: int) -> int:
        return 0


class Store:
    def __init__(self) -> None:
        self.added: list[int] = []

    def add(self, tgid: int, tid: int, comm: bytes, time_ns: int, *rest: object) -> None:
        self.added.append(time_ns)


def record(time_ns: int) -> tuple:
    return (7, 7, time_ns, b"java", b"", b"", 0, 0)


def reader(store: Store) -> RingReader:
    return RingReader(
        NoRing(), store, Jvms(), Symbols(), None, walker=True, max_stack_depth=127,  # type: ignore[arg-type]
        file_lock=threading.Lock(), maps_lock=threading.Lock(),
    )  # fmt: skip


def test_the_first_drain_with_samples_keeps_the_earliest_kernel_time_and_the_agents_cpu() -> None:
    store = Store()
    ring = reader(store)
    ring.drain()
    assert ring.first_sample is None  # an empty drain is no first sample
    ring.pending = [record(5_000), record(3_000), record(9_000)]
    cpu = sum(os.times()[:2])
    ring.drain()
    assert ring.first_sample is not None
    first_ns, agent_cpu = ring.first_sample
    assert first_ns == 3_000 and cpu <= agent_cpu <= cpu + 1.0
    assert store.added == [5_000, 3_000, 9_000]
    # a later drain does not move it
    ring.pending = [record(1_000)]
    ring.drain()
    assert ring.first_sample[0] == 3_000


def test_first_sample_of_is_the_minimum_time() -> None:
    assert first_sample_of([record(4), record(2), record(8)])[0] == 2
