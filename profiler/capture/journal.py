"""The checkpoint journal: records a killed run can be rebuilt from (pure: bytes in, bytes out, no I/O).

A journal is a run of records, each ``magic, kind, length, crc32`` then ``length`` payload bytes. The
first is the header (the run's options, JSON); each later one is a checkpoint: what changed since the
previous one (new distinct stacks and contexts, count deltas, and the small state: scope, counters,
perf-map versions, /proc/PID/maps copies), zlib-compressed. A checkpoint is one record, so it is kept
whole or not at all; a record that is cut short (the writer was killed mid-append) or fails its checksum
ends the journal there: what came before it is the recovery, never a crash. The format is versioned by
JOURNAL_VERSION in the header; docs/capture-format.md describes it.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .stackstore import StackKey, StoreDelta, pack_count_key, unpack_count_key

JOURNAL_VERSION = 2  # 2: 32-bit epochs (perf-map version and JVM name generation)
MAGIC = b"TPJ\x01"
RECORD_HEADER = struct.Struct("<4sBII")  # magic, kind, payload length, crc32 of the payload
KIND_HEADER = 1
KIND_CHECKPOINT = 2
MAX_RECORD = 1 << 30  # a length beyond this is damage, not data

_JSON_LENGTH = struct.Struct("<I")
_STACK_HEAD = struct.Struct("<IIBBii")  # key id, tgid, walk end, comm length, user length/errno, kernel length/errno
_COUNT = struct.Struct("<IIIIII")  # tgid, key id, context id, interval, epoch, samples added


class JournalError(ValueError):
    """The journal's start (magic, header) is unreadable: nothing can be recovered from it."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint: deltas of the stack store, and the run's small state at ``time`` (a full copy each)."""

    time: float  # wall clock when it was taken
    stacks: StoreDelta
    state: Mapping[str, Any] = field(default_factory=dict)  # scope, counters, perf maps, ... (JSON)


@dataclass(frozen=True)
class JournalRead:
    header: Mapping[str, Any]
    checkpoints: tuple[Checkpoint, ...]
    damage: str | None = None  # why reading stopped before the end (torn tail, bad checksum), None: clean


def encode_record(kind: int, payload: bytes) -> bytes:
    return RECORD_HEADER.pack(MAGIC, kind, len(payload), zlib.crc32(payload)) + payload


def iter_records(data: bytes) -> Iterator[tuple[int, bytes] | str]:
    """(kind, payload) of each whole record, then a string saying why the rest is unusable, if anything."""
    at = 0
    while at < len(data):
        if len(data) - at < RECORD_HEADER.size:
            yield f"torn record at byte {at} ({len(data) - at} bytes of a header)"
            return
        magic, kind, length, crc = RECORD_HEADER.unpack_from(data, at)
        if magic != MAGIC or length > MAX_RECORD:
            yield f"damaged record header at byte {at}"
            return
        payload = data[at + RECORD_HEADER.size : at + RECORD_HEADER.size + length]
        if len(payload) < length:
            yield f"torn record at byte {at} ({len(payload)} of {length} bytes)"
            return
        if zlib.crc32(payload) != crc:
            yield f"checksum mismatch in the record at byte {at}"
            return
        yield kind, payload
        at += RECORD_HEADER.size + length


# ---------------------------------------------------------------- header


def encode_header(header: Mapping[str, Any]) -> bytes:
    return encode_record(KIND_HEADER, json.dumps({"journal_version": JOURNAL_VERSION, **header}).encode())


# ---------------------------------------------------------------- checkpoints


def _stack_part(value: bytes | int) -> tuple[int, bytes]:
    return (len(value), value) if isinstance(value, bytes) else (value, b"")


def encode_stacks(delta: StoreDelta) -> bytes:
    """New keys, new contexts and count deltas of the stack store, as compact binary."""
    parts = [_JSON_LENGTH.pack(len(delta.keys))]
    for key_id, key in delta.keys:
        user_size, user = _stack_part(key.user if not isinstance(key.user, tuple) else b"".join(key.user))
        kernel_size, kernel = _stack_part(key.kernel if not isinstance(key.kernel, tuple) else b"".join(key.kernel))
        comm = key.comm[:255]
        parts.append(_STACK_HEAD.pack(key_id, key.tgid, key.walk_end, len(comm), user_size, kernel_size))
        parts.extend((comm, user, kernel))
    contexts = json.dumps(list(delta.contexts)).encode()
    parts.extend((_JSON_LENGTH.pack(len(contexts)), contexts, _JSON_LENGTH.pack(len(delta.counts))))
    for tgid, packed, count in delta.counts:
        key_id, context_id, interval, epoch = unpack_count_key(packed)
        parts.append(_COUNT.pack(tgid, key_id, context_id, interval, epoch, count))
    return b"".join(parts)


def decode_stacks(data: bytes) -> StoreDelta:
    at = 0

    def take(size: int) -> bytes:
        nonlocal at
        chunk = data[at : at + size]
        if len(chunk) < size:
            raise ValueError("stack section cut short")
        at += size
        return chunk

    keys = []
    for _ in range(_JSON_LENGTH.unpack(take(4))[0]):
        key_id, tgid, walk_end, comm_size, user_size, kernel_size = _STACK_HEAD.unpack(take(_STACK_HEAD.size))
        comm = take(comm_size)
        user: bytes | int = take(user_size) if user_size >= 0 else user_size
        kernel: bytes | int = take(kernel_size) if kernel_size >= 0 else kernel_size
        keys.append((key_id, StackKey(tgid, comm, user, kernel, walk_end)))
    contexts = tuple((int(i), str(text)) for i, text in json.loads(take(_JSON_LENGTH.unpack(take(4))[0])))
    counts = []
    for _ in range(_JSON_LENGTH.unpack(take(4))[0]):
        tgid, key_id, context_id, interval, epoch, count = _COUNT.unpack(take(_COUNT.size))
        counts.append((tgid, pack_count_key(key_id, context_id, interval, epoch), count))
    return StoreDelta(tuple(keys), contexts, tuple(counts))


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    state = json.dumps({"time": checkpoint.time, **checkpoint.state}, separators=(",", ":")).encode()
    body = _JSON_LENGTH.pack(len(state)) + state + encode_stacks(checkpoint.stacks)
    return encode_record(KIND_CHECKPOINT, zlib.compress(body, 1))


def decode_checkpoint(payload: bytes) -> Checkpoint:
    # inflated no further than MAX_RECORD: a damaged or crafted record is refused, never a bomb's allocation
    inflater = zlib.decompressobj()
    body = inflater.decompress(payload, MAX_RECORD)
    if inflater.unconsumed_tail:
        raise ValueError(f"checkpoint inflates beyond {MAX_RECORD} bytes")
    (size,) = _JSON_LENGTH.unpack_from(body)
    state = json.loads(body[4 : 4 + size])
    if not isinstance(state, dict) or not isinstance(state.get("time"), int | float):
        raise ValueError("checkpoint state is not an object with a time")
    when = float(state.pop("time"))
    return Checkpoint(when, decode_stacks(body[4 + size :]), state)


def read_journal(data: bytes) -> JournalRead:
    """Every whole checkpoint of a journal; a damaged tail is reported in ``damage``, never raised.
    Raises JournalError only when the header itself is unreadable."""
    records = iter_records(data)
    first = next(records, "empty journal (no header)")
    if isinstance(first, str) or first[0] != KIND_HEADER:
        raise JournalError(first if isinstance(first, str) else "the first record is not a header")
    try:
        header = json.loads(first[1])
    except ValueError as exc:
        raise JournalError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("journal_version") != JOURNAL_VERSION:
        version = header.get("journal_version") if isinstance(header, dict) else None
        raise JournalError(f"journal_version {version!r}, this version reads {JOURNAL_VERSION}")
    checkpoints: list[Checkpoint] = []
    damage = None
    for record in records:
        if isinstance(record, str):
            damage = record
            break
        kind, payload = record
        if kind != KIND_CHECKPOINT:
            damage = f"unknown record kind {kind} after {len(checkpoints)} checkpoints"
            break
        try:
            checkpoints.append(decode_checkpoint(payload))
        except (ValueError, zlib.error, struct.error, TypeError) as exc:
            damage = f"checkpoint {len(checkpoints) + 1} unreadable ({exc})"
            break
    return JournalRead(header, tuple(checkpoints), damage)


__all__ = [
    "Checkpoint",
    "JournalError",
    "JournalRead",
    "encode_checkpoint",
    "encode_header",
    "read_journal",
]
