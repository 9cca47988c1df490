"""Distinct raw stacks and their counts per timeline interval and perf-map epoch (pure, no I/O).

The ring-buffer sampler hands every sample here as it drains the buffer; this is the only place that
grows with the window, and it grows with the number of distinct stacks, not with the number of
samples: each distinct (process, thread kind, user addresses, kernel addresses) is stored once
(address tuples interned as bytes; the thread id is not kept: threads of one pool share their stacks,
and the folded output names threads by name), and a sample adds one to a counter keyed by one int
packing (stack, interval, epoch, context). An *epoch* is what names the addresses: the perf-map version
(low 16 bits) and, for a JVM walked by the HotSpot unwinder, the generation of its Method* names
(high 16 bits, profiler/unwind/hotspot.py): samples of one stored stack in two epochs may name other
frames. The thread *kind* is the stable part of the
thread's name (profiler/scope/threadnames.py); a name that carries a unit of work (a Spark task) is the
sample's *context*, interned once and counted beside the stack, never part of it: a window of 20,000
tasks still has the distinct stacks of one.

Deep stacks do not cost their depth each: a user stack longer than CHUNK_FRAMES is kept as a tuple of
interned chunks of CHUNK_FRAMES frames counted from the root, so stacks that differ only near the leaf
(the usual case: one thread's root frames under many leaves) share every chunk but the leaf-most.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from .format import SamplerStats
from .packedchunks import PackedChunks
from .stacktable import StackTable, table_from_folded

# struct sample_t of profiler/sampling/stack_ringbuf.c: tgid, tid, time_ns, user_bytes, kernel_bytes, comm[16].
RECORD_HEADER = struct.Struct("<IIQii16s")

# struct sample_t of profiler/sampling/stack_walk.c: the same header, then user frames walked, why the walk
# ended, the JVM's unloaded-class count at the sample, then the CPython frames after the kernel frames and
# the CPython walk's status (profiler/unwind/python_step.h).
WALK_HEADER = struct.Struct("<IIQii16sIIQII")
NO_UNLOADS = -1  # a sample without its JVM's unloaded-class count (not a JVM, or no hsperfdata)
_U64_MAX = (1 << 64) - 1

# A stored user frame of the walker: a pc, an interpreted Java frame's Method* with the top bit set, or (put
# here in parse_walk_record) the count of frames cut from the middle of a too-deep stack with the two top bits.
INTERPRETED_TAG = 1 << 63
GAP_TAG = 3 << 62
TAG_MASK = 3 << 62
# A CPython frame spliced in by profiler/unwind/cpython.py: the three top bits set (a gap's count never
# reaches bit 61), its instruction index in bits 47..60, its code object's address in bits 0..46.
PYTHON_TAG = 7 << 61
PYTHON_MASK = 7 << 61

# Why the walker stopped (WALK_* in profiler/sampling/stack_walk.c): the cause a cut stack is counted under.
WALK_ENDS = (
    "root",
    "depth limit",
    "unreadable frame pointer",
    "frame pointer below the stack pointer",
    "CFI step failed",
    "HotSpot step failed",
)

# Causes of a stack cut (SamplerStats.stacks_cut): the symbolizer and the CFI tables name them.
CUT_DEPTH = "depth limit (middle frames cut)"
CUT_DEPTH_LEAF = "depth limit (root end cut)"
CUT_NATIVE = "ended at a native frame"
CUT_JAVA = "ended at a Java frame"
CUT_CFI = "CFI step failed"
CUT_HOTSPOT = "HotSpot step failed (JIT frame without a blob or return address)"
CUT_NO_CFI = "ended at a native frame of an ELF without .eh_frame"  # CUT_NATIVE told apart by profiler/unwind/cfi.py
CUT_CFI_MISS = "ended at a native frame no FDE of its ELF covers"

# A stack is its raw addresses (8-byte little-endian each), or a negative errno when the walk failed.
RawStack = bytes | int
# One parsed ring-buffer record: tgid, tid, time_ns, comm, user, kernel, walk end, JVM unloads (NO_UNLOADS).
SampleRecord = tuple[int, int, int, bytes, RawStack, RawStack, int, int]
# As stored: a deep user stack is a tuple of chunks (leaf-most first; joined, the raw addresses).
StoredStack = bytes | int | tuple[bytes, ...]
CHUNK_FRAMES = 32
CHUNK_BYTES = 8 * CHUNK_FRAMES
ChunkFinder = Callable[[bytes], tuple[bytes, bool]]  # a chunk -> (its stored form, whether it is new)
RECENT_STACKS = 4096  # deep stacks a packed store finds again by one hash (~0.7 MB at most)


def _chunk_addresses(
    stored: bytes | tuple[bytes, ...], expand: Callable[[bytes], bytes], memo: dict[bytes, bytes]
) -> list[bytes]:
    """Each packed chunk of a user stack as ``expand`` gives its addresses, in order; a chunk already in
    ``memo`` is not expanded again (the deep stacks of a window share their root-side chunks)."""
    chunks = []
    for chunk in (stored,) if isinstance(stored, bytes) else stored:
        addresses = memo.get(chunk)
        if addresses is None:
            addresses = memo[chunk] = expand(chunk)
        chunks.append(addresses)
    return chunks


def _chunk_parts(raw: bytes) -> list[bytes]:
    """A deep stack's chunks, leaf-most first, counted from the root: the leaf-most one may be shorter."""
    head = len(raw) % CHUNK_BYTES
    parts = [raw[:head]] if head else []
    parts.extend(raw[at : at + CHUNK_BYTES] for at in range(head, len(raw), CHUNK_BYTES))
    return parts


def stack_bytes(stored: bytes | tuple[bytes, ...]) -> bytes:
    """The raw addresses of a stored stack."""
    return stored if isinstance(stored, bytes) else b"".join(stored)


@dataclass(frozen=True, slots=True)
class StackKey:
    tgid: int
    comm: bytes
    user: StoredStack
    kernel: StoredStack  # STACK_NONE in user mode
    walk_end: int = 0  # the walker's WALK_ENDS index (0: root, also for bpf_get_stack's stacks)


# Counter keys pack (stack id, context id, interval, epoch) into one int: a tuple per entry would cost
# ~100 bytes more. Context 0 is "none".
EPOCH_BITS = 32
_PERF_EPOCH_BITS = 16


def join_epoch(perf_map_epoch: int, names_generation: int) -> int:
    """One epoch of a perf-map version and a JVM's generation of names (each saturating at 16 bits)."""
    top = (1 << _PERF_EPOCH_BITS) - 1
    return min(names_generation, top) << _PERF_EPOCH_BITS | min(perf_map_epoch, top)


def split_epoch(epoch: int) -> tuple[int, int]:
    """(perf-map version, generation of names) of an epoch."""
    return epoch & ((1 << _PERF_EPOCH_BITS) - 1), epoch >> _PERF_EPOCH_BITS


INTERVAL_BITS = 24
CONTEXT_BITS = 24
_CONTEXT_SHIFT = INTERVAL_BITS + EPOCH_BITS
_KEY_SHIFT = CONTEXT_BITS + _CONTEXT_SHIFT


def pack_count_key(key_id: int, context_id: int, interval: int, epoch: int) -> int:
    return (key_id << _KEY_SHIFT) | (context_id << _CONTEXT_SHIFT) | (interval << EPOCH_BITS) | epoch


def unpack_count_key(packed: int) -> tuple[int, int, int, int]:
    """(key id, context id, interval, epoch) of a packed counter key."""
    return (
        packed >> _KEY_SHIFT,
        (packed >> _CONTEXT_SHIFT) & ((1 << CONTEXT_BITS) - 1),
        (packed >> EPOCH_BITS) & ((1 << INTERVAL_BITS) - 1),
        packed & ((1 << EPOCH_BITS) - 1),
    )


@dataclass(frozen=True)
class FreshChunks:
    """What StackStore.take_fresh hands the native-name batches."""

    stacks: int  # distinct stacks stored since the last take
    chunks: tuple[tuple[int, bytes], ...]  # (tgid, user-stack chunk stored for the first time)


@dataclass(frozen=True)
class StoreDelta:
    """What a StackStore gained since the last delta was taken (the checkpoint journal's stack part)."""

    keys: tuple[tuple[int, StackKey], ...] = ()  # (key id, key) first seen since
    contexts: tuple[tuple[int, str], ...] = ()  # (context id, full thread name) first seen since
    counts: tuple[tuple[int, int, int], ...] = ()  # (tgid, packed counter key, samples added)

    @property
    def samples(self) -> int:
        return sum(count for _tgid, _packed, count in self.counts)


def parse_record(record: bytes, user_depth: int) -> tuple[int, int, int, bytes, RawStack, RawStack]:
    """(tgid, tid, time_ns, comm, user, kernel) of one ring-buffer record.

    The user array (``user_depth`` frames) follows the header; the kernel array follows the user
    array's full size. A stack is the bytes the kernel wrote, or its negative errno (STACK_NONE for
    no kernel stack).
    """
    tgid, tid, time_ns, user_bytes, kernel_bytes, comm = RECORD_HEADER.unpack_from(record)
    user_at = RECORD_HEADER.size
    kernel_at = user_at + 8 * user_depth
    user: RawStack = record[user_at : user_at + user_bytes] if user_bytes >= 0 else user_bytes
    kernel: RawStack = record[kernel_at : kernel_at + kernel_bytes] if kernel_bytes >= 0 else kernel_bytes
    return tgid, tid, time_ns, comm.split(b"\0", 1)[0], user, kernel


def walk_order(user: bytes, walked: int, leaf_slots: int, root_slots: int) -> bytes:
    """A walker record's stored frames (``walked`` walked into ``leaf_slots`` + a ring of ``root_slots``) in
    walk order, with one GAP_TAG frame between leaf and root saying how many frames were cut."""
    slots = leaf_slots + root_slots
    if walked <= slots:
        return user
    ring = user[8 * leaf_slots :]
    start = 8 * ((walked - leaf_slots) % root_slots)
    gap = struct.pack("<Q", GAP_TAG | (walked - slots))
    return user[: 8 * leaf_slots] + gap + ring[start:] + ring[:start]


def parse_walk_record(record: bytes, leaf_slots: int, root_slots: int) -> SampleRecord:
    """(tgid, tid, time_ns, comm, user, kernel, walk end, JVM unloads) of one record of the walker; the
    last is the JVM's count of unloaded classes at the sample, or NO_UNLOADS.

    User frames come first, the kernel's right after them. A walk longer than the slots kept the
    ``leaf_slots`` leaf-most frames in order and the last ``root_slots`` in a ring: they are put back in
    walk order here, with one GAP_TAG frame between leaf and root saying how many frames were cut.
    """
    tgid, tid, time_ns, user_bytes, kernel_bytes, comm, walked, walk_end, unloads, _, _ = WALK_HEADER.unpack_from(
        record
    )
    user_at = WALK_HEADER.size
    user: RawStack = user_bytes
    kernel_at = user_at
    if user_bytes >= 0:
        kernel_at = user_at + user_bytes
        user = record[user_at:kernel_at]
        user = walk_order(user, walked, leaf_slots, root_slots)
    kernel: RawStack = record[kernel_at : kernel_at + kernel_bytes] if kernel_bytes >= 0 else kernel_bytes
    unloads = NO_UNLOADS if unloads == _U64_MAX else unloads
    return tgid, tid, time_ns, comm.split(b"\0", 1)[0], user, kernel, walk_end, unloads


def walk_record_python(record: bytes) -> tuple[int, tuple[int, ...]]:
    """(status, frames) of the CPython walk in one record of the walker (profiler/unwind/python_step.h): the
    frames as the BPF program stored them, leaf first, after the user and kernel frames."""
    fields = WALK_HEADER.unpack_from(record)
    user_bytes, kernel_bytes, count, status = fields[3], fields[4], fields[9], fields[10]
    if count == 0:
        return status, ()
    at = WALK_HEADER.size + max(0, user_bytes) + max(0, kernel_bytes)
    part = record[at : at + 8 * count]
    return status, struct.unpack(f"<{len(part) // 8}Q", part)


class StackStore:
    """Counts per process of (stack key, interval, epoch), fed one sample at a time."""

    def __init__(self, interval_ns: int) -> None:
        if interval_ns <= 0:
            raise ValueError("interval must be positive")
        self.interval_ns = interval_ns
        self.origin_ns: int | None = None  # monotonic time the window started; set by begin()
        self._chunks: dict[bytes, bytes] = {}  # interning: equal address runs share one object
        self._deep: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}  # equal deep stacks share one tuple
        self._keys: dict[StackKey, int] = {}
        self._key_list: list[StackKey] = []
        self._counts: dict[int, Counter[int]] = {}  # tgid -> packed (key id, context, interval, epoch) -> samples
        self._contexts: dict[str, int] = {}
        self._context_list: list[str | None] = [None]
        self.samples = 0
        # The checkpoint journal (profiler/capture/checkpoint.py): counts added since the last take_delta().
        self.track_deltas = False
        self._delta: Counter[tuple[int, int]] = Counter()  # (tgid, packed key) -> samples
        self._keys_taken = 0
        self._contexts_taken = 1
        # The batches that name native frames during the window (profiler/symbols/batches.py): the user-stack
        # chunks stored since the last take_fresh(), and the process of the stack that first held each. Each
        # chunk is handed out once, so the batches keep no set of the chunks they looked at.
        self.track_fresh = False
        self._fresh: list[bytes] = []
        self._fresh_owner = array("I")
        self._fresh_keys_taken = 0
        # ``packed`` (the sampler's window): user-stack chunks held as value ids (profiler/capture/packedchunks.py)
        # until end_window() turns them back into addresses for the post-run step.
        self._packed: PackedChunks | None = None
        self._recent: dict[int, tuple[int, tuple[bytes, ...]]] = {}  # hash of a deep stack -> (CRC-32, stored)

    def pack_user_stacks(self, chunks: PackedChunks | None = None) -> None:
        """Hold user stacks packed from now on (before the first sample)."""
        if self._key_list:
            raise RuntimeError("pack_user_stacks() after samples were stored")
        self._packed = chunks if chunks is not None else PackedChunks()

    def begin(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns

    def interval_of(self, time_ns: int) -> int:
        origin = self.origin_ns if self.origin_ns is not None else time_ns
        return max(0, (time_ns - origin) // self.interval_ns)

    def _intern(self, raw: RawStack, fresh: list[bytes] | None = None) -> tuple[StoredStack, bool]:
        """The stored form of ``raw`` and whether it is new; chunks stored for the first time are appended
        to ``fresh`` when given."""
        if isinstance(raw, int):
            return raw, False
        if len(raw) <= CHUNK_BYTES:
            return self._chunk(raw, self._find_chunk, fresh)
        parts = _chunk_parts(raw)
        known_deep = self._deep.get(tuple(parts))  # a tuple equals the stored one when its chunks are equal
        if known_deep is not None:
            return known_deep, False
        stored = self._stored_chunks(parts, self._find_chunk, fresh)
        self._deep[stored] = stored
        return stored, True

    def _find_chunk(self, part: bytes) -> tuple[bytes, bool]:
        """The interned chunk equal to ``part`` and whether it is new (an unpacked store's chunk finder)."""
        known = self._chunks.get(part)
        if known is None:
            known = self._chunks[part] = part
            return known, True
        return known, False

    @staticmethod
    def _chunk(part: bytes, find: ChunkFinder, fresh: list[bytes] | None) -> tuple[bytes, bool]:
        """``find``'s stored form of one chunk; a new one is appended to ``fresh`` when given."""
        found, new = find(part)
        if new and fresh is not None:
            fresh.append(part)
        return found, new

    @staticmethod
    def _stored_chunks(parts: list[bytes], find: ChunkFinder, fresh: list[bytes] | None) -> tuple[bytes, ...]:
        """The stored forms of a deep stack's chunks, in order (``_chunk`` of each, inlined: a hot loop)."""
        chunks = []
        for part in parts:
            found, new = find(part)
            if new and fresh is not None:
                fresh.append(part)
            chunks.append(found)
        return tuple(chunks)

    def _intern_user(self, raw: RawStack, fresh: list[bytes] | None = None) -> tuple[StoredStack, bool]:
        if self._packed is not None:
            return self._intern_packed(raw, self._packed, fresh)
        return self._intern(raw, fresh)

    def _intern_packed(
        self, raw: RawStack, packed: PackedChunks, fresh: list[bytes] | None
    ) -> tuple[StoredStack, bool]:
        """``_intern`` of a user stack held packed: the same chunks, each as its packed form."""
        if isinstance(raw, int):
            return raw, False
        if len(raw) % 8:
            raw = raw[: len(raw) - len(raw) % 8]  # no partial value (the walker writes whole ones)
        if len(raw) <= CHUNK_BYTES:
            return self._chunk(raw, packed.find, fresh)
        whole, crc = hash(raw), zlib.crc32(raw)  # a stack seen lately: no chunk looked up (the usual sample)
        recent = self._recent.get(whole)
        if recent is not None and recent[0] == crc:
            return recent[1], False
        stored = self._stored_chunks(_chunk_parts(raw), packed.find, fresh)
        known_deep = self._deep.get(stored)
        if len(self._recent) >= RECENT_STACKS:
            self._recent.clear()
        self._recent[whole] = (crc, known_deep or stored)
        if known_deep is not None:
            return known_deep, False
        self._deep[stored] = stored
        return stored, True

    def _expanded(self, stored: StoredStack, memo: dict[bytes, bytes]) -> StoredStack:
        """A packed user stack as addresses, its chunks interned in the store (``memo``: packed -> interned)."""
        packed = self._packed
        if packed is None or isinstance(stored, int):
            return stored

        def interned(chunk: bytes) -> bytes:
            raw = packed.expand(chunk)
            return self._chunks.setdefault(raw, raw)

        chunks = _chunk_addresses(stored, interned, memo)
        return chunks[0] if isinstance(stored, bytes) else tuple(chunks)

    def end_window(self) -> None:
        """The window is over: no more batches, and packed user stacks turned back into addresses (the same
        chunks and tuples a store that never packed holds; key ids unchanged)."""
        self.stop_fresh()
        if self._packed is None:
            return
        memo: dict[bytes, bytes] = {}
        deep: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}
        keys = []
        for key in self._key_list:
            user = self._expanded(key.user, memo)
            if isinstance(user, tuple):
                user = deep.setdefault(user, user)
            keys.append(StackKey(key.tgid, key.comm, user, key.kernel, key.walk_end))
        self._packed, self._deep, self._key_list, self._recent = None, deep, keys, {}
        self._keys = {key: key_id for key_id, key in enumerate(keys)}

    def _context_id(self, context: str | None) -> int:
        if context is None:
            return 0
        found = self._contexts.get(context)
        if found is None:
            found = len(self._context_list)
            if found >= 1 << CONTEXT_BITS:
                return 0  # 16 million units of work: beyond that samples keep their stacks, not their context
            self._contexts[context] = found
            self._context_list.append(context)
        return found

    def add(
        self,
        tgid: int,
        tid: int,
        comm: bytes,
        time_ns: int,
        user: RawStack,
        kernel: RawStack,
        epoch: int = 0,
        walk_end: int = 0,
        context: str | None = None,
    ) -> bool:
        """Count one sample; True when its user stack was not seen before (callers look at new ones only).
        ``comm`` is the thread's kind (the stacks' root frame), ``context`` its unit of work."""
        fresh: list[bytes] | None = [] if self.track_fresh else None
        stored_user, new_user = self._intern_user(user, fresh)
        if fresh:
            self._fresh.extend(fresh)
            self._fresh_owner.extend([tgid] * len(fresh))
        key = StackKey(tgid, comm, stored_user, self._intern(kernel)[0], walk_end)
        key_id = self._keys.get(key)
        if key_id is None:
            key_id = self._keys[key] = len(self._key_list)
            self._key_list.append(key)
        counts = self._counts.get(tgid)
        if counts is None:
            counts = self._counts[tgid] = Counter()
        interval = min(self.interval_of(time_ns), (1 << INTERVAL_BITS) - 1)
        epoch = min(epoch, (1 << EPOCH_BITS) - 1)
        context_id = self._context_id(context)
        packed = (key_id << _KEY_SHIFT) | (context_id << _CONTEXT_SHIFT) | (interval << EPOCH_BITS) | epoch
        counts[packed] += 1
        if self.track_deltas:
            self._delta[(tgid, packed)] += 1
        self.samples += 1
        return new_user

    def take_delta(self) -> StoreDelta:
        """Keys, contexts and counts added since the last call (all of them the first time); the caller
        serialises calls with add(). Memory: the delta holds one entry per counter touched since."""
        new_keys = enumerate(self._key_list[self._keys_taken :], self._keys_taken)
        keys = self._journal_keys(self._packed, new_keys) if self._packed is not None else tuple(new_keys)
        contexts = tuple(
            (i, str(text)) for i, text in enumerate(self._context_list[self._contexts_taken :], self._contexts_taken)
        )
        counts = tuple((tgid, packed, count) for (tgid, packed), count in self._delta.items())
        self._keys_taken, self._contexts_taken = len(self._key_list), len(self._context_list)
        self._delta = Counter()
        return StoreDelta(keys, contexts, counts)

    @staticmethod
    def _journal_keys(
        packed: PackedChunks, new_keys: Iterable[tuple[int, StackKey]]
    ) -> tuple[tuple[int, StackKey], ...]:
        """Packed keys with their user stacks as addresses, for the journal. The deep stacks of one delta
        share their root-side chunks, so each distinct chunk is expanded once per delta (the memo goes with
        the call: the window keeps no addresses)."""
        memo: dict[bytes, bytes] = {}
        keys = []
        for key_id, key in new_keys:
            user = key.user
            if not isinstance(user, int):
                user = b"".join(_chunk_addresses(user, packed.expand, memo))
            keys.append((key_id, StackKey(key.tgid, key.comm, user, key.kernel, key.walk_end)))
        return tuple(keys)

    def apply_delta(self, delta: StoreDelta) -> None:
        """Replay a delta taken from another store (recovery from the journal); ids must follow on."""
        for key_id, key in delta.keys:
            if key_id != len(self._key_list):
                raise ValueError(f"stack id {key_id} out of order (expected {len(self._key_list)})")
            user = self._intern_user(key.user)[0] if not isinstance(key.user, tuple) else key.user
            kernel = self._intern(key.kernel)[0] if not isinstance(key.kernel, tuple) else key.kernel
            key = StackKey(key.tgid, key.comm, user, kernel, key.walk_end)
            self._keys[key] = key_id
            self._key_list.append(key)
        for context_id, text in delta.contexts:
            if context_id != len(self._context_list):
                raise ValueError(f"context id {context_id} out of order (expected {len(self._context_list)})")
            self._contexts[text] = context_id
            self._context_list.append(text)
        for tgid, packed, count in delta.counts:
            key_id, context_id, _interval, _epoch = unpack_count_key(packed)
            if key_id >= len(self._key_list) or context_id >= len(self._context_list):
                raise ValueError(f"a count names stack {key_id} or context {context_id}, never defined")
            self._counts.setdefault(tgid, Counter())[packed] += count
            self.samples += count

    def kernel_stacks(self) -> set[bytes | tuple[bytes, ...]]:
        """The distinct kernel stacks stored, of every process (their addresses, to name them at once)."""
        return {key.kernel for key in self._key_list if not isinstance(key.kernel, int)}

    def take_fresh(self, limit: int) -> FreshChunks:
        """The user-stack chunks stored since the last call (at most ``limit``; the rest wait for the next
        call), in the order stored, and the stacks new since the last call (only with ``track_fresh``). The
        caller serialises calls with add()."""
        taken, owners = self._fresh[:limit], self._fresh_owner[:limit]
        del self._fresh[:limit], self._fresh_owner[:limit]
        stacks, self._fresh_keys_taken = len(self._key_list) - self._fresh_keys_taken, len(self._key_list)
        return FreshChunks(stacks, tuple(zip(owners, taken, strict=True)))

    @property
    def fresh_left(self) -> int:
        """Chunks waiting for take_fresh()."""
        return len(self._fresh)

    def stop_fresh(self) -> None:
        """No more batches: stop keeping new chunks for them and drop those waiting."""
        self.track_fresh = False
        self._fresh, self._fresh_owner = [], array("I")

    def sample_counts(self) -> dict[int, int]:
        """Samples counted per process."""
        return {tgid: sum(counts.values()) for tgid, counts in self._counts.items()}

    @property
    def distinct_stacks(self) -> int:
        return len(self._key_list)

    @property
    def stored_bytes(self) -> int:
        """Bytes of raw addresses held (the part that grows with distinct stacks), packed ones included."""
        return sum(len(raw) for raw in self._chunks) + (self._packed.held_bytes if self._packed is not None else 0)

    def pids(self) -> list[int]:
        return sorted(self._counts)

    def epochs(self, tgid: int) -> list[int]:
        mask = (1 << EPOCH_BITS) - 1
        return sorted({packed & mask for packed in self._counts.get(tgid, ())})

    def entries(self, tgid: int, epoch: int | None = None) -> Iterator[tuple[StackKey, int, int]]:
        """(key, interval, count) of one process, optionally of one perf-map epoch only."""
        for key, interval, _context, count in self.context_entries(tgid, epoch):
            yield key, interval, count

    def context_entries(self, tgid: int, epoch: int | None = None) -> Iterator[tuple[StackKey, int, str | None, int]]:
        """(key, interval, context, count) of one process; a stack's samples split by their contexts."""
        epoch_mask, interval_mask = (1 << EPOCH_BITS) - 1, (1 << INTERVAL_BITS) - 1
        context_mask = (1 << CONTEXT_BITS) - 1
        for packed, count in self._counts.get(tgid, Counter()).items():
            if epoch is None or packed & epoch_mask == epoch:
                context = self._context_list[(packed >> _CONTEXT_SHIFT) & context_mask]
                yield self._key_list[packed >> _KEY_SHIFT], (packed >> EPOCH_BITS) & interval_mask, context, count

    @property
    def contexts(self) -> int:
        return len(self._context_list) - 1

    def forget(self, tgid: int) -> None:
        """Drop one process's counts once they are symbolized (the interned stacks stay shared)."""
        self._counts.pop(tgid, None)


@dataclass(frozen=True)
class CollectedStacks:
    """What the sampler hands over per process after the window: its samples as a stack table (no
    timeline: ``table.timeline`` False, the stack-map fallback) and what the sampler saw."""

    table: StackTable
    stats: SamplerStats

    @classmethod
    def of_folded(
        cls,
        folded: Mapping[str, int],
        timeline: Mapping[tuple[int, str], int] | None,
        stats: SamplerStats,
        contexts: Mapping[tuple[str, str], int] | None = None,
    ) -> CollectedStacks:
        """From folded counts (the stack-map fallback, test doubles)."""
        return cls(table_from_folded(folded, timeline, contexts), stats)

    @property
    def folded(self) -> Counter[str]:
        """Folded stack -> samples over the whole window (derived: costs the text of every stack)."""
        return self.table.folded()

    @property
    def timeline(self) -> Counter[tuple[int, str]] | None:
        """(interval, folded stack) -> samples; None without sample times (derived)."""
        if not self.table.timeline:
            return None
        return Counter({(interval, stack): count for interval, stack, count in self.table.timeline_entries()})

    @property
    def contexts(self) -> Counter[tuple[str, str]] | None:
        """(context, folded stack) -> samples; None without contexts (derived)."""
        return self.table.context_counts() or None


@dataclass(frozen=True)
class SamplerCheckpoint:
    """What the sampler hands the checkpoint journal during the window (profiler/capture/checkpoint.py)."""

    stacks: StoreDelta
    origin_ns: int | None  # CLOCK_MONOTONIC of the window's start: timeline intervals count from it
    dropped: dict[int, int]  # samples per PID the ring buffer had no room for, so far
    perf_maps: dict[int, list[tuple[int, str | None]]]  # PID -> perf-map versions (refresh start ns, file name)
    java_names: dict[int, JavaNamesDelta] = field(default_factory=dict)  # PID -> names learned since the last one


@dataclass(frozen=True)
class JavaNamesDelta:
    """The Java names a JVM's namer learned since the last checkpoint (profiler/unwind/hotspot.py), so that a
    recovered capture names interpreted and compiled frames although the JVM may be gone."""

    code_low: int | None  # the code cache's start: compiled frames are stored as offsets from it
    names: tuple[tuple[int, int, str | None], ...]  # (generation, Method*, name; None: withdrawn)
    chains: tuple[tuple[int, int, tuple[int, ...]], ...]  # (pc, compile id, Method*s innermost first)
    # (pc, compile id, bytes to the PcDesc borrowed) of the chains named from a borrowed scope (issue 51)
    borrowed: tuple[tuple[int, int, int], ...] = ()
