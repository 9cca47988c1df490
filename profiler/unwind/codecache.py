"""HotSpot's code cache read through its vmStructs: where JIT code lies, how the BPF walker finds a pc's
CodeBlob (the code heaps' segment maps), and the compiled frames' names (nmethod -> Method*).

The walker (profiler/sampling/stack_walk.c, ``hotspot_step``) unwinds a compiled frame by its CodeBlob's frame
size instead of the frame pointer, so JIT code needs no ``-XX:+PreserveFramePointer``; it stores a
compiled frame as its pc together with the nmethod's compile id (COMPILED_TAG), and user space names it
here by finding the blob again and checking that its compile id is the one seen at sample time: code
freed and its memory reused for another method is never named after the old method.

Every offset comes from the JVM's own tables; what differs between JDK 17 and 25 (the blob's code start as
a pointer or an offset, its kind as a name or a CodeBlobKind byte, nmethod vs CompiledMethod holding the
Method*) is told by which fields it exports. docs/unwinding.md lists what is still assumed.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Protocol

from ..errors import VMStructsError

# A compiled frame as the walker stores it: this tag, the compile id in bits 31..61, pc - code cache low
# in bits 0..30 (profiler/sampling/stack_walk.c COMPILED_TAG; the code cache is at most 2 GiB).
COMPILED_TAG = 1 << 62
COMPILE_ID_SHIFT = 31
PC_MASK = (1 << COMPILE_ID_SHIFT) - 1
COMPILE_ID_MASK = (1 << 31) - 1
MAX_HEAPS = 4  # segmented code cache: non-nmethods, profiled, non-profiled (3); one when not segmented
MAX_SPAN = 1 << 31
SEGMAP_STEPS = 16  # the segment map's back-links walked per lookup (the BPF walker's bound too)
FREE_SEGMENT = 0xFF
# nmethods whose debug information stays read (least recently used dropped first): a long window of a JVM
# that keeps compiling (Spark generates classes every window) would otherwise keep every nmethod it met;
# a dropped one is read again, its compile id checked first, when a new pc of it is sampled.
SCOPES_KEPT = 512
# and at most this many bytes of it in all (a crafted JVM's nmethods of MAX_DEBUG_BYTES each would make
# SCOPES_KEPT of them gigabytes; real ones are tens of KiB)
SCOPES_KEPT_BYTES = 64 << 20

# Blob kinds as the walker tells them apart (BLOB_* in stack_walk.c).
KIND_OTHER, KIND_NMETHOD, KIND_VTABLE = 0, 1, 2
NAME_KINDS = {b"nmet": KIND_NMETHOD, b"nati": KIND_NMETHOD, b"vtab": KIND_VTABLE}  # JDK <= 22: by _name

# Needed to walk the code cache (a JVM without them keeps the frame-pointer walk for JIT code).
_REQUIRED = {
    ("CodeCache", "_heaps"),
    ("CodeCache", "_low_bound"),
    ("CodeCache", "_high_bound"),
    ("GrowableArrayBase", "_len"),
    ("GrowableArray<int>", "_data"),
    ("CodeHeap", "_memory"),
    ("CodeHeap", "_segmap"),
    ("CodeHeap", "_log2_segment_size"),
    ("VirtualSpace", "_low_boundary"),
    ("VirtualSpace", "_high_boundary"),
    ("VirtualSpace", "_low"),
    ("CodeBlob", "_name"),
    ("CodeBlob", "_frame_size"),
    ("CodeBlob", "_frame_complete_offset"),
    ("nmethod", "_compile_id"),
}
CODE_FIELDS = _REQUIRED | {
    ("CodeBlob", "_code_begin"),  # JDK <= 22: a pointer
    ("CodeBlob", "_code_offset"),  # JDK 23+: an int from the blob's start
    ("CodeBlob", "_kind"),  # JDK 23+
    ("CompiledMethod", "_method"),  # JDK <= 22
    ("nmethod", "_method"),  # JDK 23+
    # Inlined scopes (debug information): JDK <= 22 in the nmethod, JDK 23+ in its immutable/mutable data.
    ("nmethod", "_metadata_offset"),
    ("nmethod", "_dependencies_offset"),
    ("CompiledMethod", "_scopes_data_begin"),
    ("nmethod", "_scopes_pcs_offset"),
    ("nmethod", "_scopes_data_offset"),
    ("nmethod", "_immutable_data"),
    ("nmethod", "_immutable_data_size"),
    ("CodeBlob", "_mutable_data"),
    ("CodeBlob", "_relocation_size"),
    ("CodeBlob", "_mutable_data_size"),
    ("PcDesc", "_pc_offset"),
    ("PcDesc", "_scope_decode_offset"),
    ("Abstract_VM_Version", "_vm_major_version"),
}
KIND_CONSTANTS = {"CodeBlobKind::Nmethod", "CodeBlobKind::Vtable"}
_WIDTHS = {"int": 4, "int16_t": 2, "u2": 2, "short": 2, "jint": 4}


class Memory(Protocol):
    """What this module reads of a JVM (profiler.unwind.vmstructs.ProcessMemory)."""

    def read(self, address: int, size: int) -> bytes: ...
    def u64(self, address: int) -> int: ...
    def s32(self, address: int) -> int: ...


@dataclass(frozen=True)
class CodeHeap:
    low: int  # reserved [low, high) of the heap's code
    high: int
    segmap: int  # one byte per segment


@dataclass(frozen=True)
class CodeCacheLayout:
    """One JVM's code cache and the CodeBlob fields the walker reads (offsets from the blob's start)."""

    low: int
    high: int
    heaps: tuple[CodeHeap, ...]
    segment_shift: int
    heapblock_size: int
    frame_size: int
    frame_complete: int
    frame_complete_width: int  # bytes: 4 (JDK <= 22) or 2 (JDK 23+)
    code: int  # _code_begin (a pointer) or _code_offset (an int)
    code_is_offset: bool
    kind: int  # _kind's offset, or -1: the kind is told by the first bytes of _name
    name: int
    kind_nmethod: int
    kind_vtable: int
    compile_id: int
    method: int
    scopes: ScopesLayout | None = None  # None: inlined methods not expanded (scopes_error says why)
    scopes_error: str = ""


@dataclass(frozen=True)
class ScopesLayout:
    """Where an nmethod keeps its debug information: offsets of the fields locating its metadata
    (Method*s by index), scopes data and PcDescs, as the JDK's layout has them."""

    immutable: bool  # JDK 23+: pcs and scopes in _immutable_data, metadata in _mutable_data
    fields: dict[str, tuple[int, int]]  # name -> (offset in the nmethod, width in bytes)
    pc_desc_size: int
    pc_offset: int
    scope_offset: int
    excluded_bytes: int  # UNSIGNED5's excluded low bytes: 1 since JDK 20, 0 before


def _width(type_string: str) -> int:
    width = _WIDTHS.get(type_string.strip())
    if width is None:
        raise VMStructsError(f"CodeBlob::_frame_complete_offset has type {type_string!r}, not a known integer")
    return width


def read_code_cache(
    memory: Memory,
    fields: dict[tuple[str, str], int],
    types: dict[tuple[str, str], str],
    sizes: dict[str, int],
    constants: dict[str, int],
) -> CodeCacheLayout:
    """The code cache of a JVM from its vmStructs; VMStructsError (with why) when it cannot be walked."""
    missing = sorted(f"{t}::{f}" for t, f in _REQUIRED - fields.keys())
    method = fields.get(("nmethod", "_method"), fields.get(("CompiledMethod", "_method")))
    code_offset = fields.get(("CodeBlob", "_code_offset"))
    code = code_offset if code_offset is not None else fields.get(("CodeBlob", "_code_begin"))
    if missing or method is None or code is None or "HeapBlock" not in sizes:
        lacking = ", ".join(missing) or "the Method* of nmethod, code start or HeapBlock"
        raise VMStructsError(f"vmStructs lack {lacking}")
    kind = fields.get(("CodeBlob", "_kind"), -1)
    if kind >= 0 and not constants.keys() >= KIND_CONSTANTS:
        raise VMStructsError("vmStructs have CodeBlob::_kind but not the CodeBlobKind constants")
    blob_offsets = [fields[("CodeBlob", f)] for f in ("_name", "_frame_size", "_frame_complete_offset")]
    if max([*blob_offsets, code, kind, method, fields[("nmethod", "_compile_id")]]) >= 4096:
        raise VMStructsError("CodeBlob/nmethod field offsets beyond 4 KiB: not a layout the walker reads")
    heaps = _read_heaps(memory, fields)
    low = memory.u64(fields[("CodeCache", "_low_bound")])
    high = memory.u64(fields[("CodeCache", "_high_bound")])
    if not 0 < low < high <= low + MAX_SPAN or any(h.low < low or h.high > high for h in heaps):
        raise VMStructsError(f"code cache [{low:#x}, {high:#x}) absurd or larger than 2 GiB")
    shift_at = fields[("CodeHeap", "_log2_segment_size")]
    shifts = {memory.s32(address + shift_at) for address in _heap_pointers(memory, fields)}
    if len(shifts) != 1 or not 4 <= next(iter(shifts)) <= 16:
        raise VMStructsError(f"code heaps' segment sizes {sorted(shifts)}: one power of two 2^4..2^16 expected")
    if not 0 < sizes["HeapBlock"] <= 64:
        raise VMStructsError(f"HeapBlock of {sizes['HeapBlock']} bytes")
    scopes, scopes_error = None, ""
    try:
        scopes = read_scopes_layout(memory, fields, types, sizes)
    except VMStructsError as exc:
        scopes_error = str(exc)
    return CodeCacheLayout(
        low=low,
        high=high,
        heaps=heaps,
        segment_shift=next(iter(shifts)),
        heapblock_size=sizes["HeapBlock"],
        frame_size=fields[("CodeBlob", "_frame_size")],
        frame_complete=fields[("CodeBlob", "_frame_complete_offset")],
        frame_complete_width=_width(types.get(("CodeBlob", "_frame_complete_offset"), "int")),
        code=code,
        code_is_offset=code_offset is not None,
        kind=kind,
        name=fields[("CodeBlob", "_name")],
        kind_nmethod=constants.get("CodeBlobKind::Nmethod", KIND_NMETHOD),
        kind_vtable=constants.get("CodeBlobKind::Vtable", KIND_VTABLE),
        compile_id=fields[("nmethod", "_compile_id")],
        method=method,
        scopes=scopes,
        scopes_error=scopes_error,
    )


_SCOPE_FIELDS_OLD = {
    "metadata": ("nmethod", "_metadata_offset"),
    "dependencies": ("nmethod", "_dependencies_offset"),
    "scopes_pcs": ("nmethod", "_scopes_pcs_offset"),
    "scopes_data_begin": ("CompiledMethod", "_scopes_data_begin"),
}
_SCOPE_FIELDS_NEW = {
    "scopes_pcs": ("nmethod", "_scopes_pcs_offset"),
    "scopes_data": ("nmethod", "_scopes_data_offset"),
    "immutable_data": ("nmethod", "_immutable_data"),
    "immutable_data_size": ("nmethod", "_immutable_data_size"),
    "mutable_data": ("CodeBlob", "_mutable_data"),
    "relocation_size": ("CodeBlob", "_relocation_size"),
    "mutable_data_size": ("CodeBlob", "_mutable_data_size"),
}
_FIELD_WIDTHS = {**_WIDTHS, "address": 8, "u_char*": 8}


def read_scopes_layout(
    memory: Memory, fields: dict[tuple[str, str], int], types: dict[tuple[str, str], str], sizes: dict[str, int]
) -> ScopesLayout:
    """Where this JDK's nmethods keep their inlining information; VMStructsError when it cannot tell."""
    immutable = ("nmethod", "_immutable_data") in fields
    wanted = _SCOPE_FIELDS_NEW if immutable else _SCOPE_FIELDS_OLD
    missing = [f"{t}::{f}" for t, f in wanted.values() if (t, f) not in fields]
    pc_fields = [("PcDesc", "_pc_offset"), ("PcDesc", "_scope_decode_offset")]
    if missing or any(key not in fields for key in pc_fields) or not 8 <= sizes.get("PcDesc", 0) <= 64:
        raise VMStructsError(f"vmStructs lack the nmethod's debug information ({', '.join(missing) or 'PcDesc'})")
    located: dict[str, tuple[int, int]] = {}
    for name, key in wanted.items():
        width = _FIELD_WIDTHS.get(types.get(key, "").strip(), 8 if types.get(key, "").endswith("*") else 0)
        if width == 0 or fields[key] >= 4096:
            raise VMStructsError(f"{key[0]}::{key[1]} of type {types.get(key)!r} at {fields[key]}: not read")
        located[name] = (fields[key], width)
    major_at = fields.get(("Abstract_VM_Version", "_vm_major_version"))
    major = memory.s32(major_at) if major_at is not None else 0
    return ScopesLayout(
        immutable=immutable,
        fields=located,
        pc_desc_size=sizes["PcDesc"],
        pc_offset=fields[("PcDesc", "_pc_offset")],
        scope_offset=fields[("PcDesc", "_scope_decode_offset")],
        excluded_bytes=1 if major >= 20 or immutable else 0,
    )


def _heap_pointers(memory: Memory, fields: dict[tuple[str, str], int]) -> list[int]:
    array = memory.u64(fields[("CodeCache", "_heaps")])
    count = memory.s32(array + fields[("GrowableArrayBase", "_len")])
    if not 1 <= count <= MAX_HEAPS:
        raise VMStructsError(f"CodeCache::_heaps holds {count} heaps: 1..{MAX_HEAPS} expected")
    data = memory.u64(array + fields[("GrowableArray<int>", "_data")])
    return [memory.u64(data + 8 * index) for index in range(count)]


def _read_heaps(memory: Memory, fields: dict[tuple[str, str], int]) -> tuple[CodeHeap, ...]:
    heaps = []
    for address in _heap_pointers(memory, fields):
        space = address + fields[("CodeHeap", "_memory")]
        segmap = address + fields[("CodeHeap", "_segmap")]
        low = memory.u64(space + fields[("VirtualSpace", "_low_boundary")])
        high = memory.u64(space + fields[("VirtualSpace", "_high_boundary")])
        if not 0 < low < high:
            raise VMStructsError(f"code heap at {address:#x}: bounds [{low:#x}, {high:#x}) absurd")
        heaps.append(CodeHeap(low, high, memory.u64(segmap + fields[("VirtualSpace", "_low")])))
    return tuple(sorted(heaps, key=lambda heap: heap.low))


# ---------------------------------------------------------------- user space: blob of a pc, its name


def find_blob(memory: Memory, layout: CodeCacheLayout, pc: int) -> int | None:
    """The CodeBlob holding ``pc`` (the walker's lookup, done again from user space); None: free or none."""
    heap = next((h for h in layout.heaps if h.low <= pc < h.high), None)
    if heap is None:
        return None
    segment = (pc - heap.low) >> layout.segment_shift
    for _ in range(SEGMAP_STEPS):
        tag = memory.read(heap.segmap + segment, 1)[0]
        if tag == FREE_SEGMENT or tag > segment:
            return None
        if tag == 0:
            return heap.low + (segment << layout.segment_shift) + layout.heapblock_size
        segment -= tag
    return None


def blob_kind(memory: Memory, layout: CodeCacheLayout, blob: int) -> int:
    """KIND_NMETHOD, KIND_VTABLE or KIND_OTHER, as the walker tells them."""
    if layout.kind >= 0:
        raw = memory.read(blob + layout.kind, 1)[0]
        return KIND_NMETHOD if raw == layout.kind_nmethod else KIND_VTABLE if raw == layout.kind_vtable else KIND_OTHER
    return NAME_KINDS.get(memory.read(memory.u64(blob + layout.name), 4), KIND_OTHER)


def compiled_pc(layout: CodeCacheLayout, value: int) -> tuple[int, int]:
    """(pc, compile id) of a stored compiled frame (its tag already checked)."""
    return compiled_at(layout.low, value)


def compiled_at(code_low: int, value: int) -> tuple[int, int]:
    """(pc, compile id) of a stored compiled frame of a code cache that begins at ``code_low``."""
    return code_low + (value & PC_MASK), (value >> COMPILE_ID_SHIFT) & COMPILE_ID_MASK


# Causes of a compiled frame left unnamed by vmStructs (then named by the perf map, if any).
FREED = "nmethod freed or recompiled before it was named"
UNREADABLE_BLOB = "code cache unreadable at the frame's pc"


@dataclass
class CompiledNamer:
    """Names of compiled frames: (blob, compile id) -> the nmethod's Method*, memoized; a frame whose blob
    now holds another compile id (its code freed, the memory reused) gets no name from here."""

    memory: Memory
    layout: CodeCacheLayout

    def __post_init__(self) -> None:
        self.methods: dict[tuple[int, int], int] = {}  # (blob, compile id) -> Method*
        # compile id -> (blob, lowest and highest pc found in it): a pc between two of one nmethod's is in it
        # too (a blob is contiguous, a compile id never reused), so the new pcs of a hot nmethod (a window's
        # sampled pcs keep being new) skip the code cache's segment map
        self.extents: dict[int, tuple[int, int, int]] = {}
        self.failures: dict[tuple[int, int], str] = {}  # (pc, compile id) -> why unnamed
        self.blob_names: dict[int, str | None] = {}  # blob -> its _name (stubs, adapters)
        self.scopes: dict[tuple[int, int], NmethodScopes | None] = {}  # (blob, compile id) -> debug info (LRU)
        self.scopes_bytes = 0  # held by ``scopes`` (at most SCOPES_KEPT_BYTES, but for the last one read)
        self.chains: dict[tuple[int, int], tuple[int, ...]] = {}  # (pc, compile id) -> Method*s, innermost first
        self.borrowed: dict[tuple[int, int], int] = {}  # (pc, compile id) -> bytes to the PcDesc it borrowed
        self._chain_forms: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct chain
        self.dense: dict[tuple[int, int], bool] = {}  # (blob, compile id) -> its scopes' density, once known
        self.log: list[tuple[int, int, tuple[int, ...]]] | None = None  # new chains, for the checkpoint journal
        self.borrowed_log: list[tuple[int, int, int]] | None = None  # and their ``borrowed`` entries

    def methods_of(self, pc: int, compile_id: int) -> tuple[int, ...]:
        """The Method*s of the frame's scopes, innermost first (the inlined ones, then the nmethod's own);
        empty when the frame cannot be named (cause in ``failures``). A chain from a borrowed PcDesc
        (``borrowed_bytes``) is noted in ``borrowed``."""
        key = (pc, compile_id)
        chain = self.chains.get(key)
        if chain is not None:
            return chain
        method = self.method_of(pc, compile_id)
        if method is None:
            return ()
        scopes = self._scopes_of(self.extents[compile_id][0], compile_id)
        inlined: tuple[int, ...] = ()
        if scopes is not None:
            try:
                found = scope_methods(scopes, pc)
            except ValueError:
                found = ()
            if found and found[-1] == method:
                inlined = found[:-1]
                borrowed = borrowed_bytes(scopes, pc)
                if borrowed:
                    self.borrowed[key] = borrowed
                    if self.borrowed_log is not None:
                        self.borrowed_log.append((pc, compile_id, borrowed))
        chain = (*inlined, method)
        chain = self.chains[key] = self._chain_forms.setdefault(chain, chain)  # the pcs of a scope share it
        if self.log is not None:
            self.log.append((pc, compile_id, chain))
        return chain

    def _scopes_of(self, blob: int, compile_id: int) -> NmethodScopes | None:
        """The nmethod's debug information (None: unreadable, or its code freed), from the ``SCOPES_KEPT``
        read last or read now."""
        key = (blob, compile_id)
        kept = self.scopes
        if key in kept:
            kept[key] = kept.pop(key)  # the dict's order is the use order: most recent last
            return kept[key]
        scopes = None
        try:
            if self._compile_id_at(blob) == compile_id:
                scopes = read_nmethod_scopes(self.memory, self.layout, blob)
        except (OSError, ValueError):
            pass
        known = self.dense.get(key)
        if scopes is not None and known is not None and scopes.dense is None:
            scopes = replace(scopes, dense=known)  # read again after its eviction: its density was found then
        kept[key] = scopes
        self.scopes_bytes += _scopes_bytes(scopes)
        while len(kept) > SCOPES_KEPT or self.scopes_bytes > SCOPES_KEPT_BYTES and len(kept) > 1:
            evicted_key = next(iter(kept))
            evicted = kept.pop(evicted_key)
            self.scopes_bytes -= _scopes_bytes(evicted)
            if evicted is not None and evicted.density_known():
                self.dense[evicted_key] = evicted.is_dense
        return scopes

    def _compile_id_at(self, blob: int) -> int:
        """The compile id the nmethod at ``blob`` holds now (OSError: unreadable)."""
        return self.memory.s32(blob + self.layout.compile_id) & COMPILE_ID_MASK

    def blob_name(self, pc: int) -> str | None:
        """The CodeBlob _name of a pc in the code cache that is no compiled method (a stub, an adapter,
        the interpreter), as ``[stub] name``; None outside the code cache or when unreadable."""
        if not self.layout.low <= pc < self.layout.high:
            return None
        try:
            blob = find_blob(self.memory, self.layout, pc)
            if blob is None:
                return None
            if blob not in self.blob_names:
                raw = self.memory.read(self.memory.u64(blob + self.layout.name), 80).split(b"\0", 1)[0]
                text = raw.decode("ascii", "replace")
                self.blob_names[blob] = f"[stub] {text}" if text and text.isprintable() else None
        except OSError:
            return None
        return self.blob_names[blob]

    def method_of(self, pc: int, compile_id: int) -> int | None:
        """The Method* of the nmethod ``compile_id`` holding ``pc``, or None (cause in ``failures``)."""
        failed = (pc, compile_id)
        if failed in self.failures:
            return None
        try:
            extent = self.extents.get(compile_id)
            if extent is not None and extent[1] <= pc <= extent[2]:
                return self.methods[(extent[0], compile_id)]
            blob = find_blob(self.memory, self.layout, pc)
            if blob is None:
                self.failures[failed] = FREED
                return None
            known = self.methods.get((blob, compile_id))
            if known is not None:
                self._extend(blob, compile_id, pc)
                return known
            if blob_kind(self.memory, self.layout, blob) != KIND_NMETHOD:
                self.failures[failed] = FREED
                return None
            if self._compile_id_at(blob) != compile_id:
                self.failures[failed] = FREED
                return None
            method = self.memory.u64(blob + self.layout.method)
        except OSError:
            self.failures[failed] = UNREADABLE_BLOB
            return None
        self.methods[(blob, compile_id)] = method
        self._extend(blob, compile_id, pc)
        return method

    def _extend(self, blob: int, compile_id: int, pc: int) -> None:
        """``pc`` was found in ``blob``, which holds the nmethod ``compile_id``: its known extent grows to it."""
        extent = self.extents.get(compile_id)
        if extent is None or extent[0] != blob:
            self.extents[compile_id] = (blob, pc, pc)
        else:
            self.extents[compile_id] = (blob, min(extent[1], pc), max(extent[2], pc))


# ---------------------------------------------------------------- inlined scopes (nmethod debug information)

MAX_DEBUG_BYTES = 4 << 20  # an nmethod's metadata + scopes + PcDescs: tens of KiB in practice
MAX_SCOPES = 64  # inlining depth expanded per frame (C2's MaxInlineLevel is 15)
_UNSIGNED5_LOW = 192  # bytes below this end a number (HotSpot's UNSIGNED5: 6-bit high digits)


@dataclass(frozen=True)
class NmethodScopes:
    """One nmethod's debug information, read while its code is alive."""

    code_begin: int
    metadata: bytes  # Method*s (and other Metadata*) by index - 1
    scopes_data: bytes  # ScopeDescs: (sender offset, method index, bci + 1), UNSIGNED5
    # PcDescs as flat pairs: pc offset from code_begin, scope decode offset, ... in pc offset order (an
    # array: a big C2 nmethod has thousands, and the namer keeps every nmethod's scopes it has read)
    pcs: array[int]
    excluded_bytes: int
    # it holds non-safepoint PcDescs: compiled while DebugNonSafepoints (or a JVMTI agent) made the JIT record
    # one at the end of every run of instructions whose inlining differs from the next one's (has_non_safepoints);
    # None: not looked at yet (``is_dense`` finds it when a pc first needs it: decoding every scope costs more
    # than reading the nmethod, and return addresses, most frames, never need it)
    dense: bool | None = None

    @cached_property
    def is_dense(self) -> bool:
        if self.dense is not None:
            return self.dense
        return has_non_safepoints(self.scopes_data, self.pcs, self.excluded_bytes)

    def density_known(self) -> bool:
        """Whether ``is_dense`` is known without decoding the scopes."""
        return self.dense is not None or "is_dense" in self.__dict__


def _scopes_bytes(scopes: NmethodScopes | None) -> int:
    if scopes is None:
        return 0
    return len(scopes.metadata) + len(scopes.scopes_data) + scopes.pcs.itemsize * len(scopes.pcs)


def _blob_field(memory: Memory, blob: int, spec: tuple[int, int]) -> int:
    offset, width = spec
    return int.from_bytes(memory.read(blob + offset, width), "little", signed=width < 8)


def _debug_regions(memory: Memory, scopes: ScopesLayout, blob: int) -> tuple[bytes, bytes, bytes]:
    """(metadata, scopes data, PcDescs) of the nmethod at ``blob``; ValueError when the sizes are absurd."""

    def field(name: str) -> int:
        return _blob_field(memory, blob, scopes.fields[name])

    if scopes.immutable:
        immutable, size = field("immutable_data"), field("immutable_data_size")
        pcs_at, data_at = field("scopes_pcs"), field("scopes_data")
        mutable, relocation, mutable_size = field("mutable_data"), field("relocation_size"), field("mutable_data_size")
        sizes_sane = 0 <= pcs_at <= data_at <= size <= MAX_DEBUG_BYTES
        if not (sizes_sane and 0 <= relocation <= mutable_size <= MAX_DEBUG_BYTES):
            raise ValueError(f"nmethod {blob:#x}: debug information sizes absurd")
        return (
            memory.read(mutable + relocation, mutable_size - relocation),
            memory.read(immutable + data_at, size - data_at),
            memory.read(immutable + pcs_at, data_at - pcs_at),
        )
    metadata_at, pcs_at, end_at = field("metadata"), field("scopes_pcs"), field("dependencies")
    data_at = field("scopes_data_begin") - blob  # a pointer on these JDKs
    if not 0 <= metadata_at <= data_at <= pcs_at <= end_at <= metadata_at + MAX_DEBUG_BYTES:
        raise ValueError(f"nmethod {blob:#x}: debug information offsets out of order")
    region = memory.read(blob + metadata_at, end_at - metadata_at)
    data_at, pcs_at = data_at - metadata_at, pcs_at - metadata_at
    return region[:data_at], region[data_at:pcs_at], region[pcs_at:]


def read_nmethod_scopes(memory: Memory, layout: CodeCacheLayout, blob: int) -> NmethodScopes:
    """The debug information of the nmethod at ``blob`` (OSError: unreadable; ValueError: absurd)."""
    scopes = layout.scopes
    if scopes is None:
        raise ValueError(layout.scopes_error)
    metadata, data, pcs_raw = _debug_regions(memory, scopes, blob)
    pcs = pc_desc_pairs(pcs_raw, scopes)
    if layout.code_is_offset:
        code_begin = blob + _blob_field(memory, blob, (layout.code, 4))
    else:
        code_begin = memory.u64(blob + layout.code)
    return NmethodScopes(code_begin, metadata, data, pcs, scopes.excluded_bytes)


def pc_desc_pairs(pcs_raw: bytes, scopes: ScopesLayout) -> array[int]:
    """The PcDescs' (pc offset, scope decode offset) as flat pairs in pc offset order (stable)."""
    size = scopes.pc_desc_size
    count = len(pcs_raw) // size
    aligned = size % 4 == 0 and scopes.pc_offset % 4 == 0 and scopes.scope_offset % 4 == 0
    if aligned and sys.byteorder == "little" and count:
        # HotSpot writes them in pc order: then two strided views of the s32s are the answer, without a loop
        ints = memoryview(pcs_raw[: count * size]).cast("i")
        stride = size // 4
        offsets = array("i", ints[scopes.pc_offset // 4 :: stride])
        if offsets.tolist() == sorted(offsets):
            pcs = array("i", bytes(8 * count))
            pcs[0::2] = offsets
            pcs[1::2] = array("i", ints[scopes.scope_offset // 4 :: stride])
            return pcs
    pairs = []
    for at in range(0, count * size, size):
        pc_offset = int.from_bytes(pcs_raw[at + scopes.pc_offset : at + scopes.pc_offset + 4], "little", signed=True)
        scope = int.from_bytes(pcs_raw[at + scopes.scope_offset : at + scopes.scope_offset + 4], "little", signed=True)
        pairs.append((pc_offset, scope))
    pairs.sort(key=lambda pair: pair[0])  # stable
    return array("i", (number for pair in pairs for number in pair))


def unsigned5(data: bytes, at: int, excluded: int) -> tuple[int, int]:
    """One UNSIGNED5 number at ``at`` (HotSpot's compressed stream): (value, offset after it)."""
    value = 0
    for digit in range(5):
        if at >= len(data) or data[at] < excluded:
            raise ValueError(f"UNSIGNED5 number broken at byte {at}")
        byte = data[at]
        at += 1
        value += (byte - excluded) << (6 * digit)
        if byte < _UNSIGNED5_LOW:
            break
    return value, at


def _pc_desc_at_or_after(scopes: NmethodScopes, delta: int) -> int:
    """The index of the first PcDesc at or after the code offset ``delta`` (their count when none is)."""
    pcs = scopes.pcs
    low, high = 0, len(pcs) // 2  # in pc order: a binary search
    while low < high:
        middle = (low + high) // 2
        if pcs[2 * middle] < delta:
            low = middle + 1
        else:
            high = middle
    return low


def scope_methods(scopes: NmethodScopes, pc: int) -> tuple[int, ...]:
    """The Method*s of the scopes at ``pc``, innermost (inlined deepest) first, the nmethod's own last;
    empty when there is no debug information for it. A return address has a PcDesc of its own; a
    sampled pc between two takes the next one after it (the JVM's own ``pc_desc_near``: the code up to
    a safepoint or call belongs to that call's scope)."""
    desc = _pc_desc_at_or_after(scopes, pc - scopes.code_begin)
    offset = scopes.pcs[2 * desc + 1] if desc < len(scopes.pcs) // 2 else 0
    methods: list[int] = []
    limit = len(scopes.scopes_data)
    for _ in range(MAX_SCOPES):
        if not 0 < offset < limit:  # 0: no sender; offsets only go down, so the walk ends
            break
        limit = offset
        sender, at = unsigned5(scopes.scopes_data, offset, scopes.excluded_bytes)
        index, _at = unsigned5(scopes.scopes_data, at, scopes.excluded_bytes)
        if index > 0 and 8 * index <= len(scopes.metadata):
            methods.append(int.from_bytes(scopes.metadata[8 * (index - 1) : 8 * index], "little"))
        offset = sender
    return tuple(methods)


# A PcDesc further than this after the pc is counted this far (a stats field sums them per sample).
MAX_BORROWED = 1 << 16


def borrowed_bytes(scopes: NmethodScopes, pc: int) -> int:
    """0 when the scope ``scope_methods`` gives ``pc`` is exact, else how many bytes after the pc the
    PcDesc it borrowed lies (1..MAX_BORROWED). Exact: a PcDesc at the pc itself (a return address, a
    safepoint poll), or any pc of a dense nmethod (every run of instructions with its own inlining ends
    in a PcDesc). Otherwise the pc lies in code no PcDesc describes, between two safepoints or calls,
    and the next one's scope stands in: methods inlined there are charged to that scope's (docs/unwinding.md).
    A pc after the last PcDesc (the nmethod's stubs) has no scope to borrow: 0."""
    delta = pc - scopes.code_begin
    index = _pc_desc_at_or_after(scopes, delta)
    if index >= len(scopes.pcs) // 2:
        return 0
    gap = scopes.pcs[2 * index] - delta
    if gap == 0 or scopes.is_dense:
        return 0
    return min(gap, MAX_BORROWED)


def has_non_safepoints(scopes_data: bytes, pcs: array[int], excluded: int) -> bool:
    """Whether some PcDesc describes no safepoint: each scope of its chain carries no values (its locals,
    expressions and monitors are all HotSpot's serialized null, 0). The JIT writes such scopes only for
    the PcDescs it records with DebugNonSafepoints (``add_non_safepoint``); a safepoint or call keeps its
    live locals. A safepoint whose chain has nothing live at all (an outermost method without locals,
    its expression stack empty) would look the same: rare, and it errs towards "exact". Bounded: each
    distinct scope is decoded once, and the first such PcDesc ends the search."""
    free: dict[int, bool] = {}  # scope decode offset -> its chain carries no values
    return any(offset > 0 and _value_free(scopes_data, offset, excluded, free) for offset in pcs[1::2])


def _value_free(data: bytes, offset: int, excluded: int, free: dict[int, bool]) -> bool:
    """Whether the scope chain at ``offset`` carries no values (memoized in ``free``); garbage: False."""
    seen: list[int] = []
    result = True
    limit = len(data)
    for _ in range(MAX_SCOPES):
        if offset == 0 and seen:  # no sender: the chain ends here
            break
        if not 0 < offset < limit:  # beyond the data, or a sender that does not go down: garbage
            result = False
            break
        known = free.get(offset)
        if known is not None:
            result = known
            break
        seen.append(offset)
        limit = offset
        try:
            sender, at = unsigned5(data, offset, excluded)
            for _field in range(2):  # method index, bci + 1
                _value, at = unsigned5(data, at, excluded)
            values = 0
            for _field in range(3):  # locals, expressions, monitors
                value, at = unsigned5(data, at, excluded)
                values |= value
        except ValueError:
            result = False
            break
        if values:
            result = False
            break
        offset = sender
    for scope in seen:
        free[scope] = result
    return result
