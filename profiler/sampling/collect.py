"""The stack sampler's collection after the window: the ring buffer's samples (stored by the reader,
reader.py) or the stack map's counts folded per PID and named, the BPF program's per-process counts,
and the end-of-run warnings that name the option to change."""

from __future__ import annotations

import errno
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..bpf.compiler import release_freed_memory
from ..capture.format import SamplerStats
from ..capture.stackstore import CUT_CFI_MISS, CUT_NATIVE, CUT_NO_CFI, CollectedStacks, StackStore
from ..capture.stacktable import StackTableBuilder
from ..symbols.batches import WindowSymbols
from ..symbols.procsyms import ProcessSymbols
from ..symbols.symbolize import (
    Frame,
    KernelSymbols,
    PythonNamer,
    StackFolder,
    fold_stack,
    is_java_unwalkable,
    tabulate_store,
)
from ..symbols.symbolprep import SymbolPreparer
from ..unwind.cfi import CfiLoader
from ..unwind.hotspot import JvmNames
from .program import STACK_NONE, SamplerProgram

HOTSPOT_STEPS = ("compiled", "interpreted", "no_blob", "bad_return")  # struct hs_health's fields


def hotspot_steps(bpf: Any, pid: int) -> dict[str, int]:
    """The walker's steps through ``pid``'s code cache, by kind (empty: none, or not a JVM)."""
    health = bpf[b"hs_health_map"]
    try:
        entry = health[health.Key(pid)]
    except KeyError:
        return {}
    return {name: int(getattr(entry, name)) for name in HOTSPOT_STEPS if getattr(entry, name)}


def _read_counts(bpf: Any) -> list[tuple[Any, int]]:
    counts = bpf[b"counts"]
    try:
        # one syscall per batch on kernels >= 5.6, instead of two per entry
        return [(k, int(v.value)) for k, v in counts.items_lookup_batch()]
    except Exception:  # noqa: BLE001 - no batch lookup in this kernel or bcc: one by one
        return [(k, int(v.value)) for k, v in counts.items()]


def _stack(stacks: Any, cache: dict[int, tuple[int, ...]], stack_id: int) -> tuple[int, ...]:
    frames = cache.get(stack_id)
    if frames is None:
        try:
            leaf = stacks[stacks.Key(stack_id)]
            ips = []
            for addr in leaf.ip:
                if addr == 0:
                    break
                ips.append(int(addr))
            frames = tuple(ips)
        except KeyError:
            frames = ()
        cache[stack_id] = frames
    return frames


def target_counts(bpf: Any, pid: int) -> tuple[int, int]:
    """(samples, dropped) the BPF program counted for ``pid``."""
    targets = bpf[b"targets"]
    try:
        target = targets[targets.Key(pid)]
        return int(target.samples), int(target.dropped)
    except KeyError:
        return 0, 0


def collect_ringbuf(
    bpf: Any,
    store: StackStore,
    symbols_of: SymbolPreparer,
    jvms: JvmNames | None,
    targets: Iterable[int],
    max_stack_depth: int,
    kernel_stack_depth: int,
    last: int | None,
    cfi: CfiLoader | None = None,
    window: WindowSymbols | None = None,
    kernel_named: Mapping[int, int] | None = None,
    pythons: Mapping[int, PythonNamer] | None = None,
) -> tuple[dict[int, CollectedStacks], int]:
    """The ring buffer's samples folded per PID with their timeline (``last``: the window's last
    interval), each Java frame named by the perf-map version of its sample's time, interpreted frames by
    ``jvms`` (our walker; None: bpf_get_stack's stacks), stacks ending at a native frame told apart by
    ``cfi``'s tables, native names found during the window taken from ``window``, each pid's samples
    whose thread the kernel's name named (``kernel_named``, from the reader, with thread names); and the
    samples dropped in all (ring buffer full)."""
    result: dict[int, CollectedStacks] = {}
    kernel = KernelSymbols()
    dropped_total = 0
    try:
        kernel.name_all(store.kernel_stacks())
        release_freed_memory()
        for pid in sorted(set(targets) | set(store.pids())):
            samples, dropped = target_counts(bpf, pid)
            dropped_total += dropped
            stats = SamplerStats(pid=pid, samples=samples, max_stack_depth=max_stack_depth, dropped=dropped)
            table = StackTableBuilder().build()
            if store.epochs(pid):
                if jvms is not None:
                    jvms.final_check(pid)
                symbols, owned = symbols_of.symbols_for(pid)
                if window is not None:
                    window.adopt_into(pid, symbols)
                if owned:
                    symbols_of.release_symbols(pid)  # a fresh cache names it: the prepared one's tables go now
                try:
                    is_java = symbols_of.is_java(pid, symbols)
                    folder = StackFolder(
                        symbols,
                        kernel,
                        max_stack_depth,
                        is_java,
                        kernel_stack_depth,
                        walker=jvms is not None,
                        methods=jvms.namers.get(pid) if jvms is not None else None,
                        no_methods_cause=jvms.unnamed_cause(pid) if jvms is not None else "",
                        native_cause=cfi.cut_cause_of(pid) if cfi is not None else None,
                        python=pythons.get(pid) if pythons is not None else None,
                    )
                    history = symbols_of.histories.get(pid)
                    table = tabulate_store(store, pid, folder, history, last)
                    stats = replace(stats, **folder.stats_fields)  # type: ignore[arg-type]
                    if jvms is not None:
                        stats = replace(stats, hotspot_steps=hotspot_steps(bpf, pid))
                    if history is not None:
                        stats = replace(stats, perf_map_snapshots=history.snapshots)
                    if kernel_named is not None:
                        stats = replace(stats, thread_names_kernel=kernel_named.get(pid, 0))
                finally:
                    if owned:
                        symbols.close()
                store.forget(pid)
                symbols_of.release_symbols(pid)
                # the symbol cache's and the naming's heap back to the kernel before the next process and the
                # writing: glibc keeps it otherwise, and the next steps stack on it
                release_freed_memory()
                symbols_of.discard_history(pid)
            result[pid] = CollectedStacks(table, stats)
    finally:
        kernel.close()
    return result, dropped_total


def collect_stackmap(
    bpf: Any, symbols_of: SymbolPreparer, targets: Iterable[int], depth: int
) -> tuple[dict[int, tuple[Counter[str], SamplerStats]], Counter[int], int]:
    """The stack map's counts folded per PID; the samples lost per reason (errno) and dropped in all."""
    stacks_table = bpf[b"stack_traces"]
    stack_cache: dict[int, tuple[int, ...]] = {}
    by_pid: dict[int, list[tuple[Any, int]]] = {}
    for key, count in _read_counts(bpf):
        by_pid.setdefault(int(key.tgid), []).append((key, count))
    kernel = KernelSymbols()
    result: dict[int, tuple[Counter[str], SamplerStats]] = {}
    lost_reasons: Counter[int] = Counter()
    dropped_total = 0
    try:
        for pid in sorted(set(targets) | set(by_pid)):
            samples, dropped = target_counts(bpf, pid)
            dropped_total += dropped
            folded: Counter[str] = Counter()
            stats = SamplerStats(pid=pid, samples=samples, max_stack_depth=depth, dropped=dropped)
            entries = by_pid.get(pid, [])
            symbols: ProcessSymbols | None = None
            owned = False
            if entries:
                symbols, owned = symbols_of.symbols_for(pid)
            is_java = symbols_of.is_java(pid, symbols)  # no perf-map versions without the ring buffer
            try:
                for key, count in entries:
                    user_frames: list[Frame] | None = None
                    kernel_names: list[str] | None = []
                    truncated = False
                    user_id, kernel_id = int(key.user_stack_id), int(key.kernel_stack_id)
                    if user_id >= 0:
                        addrs = _stack(stacks_table, stack_cache, user_id)
                        truncated = len(addrs) >= depth
                        assert symbols is not None
                        user_frames = [symbols.resolve(a) for a in addrs]
                    else:
                        lost_reasons[-user_id] += count
                        stats = replace(stats, lost_user_stack=stats.lost_user_stack + count)
                    if kernel_id >= 0:
                        addrs = _stack(stacks_table, stack_cache, kernel_id)
                        truncated = truncated or len(addrs) >= depth
                        kernel_names = [kernel.resolve(a) for a in addrs]
                    elif kernel_id != STACK_NONE:
                        kernel_names = None
                        lost_reasons[-kernel_id] += count
                        stats = replace(stats, lost_kernel_stack=stats.lost_kernel_stack + count)
                    if truncated:
                        stats = replace(stats, truncated=stats.truncated + count)
                    if user_frames is not None and is_java_unwalkable(user_frames, truncated, is_java):
                        stats = replace(stats, java_unwalkable=stats.java_unwalkable + count)
                    comm = bytes(key.comm).split(b"\0", 1)[0].decode("utf-8", "replace")
                    user_names = [f.name for f in user_frames] if user_frames is not None else None
                    folded[fold_stack(comm, user_names, kernel_names)] += count
            finally:
                if owned and symbols is not None:
                    symbols.close()
            result[pid] = (folded, stats)
    finally:
        kernel.close()
    return result, lost_reasons, dropped_total


def end_of_run_warnings(
    result: dict[int, SamplerStats],
    lost: Counter[int],
    dropped: int,
    limits: SamplerProgram,
    jvm_errors: dict[int, str],
) -> list[str]:
    """What went missing or unnamed in the window, each naming the option to change (``limits``: the
    program's collection and sizes)."""
    warnings: list[str] = []
    # A few bucket collisions are normal in a hash of stacks; a full map or many collisions are not.
    full = lost[errno.ENOMEM] + lost[errno.EEXIST]
    total = sum(stats.samples for stats in result.values())
    if lost[errno.ENOMEM] or full > 0.005 * total:
        warnings.append(
            f"{full} stacks not stored (stack map full or hash collisions); raise --stack-storage-size "
            f"(now {limits.stack_storage_size})"
        )
    if dropped and limits.collection == "ringbuf":
        warnings.append(
            f"{dropped} samples not counted (ring buffer of {limits.ringbuf_pages() * 4 // 1024} MiB full: the "
            "reader fell behind); lower --frequency or give the profiler more CPU"
        )
    elif dropped:
        warnings.append(
            f"{dropped} samples not counted (counts map of {limits.count_map_size} entries full); "
            f"raise --stack-storage-size (now {limits.stack_storage_size}) or shorten --duration"
        )
    for pid, stats in sorted(result.items()):
        if stats.samples and stats.interpreted_only / stats.samples >= 0.05:
            warnings.append(
                f"pid {pid}: {stats.interpreted_only / stats.samples:.0%} of samples are in interpreted Java "
                "code only (frames show as Interpreter, not by method); profile after warm-up (the JIT "
                "compiles hot code) or see docs/capture-format.md (interpreted_only)"
            )
        if stats.java_frames and stats.java_frames_unresolved / stats.java_frames >= 0.05:
            warnings.append(
                f"pid {pid}: {stats.java_frames_unresolved / stats.java_frames:.0%} of Java frames have no name "
                "in any perf-map version; lower --perf-map-refresh (code freed between refreshes)"
            )
        unnamed = sum(stats.interpreted_unnamed.values())
        if stats.interpreted_frames and unnamed / stats.interpreted_frames >= 0.05:
            cause = max(stats.interpreted_unnamed.items(), key=lambda item: item[1])[0]
            detail = jvm_errors.get(pid, "")
            warnings.append(
                f"pid {pid}: {unnamed / stats.interpreted_frames:.0%} of interpreted Java frames unnamed, mostly: "
                f"{cause}{f' ({detail[:160]})' if detail else ''}; see docs/unwinding.md"
            )
        native_cut = sum(stats.stacks_cut.get(cause, 0) for cause in (CUT_NATIVE, CUT_NO_CFI, CUT_CFI_MISS))
        if stats.samples and native_cut / stats.samples >= 0.05:
            warnings.append(
                f"pid {pid}: {native_cut / stats.samples:.0%} of stacks end at a native frame before the thread's "
                "start (code without frame pointers, e.g. glibc); the task frames above it are lost"
            )
        if stats.samples and stats.truncated / stats.samples >= 0.01:
            warnings.append(
                f"pid {pid}: {stats.truncated / stats.samples:.0%} of stacks hit the depth limit of "
                f"{stats.max_stack_depth} frames; raise --max-stack-depth"
            )
    return warnings
