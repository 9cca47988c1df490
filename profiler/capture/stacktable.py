"""The compact stack table of a capture (format 4): each frame once, stacks as frame ids, samples as rows.

A PID's samples are one table: frames (name, kind, module) each stored once, stacks as sequences of frame
ids (root first), contexts (full thread names of a Spark task, a Flink subtask) as ids, and one row per
(interval, stack, context) with its samples. ``pids/<pid>/stacks.tpc`` holds it gzip-compressed; folded
text (``stacks.folded``, ``timeline.folded``) is derived from it, never stored. Standard library only: the
host agent writes it, the coordinator and the analysis read it. docs/capture-format.md describes the bytes.
"""

from __future__ import annotations

import functools
import json
import struct
import sys
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, overload

from ..errors import CaptureFormatError
from .checks import DEFLATE_MAX_RATIO, BoundedInflater, open_regular, row_problem, text_problem
from .folded import FRAME_SEPARATOR, KERNEL_SUFFIX, MAX_COUNT

STACK_TABLE_FILE = "stacks.tpc"
MAGIC = b"TPSTK"
TABLE_VERSION = 1
READABLE_TABLE_VERSIONS = (1,)
# A decompressed table larger than this is a hostile or corrupt file, not a capture (a 900 s window of
# deep stacks is a few tens of MB); a reader holds at most this much of a table's bytes.
MAX_TABLE_BYTES = 1 << 30
_PREAMBLE = struct.Struct("<5sBI")  # magic, table version, header length

# Frame kinds. "thread": the root frame (the thread's name or kind); "kernel" frames are folded with
# KERNEL_SUFFIX; "lost": a stack the walk could not read; the rest are profiler/symbols/frames.py's Frame kinds.
THREAD = "thread"
KERNEL = "kernel"
LOST = "lost"
FRAME_KINDS = (THREAD, "native", "jit", "anon", "unknown", "gap", KERNEL, LOST)
# Kinds named in a table only when it has such frames (readers take the names from the table, and a table
# without them keeps its bytes): a CPython frame (profiler/unwind/cpython.py).
EXTRA_FRAME_KINDS = ("python",)


@dataclass(frozen=True)
class StackTable:
    """One PID's samples. ``rows`` are parallel arrays; a row's context is 0 (none) or 1 + an index into
    ``contexts``; ``timeline`` False: no sample times (stack-map collection), every row in interval 0."""

    names: Sequence[str]
    kinds: Sequence[str]
    modules: Sequence[str]
    stacks: Sequence[tuple[int, ...]]  # frame ids, root first
    contexts: Sequence[str]
    intervals: Sequence[int]
    stack_ids: Sequence[int]
    context_ids: Sequence[int]
    counts: Sequence[int]
    timeline: bool = True

    @property
    def samples(self) -> int:
        return sum(self.counts)

    def frame_texts(self) -> list[str]:
        """Each frame as it appears in folded text (kernel frames with KERNEL_SUFFIX)."""
        return [name + KERNEL_SUFFIX if kind == KERNEL else name for name, kind in zip(self.names, self.kinds)]

    def stack_text(self, texts: Sequence[str]) -> Callable[[int], str]:
        """stack id -> its folded text, given ``frame_texts()``."""
        stacks = self.stacks
        join = FRAME_SEPARATOR.join
        get = texts.__getitem__
        return lambda stack_id: join(map(get, stacks[stack_id]))

    def stack_counts(self, first: int | None = None, last: int | None = None) -> Counter[int]:
        """stack id -> samples, over intervals ``first..last`` (inclusive; None: open)."""
        totals: Counter[int] = Counter()
        if first is None and last is None:
            for stack_id, count in zip(self.stack_ids, self.counts):
                totals[stack_id] += count
            return totals
        low = -1 if first is None else first
        high = MAX_COUNT if last is None else last
        for interval, stack_id, count in zip(self.intervals, self.stack_ids, self.counts):
            if low <= interval <= high:
                totals[stack_id] += count
        return totals

    def folded(self, first: int | None = None, last: int | None = None) -> Counter[str]:
        """Folded stack -> samples (stacks that fold to the same text merged)."""
        text = self.stack_text(self.frame_texts())
        counts: Counter[str] = Counter()
        for stack_id, count in self.stack_counts(first, last).items():
            counts[text(stack_id)] += count
        return counts

    def timeline_entries(self) -> Iterator[tuple[int, str, int]]:
        """(interval, folded stack, count) per row, contexts merged."""
        text = self.stack_text(self.frame_texts())
        merged: Counter[tuple[int, int]] = Counter()
        for interval, stack_id, count in zip(self.intervals, self.stack_ids, self.counts):
            merged[(interval, stack_id)] += count
        for (interval, stack_id), count in merged.items():
            yield interval, text(stack_id), count

    def context_counts(self) -> Counter[tuple[str, str]]:
        """(context, folded stack) -> samples of the rows with a context."""
        text = self.stack_text(self.frame_texts())
        counts: Counter[tuple[str, str]] = Counter()
        for stack_id, context_id, count in zip(self.stack_ids, self.context_ids, self.counts):
            if context_id:
                counts[(self.contexts[context_id - 1], text(stack_id))] += count
        return counts

    def within(self, first: int, last: int) -> StackTable:
        """The table of the rows of intervals ``first..last`` (inclusive) only: a sub-window's samples."""
        builder = StackTableBuilder(self.timeline)
        builder.adopt_frames(self)
        for interval, stack_id, context_id, count in zip(self.intervals, self.stack_ids, self.context_ids, self.counts):
            if first <= interval <= last:
                context = self.contexts[context_id - 1] if context_id else None
                builder.add(interval, builder.stack(self.stacks[stack_id]), context, count)
        return builder.build()

    def clamped(self, last: int) -> StackTable:
        """The table with every interval past ``last`` counted in ``last`` (a window ends a hair late).

        Only the rows change: the frames, stacks and contexts are this table's own objects (a deep window's
        stacks are tens of MB; a rebuilt copy of them beside this table set the post-run's peak). Rows are
        kept in (interval, stack, context) order: those of ``last`` and later are merged, the rest stay."""
        if not self.intervals or max(self.intervals) <= last:
            return self
        rows: list[tuple[tuple[int, int, int], int]] = []
        merged: Counter[tuple[int, int, int]] = Counter()
        for interval, stack_id, context_id, count in zip(self.intervals, self.stack_ids, self.context_ids, self.counts):
            if interval < last:
                rows.append(((interval, stack_id, context_id), count))
            else:
                merged[(last, stack_id, context_id)] += count
        rows = sorted(rows + list(merged.items()))
        return replace(
            self,
            intervals=array("I", (row[0][0] for row in rows)),
            stack_ids=array("I", (row[0][1] for row in rows)),
            context_ids=array("I", (row[0][2] for row in rows)),
            counts=array("Q", (row[1] for row in rows)),
        )


# Frame ids are below 2^32 (a table's names are in one JSON header of at most 2^31 bytes), and nearly always
# below 2^16 (a deep 900 s window names ~9 k frames): a builder packs them in 2 bytes until one is not.
_NARROW, _WIDE = "H", "I"
_SWAP = sys.byteorder == "little"


def pack_stack(frame_ids: Sequence[int], code: str = _WIDE) -> bytes:
    """A stack's frame ids as big-endian numbers of ``code``'s width (``H``: 2 bytes, ``I``: 4): two stacks
    packed alike compare (==, <) as their tuples do, so the builder interns and sorts them without making
    tuples. OverflowError when an id does not fit."""
    packed = array(code, frame_ids)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def unpack_stack(packed: bytes, code: str = _WIDE) -> tuple[int, ...]:
    """``pack_stack``'s inverse."""
    frame_ids = array(code)
    frame_ids.frombytes(packed)
    if _SWAP:
        frame_ids.byteswap()
    return tuple(frame_ids)


class PackedStacks(Sequence[tuple[int, ...]]):
    """A built table's stacks, held packed (``pack_stack`` with ``code``); each is a tuple only while it is read."""

    def __init__(self, packed: list[bytes], code: str = _WIDE) -> None:
        self._packed, self._code = packed, code
        self._unpack: Callable[[bytes], tuple[int, ...]] = functools.partial(unpack_stack, code=code)

    def __len__(self) -> int:
        return len(self._packed)

    @overload
    def __getitem__(self, index: int) -> tuple[int, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, ...]]: ...
    def __getitem__(self, index: int | slice) -> tuple[int, ...] | list[tuple[int, ...]]:
        if isinstance(index, slice):
            return list(map(self._unpack, self._packed[index]))
        return self._unpack(self._packed[index])

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return map(self._unpack, self._packed)

    def __eq__(self, other: object) -> bool:
        # a built table equals the same table read back from its file (whose stacks are a list of tuples)
        if isinstance(other, PackedStacks) and self._code == other._code:
            return self._packed == other._packed
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(map(tuple.__eq__, self, map(tuple, other)))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedStacks({list(self)!r})"


class StackTableBuilder:
    """Interns frames, stacks and contexts as samples arrive and sums their rows; ``build()`` freezes it.
    Memory grows with distinct frames, stacks and (interval, stack, context) cells, never with samples."""

    def __init__(self, timeline: bool = True) -> None:
        self.timeline = timeline
        self._frames: dict[tuple[str, str, str], int] = {}
        self._frame_list: list[tuple[str, str, str]] = []
        # Stacks as packed frame ids (pack_stack), not tuples: a deep window's ~27 k stacks of ~490 frames
        # are ~13 M references as tuples, an eighth of that as 2-byte ids (the dict and the list share each
        # one); all 4 bytes wide from the first id that needs it (``_widen``).
        self._code = _NARROW
        self._stacks: dict[bytes, int] = {}
        self._stack_list: list[bytes] = []
        self._contexts: dict[str, int] = {}
        self._context_list: list[str] = []
        self._rows: Counter[tuple[int, int, int]] = Counter()

    def frame(self, name: str, kind: str, module: str = "") -> int:
        key = (name, kind, module)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = len(self._frame_list)
            self._frame_list.append(key)
        return found

    def stack(self, frame_ids: Sequence[int]) -> int:
        try:
            packed = pack_stack(frame_ids, self._code)
        except OverflowError:
            if self._code == _WIDE:
                raise
            self._widen()
            packed = pack_stack(frame_ids, self._code)
        found = self._stacks.get(packed)
        if found is None:
            found = self._stacks[packed] = len(self._stack_list)
            self._stack_list.append(packed)
        return found

    def stack_frames(self, stack_id: int) -> tuple[int, ...]:
        """The frame ids of a stack interned before, root first."""
        return unpack_stack(self._stack_list[stack_id], self._code)

    def _widen(self) -> None:
        """Every stack interned so far repacked 4 bytes a frame id (the ids keep their numbers)."""
        narrow, self._code = self._code, _WIDE
        self._stack_list = [pack_stack(unpack_stack(packed, narrow), _WIDE) for packed in self._stack_list]
        self._stacks = {packed: stack_id for stack_id, packed in enumerate(self._stack_list)}

    def context(self, text: str | None) -> int:
        if text is None:
            return 0
        found = self._contexts.get(text)
        if found is None:
            self._context_list.append(text)
            found = self._contexts[text] = len(self._context_list)
        return found

    def add(self, interval: int, stack_id: int, context: str | None, count: int) -> None:
        if count > 0:
            self._rows[(interval if self.timeline else 0, stack_id, self.context(context))] += count

    def adopt_frames(self, table: StackTable) -> None:
        """Intern a table's frames first, in its order (its stacks' frame ids stay valid here)."""
        for entry in zip(table.names, table.kinds, table.modules):
            self.frame(*entry)

    def add_folded(self, stack: str, count: int, interval: int = 0, context: str | None = None) -> None:
        """A folded stack (root first): the root is the thread, ``_[k]`` frames are kernel frames."""
        parts = stack.split(FRAME_SEPARATOR)
        ids = [self.frame(parts[0], THREAD)]
        for part in parts[1:]:
            if part.endswith(KERNEL_SUFFIX):
                ids.append(self.frame(part[: -len(KERNEL_SUFFIX)], KERNEL))
            else:
                ids.append(self.frame(part, "unknown"))
        self.add(interval, self.stack(tuple(ids)), context, count)

    def build(self) -> StackTable:
        """The table, stacks sorted by their frame ids (neighbours share their root frames: the file's
        prefix coding), rows by (interval, stack, context)."""
        # packed stacks sort as their frame-id tuples do (pack_stack)
        order = sorted(range(len(self._stack_list)), key=self._stack_list.__getitem__)
        new_id = [0] * len(order)
        for position, old in enumerate(order):
            new_id[old] = position
        rows = sorted(((i, new_id[s], c), n) for (i, s, c), n in self._rows.items())
        return StackTable(
            names=[f[0] for f in self._frame_list],
            kinds=[f[1] for f in self._frame_list],
            modules=[f[2] for f in self._frame_list],
            stacks=PackedStacks([self._stack_list[old] for old in order], self._code),
            contexts=list(self._context_list),
            intervals=array("I", (r[0][0] for r in rows)),
            stack_ids=array("I", (r[0][1] for r in rows)),
            context_ids=array("I", (r[0][2] for r in rows)),
            counts=array("Q", (r[1] for r in rows)),
            timeline=self.timeline,
        )


def ordered_folded(
    parts: Iterable[tuple[StackTable, Sequence[str], Sequence[int], Sequence[int]]],
) -> Iterator[str]:
    """``format_folded``'s lines of the stacks ``ids`` of tables (with ``frame_texts()`` and each id's
    samples), stacks of the same text merged, most samples first, ties by text, one line at a time: the
    order is found from the stacks' frame ids, not their texts (a deep stack's text is ~100x its ids).

    A stack's sort key is a rank per frame, as fixed-width big-endian numbers: of the frame's text followed
    by the separator, and of the last frame's text alone, among all those strings sorted. No frame text
    holds the separator, so the first frame whose string differs decides as the first differing character
    of the joined texts does (a last frame's text that begins another stack's frame there sorts first, as
    the shorter text does), and two stacks have the same text exactly when they have the same key."""
    parts = list(parts)
    frames = {text for _table, texts, _ids, _counts in parts for text in texts}
    strings = sorted(frames | {text + FRAME_SEPARATOR for text in frames})
    rank = {string: number for number, string in enumerate(strings)}
    del frames
    code = "H" if len(strings) <= 1 << 16 else "I"
    swap = sys.byteorder == "little"
    samples: dict[bytes, int] = {}
    for table, texts, ids, counts in parts:
        inner = [rank[text + FRAME_SEPARATOR] for text in texts].__getitem__
        last = [rank[text] for text in texts]
        stacks = table.stacks
        for stack_id, count in zip(ids, counts):
            stack = stacks[stack_id]
            key = array(code, map(inner, stack))
            if stack:
                key[-1] = last[stack[-1]]
            if swap:
                key.byteswap()
            encoded = key.tobytes()
            samples[encoded] = samples.get(encoded, 0) + count
    ordered = sorted(samples.items(), key=lambda item: (-item[1], item[0]))
    del samples, rank
    string = strings.__getitem__
    for encoded, count in ordered:
        if count > 0:
            key = array(code, encoded)
            if swap:
                key.byteswap()
            yield f"{''.join(map(string, key))} {count}\n"


def table_from_folded(
    folded: Mapping[str, int],
    timeline: Mapping[tuple[int, str], int] | None = None,
    contexts: Mapping[tuple[str, str], int] | None = None,
) -> StackTable:
    """The table of folded counts (an older capture, the stack-map fallback, a test's samples). Each
    context's samples of a stack are taken from that stack's earliest intervals: folded captures did not
    record when a context's samples fell, only how many there were."""
    builder = StackTableBuilder(timeline is not None)
    cells: dict[str, list[list[int]]] = {}
    for (interval, stack), count in sorted(timeline.items()) if timeline is not None else ():
        if count > 0:
            cells.setdefault(stack, []).append([interval, count])
    for stack, count in folded.items():
        if count > 0 and stack not in cells:
            cells[stack] = [[0, count]]
    by_stack: dict[str, list[tuple[str, int]]] = {}
    for (context, stack), count in sorted((contexts or {}).items()):
        by_stack.setdefault(stack, []).append((context, count))
    for stack, intervals in cells.items():
        for context, wanted in by_stack.get(stack, ()):
            for cell in intervals:
                taken = min(wanted, cell[1])
                if taken:
                    builder.add_folded(stack, taken, cell[0], context)
                    cell[1] -= taken
                    wanted -= taken
        for interval, count in intervals:
            builder.add_folded(stack, count, interval)
    return builder.build()


# ---------------------------------------------------------------- the file (I/O)


def _le(values: array) -> bytes:  # type: ignore[type-arg]
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


SUFFIX_CHUNK = 1 << 16  # frame ids per part of the suffix array while a table is encoded


def encode_table(table: StackTable) -> bytes:
    """The uncompressed bytes of a table (see docs/capture-format.md, stacks.tpc)."""
    return b"".join(encode_table_parts(table))


def _prefix_coding(stacks: Sequence[tuple[int, ...]]) -> tuple[array, array]:  # type: ignore[type-arg]
    """Per stack, the frames it shares with the stack before it and the number of frames after those."""
    prefixes, suffix_lengths = array("I"), array("I")
    previous: tuple[int, ...] = ()
    for stack in stacks:
        shared = 0
        limit = min(len(stack), len(previous))
        while shared < limit and stack[shared] == previous[shared]:
            shared += 1
        prefixes.append(shared)
        suffix_lengths.append(len(stack) - shared)
        previous = stack
    return prefixes, suffix_lengths


def _suffix_parts(stacks: Sequence[tuple[int, ...]], prefixes: array) -> Iterator[bytes]:  # type: ignore[type-arg]
    """The suffix array's bytes in parts of about SUFFIX_CHUNK ids (never the whole array at once)."""
    suffixes = array("I")
    for stack, shared in zip(stacks, prefixes):
        suffixes.extend(stack[shared:])
        if len(suffixes) >= SUFFIX_CHUNK:
            yield _le(suffixes)
            suffixes = array("I")
    if suffixes:
        yield _le(suffixes)


def encode_table_parts(table: StackTable) -> Iterator[bytes]:
    """``encode_table``'s bytes in parts, in order: the frames' suffix ids are produced a part at a time
    (a deep window's 2-3 M frame references are never one more array and one joined copy in memory)."""
    kind_names = list(FRAME_KINDS) + [kind for kind in EXTRA_FRAME_KINDS if kind in table.kinds]
    kind_index = {kind: i for i, kind in enumerate(kind_names)}
    module_names = sorted(set(table.modules))
    module_index = {module: i for i, module in enumerate(module_names)}
    prefixes, suffix_lengths = _prefix_coding(table.stacks)
    header = {
        "names": list(table.names),
        "kinds": [kind_index[kind] for kind in table.kinds],
        "kind_names": kind_names,
        "modules": [module_index[module] for module in table.modules],
        "module_names": module_names,
        "contexts": list(table.contexts),
        "timeline": table.timeline,
        "stacks": len(table.stacks),
        "stack_frames": sum(suffix_lengths),
        "rows": len(table.counts),
    }
    header_bytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    del header
    yield _PREAMBLE.pack(MAGIC, TABLE_VERSION, len(header_bytes))
    yield header_bytes
    yield _le(prefixes)
    yield _le(suffix_lengths)
    yield from _suffix_parts(table.stacks, prefixes)
    for values, code in ((table.intervals, "I"), (table.stack_ids, "I"), (table.context_ids, "I"),
                         (table.counts, "Q")):
        yield _le(values if isinstance(values, array) else array(code, values))


def gzip_parts(parts: Iterable[bytes], level: int = 6) -> Iterator[bytes]:
    """``gzip.compress(b"".join(parts), level, mtime=0)``'s bytes, in parts, without joining the input."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)
    for part in parts:
        packed = compressor.compress(part)
        if packed:
            yield packed
    yield compressor.flush()


def is_table_file(path: Path) -> bool:
    """Whether ``path`` holds a stack table (a gzip stream) rather than folded text, whatever its name."""
    try:
        with open_regular(path, follow=True) as handle:
            return handle.read(2) == b"\x1f\x8b"
    except (CaptureFormatError, OSError):
        return False


def write_table(path: Path, table: StackTable, write: Callable[[Path, Iterable[bytes]], None]) -> None:
    """gzip-compress the table into ``path`` through ``write`` (the capture's atomic writer of parts),
    a part at a time: the same bytes as compressing the whole encoded table at once."""
    write(path, gzip_parts(encode_table_parts(table)))


def read_table(path: Path, interval_limit: int | None | Literal["meta"] = "meta") -> StackTable:
    """The table of a stacks.tpc; a truncated, corrupt, unknown or hostile file is one CaptureFormatError
    naming it. ``interval_limit``: rows must lie in intervals below it ("meta": the window of the capture
    around the file, meta.json's; None: no bound, a table outside a capture)."""
    if interval_limit == "meta":
        interval_limit = capture_interval_limit(path)
    return decode_table(read_table_bytes(path), str(path), interval_limit)


def capture_interval_limit(path: Path) -> int | None:
    """The intervals the rows of a capture's ``pids/<pid>/stacks.tpc`` may lie in (format.interval_limit_of)."""
    from .read import interval_limit_of

    return interval_limit_of(path)


def read_table_bytes(path: Path) -> bytearray:
    """A stacks.tpc's uncompressed bytes (``decode_table``'s input); errors as ``read_table``. Inflated a
    part at a time and never past the size its header announces, which must fit the file's compressed
    bytes and MAX_TABLE_BYTES: a crafted stream is refused at its first byte too many."""
    source = str(path)
    with open_regular(path) as handle:
        stream = BoundedInflater(handle, source)
        preamble = stream.read(_PREAMBLE.size)
        decode_header(preamble, source, preamble_only=True)
        header_length = _PREAMBLE.unpack_from(preamble)[2]
        _check_announced(_PREAMBLE.size + header_length, stream.compressed_size, source)
        head = preamble + stream.read(header_length)
        if len(head) < _PREAMBLE.size + header_length:
            raise bad_table(source, "cut short (the header is not all there)")
        header, at = decode_header(head, source)
        total = at + sum(array(code).itemsize * header.sizes[size] for code, size in ARRAY_LAYOUT)
        _check_announced(total, stream.compressed_size, source)
        raw = bytearray(total)
        raw[:at] = head
        if stream.read_into(memoryview(raw)[at:]) < total - at:
            raise bad_table(source, "cut short (the arrays the header announces are not all there)")
        if not stream.at_end():
            raise bad_table(source, f"bytes after the last row (more than the {total} bytes the header announces)")
    return raw  # not copied: a table's bytes are held once


def _check_announced(size: int, compressed: int, source: str) -> None:
    """A table's announced uncompressed size fits its bound and what its compressed bytes can inflate to."""
    if size > MAX_TABLE_BYTES:
        raise bad_table(source, f"announces {size} bytes uncompressed, more than {MAX_TABLE_BYTES}; not a stack table")
    if size > DEFLATE_MAX_RATIO * compressed:
        raise bad_table(source, f"announces {size} bytes uncompressed, more than its {compressed} bytes can hold")


def bad_table(source: str, what: str) -> CaptureFormatError:
    return CaptureFormatError(f"{source}: {what}; re-run or re-fetch the capture")


@dataclass(frozen=True)
class TableHeader:
    """A table file's checked header: frames, contexts, whether it has sample times, and the array sizes."""

    names: list[str]
    kinds: list[str]
    modules: list[str]
    contexts: list[str]
    timeline: bool
    sizes: tuple[int, int, int]  # stacks, stack frames, rows


# The arrays after the header, in file order: (array typecode, which header size gives its length).
ARRAY_LAYOUT = (("I", 0), ("I", 0), ("I", 1), ("I", 2), ("I", 2), ("I", 2), ("Q", 2))


def decode_header(raw: bytes | bytearray, source: str, preamble_only: bool = False) -> tuple[TableHeader, int]:
    """The checked header of a table's bytes and where its arrays start (``preamble_only``: the magic and
    version checked, nothing returned)."""
    if len(raw) < _PREAMBLE.size or raw[:5] != MAGIC:
        raise bad_table(source, "not a stack table (no TPSTK magic)")
    _magic, version, header_length = _PREAMBLE.unpack_from(raw)
    if version not in READABLE_TABLE_VERSIONS:
        raise CaptureFormatError(
            f"{source}: stack table version {version}, this version reads "
            f"{', '.join(map(str, READABLE_TABLE_VERSIONS))}; use a matching profiler version"
        )
    if preamble_only:
        return None, 0  # type: ignore[return-value]
    at = _PREAMBLE.size + header_length
    try:
        header = json.loads(raw[_PREAMBLE.size : at].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_table(source, f"header is not JSON ({exc})") from None
    names, kinds, modules, contexts, sizes = _check_header(header, source)
    for values, what in ((names, "frame name"), (contexts, "context name"), (header["module_names"], "module name")):
        problem = text_problem(values, what)
        if problem is not None:
            raise bad_table(source, problem)
    return TableHeader(names, kinds, modules, contexts, bool(header["timeline"]), (sizes[0], sizes[1], sizes[2])), at


def array_spans(raw: bytes | bytearray, at: int, header: TableHeader, source: str) -> list[tuple[str, int, int]]:
    """(typecode, start, length) of each array of ``ARRAY_LAYOUT``; a file cut short or with bytes after the
    last row is a CaptureFormatError."""
    spans = []
    for code, size in ARRAY_LAYOUT:
        length = header.sizes[size]
        end = at + array(code).itemsize * length
        if end > len(raw):
            raise bad_table(source, "cut short (the arrays the header announces are not all there)")
        spans.append((code, at, length))
        at = end
    if at != len(raw):
        raise bad_table(source, f"{len(raw) - at} bytes after the last row")
    return spans


def decode_table(raw: bytes | bytearray, source: str, interval_limit: int | None = None) -> StackTable:
    """``encode_table``'s inverse; every id and length is checked before it is used. (The coordinator's
    numpy reader, coordinator/analysis/tableread.py, makes the same checks with the same messages.)"""
    header, at = decode_header(raw, source)
    arrays = []
    for code, start, length in array_spans(raw, at, header, source):
        values = array(code)
        values.frombytes(raw[start : start + values.itemsize * length])
        if sys.byteorder != "little":
            values.byteswap()
        arrays.append(values)
    prefixes, suffix_lengths, suffixes, intervals, stack_ids, context_ids, counts = arrays
    stacks = _unfold_stacks(prefixes, suffix_lengths, suffixes, len(header.names), source)
    if stack_ids and max(stack_ids) >= len(stacks):
        raise bad_table(source, ROW_STACK_ERROR)
    if context_ids and max(context_ids) > len(header.contexts):
        raise bad_table(source, ROW_CONTEXT_ERROR)
    if counts and max(counts) > MAX_COUNT:
        raise bad_table(source, ROW_COUNT_ERROR)
    problem = row_problem(intervals, stack_ids, context_ids, interval_limit)
    if problem is not None:
        raise bad_table(source, problem)
    return StackTable(header.names, header.kinds, header.modules, stacks, header.contexts, intervals, stack_ids,
                      context_ids, counts, header.timeline)


ROW_STACK_ERROR = "a row names a stack the table does not have"
ROW_CONTEXT_ERROR = "a row names a context the table does not have"
ROW_COUNT_ERROR = "a row's count is above 2^63 - 1"
FRAME_ID_ERROR = "a stack names a frame the table does not have"
LEFTOVER_ERROR = "stack frames left over after the last stack"


def prefix_error(stack: int) -> str:
    return f"stack {stack} shares more frames than the stack before it has"


def _strings(value: object, source: str, what: str) -> list[str]:
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:  # JSON's strings are exactly str
        raise bad_table(source, f"{what} is not a list of strings")
    return value


def _indexes(value: object, names: Sequence[str], count: int, source: str, what: str) -> list[str]:
    # set(map(type, ...)), min and max run in C: a header holds one kind and one module per frame
    if not (isinstance(value, list) and len(value) == count
            and (not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) < len(names)))):
        raise bad_table(source, f"{what} is not one index per frame")
    return [names[item] for item in value]


def _check_header(header: object, source: str) -> tuple[list[str], list[str], list[str], list[str], list[int]]:
    if not isinstance(header, dict):
        raise bad_table(source, "header is not a JSON object")
    names = _strings(header.get("names"), source, "names")
    kinds = _indexes(header.get("kinds"), _strings(header.get("kind_names"), source, "kind_names"), len(names),
                     source, "kinds")
    modules = _indexes(header.get("modules"), _strings(header.get("module_names"), source, "module_names"),
                       len(names), source, "modules")
    contexts = _strings(header.get("contexts"), source, "contexts")
    sizes = [header.get(key) for key in ("stacks", "stack_frames", "rows")]
    if not all(type(size) is int and 0 <= size <= MAX_TABLE_BYTES for size in sizes):
        raise bad_table(source, "stacks, stack_frames and rows are not counts")
    if not isinstance(header.get("timeline"), bool):
        raise bad_table(source, "timeline is not true/false")
    return names, kinds, modules, contexts, [int(size) for size in sizes]  # type: ignore[arg-type]


def _unfold_stacks(
    prefixes: Iterable[int], suffix_lengths: Iterable[int], suffixes: array, frames: int, source: str  # type: ignore[type-arg]
) -> list[tuple[int, ...]]:
    """Stacks from their prefix coding: each shares ``prefix`` frames with the one before it."""
    if suffixes and max(suffixes) >= frames:
        raise bad_table(source, FRAME_ID_ERROR)
    stacks: list[tuple[int, ...]] = []
    previous: tuple[int, ...] = ()
    at = 0
    for prefix, length in zip(prefixes, suffix_lengths):
        if prefix > len(previous) or at + length > len(suffixes):
            raise bad_table(source, prefix_error(len(stacks)))
        previous = previous[:prefix] + tuple(suffixes[at : at + length])
        at += length
        stacks.append(previous)
    if at != len(suffixes):
        raise bad_table(source, LEFTOVER_ERROR)
    return stacks
