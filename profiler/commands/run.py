"""Sample the stream-engine processes of this host and write a capture directory.

Finds Spark/Flink processes from known_spes.txt (and --pid; Kafka brokers with --roles), samples the
stacks of workload processes with one in-kernel-filtered BPF program at --frequency Hz on every CPU,
reads per-process counters, then symbolizes, matches stacks to the tasks of the application profile and writes
<out>/<host>_result.csv. Needs root (or CAP_BPF and CAP_PERFMON), bcc and kernel headers or BTF.
Overhead: BPF compilation (~2-3 CPU-seconds) happens before the window; sampling at 99 Hz costs well
under 1 % of a core. SIGINT/SIGTERM end the window early; everything collected is still written.
Every --checkpoint seconds (30) the samples so far are appended to OUT/checkpoint/journal.tpj: a run
killed outright (SIGKILL, the OOM killer) is rebuilt up to its last checkpoint by `profiler recover OUT`.

examples:
  profiler run --duration 60 --out /tmp/cap
  profiler run --duration 900 --out /tmp/cap --profile my_profile.txt --net
  profiler run --duration 60 --out /tmp/cap --off-cpu --off-cpu-min-block 5
  profiler run --duration 60 --out /tmp/cap --roles workload,managing,broker   (Kafka brokers too)
  profiler run --duration 30 --out /tmp/cap --pid 4242 --frequency 199 --force
  profiler run --duration 900 --out /tmp/cap --checkpoint 10   (killed? profiler recover /tmp/cap)
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

from ..argtypes import (
    checkpoint_period,
    duration,
    frequency,
    interval,
    min_block_ms,
    perf_map_refresh,
    positive_int,
)
from ..capture.checkpoint import DEFAULT_CHECKPOINT
from ..capture.offcpu import DEFAULT_SAMPLE_EVERY
from ..defaults import DEFAULT_KNOWN_SPES, DEFAULT_PROFILE, data_file
from ..scope.spes import DEFAULT_ROLES, ROLES, role_list


def host_label(text: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", text):
        raise argparse.ArgumentTypeError(f"{text!r}: use letters, digits and . _ : @ - only")
    return text


def _add_scope_arguments(parser: argparse.ArgumentParser) -> None:
    """The window, its output and which processes are in the scope."""
    parser.add_argument("--duration", type=duration, required=True, help="window length in seconds")
    parser.add_argument("--out", type=Path, help="capture directory (default: ./capture-HOST-TIME)")
    parser.add_argument("--profile", type=Path, default=None, help=f"application profile (default: {DEFAULT_PROFILE})")
    parser.add_argument(
        "--known-spes", type=Path, default=None, help=f"process kinds to find (default: {DEFAULT_KNOWN_SPES})"
    )
    parser.add_argument(
        "--pid", type=positive_int, action="append", default=[], help="add a process by hand (repeatable)"
    )
    parser.add_argument(
        "--roles",
        type=role_list,
        default=DEFAULT_ROLES,
        metavar="ROLE[,ROLE...]",
        help=f"the known_spes.txt roles to put in the scope, of {', '.join(ROLES)} ({','.join(DEFAULT_ROLES)}); "
        "add broker to count the Kafka brokers on the host beside the executors",
    )


def _add_collector_arguments(parser: argparse.ArgumentParser) -> None:
    """What is collected beside the stacks: the sampling rate, network bytes, off-CPU time."""
    parser.add_argument("--frequency", type=frequency, default=99, help="samples per second per CPU (99)")
    parser.add_argument("--net", action="store_true", help="also count bytes sent/received per process")
    parser.add_argument(
        "--counters",
        choices=("auto", "perf", "proc"),
        default="auto",
        help="where the software counters (task-clock, context-switches, cpu-migrations, page-faults) come "
        "from: auto (the default) reads /proc unless hardware events open here (a PMU: then all are perf "
        "events, as perf stat -p); proc reads /proc and adds nothing to the workload's context switches, "
        "with the kernel's taskstats exit records for what a process or thread did after its last reading "
        "(needs CAP_NET_ADMIN; without it a process that exits loses its last interval); perf counts them "
        "with perf events, frozen at exit (+~2 us per switch of a counted thread without a PMU, "
        "docs/benchmarks/overhead.md)",
    )
    parser.add_argument(
        "--off-cpu",
        action="store_true",
        help="also sum the time workload threads spend blocked, per stack and cause (sleep, monitor, wait, park, "
        "lock, net, disk, safepoint, preempted), from the sched_switch tracepoint (docs/offcpu.md)",
    )
    parser.add_argument(
        "--off-cpu-min-block",
        type=min_block_ms,
        default=1.0,
        metavar="MS",
        help="with --off-cpu: blocks shorter than this many milliseconds are counted but not summed (1)",
    )
    parser.add_argument(
        "--off-cpu-sample-every",
        type=positive_int,
        default=DEFAULT_SAMPLE_EVERY,
        metavar="N",
        help="with --off-cpu: beyond a thread's first 100 voluntary switch-outs a second, follow one in N at "
        "random and count it N times, more than N for a thread so busy that it would be followed over ~100 "
        "more times a second (1: all, exactly); the stack walks are the cost on threads that switch "
        f"thousands of times a second ({DEFAULT_SAMPLE_EVERY})",
    )


def _add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """How samples are walked, named, sliced and stored."""
    parser.add_argument("--events", type=positive_int, help="events processed in the window, if known")
    parser.add_argument("--host", type=host_label, default=None, help="label of this host in the results")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    parser.add_argument(
        "--max-stack-depth",
        type=positive_int,
        default=None,
        help="frames per user stack kept (1024 with --stack-walk bpf, 127 with kernel); a deeper stack keeps "
        "its leaf and root ends (bpf) or its leaf end (kernel)",
    )
    parser.add_argument(
        "--interval",
        type=interval,
        default=10.0,
        help="seconds per timeline slice (10): shares and cycles over time, analyze --from/--to",
    )
    parser.add_argument(
        "--perf-map-refresh",
        type=perf_map_refresh,
        default=60.0,
        help="seconds between Java perf-map refreshes (60; 0 = at the end only): each sample is named with "
        "the JIT code of its time",
    )
    parser.add_argument(
        "--stack-collection",
        choices=("auto", "ringbuf", "stackmap"),
        default="auto",
        help="ringbuf: every sample to user space, nothing lost to a full map (Linux 5.8+); stackmap: the "
        "in-kernel stack map (no timeline); auto: ringbuf when the kernel has it",
    )
    parser.add_argument(
        "--stack-walk",
        choices=("auto", "bpf", "kernel"),
        default="auto",
        help="bpf: our walker (names interpreted Java frames, keeps the root of deep stacks; needs "
        "--stack-collection ringbuf); kernel: bpf_get_stack; auto: bpf when it loads",
    )
    parser.add_argument(
        "--hotspot-unwind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="walk JIT-compiled Java frames by their CodeBlobs, without -XX:+PreserveFramePointer or perf maps, "
        "inlined methods named (docs/unwinding.md); --no-hotspot-unwind walks them by frame pointers only "
        "(default: on)",
    )
    parser.add_argument(
        "--stack-storage-size",
        type=positive_int,
        default=65536,
        help="with --stack-collection stackmap: distinct stacks the BPF map holds (65536; about 1 KB of "
        "kernel memory each at depth 127)",
    )


class RunCommand:
    __doc__ = __doc__  # the module's: its examples and the --checkpoint note reach --help

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        _add_scope_arguments(parser)
        _add_collector_arguments(parser)
        _add_capture_arguments(parser)
        parser.add_argument(
            "--checkpoint",
            type=checkpoint_period,
            default=DEFAULT_CHECKPOINT,
            help=f"seconds between checkpoints to OUT/checkpoint ({DEFAULT_CHECKPOINT:g}; 0 = none): a run killed "
            "before writing its capture is rebuilt up to the last one by `profiler recover OUT`",
        )
        parser.add_argument("--no-exec-watch", action="store_true", help="poll for new processes instead")
        # for the coordinator
        parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
        parser.add_argument("--status-file", type=Path, help=argparse.SUPPRESS)
        parser.add_argument("--print-bpf", action="store_true", help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        from ..run.components import make_sampler
        from ..run.options import RunOptions
        from ..run.runner import run_capture

        host = args.host or socket.gethostname()
        out = args.out or Path(f"capture-{host}-{time.strftime('%Y%m%d-%H%M%S')}")
        options = RunOptions(
            duration=args.duration,
            out=out,
            profile=args.profile or data_file(DEFAULT_PROFILE),
            known_spes=args.known_spes or data_file(DEFAULT_KNOWN_SPES),
            pids=tuple(args.pid),
            roles=args.roles,
            frequency=args.frequency,
            net=args.net,
            events=args.events,
            host=host,
            start_at=args.start_at,
            status_file=args.status_file,
            force=args.force,
            max_stack_depth=args.max_stack_depth,
            stack_storage_size=args.stack_storage_size,
            exec_watch=not args.no_exec_watch,
            interval=args.interval,
            perf_map_refresh=args.perf_map_refresh,
            stack_collection=args.stack_collection,
            stack_walk=args.stack_walk,
            hotspot_unwind=args.hotspot_unwind,
            checkpoint=args.checkpoint,
            off_cpu=args.off_cpu,
            off_cpu_min_block_ms=args.off_cpu_min_block,
            off_cpu_sample_every=args.off_cpu_sample_every,
            counters=args.counters,
        )
        if args.print_bpf:
            sampler = make_sampler(options)
            print(sampler.bpf_text("walker" if sampler.stack_walk == "bpf" else None))
            if sampler.collection == "ringbuf":
                from ..scope.threadwatch import ThreadWatch

                print(ThreadWatch([]).bpf_text())
            if args.net:
                from ..sampling.net import NetTracer

                print(NetTracer().bpf_text())
            if args.off_cpu:
                from ..sampling.offcpu import OffCpuTracer

                print(OffCpuTracer(args.off_cpu_min_block, sample_every=args.off_cpu_sample_every).bpf_text())
            return 0
        run_capture(options, announce=lambda line: print(f"profiler: {line}", file=sys.stderr))
        from ..capture import format as capture

        meta = capture.read_meta(out)
        for warning in meta.warnings:
            print(f"profiler: warning: {warning}", file=sys.stderr)
        print(f"wrote {out / capture.result_file_name(host)}")
        print(f"next: profiler match --profile {options.profile} {out}")
        return 0


COMMAND = RunCommand
