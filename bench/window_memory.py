"""What the host agent's memory holds at the end of the window, structure by structure (issue 29's in-window
growth), for bench/postrun_memory.py's ``--window-breakdown``.

Three views, each from this process:
- per structure: the Python objects reachable from each in-window structure of the sampler (the stack
  store's parts, the batches' memos, the JVMs' names, thread names, perf-map histories), counted once each
  in the order listed (an object shared by two structures counts in the first);
- per allocator: glibc's heap in use and free (``mallinfo2``: C allocations, bcc's caches, Python objects
  above 512 bytes) and pymalloc's arenas (``sys._debugmallocstats``: small Python objects), against VmRSS
  split into anonymous, file and shared pages;
- per tick: RSS, distinct stacks and samples at each interval, to extrapolate per distinct stack.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MB = 1e6
_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def proc_status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem and VmHWM of this process, in bytes."""
    wanted = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in wanted:
            found[name] = int(rest.split()[0]) * 1024
    return found


def deep_size(roots: Iterable[Any], seen: set[int]) -> tuple[int, int]:
    """(bytes, objects) reachable from ``roots`` through gc referents and container items, skipping what
    ``seen`` holds and classes, modules and code (shared by everything)."""
    total = count = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        count += 1
        if isinstance(obj, str | bytes | int | float):
            continue
        stack.extend(gc.get_referents(obj))
    return total, count


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_figures() -> dict[str, int]:
    """glibc's heap: bytes in use, free inside the heap, and mmapped blocks (all arenas)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"malloc in use": info.uordblks, "malloc free (kept)": info.fordblks, "malloc mmapped": info.hblkhd}


def pymalloc_figures() -> dict[str, int]:
    """pymalloc's arenas: bytes in allocated blocks, in free blocks and pools, and the arenas' total."""
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(sink.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        text = sink.read()

    def figure(label: str) -> int:
        found = re.search(rf"# {re.escape(label)}\s*=\s*([\d,]+)", text)
        return int(found.group(1).replace(",", "")) if found else 0

    arenas = figure("arenas allocated current")
    return {
        "pymalloc arenas": arenas * (1 << 20),
        "pymalloc in used blocks": figure("bytes in allocated blocks"),
        "pymalloc free (pools, blocks)": figure("bytes in available blocks") + figure("bytes in 0 quarantined"),
    }


@dataclass
class Tick:
    t: float
    rss: int
    anon: int
    distinct_stacks: int
    samples: int


def sampler_structures(sampler: Any) -> Iterator[tuple[str, list[Any]]]:
    """(label, roots) of the sampler's in-window structures, most specific first."""
    store = sampler._store
    yield "store: packed user chunks, value table", [getattr(store, "_packed", None)]
    yield "store: raw stack chunks", [store._chunks]
    yield "store: deep stack tuples", [store._deep]
    yield "store: deep stacks seen lately (by hash)", [getattr(store, "_recent", None)]
    yield "store: keys (dict + list)", [store._keys, store._key_list]
    yield "store: counts per process", [store._counts]
    yield "store: journal delta", [store._delta]
    yield "store: chunks waiting for a batch", [getattr(store, "_fresh", None), getattr(store, "_fresh_owner", None)]
    yield "store: contexts", [store._contexts, store._context_list]
    window = sampler._window
    if window is not None:
        yield "batches: pcs looked at", [window._seen]
        yield "batches: native-name memos", [getattr(symbols, "_memo", None) for symbols in window.used.values()]
    prepared = sampler._symbols._prepared.values()
    yield "prepared symbol caches' memos", [getattr(p.symbols, "_memo", None) for p in prepared]
    yield "perf-map histories", [sampler._symbols.histories]
    jvms = sampler.walker.jvms
    yield "JVMs: stacks seen per generation", [jvms._seen]
    for pid, namer in jvms.namers.items():
        compiled = namer.compiled
        yield f"JVM {pid}: Method* names", [namer.names, namer.failures, namer.frozen, namer.spellings, namer.log]
        if compiled is not None:
            yield f"JVM {pid}: compiled frames", [vars(compiled)]
    if sampler._names is not None:
        yield "thread names", [vars(sampler._names)]
    if sampler._reader is not None:
        yield "pending records, kernel-named counts", [sampler._reader.pending, sampler._reader.kernel_named]


def breakdown(sampler: Any) -> list[tuple[str, int, int]]:
    """(label, bytes, objects) per structure, then what every gc-tracked object adds beyond them."""
    seen: set[int] = set()
    rows = []
    for label, roots in sampler_structures(sampler):
        size, count = deep_size([root for root in roots if root is not None], seen)
        rows.append((label, size, count))
    return rows


def report(sampler: Any, ticks: list[Tick], baseline: int) -> str:
    """The text printed at the window's end."""
    lines = ["", "== at the window's end, per structure (objects reachable, each counted once, in this order)"]
    rows = breakdown(sampler)
    for label, size, count in rows:
        lines.append(f"{label:<45} {size / MB:>8.2f} MB {count:>10,} objects")
    lines.append(f"{'sum of the structures':<45} {sum(r[1] for r in rows) / MB:>8.2f} MB")
    store = sampler._store
    lines.append(
        f"store: {store.distinct_stacks:,} distinct stacks, {store.samples:,} samples, {len(store._chunks):,} chunks"
        f" ({store.stored_bytes / MB:.2f} MB of addresses), {sum(len(c) for c in store._counts.values()):,} counts"
    )
    lines.append("== allocators and RSS")
    status = proc_status()
    for name, value in {**status, **malloc_figures(), **pymalloc_figures()}.items():
        lines.append(f"{name:<45} {value / MB:>8.2f} MB")
    lines.append(f"{'RSS when the window began':<45} {baseline / MB:>8.2f} MB")
    lines.append("== per tick: t, RSS, anon, distinct stacks, samples")
    for tick in ticks:
        lines.append(
            f"{tick.t:>6.0f} s {tick.rss / MB:>8.1f} MB {tick.anon / MB:>8.1f} MB {tick.distinct_stacks:>8,}"
            f" {tick.samples:>8,}"
        )
    lines.extend(extrapolation(ticks, baseline))
    return "\n".join(lines)


def extrapolation(ticks: list[Tick], baseline: int) -> list[str]:
    """Growth per distinct stack from the first tick with stacks to the last (a least-squares slope)."""
    points = [(t.distinct_stacks, t.rss) for t in ticks if t.distinct_stacks]
    if len(points) < 3:
        return ["(too few ticks to extrapolate)"]
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return ["(distinct stacks did not grow)"]
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
    offset = mean_y - slope * mean_x - baseline
    return [
        f"RSS growth per distinct stack (least squares, {n} ticks): {slope:,.0f} B; fixed part {offset / MB:+.1f} MB",
        f"extrapolated to 14,000 distinct stacks: {(offset + 14_000 * slope) / MB:+.1f} MB over the window's start",
    ]
