"""User-stack chunks held compactly during the window (pure, no I/O): the StackStore's largest part.

A deep workload makes a new stack of about every sample, and each new stack brings its leaf-side chunks of
32 raw 8-byte values (pcs, tagged Method*s, compiled frames) that no other stack shares; a JVM's stacks,
though, use few distinct values. So a chunk is held as the ids of its values in a table of distinct
values, 2 bytes each, behind its CRC-32, and it is found
again by Python's hash of its addresses and that CRC, never by the addresses themselves (which are not
kept). Two chunks with the same hash and CRC (96 bits; Python's hash of bytes is keyed per process) would
be taken for one; two with the same hash and another CRC are told apart (the second kept by its
addresses). ``expand`` gives the addresses back, byte for byte.

The table holds at most MAX_VALUES values (~6 MB with its dict): a chunk with a value it has no room for
is held as its addresses (behind the same CRC), so stacks of ever new values (garbage a broken frame
chain leaves, or a hostile process's) cost what they cost unpacked, plus 5 bytes a chunk.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable

_CRC = struct.Struct("<I")
_IDS, _ADDRESSES = 2, 8  # the byte after the CRC: 2-byte value ids follow, or the 8-byte addresses themselves
_HEAD = _CRC.size + 1
MAX_VALUES = 1 << 16  # distinct values in the table: every id fits in 2 bytes


class PackedChunks:
    """The packed form of each distinct chunk of addresses seen, and the table of values they use."""

    def __init__(self, chunk_hash: Callable[[bytes], int] = hash) -> None:
        self._hash = chunk_hash
        self._by_hash: dict[int, bytes] = {}  # hash of a chunk's addresses -> its packed form
        self._collided: dict[bytes, bytes] = {}  # addresses -> packed form, for a hash another chunk holds
        self._values: list[int] = []
        self._value_ids: dict[int, int] = {}
        self.held_bytes = 0  # bytes of the packed forms and the value table's values

    def __len__(self) -> int:
        return len(self._by_hash) + len(self._collided)

    def find(self, part: bytes) -> tuple[bytes, bool]:
        """The packed form of ``part`` (a whole number of 8-byte values) and whether it is new."""
        key = self._hash(part)
        found = self._by_hash.get(key)
        crc = zlib.crc32(part)
        if found is not None:
            if _CRC.unpack_from(found)[0] == crc:
                return found, False
            known = self._collided.get(part)
            if known is not None:
                return known, False
            packed = self._collided[part] = self._pack(part, crc)
            self.held_bytes += len(part)  # the addresses are the key here
            return packed, True
        packed = self._by_hash[key] = self._pack(part, crc)
        return packed, True

    def _pack(self, part: bytes, crc: int) -> bytes:
        value_ids, values = self._value_ids, self._values
        addresses = struct.unpack(f"<{len(part) // 8}Q", part)
        ids = list(map(value_ids.get, addresses))
        if None in ids:  # values not in the table yet (after the first seconds, few)
            for index, value in enumerate(addresses):
                if ids[index] is None:
                    found = value_ids.get(value)  # the same value earlier in this chunk
                    if found is None:
                        if len(values) >= MAX_VALUES:
                            packed = _CRC.pack(crc) + bytes((_ADDRESSES,)) + part
                            self.held_bytes += len(packed)
                            return packed
                        found = value_ids[value] = len(values)
                        values.append(value)
                        self.held_bytes += 8
                    ids[index] = found
        packed = _CRC.pack(crc) + bytes((_IDS,)) + array("H", ids).tobytes()  # type: ignore[type-var]
        self.held_bytes += len(packed)
        return packed

    def expand(self, packed: bytes) -> bytes:
        """The addresses of a packed chunk."""
        if packed[_CRC.size] == _ADDRESSES:
            return packed[_HEAD:]
        ids = array("H", packed[_HEAD:])
        values = self._values
        return struct.pack(f"<{len(ids)}Q", *[values[i] for i in ids])
