"""The options of one run (``profiler run``): what the runner, the window and the writer read."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from ..capture.checkpoint import DEFAULT_CHECKPOINT
from ..capture.format import DEFAULT_INTERVAL
from ..capture.offcpu import DEFAULT_SAMPLE_EVERY
from ..scope.spes import DEFAULT_ROLES


@dataclass(frozen=True)
class RunOptions:
    duration: float
    out: Path
    profile: Path
    known_spes: Path
    pids: tuple[int, ...] = ()
    roles: tuple[str, ...] = DEFAULT_ROLES  # the known_spes.txt roles in scope (--roles)
    frequency: int = 99
    net: bool = False
    events: int | None = None
    host: str = field(default_factory=socket.gethostname)
    start_at: float | None = None
    status_file: Path | None = None
    force: bool = False
    max_stack_depth: int | None = None  # None: 1024 with our walker, 127 with bpf_get_stack
    stack_storage_size: int = 65536
    exec_watch: bool = True
    interval: float = DEFAULT_INTERVAL
    perf_map_refresh: float = 60.0
    stack_collection: str = "auto"
    stack_walk: str = "auto"
    checkpoint: float = DEFAULT_CHECKPOINT  # seconds between checkpoint-journal records; 0: none
    # JIT frames stepped by their CodeBlob without frame pointers (issue 30); the checkpoint journal keeps
    # the names learned (profiler/unwind/recorded.py), so a recovered capture names them too.
    hotspot_unwind: bool = True
    # Blocked time per stack and cause from sched_switch (issue 31); blocks shorter than the minimum are
    # counted (meta.json) but not summed.
    off_cpu: bool = False
    off_cpu_min_block_ms: float = 1.0
    off_cpu_sample_every: int = DEFAULT_SAMPLE_EVERY  # beyond 100/s per thread one switch-out in N, counted N times
    counters: str = "auto"  # software counters from perf events or /proc (--counters, sampling/counters.py)


# ------------------------------------------------------------------ component interfaces
