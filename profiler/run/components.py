"""The run's components: the interfaces the runner drives (scope, sampler, counters, network, off-CPU,
events, Spark plans) and the real bcc/perf-backed ones built from the options."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..capture.checkpoint import PERF_MAPS_DIR, checkpoint_dir
from ..capture.format import (
    EventCount,
    FlinkSubtask,
    FlinkTaskManager,
    NetStats,
    PidCounters,
    ProcessInfo,
    VertexWindow,
)
from ..capture.offcpu import OffCpuEntry
from ..capture.stackstore import CollectedStacks, SamplerCheckpoint
from ..errors import CapabilityError
from .options import RunOptions

if TYPE_CHECKING:
    from ..sampling.sampler import StackSampler


class ScopeLike(Protocol):
    exec_watch_mode: str  # "tracepoint" or "polling", known after start()

    def start(self) -> None: ...
    def poll(self) -> tuple[list[ProcessInfo], list[int]]: ...
    def processes(self) -> list[ProcessInfo]: ...
    def finish(self, end_time: float) -> list[ProcessInfo]: ...
    def close(self) -> None: ...


class SamplerLike(Protocol):
    warnings: list[str]  # end-of-run warnings, each naming the option to change

    @property
    def collection(self) -> str: ...  # "ringbuf" or "stackmap", known after start()
    @property
    def stack_walk(self) -> str: ...  # "bpf" (our walker) or "kernel" (bpf_get_stack), known after start()
    @property
    def max_stack_depth(self) -> int: ...  # the depth the kernel allowed, known after start()
    @property
    def thread_names(self) -> str: ...  # "uprobe", "jcmd" or "comm": where the stacks' thread names came from
    @property
    def first_sample(self) -> tuple[int, float] | None: ...  # (CLOCK_MONOTONIC ns, agent CPU-s then); None: none yet

    def start(self) -> None: ...
    def begin_window(self) -> None: ...
    # sampled from now on; its unwind tables and vmStructs prepared beside it, with a deadline
    def add_pid(self, pid: int) -> None: ...
    def prepare_symbols(self, pid: int) -> None: ...
    def pid_exited(self, pid: int) -> None: ...
    def sample_count(self, pid: int) -> int: ...
    def stop(self) -> None: ...
    def collect(self) -> dict[int, CollectedStacks]: ...
    def checkpoint(self) -> SamplerCheckpoint | None: ...  # what changed since the last call; None: unsupported
    def name_batch(self) -> int: ...  # native frames of the stacks new since the last call named now
    def close(self) -> None: ...


class CountersLike(Protocol):
    @property
    def exits_note(self) -> str: ...  # why exits of /proc-counted pids are not followed ("" when they are)
    def add_pid(self, pid: int) -> None: ...
    def pid_exited(self, pid: int) -> None: ...
    def read(self, pid: int) -> PidCounters: ...
    def stop_exits(self) -> None: ...  # the window is over: stop following exits (taskstats)
    def close(self) -> None: ...


class NetLike(Protocol):
    @property
    def warnings(self) -> list[str]: ...  # end-of-run warnings, complete after collect()

    def start(self) -> str: ...
    def add_pid(self, pid: int) -> None: ...
    def stop(self) -> None: ...
    def collect(self) -> dict[int, NetStats]: ...
    def close(self) -> None: ...


class OffCpuLike(Protocol):
    @property
    def warnings(self) -> list[str]: ...  # end-of-run warnings, complete after collect()

    def start(self) -> str: ...
    def add_pid(self, pid: int) -> None: ...
    def stop(self) -> None: ...
    def pid_exited(self, pid: int) -> None: ...  # a later process with its pid is not traced
    def collect(self) -> dict[int, list[OffCpuEntry]]: ...  # names the stacks: after the sampler's collect()
    def close(self) -> None: ...
    def tick(self, interval: int) -> None: ...  # an interval of the window ends (the per-interval split)
    # the sums so far, named, while attached (the checkpoint's off-CPU copy)
    def checkpoint_entries(self) -> dict[int, list[OffCpuEntry]]: ...

    # after collect(): interval -> PID -> entries, for the intervals tick() saw
    # None: the time is not split by interval (a recovered run): no offcpu_timeline.folded is written
    @property
    def interval_entries(self) -> dict[int, dict[int, list[OffCpuEntry]]] | None: ...


class SparkPlansLike(Protocol):
    def start(self, processes: Sequence[ProcessInfo]) -> None: ...
    def add_process(self, process: ProcessInfo) -> None: ...
    def finish(self) -> dict[str, Any] | None: ...


class EventsLike(Protocol):
    warnings: list[str]

    def start(self, processes: Sequence[ProcessInfo], window_start: float | None = None) -> None: ...
    def add_process(self, process: ProcessInfo) -> None: ...
    def finish(self, end_time: float) -> EventCount: ...
    def vertex_windows(self) -> list[VertexWindow]: ...
    def flink_placement(self) -> tuple[list[FlinkSubtask], list[FlinkTaskManager]]: ...


@dataclass
class Components:
    scope: ScopeLike
    sampler: SamplerLike
    counters: CountersLike
    net: NetLike | None
    events: EventsLike
    cycles_source: Callable[[], str] = lambda: "estimated"
    prog_ids: Callable[[], list[int]] = lambda: []
    spark_plans: SparkPlansLike | None = None  # stages, jobs and codegen operators of Spark drivers
    offcpu: OffCpuLike | None = None  # --off-cpu


def make_sampler(options: RunOptions) -> StackSampler:
    """The stack sampler a run uses (and `profiler run --print-bpf` prints the programs of); imports bcc."""
    from ..sampling.sampler import StackSampler

    return StackSampler(
        options.frequency,
        options.max_stack_depth,
        options.stack_storage_size,
        collection=options.stack_collection,
        interval=options.interval,
        perf_map_refresh=options.perf_map_refresh,
        stack_walk=options.stack_walk,
        hotspot_unwind=options.hotspot_unwind,
        exact_inlining=options.exact_inlining,
        checkpoints=options.checkpoint > 0,
        perf_map_dir=checkpoint_dir(options.out) / PERF_MAPS_DIR if options.checkpoint > 0 else None,
    )


def real_components(options: RunOptions) -> Components:
    """Build the real bcc/perf-backed components (imports bcc only here)."""
    from ..engines.events import EventCounter
    from ..engines.sparkplan import SparkPlanCollector
    from ..sampling.counters import CounterGroup
    from ..scope.analyzer import ScopeAnalyzer
    from ..scope.spes import load_known_spes

    kinds = load_known_spes(options.known_spes)
    sampler = make_sampler(options)
    net = None
    if options.net:
        from ..sampling.net import NetTracer

        net = NetTracer()
    offcpu = None
    if options.off_cpu:
        from ..sampling.offcpu import OffCpuTracer

        offcpu = OffCpuTracer(
            options.off_cpu_min_block_ms, sample_every=options.off_cpu_sample_every, borrow_namer=sampler.jvm_namer,
            thread_label=sampler.thread_label, walker=sampler.offcpu_program,
        )
        try:  # blocked threads' stacks by the sampler's walker: the off-CPU program compiled into its program
            sampler.share_walker(offcpu.bpf_text())
        except CapabilityError:
            pass  # no BTF or too old a kernel: OffCpuTracer.start() refuses with its one line
    counters = CounterGroup(source=options.counters)

    def cycles_source() -> str:
        return str(counters.cycles_source)

    scope = ScopeAnalyzer(kinds, manual_pids=options.pids, exec_watch=options.exec_watch, roles=options.roles)

    def prog_ids() -> list[int]:
        ids = sampler.prog_ids + scope.prog_ids
        if net is not None:
            ids += net.prog_ids
        if offcpu is not None:
            ids += offcpu.prog_ids
        return ids

    return Components(
        scope=scope,
        sampler=sampler,
        counters=counters,
        net=net,
        events=EventCounter(manual_count=options.events),
        cycles_source=cycles_source,
        prog_ids=prog_ids,
        spark_plans=SparkPlanCollector(),
        offcpu=offcpu,
    )


# ------------------------------------------------------------------ checks before any work
