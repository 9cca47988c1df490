"""Sample the stream-engine processes of this host and write a capture directory.

Finds Spark/Flink processes from known_spes.txt (and --pid; Kafka brokers with --roles), samples the
stacks of workload processes with one in-kernel-filtered BPF program at --frequency Hz on every CPU,
reads per-process counters, then symbolizes, matches stacks to the tasks of the application profile and writes
<out>/<host>_result.csv. Needs root (or CAP_BPF and CAP_PERFMON), bcc and kernel headers or BTF.
Overhead: the BPF programs are compiled (seconds of CPU each) on the first run after set-up, a kernel or
a bcc change, and loaded from /var/cache/spe-taskprof/bpf without compiling on later runs
(SPE_TASKPROF_BPF_CACHE=off: always compile); each library's unwind table is parsed once (libjvm.so's: ~1.7
CPU-s) and loaded from /var/cache/spe-taskprof/cfi after (SPE_TASKPROF_CFI_CACHE=off: always parse);
sampling at 99 Hz costs well under 1 % of a core.
SIGINT/SIGTERM end the window early; everything collected is still written.
Every --checkpoint seconds (30) the samples so far are appended to OUT/checkpoint/journal.tpj: a run
killed outright (SIGKILL, the OOM killer) is rebuilt up to its last checkpoint by `profiler recover OUT`.
A --pid or scoped process that exits before or during the window gets a warning line saying when it went
and keeps its samples up to then; a --pid that does not exist at the command is an error (exit 2), and a
run whose every --pid was gone before a sample was taken, with nothing else found, writes its capture and
exits 7 ("nothing to sample").

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
import sys

from ..run.options import RUN_OPTIONS, RunOptions, add_run_arguments


class RunCommand:
    __doc__ = __doc__  # the module's: its examples and the --checkpoint note reach --help

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_arguments(parser, RUN_OPTIONS)  # profiler/run/options.py: every option, declared once
        parser.add_argument("--print-bpf", action="store_true", help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        from ..run.components import make_sampler
        from ..run.runner import run_capture

        options = RunOptions.from_args(args)
        out, host = options.out, options.host
        if args.print_bpf:  # as compiled: with current_pid_tgid() of this PID namespace
            from ..bpf.pidns import with_own_ids

            sampler = make_sampler(options)
            print(with_own_ids(sampler.bpf_text("walker" if sampler.stack_walk == "bpf" else None)))
            if sampler.collection == "ringbuf":
                from ..scope.threadwatch import ThreadWatch

                print(with_own_ids(ThreadWatch([]).bpf_text()))
            if options.net:
                from ..sampling.net import NetTracer

                print(with_own_ids(NetTracer().bpf_text()))
            if options.off_cpu:
                from ..sampling.offcpu import OffCpuTracer

                tracer = OffCpuTracer(options.off_cpu_min_block_ms, sample_every=options.off_cpu_sample_every)
                print(with_own_ids(tracer.bpf_text()))
            return 0
        run_capture(options, announce=lambda line: print(f"profiler: {line}", file=sys.stderr))
        from ..capture import format as capture
        from ..capture.read import read_meta

        meta = read_meta(out)
        for warning in meta.warnings:
            print(f"profiler: warning: {warning}", file=sys.stderr)
        print(f"wrote {out / capture.result_file_name(host)}")
        print(f"next: profiler match --profile {options.profile} {out}")
        return 0


COMMAND = RunCommand
