"""The checkpoint journal's writer: during the window, every ``--checkpoint`` seconds, what a killed run
needs to be rebuilt by ``profiler recover`` is appended to ``<out>/checkpoint/journal.tpj``.

Each checkpoint adds only what changed (new distinct stacks, count deltas, /proc/PID/maps of a process
when first seen or changed) plus the small state as it is now (scope, counters, perf-map versions); it
is written by the runner's thread, never the ring-buffer reader's, and fsync'ed so a kill or a crash
of the host keeps it. The format is profiler/capture/journal.py's; the perf-map versions the sampler copies
aside live beside the journal (``perfmaps/``). A run that ends normally removes the directory.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import procread, procstat
from .format import PidCounters, ProcessInfo
from .journal import Checkpoint, encode_checkpoint, encode_header
from .stackstore import SamplerCheckpoint
from .timeline import CounterReading

CHECKPOINT_DIR = "checkpoint"
JOURNAL_FILE = "journal.tpj"
PERF_MAPS_DIR = "perfmaps"
DEFAULT_CHECKPOINT = 30.0  # seconds between checkpoints: at most this much of a killed run is lost


def checkpoint_dir(out: Path) -> Path:
    return Path(out) / CHECKPOINT_DIR


def journal_path(out: Path) -> Path:
    return checkpoint_dir(out) / JOURNAL_FILE


def executable_maps(maps_text: str) -> str:
    """The executable mappings of a /proc/PID/maps text: all that symbolization needs (a JVM's maps
    are mostly heap and thread stacks)."""
    kept = [line for line in maps_text.splitlines() if len(line.split(None, 2)) > 1 and "x" in line.split(None, 2)[1]]
    return "\n".join(kept) + ("\n" if kept else "")


@dataclass
class CheckpointCost:
    """What the checkpoints cost the profiler (overhead.json)."""

    count: int = 0
    cpu_seconds: float = 0.0  # CPU of the runner's thread while taking and writing them
    seconds: float = 0.0  # wall time, fsync included
    bytes: int = 0  # journal bytes written
    largest_bytes: int = 0


def checkpoint_state(
    processes: Sequence[ProcessInfo],
    counters: Mapping[int, PidCounters],
    new_readings: Mapping[int, Sequence[CounterReading]],
    sampler: SamplerCheckpoint,
    maps: Mapping[int, tuple[int | None, str]],
    warnings: Sequence[str],
    cycles_source: str,
) -> dict[str, Any]:
    """The JSON part of a checkpoint (pure). ``maps``: PID -> (start ticks, executable maps) of the
    processes whose maps changed since the last checkpoint."""
    return {
        "origin_ns": sampler.origin_ns,
        "processes": [asdict(p) for p in processes],
        "counters": {str(pid): asdict(c) for pid, c in counters.items()},
        "readings": {str(pid): [list(asdict(r).values()) for r in rows] for pid, rows in new_readings.items() if rows},
        "dropped": {str(pid): n for pid, n in sampler.dropped.items()},
        "perf_maps": {str(pid): versions for pid, versions in sampler.perf_maps.items()},
        "java_names": {
            str(pid): {"code_low": d.code_low, "names": d.names, "chains": d.chains, "borrowed": d.borrowed}
            for pid, d in sampler.java_names.items()
            if d.names or d.chains
        },
        "maps": {str(pid): {"start_ticks": ticks, "maps": text} for pid, (ticks, text) in maps.items()},
        "warnings": list(dict.fromkeys(warnings)),
        "cycles_source": cycles_source,
    }


def start_ticks(pid: int) -> int | None:
    """/proc/PID/stat starttime: tells a reused pid from the original; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            line = procstat.split_stat(handle.read())
    except OSError:
        return None
    return line.count(procstat.STARTTIME) if line is not None else None


def _read_maps(pid: int) -> tuple[int | None, str] | None:
    """The executable mappings of a sampled process, read within procread's caps (a target's maps is
    hostile: a line, a count or a size past its cap is skipped with the run's warning)."""
    lines = procread.maps(pid)
    text = executable_maps("\n".join(lines))
    if not lines.found:
        return None
    return start_ticks(pid), text


class CheckpointWriter:
    """Appends the header and then one record per checkpoint to the journal; never raises into the run
    for a process that vanished (its last maps copy stays the one recorded)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / JOURNAL_FILE
        self.cost = CheckpointCost()
        self._fd: int | None = None
        self._maps_digest: dict[int, str] = {}
        self._maps_pending: dict[int, tuple[int | None, str]] = {}
        self._readings_sent: dict[int, int] = {}

    @property
    def perf_map_dir(self) -> Path:
        return self.directory / PERF_MAPS_DIR

    def begin(self, header: Mapping[str, Any]) -> None:
        """Start a fresh journal with the run's header."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._append(encode_header(header))

    def note_process(self, pid: int) -> None:
        """A sampled process entered the scope: copy its maps now, in case it exits before the next checkpoint."""
        self._note_maps(pid)

    def _note_maps(self, pid: int) -> None:
        found = _read_maps(pid)
        if found is None or not found[1]:
            return
        digest = hashlib.blake2b(found[1].encode(), digest_size=16).hexdigest()
        if self._maps_digest.get(pid) != digest:
            self._maps_digest[pid] = digest
            self._maps_pending[pid] = found

    def write(
        self,
        sampler: SamplerCheckpoint,
        processes: Sequence[ProcessInfo],
        counters: Mapping[int, PidCounters],
        readings: Mapping[int, Sequence[CounterReading]],
        warnings: Iterable[str],
        cycles_source: str,
        when: float | None = None,
    ) -> int:
        """Append one checkpoint; returns its size in bytes."""
        began, cpu_began = time.monotonic(), time.thread_time()
        for process in processes:
            if process.sampled and not process.exited:
                self._note_maps(process.pid)
        new_readings = {pid: list(rows[self._readings_sent.get(pid, 0) :]) for pid, rows in readings.items()}
        state = checkpoint_state(
            processes, counters, new_readings, sampler, self._maps_pending, list(warnings), cycles_source
        )
        record = encode_checkpoint(Checkpoint(time.time() if when is None else when, sampler.stacks, state))
        self._append(record)
        self._maps_pending = {}
        self._readings_sent.update({pid: len(rows) for pid, rows in readings.items()})
        cost = self.cost
        cost.count += 1
        cost.bytes += len(record)
        cost.largest_bytes = max(cost.largest_bytes, len(record))
        cost.seconds += time.monotonic() - began
        cost.cpu_seconds += time.thread_time() - cpu_began
        return len(record)

    def _append(self, record: bytes) -> None:
        if self._fd is None:
            raise RuntimeError("CheckpointWriter.begin() first")
        view = memoryview(record)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["CheckpointWriter", "DEFAULT_CHECKPOINT", "checkpoint_dir", "journal_path"]
