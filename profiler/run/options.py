"""The options of one run, declared once: each ``RunOptions`` field carries its flag, parser, help and
whether the coordinator passes it to every host. The ``profiler run`` parser, the coordinator's parsers
(``coordinator profile``, ``demo``) and the argv that starts ``profiler run`` on a host all derive from
these fields (``add_run_arguments``, ``run_argv``, ``RunOptions.from_args``). A default is written here
and nowhere else, or as a named constant that a lower room shares (``DEFAULT_INTERVAL``,
``DEFAULT_CHECKPOINT``, the sampler's ``DEFAULT_FREQUENCY``): tests/unit/run/test_options.py fails on a
second literal one.
"""

from __future__ import annotations

import argparse
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import argtypes
from ..capture.checkpoint import DEFAULT_CHECKPOINT
from ..capture.format import DEFAULT_INTERVAL
from ..capture.offcpu import DEFAULT_SAMPLE_EVERY
from ..defaults import (
    DEFAULT_FREQUENCY,
    DEFAULT_KNOWN_SPES,
    DEFAULT_PERF_MAP_REFRESH,
    DEFAULT_PROFILE,
    DEFAULT_STACK_STORAGE_SIZE,
    data_file,
)
from ..scope.spes import DEFAULT_ROLES, ROLES, role_list

OPTION = "run_option"  # the key of a field's metadata that holds its RunOption


def host_label(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", text):
        raise argparse.ArgumentTypeError(f"{text!r}: use letters, digits and . _ : @ - only")
    return text


@dataclass(frozen=True)
class RunOption:
    """How one ``RunOptions`` field looks on the command line.

    ``kind``: "value" (``--flag VALUE``), "switch" (``--flag`` sets True), "negated" (``--flag`` sets
    False), "toggle" (``--flag``/``--no-flag``) or "append" (repeatable, a tuple). ``help`` may hold
    ``{default}``. ``forwarded``: ``coordinator profile`` offers it and passes it to every host.
    """

    flag: str
    help: str
    parse: Callable[[str], Any] | None = None
    kind: str = "value"
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    hidden: bool = False
    forwarded: bool = False
    name: str = ""  # the RunOptions field, filled in by RUN_OPTIONS
    default: Any = None  # the field's default (None where the command computes it), filled in by RUN_OPTIONS
    required: bool = False  # no default at all (--duration)

    def help_text(self, wording: str | None = None, default: Any = None) -> str:
        """The help, ``wording`` if given, with ``{default}`` replaced by ``default`` (else the declared one)."""
        if self.hidden:
            return argparse.SUPPRESS
        shown = self.default if default is None else default
        if isinstance(shown, float):
            shown = f"{shown:g}"
        elif isinstance(shown, tuple):
            shown = ",".join(map(str, shown))
        return (wording or self.help).replace("{default}", str(shown))

    def argv(self, value: Any) -> list[str]:
        """This option's words for ``value`` (none when it is the default and need not be said)."""
        if self.kind == "append":
            return [word for item in value for word in (self.flag, self.show(item))]
        if self.kind in ("switch", "negated"):
            return [self.flag] if value != self.default else []
        if self.kind == "toggle":
            return [] if value == self.default else [self.flag if value else "--no-" + self.flag[2:]]
        if value is None or value == self.default:
            return []
        return [self.flag, self.show(value)]

    @staticmethod
    def show(value: Any) -> str:
        if isinstance(value, float):
            return repr(value)  # exact: the host parses the very value
        if isinstance(value, tuple):
            return ",".join(map(str, value))
        return str(value)


def option(flag: str, help: str, **how: Any) -> dict[str, RunOption]:
    """A field's metadata: its command-line form (``RunOption``'s fields)."""
    return {OPTION: RunOption(flag, help, **how)}


@dataclass(frozen=True)
class RunOptions:
    """Everything one ``profiler run`` is told; the fields are in its --help order."""

    duration: float = field(
        metadata=option(
            "--duration", "window length in seconds", parse=argtypes.duration, required=True, forwarded=True
        )
    )
    out: Path = field(metadata=option("--out", "capture directory (default: ./capture-HOST-TIME)", parse=Path))
    profile: Path = field(
        metadata=option("--profile", f"application profile (default: {DEFAULT_PROFILE})", parse=Path, forwarded=True)
    )
    known_spes: Path = field(
        metadata=option(
            "--known-spes", f"process kinds to find (default: {DEFAULT_KNOWN_SPES})", parse=Path, forwarded=True
        )
    )
    pids: tuple[int, ...] = field(
        default=(),
        metadata=option(
            "--pid",
            "add a process by hand (repeatable)",
            parse=argtypes.positive_int,
            kind="append",
            metavar="PID",
            forwarded=True,
        ),
    )
    roles: tuple[str, ...] = field(  # the known_spes.txt roles in scope
        default=DEFAULT_ROLES,
        metadata=option(
            "--roles",
            f"the known_spes.txt roles to put in the scope, of {', '.join(ROLES)} ({{default}}); "
            "add broker to count the Kafka brokers on the host beside the executors",
            parse=role_list,
            metavar="ROLE[,ROLE...]",
            forwarded=True,
        ),
    )
    frequency: int = field(
        default=DEFAULT_FREQUENCY,
        metadata=option(
            "--frequency", "samples per second per CPU ({default})", parse=argtypes.frequency, forwarded=True
        ),
    )
    net: bool = field(
        default=False,
        metadata=option("--net", "also count bytes sent/received per process", kind="switch", forwarded=True),
    )
    # software counters from perf events or /proc (sampling/counters.py)
    counters: str = field(
        default="auto",
        metadata=option(
            "--counters",
            "where the software counters (task-clock, context-switches, cpu-migrations, page-faults) come "
            "from: auto (the default) reads /proc unless hardware events open here (a PMU: then all are perf "
            "events, as perf stat -p); proc reads /proc and adds nothing to the workload's context switches, "
            "with the kernel's taskstats exit records for what a process or thread did after its last reading "
            "(needs CAP_NET_ADMIN; without it a process that exits loses its last interval); perf counts them "
            "with perf events, frozen at exit (+~2 us per switch of a counted thread without a PMU, "
            "docs/benchmarks/overhead.md)",
            choices=("auto", "perf", "proc"),
        ),
    )
    # Blocked time per stack and cause from sched_switch (issue 31); blocks shorter than the minimum are
    # counted (meta.json) but not summed.
    off_cpu: bool = field(
        default=False,
        metadata=option(
            "--off-cpu",
            "also sum the time workload threads spend blocked, per stack and cause (sleep, monitor, wait, park, "
            "lock, net, disk, safepoint, preempted), from the sched_switch tracepoint (docs/offcpu.md)",
            kind="switch",
            forwarded=True,
        ),
    )
    off_cpu_min_block_ms: float = field(
        default=1.0,
        metadata=option(
            "--off-cpu-min-block",
            "with --off-cpu: blocks shorter than this many milliseconds are counted but not summed ({default})",
            parse=argtypes.min_block_ms,
            metavar="MS",
        ),
    )
    off_cpu_sample_every: int = field(  # beyond 100/s per thread one switch-out in N, counted N times
        default=DEFAULT_SAMPLE_EVERY,
        metadata=option(
            "--off-cpu-sample-every",
            "with --off-cpu: beyond a thread's first 100 voluntary switch-outs a second, follow one in N at "
            "random and count it N times, more than N for a thread so busy that it would be followed over ~100 "
            "more times a second (such a thread's switch-outs are all sampled: ~100 followed a second; 1: all, "
            "exactly); the stack walks are the cost on threads that switch thousands of times a second "
            "({default})",
            parse=argtypes.positive_int,
            metavar="N",
        ),
    )
    events: int | None = field(
        default=None,
        metadata=option(
            "--events", "events processed in the window, if known", parse=argtypes.positive_int, forwarded=True
        ),
    )
    host: str = field(
        default_factory=socket.gethostname,
        metadata=option("--host", "label of this host in the results", parse=host_label),
    )
    force: bool = field(
        default=False, metadata=option("--force", "replace an existing output directory", kind="switch")
    )
    max_stack_depth: int | None = field(  # None: 1024 with our walker, 127 with bpf_get_stack
        default=None,
        metadata=option(
            "--max-stack-depth",
            "frames per user stack kept (1024 with --stack-walk bpf, 127 with kernel); a deeper stack keeps "
            "its leaf and root ends (bpf) or its leaf end (kernel)",
            parse=argtypes.positive_int,
        ),
    )
    interval: float = field(
        default=DEFAULT_INTERVAL,
        metadata=option(
            "--interval",
            "seconds per timeline slice ({default}): shares and cycles over time, analyze --from/--to",
            parse=argtypes.interval,
            forwarded=True,
        ),
    )
    perf_map_refresh: float = field(
        default=DEFAULT_PERF_MAP_REFRESH,
        metadata=option(
            "--perf-map-refresh",
            "seconds between Java perf-map refreshes ({default}; 0 = at the end only): each sample is named with "
            "the JIT code of its time",
            parse=argtypes.perf_map_refresh,
            forwarded=True,
        ),
    )
    stack_collection: str = field(
        default="auto",
        metadata=option(
            "--stack-collection",
            "ringbuf: every sample to user space, nothing lost to a full map (Linux 5.8+); stackmap: the "
            "in-kernel stack map (no timeline); auto: ringbuf when the kernel has it",
            choices=("auto", "ringbuf", "stackmap"),
        ),
    )
    stack_walk: str = field(
        default="auto",
        metadata=option(
            "--stack-walk",
            "bpf: our walker (names interpreted Java frames, keeps the root of deep stacks; needs "
            "--stack-collection ringbuf); kernel: bpf_get_stack; auto: bpf when it loads",
            choices=("auto", "bpf", "kernel"),
        ),
    )
    # JIT frames stepped by their CodeBlob without frame pointers (issue 30); the checkpoint journal keeps
    # the names learned (profiler/unwind/recorded.py), so a recovered capture names them too.
    hotspot_unwind: bool = field(
        default=True,
        metadata=option(
            "--hotspot-unwind",
            "walk JIT-compiled Java frames by their CodeBlobs, without -XX:+PreserveFramePointer or perf maps, "
            "inlined methods named (docs/unwinding.md); --no-hotspot-unwind walks them by frame pointers only "
            "(default: on)",
            kind="toggle",
        ),
    )
    # Opt-in: changes the target (issue 51). One byte of each sampled JVM's memory, DebugNonSafepoints,
    # written when its vmStructs are read and put back at the window's end (profiler/unwind/debugflag.py).
    exact_inlining: bool = field(
        default=False,
        metadata=option(
            "--exact-inlining",
            "write -XX:+DebugNonSafepoints into each sampled JVM while the window runs (no restart; put back "
            "at the end), so methods C2 inlines are named exactly in code compiled from then on; changes "
            "the target's memory: opt-in (docs/unwinding.md, docs/security.md)",
            kind="switch",
            forwarded=True,
        ),
    )
    stack_storage_size: int = field(
        default=DEFAULT_STACK_STORAGE_SIZE,
        metadata=option(
            "--stack-storage-size",
            "with --stack-collection stackmap: distinct stacks the BPF map holds ({default}; about 1 KB of "
            "kernel memory each at depth 127)",
            parse=argtypes.positive_int,
        ),
    )
    checkpoint: float = field(  # seconds between checkpoint-journal records; 0: none
        default=DEFAULT_CHECKPOINT,
        metadata=option(
            "--checkpoint",
            "seconds between checkpoints to OUT/checkpoint ({default}; 0 = none): a run killed before writing "
            "its capture is rebuilt up to the last one by `profiler recover OUT`",
            parse=argtypes.checkpoint_period,
            forwarded=True,
        ),
    )
    exec_watch: bool = field(
        default=True, metadata=option("--no-exec-watch", "poll for new processes instead", kind="negated")
    )
    # for the coordinator
    start_at: float | None = field(default=None, metadata=option("--start-at", "", parse=float, hidden=True))
    status_file: Path | None = field(default=None, metadata=option("--status-file", "", parse=Path, hidden=True))
    # written by the coordinator once every host is ready; it brings --start-at forward (run/start.py)
    start_file: Path | None = field(default=None, metadata=option("--start-file", "", parse=Path, hidden=True))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """The options ``add_run_arguments`` parsed; what the command line leaves out is computed here: the
        host's name, ./capture-HOST-TIME, the default profile and known_spes.txt."""
        values = option_values(args, RUN_OPTIONS)
        host = values["host"] or socket.gethostname()
        values.update(
            host=host,
            out=values["out"] or Path(f"capture-{host}-{time.strftime('%Y%m%d-%H%M%S')}"),
            profile=values["profile"] or data_file(DEFAULT_PROFILE),
            known_spes=values["known_spes"] or data_file(DEFAULT_KNOWN_SPES),
        )
        return cls(**values)


def _declared() -> dict[str, RunOption]:
    declared = {}
    for spec in fields(RunOptions):
        how: RunOption = spec.metadata[OPTION]
        default = None if spec.default is MISSING else spec.default
        declared[spec.name] = RunOption(**{**how.__dict__, "name": spec.name, "default": default})
    return declared


RUN_OPTIONS: Mapping[str, RunOption] = _declared()  # field name -> its command-line form, in --help order
FORWARDED = tuple(name for name, how in RUN_OPTIONS.items() if how.forwarded)


def add_run_arguments(
    parser: argparse.ArgumentParser,
    names: Iterable[str] = RUN_OPTIONS,
    wording: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """``names``' arguments, as ``profiler run`` has them (its dest is the field's name). ``wording`` words an
    option's help for another command; ``defaults`` gives one a command's own default (demo: --duration)."""
    for name in names:
        how = RUN_OPTIONS[name]
        has_own_default = defaults is not None and name in defaults
        default = defaults[name] if defaults is not None and has_own_default else how.default
        text = how.help_text((wording or {}).get(name), default)
        if how.kind == "switch":
            parser.add_argument(how.flag, dest=name, action="store_true", help=text)
        elif how.kind == "negated":
            parser.add_argument(how.flag, dest=name, action="store_false", help=text)
        elif how.kind == "toggle":
            parser.add_argument(how.flag, dest=name, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif how.kind == "append":
            parser.add_argument(
                how.flag, dest=name, type=how.parse or str, action="append", default=[], metavar=how.metavar, help=text
            )
        else:
            parser.add_argument(
                how.flag,
                dest=name,
                type=how.parse or str,
                choices=how.choices,
                default=default,
                metavar=how.metavar,
                required=how.required and not has_own_default,
                help=text,
            )


def option_values(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The parsed values of ``names`` by field name, as RunOptions holds them (a repeated option a tuple)."""
    values = {name: getattr(args, name) for name in names}
    return {name: tuple(value) if RUN_OPTIONS[name].kind == "append" else value for name, value in values.items()}


def run_argv(options: RunOptions) -> list[str]:
    """``profiler run``'s arguments (after ``run``) that give back ``options``: every option that is not
    its default, and those that have none (duration, out, profile, known_spes, host)."""
    return [word for name, how in RUN_OPTIONS.items() for word in how.argv(getattr(options, name))]


__all__ = ["FORWARDED", "RUN_OPTIONS", "RunOption", "RunOptions", "add_run_arguments", "run_argv"]
