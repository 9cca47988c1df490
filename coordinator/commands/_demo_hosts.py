"""`coordinator demo --hosts 1,2,4`: the demo's YSB query spread over N namespaced hosts on this machine
(coordinator/workloads/nshosts.py), one 1-core executor per host, profiled over SSH as any cluster; one
run per N, then the campaign page of cycles per event per task against the number of hosts (the paper's
nodes figure, docs/demo.md)."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.errors import ConfigError, PrivilegeError, ProfilerError

if TYPE_CHECKING:
    from coordinator.remote.cluster import HostSpec
    from coordinator.workloads.nshosts import NamespacedHosts
    from coordinator.workloads.ysb.spark import YsbOptions

HOSTS_LABEL = "hosts"  # the run label of the number of hosts: the figure's x axis
HOSTS_SPE = "spark-str"  # the engine spread over hosts so far
MAX_DEMO_HOSTS = 16
# The workload's scratch (Spark's work, local and sink directories): every host's executor reads and writes
# it, and a host's /tmp is its own, so not under /tmp.
SHARED_SCRATCH = Path("/var/tmp")


@dataclass(frozen=True)
class DemoCluster:
    """What the demo profiles instead of this machine: hosts over SSH, their known_hosts, extra run labels."""

    hosts: Sequence[HostSpec]
    known_hosts: Path
    labels: Mapping[str, str]


def host_counts(text: str) -> list[int]:
    """``1,2,4``: distinct host counts of 1..16, each once, in increasing order."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or len(set(counts)) != len(counts) or not all(1 <= n <= MAX_DEMO_HOSTS for n in counts):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct host counts of 1 to {MAX_DEMO_HOSTS} separated by commas, e.g. 1,2,4"
        )
    return sorted(counts)


def check_hosts_options(args: argparse.Namespace) -> None:
    """What --hosts runs with so far, refused before anything starts (one line each)."""
    if args.spe != [HOSTS_SPE]:
        raise ConfigError(f"--hosts: only --spe {HOSTS_SPE} is spread over hosts so far, not {','.join(args.spe)}")
    if args.rates is not None:
        raise ConfigError("--hosts makes its own campaign (one run per host count): give one --rate, not --rates")
    if args.source != "generator":
        raise ConfigError("--hosts: only --source generator so far (the broker is not placed on a host yet)")
    if args.sink == "redis":
        raise ConfigError("--hosts: the executors write the file sink (Redis listens on loopback only); drop --sink")
    if args.off_cpu:
        raise ConfigError("--hosts: --off-cpu is refused inside a host's PID namespace (docs/cluster-namespaces.md)")
    if os.geteuid() != 0:
        raise PrivilegeError("--hosts makes network namespaces, links and sshd servers: run as root")


def level_dir(out: Path, hosts: int) -> Path:
    return out / f"{HOSTS_LABEL}-{hosts}"


def run_hosts(args: argparse.Namespace) -> int:
    """One run per host count into ``<out>/hosts-<N>/``, each on its own N fresh hosts and its own
    Spark cluster (a Worker and executor per host, the Master and driver on the hosts' bridge), then all
    analysed together into ``<out>/campaign/`` by the ``hosts`` label."""
    from coordinator.commands.demo import run_levels
    from coordinator.rundir import new_run_id

    check_hosts_options(args)
    out = args.out or Path("runs") / f"demo-hosts-{new_run_id()}"
    levels = (([level_dir(out, count)], _one_level(args, level_dir(out, count), count)) for count in args.hosts)
    return run_levels(
        out, args.force, "coordinator demo --hosts", HOSTS_LABEL, levels,
        "every host and process it started is stopped",
    )  # fmt: skip


def _one_level(args: argparse.Namespace, level: Path, count: int) -> int:
    """``count`` hosts, the query spread over them, profiled and analysed into ``level``; every host,
    link and process gone afterwards (also on a failure)."""
    from coordinator.commands.demo import (
        WORKLOAD_DIR,
        DemoCommand,
        _prepare_out,
        keep_logs,
        with_kept_logs,
    )  # fmt: skip
    from coordinator.remote.session import analyze_run
    from coordinator.workloads.nshosts import NamespacedHosts
    from coordinator.workloads.ysb.engines import ENGINES

    _prepare_out(level, args.force)
    harness = NamespacedHosts()
    try:
        hosts = harness.start(count)
        print(f"demo: {count} hosts {', '.join(f'{h.name} {h.address}' for h in hosts)} (bridge {harness.gateway})")
        with tempfile.TemporaryDirectory(prefix="coordinator-demo-", dir=SHARED_SCRATCH) as scratch:
            os.chmod(scratch, 0o755)
            log_dir = Path(scratch) / WORKLOAD_DIR
            try:
                engine = ENGINES[HOSTS_SPE](spread_options(args, harness, count), log_dir)
                with engine:
                    print(f"demo: {engine.describe()} (logs {engine.log_dir})")
                    outcome, window, elapsed = DemoCommand.profile_running(
                        args, level, engine, Path(scratch), args.rate, demo_cluster(harness, count),
                    )  # fmt: skip
            except ProfilerError as exc:
                raise with_kept_logs(exc, log_dir, keep_logs(log_dir, level / WORKLOAD_DIR)) from exc
            keep_logs(log_dir, level / WORKLOAD_DIR, suffix=".out")
    finally:
        harness.stop()
    return DemoCommand.print_result(analyze_run(outcome), window, elapsed)


def spread_options(args: argparse.Namespace, harness: NamespacedHosts, count: int) -> YsbOptions:
    """The demo's YsbOptions with one 1-core executor per host, the file sink, the Master and driver on
    the bridge's address."""
    from coordinator.workloads.sparkcluster import WorkerHost
    from coordinator.workloads.ysb.spark import YsbOptions

    return YsbOptions(
        rate=args.rate, campaigns=args.campaigns, sink="file", executors=count, executor_cores=1,
        frame_pointers=args.frame_pointers, source="generator",
        worker_hosts=tuple(WorkerHost(h.address, tuple(h.enter())) for h in harness.hosts),
        bind_address=harness.gateway,
    )  # fmt: skip


def demo_cluster(harness: NamespacedHosts, count: int) -> DemoCluster:
    """The hosts' cluster.txt as HostSpecs, their known_hosts, and the run label of their number."""
    from coordinator.remote.cluster import load_cluster

    cluster_file, known_hosts = harness.cluster_file()
    return DemoCluster(load_cluster(cluster_file), known_hosts, {HOSTS_LABEL: str(count)})
