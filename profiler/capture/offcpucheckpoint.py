"""The off-CPU part of the checkpoint (``<out>/checkpoint/offcpu.json``, ``profiler run --off-cpu``): the
named blocked-time entries per PID as the last checkpoint saw them, so that ``profiler recover`` writes a
killed run's ``offcpu.folded`` too.

A file of its own beside the journal, replaced whole at each checkpoint (the entries are sums: the last
copy holds everything before it), rather than a journal record: the on-CPU records stay as they are. The
stacks are named when the copy is taken, the way the normal end names them, because the off-CPU stack map
and the JVMs' thread views are gone with the killed profiler. Encoding and decoding are pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files.atomic import atomic_write_bytes
from .offcpu import CAUSES, OffCpuEntry

OFFCPU_CHECKPOINT_FILE = "offcpu.json"
OFFCPU_CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class OffCpuCheckpoint:
    """Blocked time per PID up to ``time`` (wall clock), and the options it was measured with."""

    time: float
    min_block_ms: float
    sample_every: int
    entries: Mapping[int, Sequence[OffCpuEntry]]


def encode_offcpu_checkpoint(checkpoint: OffCpuCheckpoint) -> bytes:
    payload = {
        "version": OFFCPU_CHECKPOINT_VERSION,
        "time": checkpoint.time,
        "min_block_ms": checkpoint.min_block_ms,
        "sample_every": checkpoint.sample_every,
        "pids": {
            str(pid): [[e.cause, e.stack, e.blocked_ns, e.switches, e.context] for e in entries]
            for pid, entries in sorted(checkpoint.entries.items())
        },
    }
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def _entry(row: Any) -> OffCpuEntry:
    """One entry of the file, checked: it comes from disk and names a directory of the capture."""
    cause, stack, blocked_ns, switches, context = row
    counts_ok = all(type(n) is int and n >= 0 for n in (blocked_ns, switches))
    if cause not in CAUSES or not isinstance(stack, str) or not stack or not counts_ok:
        raise ValueError(f"malformed off-CPU entry {str(row)[:80]!r}")
    if context is not None and not isinstance(context, str):
        raise ValueError(f"malformed off-CPU context {str(context)[:80]!r}")
    return OffCpuEntry(cause, stack, blocked_ns, switches, context)


def decode_offcpu_checkpoint(data: bytes) -> OffCpuCheckpoint:
    """Raises ValueError (with the reason) when the file is not one this version wrote whole."""
    payload = json.loads(data)
    if not isinstance(payload, dict) or payload.get("version") != OFFCPU_CHECKPOINT_VERSION:
        raise ValueError(f"not an off-CPU checkpoint of version {OFFCPU_CHECKPOINT_VERSION}")
    entries: dict[int, list[OffCpuEntry]] = {}
    for pid_text, rows in dict(payload["pids"]).items():
        pid = int(pid_text)
        if pid <= 0 or str(pid) != pid_text:
            raise ValueError(f"bad pid {pid_text[:20]!r}")
        entries[pid] = [_entry(row) for row in rows]
    return OffCpuCheckpoint(
        float(payload["time"]), float(payload["min_block_ms"]), int(payload["sample_every"]), entries
    )


def write_offcpu_checkpoint(directory: Path, checkpoint: OffCpuCheckpoint) -> int:
    """Replace ``directory``/offcpu.json, fsync'ed (a kill or a host crash keeps the old or the new copy);
    returns its size in bytes."""
    data = encode_offcpu_checkpoint(checkpoint)
    atomic_write_bytes(Path(directory) / OFFCPU_CHECKPOINT_FILE, data, sync=True)
    return len(data)


def read_offcpu_checkpoint(directory: Path) -> OffCpuCheckpoint | None:
    """The last off-CPU copy of a checkpoint directory; None when the run had no --off-cpu. Raises
    ValueError when it is unreadable."""
    path = Path(directory) / OFFCPU_CHECKPOINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode_offcpu_checkpoint(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from None


__all__ = [
    "OFFCPU_CHECKPOINT_FILE",
    "OffCpuCheckpoint",
    "decode_offcpu_checkpoint",
    "encode_offcpu_checkpoint",
    "read_offcpu_checkpoint",
    "write_offcpu_checkpoint",
]
