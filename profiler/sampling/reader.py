"""The ring buffer's reader: a thread that drains the BPF ring buffer every READ_PERIOD seconds (no
wake-up per sample) and files each sample into the stack store under its thread's name at its time, in
the epoch that names it (perf-map version, JVM's generation of names)."""

from __future__ import annotations

import ctypes as ct
import os
import struct
import threading
from collections import Counter
from typing import Any

from ..capture.stackstore import (
    INTERPRETED_TAG,
    NO_UNLOADS,
    TAG_MASK,
    SampleRecord,
    StackStore,
    join_epoch,
    parse_record,
    parse_walk_record,
    walk_record_python,
)
from ..scope.threadwatch import ThreadWatch
from ..symbols.symbolprep import SymbolPreparer
from ..unwind.codecache import COMPILED_TAG
from ..unwind.cpython import PythonTargets
from ..unwind.hotspot import JvmNames
from .program import walk_slots

READ_PERIOD = 0.2  # seconds between ring-buffer drains


def tagged_frames(user: bytes) -> tuple[list[int], list[int]]:
    """A walker stack's interpreted frames' Method* pointers, and its compiled frames' stored values (pc
    and compile id under COMPILED_TAG)."""
    values = struct.unpack(f"<{len(user) // 8}Q", user)
    methods = [value & ~TAG_MASK for value in values if value & TAG_MASK == INTERPRETED_TAG]
    return methods, [value for value in values if value & TAG_MASK == COMPILED_TAG]


def first_sample_of(records: list[SampleRecord]) -> tuple[int, float]:
    """The earliest of ``records``' kernel times, and the agent's own CPU seconds now (user + system, every
    thread)."""
    times = os.times()
    return min(record[2] for record in records), times.user + times.system


class RingReader:
    """Drains ``bpf``'s ring buffer ``samples`` into ``store`` from its own thread.

    ``file_lock`` is held while samples are filed (checkpoint() and name_batch() take the store's deltas
    under it); ``maps_lock`` while the ring buffer is consumed (bcc's objects are not thread-safe: the
    preparation workers publish JVMs into the same BPF object under it).
    """

    def __init__(
        self,
        bpf: Any,
        store: StackStore,
        jvms: JvmNames,
        symbols: SymbolPreparer,
        names: ThreadWatch | None,
        *,
        walker: bool,
        max_stack_depth: int,
        file_lock: threading.Lock,
        maps_lock: threading.Lock,
        pythons: PythonTargets | None = None,
    ) -> None:
        self._bpf = bpf
        self._store = store
        self._jvms = jvms
        self._symbols = symbols
        self._names = names
        self._walker = walker
        self._pythons = pythons  # CPython frames spliced into the walker's stacks (profiler/unwind/cpython.py)
        self._max_stack_depth = max_stack_depth
        self._walk_slots = walk_slots(max_stack_depth)
        self._file_lock = file_lock
        self._maps_lock = maps_lock
        self.pending: list[SampleRecord] = []
        self.kernel_named: Counter[int] = Counter()  # samples per tgid named by the comm only
        self.errors = 0  # records that could not be parsed or filed
        # the first drain that held samples: the earliest one's kernel time (CLOCK_MONOTONIC ns, bpf_ktime_get_ns)
        # and the agent's CPU seconds (all its threads) at that drain, up to READ_PERIOD after the sample
        self.first_sample: tuple[int, float] | None = None
        self._callback: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Open the ring buffer and start the thread that drains it."""
        self._callback = self._on_sample  # keep a reference: bcc holds only a C pointer
        with self._maps_lock:
            self._bpf[b"samples"].open_ring_buffer(self._callback)
        self._thread = threading.Thread(target=self._read_loop, name="ringbuf-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, then drain whatever arrived after its last period. Idempotent."""
        if self._thread is not None:
            self.halt()
            self.drain()

    def halt(self) -> None:
        """End the thread without a last drain (close(), after any failure)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _read_loop(self) -> None:
        while not self._stop.wait(READ_PERIOD):
            self.drain()

    def _on_sample(self, _ctx: Any, data: Any, size: int) -> int:
        try:
            record = ct.string_at(data, size)
            if self._walker:
                sample = parse_walk_record(record, *self._walk_slots)
                if self._pythons is not None and isinstance(sample[4], bytes) and sample[0] in self._pythons.namers:
                    _status, python = walk_record_python(record)
                    sample = (*sample[:4], self._pythons.splice(sample[0], sample[4], python), *sample[5:])  # type: ignore[assignment]
                self.pending.append(sample)
            else:
                self.pending.append((*parse_record(record, self._max_stack_depth), 0, NO_UNLOADS))
        except Exception:  # noqa: BLE001 - a bad record must not stop the drain; counted
            self.errors += 1
        return 0

    def drain(self) -> None:
        """Samples first, then thread renames, then file the samples: a rename precedes its thread's
        later samples in time, so it is in the second drain whenever the sample is in the first.
        Samples of a process whose names jcmd is still reading wait for them (a few seconds at most)."""
        with self._maps_lock:
            self._bpf.ring_buffer_consume()
        names = self._names
        awaiting: frozenset[int] = frozenset()
        if names is not None:
            awaiting = names.awaiting()
            names.drain()
        pending, self.pending = self.pending, []
        if pending and self.first_sample is None:
            self.first_sample = first_sample_of(pending)
        with self._file_lock:
            for record in pending:
                if record[0] in awaiting:
                    self.pending.append(record)
                    continue
                try:
                    self._file(record, names)
                except Exception:  # noqa: BLE001 - a bad record must not stop the drain; counted
                    self.errors += 1
        self._jvms.poll_unloads()

    def _file(self, record: SampleRecord, names: ThreadWatch | None) -> None:
        """Count one sample under its thread's name at its time (kind in the stack, context beside it), in the
        epoch that names it (perf-map version, JVM's generation of names)."""
        tgid, tid, time_ns, comm, user, kernel, walk_end, unloads = record
        generation = 0
        if isinstance(user, bytes) and tgid in self._jvms.namers:
            generation = self._jvms.generation_of(tgid, time_ns, unloads)
            if self._jvms.first_in_generation(tgid, generation, user):
                self._jvms.note_stack(tgid, *tagged_frames(user))
        if self._pythons is not None and isinstance(user, bytes):
            self._pythons.note(tgid, user)  # the code objects read while they live
        epoch = join_epoch(self._symbols.epoch_at(tgid, time_ns), generation)
        context = None
        if names is not None:
            label = names.label(tgid, tid, time_ns, comm)
            comm, context = label.kind_bytes, label.context
            if not label.full:
                self.kernel_named[tgid] += 1
        self._store.add(tgid, tid, comm, time_ns, user, kernel, epoch, walk_end, context)
