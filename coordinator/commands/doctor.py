"""`coordinator doctor`: run `profiler doctor` on every host of the cluster and print one table."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.remote.hosts import parse_doctor_output, terminal_text

if TYPE_CHECKING:
    from coordinator.remote.cluster import HostSpec
    from coordinator.remote.hosts import HostTransport

_HELP = """Check every host of cluster.txt: can it be profiled (privileges, bcc, kernel, tracepoints, PMU, JVMs)?

Reaches each host like `coordinator profile` does (SSH with key authentication and known_hosts
checking, or locally for the bare `localhost` entry), ships the host agent into a private temporary
directory, runs `profiler doctor --json` there as root, removes the directory, and prints one table:
one row per check, one column per host (ok / warn / fail / -), then the fix for every non-ok cell.
Exit code 0 when every host can sample (warnings allowed), 1 when a check failed somewhere, 7 when a
host could not be reached.

examples:
  $ coordinator doctor
  check                         localhost
  privileges                    ok
  bcc                           ok
  counter:cycles                warn
  ...
  $ coordinator doctor --cluster cluster.txt --accept-new-hosts
  $ coordinator doctor --json > doctor.json
"""

DOCTOR_TIMEOUT = 180.0


@dataclass(frozen=True)
class HostReport:
    host: str
    checks: tuple[Mapping[str, str], ...] = ()
    error: str = ""  # host unreachable or doctor unusable


def format_doctor_table(reports: Sequence[HostReport]) -> str:
    """Checks down, hosts across; then one line per non-ok cell with its detail and fix."""
    order: list[str] = []
    cells: dict[tuple[str, str], Mapping[str, str]] = {}
    for report in reports:
        for check in report.checks:
            if check["check"] not in order:
                order.append(check["check"])
            cells[(check["check"], report.host)] = check
    hosts = [r.host for r in reports]
    first = max([len("reachable"), *(len(name) for name in order)])
    widths = [max(len(h), 7) for h in hosts]
    lines = ["  ".join(["check".ljust(first), *(h.ljust(w) for h, w in zip(hosts, widths))]).rstrip()]
    if any(r.error for r in reports):
        order.insert(0, "reachable")
    for name in order:
        row = [name.ljust(first)]
        for report, width in zip(reports, widths):
            if name == "reachable":
                status = "fail" if report.error else "ok"
            else:
                status = cells.get((name, report.host), {}).get("status", "-") if not report.error else "-"
            row.append(status.ljust(width))
        lines.append("  ".join(row).rstrip())
    problems = []
    for report in reports:
        if report.error:
            problems.append(f"{report.host}: {report.error}")
        for check in report.checks:
            if check["status"] != "ok":
                fix = f"; fix: {check['fix']}" if check["fix"] else ""
                problems.append(f"{report.host}: {check['check']} {check['status']}: {check['detail']}{fix}")
    if problems:
        lines += ["", *problems]
    return "\n".join(lines)


def doctor_exit_code(reports: Sequence[HostReport]) -> int:
    from coordinator.errors import HostUnreachable

    if any(r.error for r in reports):
        return HostUnreachable.exit_code
    if any(c["status"] == "fail" for r in reports for c in r.checks):
        return 1
    return 0


def _doctor_host(transport: HostTransport, profile: Path, known_spes: Path) -> HostReport:
    from profiler.errors import ProfilerError

    label = transport.spec.label
    try:
        transport.connect()
        transport.deploy(profile, known_spes)
        result = transport.run_profiler(["doctor", "--json"], DOCTOR_TIMEOUT)
        try:
            return HostReport(label, parse_doctor_output(result.stdout))
        except ValueError as exc:
            tail = terminal_text((result.stderr or result.stdout)[-300:])
            return HostReport(label, error=f"`profiler doctor --json` gave no usable output ({exc}): {tail}")
    except ProfilerError as exc:
        return HostReport(label, error=terminal_text(str(exc)))
    except Exception as exc:  # noqa: BLE001 - one broken host must not hide the others
        return HostReport(label, error=terminal_text(f"internal error: {exc.__class__.__name__}: {exc}"))
    finally:
        try:
            transport.cleanup()
        except Exception:  # noqa: BLE001
            pass
        transport.close()


def doctor_cluster(
    hosts: Sequence[HostSpec],
    profile: Path,
    known_spes: Path,
    transport_factory: Callable[[HostSpec], HostTransport],
) -> list[HostReport]:
    """Run the doctor on every host in parallel; reports in cluster order."""
    reports: dict[str, HostReport] = {}

    def one(spec: HostSpec) -> None:
        reports[spec.label] = _doctor_host(transport_factory(spec), profile, known_spes)

    threads = [threading.Thread(target=one, args=(spec,), daemon=True) for spec in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [reports[spec.label] for spec in hosts]


class DoctorCommand:
    __doc__ = _HELP

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--cluster",
            type=Path,
            default=None,
            help="cluster file (default: ./cluster.txt, else the installed one, which holds localhost)",
        )
        parser.add_argument(
            "--accept-new-hosts", action="store_true", help="record unknown host keys (never changed ones)"
        )
        parser.add_argument("--known-hosts", type=Path, help="known_hosts file (default: ~/.ssh/known_hosts)")
        parser.add_argument("--json", action="store_true", help="print {host: [checks]} as JSON")

    def run(self, args: argparse.Namespace) -> int:
        from coordinator.remote.cluster import default_cluster_file
        from coordinator.remote.session import load_cluster, make_transport
        from profiler.defaults import DEFAULT_KNOWN_SPES, DEFAULT_PROFILE, data_file

        args.cluster = args.cluster or default_cluster_file()
        hosts = load_cluster(args.cluster)
        factory = make_transport(args.known_hosts, args.accept_new_hosts)
        reports = doctor_cluster(hosts, data_file(DEFAULT_PROFILE), data_file(DEFAULT_KNOWN_SPES), factory)
        if args.json:
            payload = {r.host: {"error": r.error or None, "checks": list(r.checks)} for r in reports}
            print(json.dumps(payload, indent=1))
        else:
            print(format_doctor_table(reports))
        code = doctor_exit_code(reports)
        if code and not args.json:
            print(
                "coordinator doctor: fix the problems above, then: coordinator profile --duration 60",
                file=sys.stderr,
            )
        return code


COMMAND = DoctorCommand
