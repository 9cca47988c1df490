"""The coordinator run directory ``runs/<run-id>/``: typed ``run.json`` and the per-host capture paths.

docs/capture-format.md ("Coordinator run directory") describes the same layout for people.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from profiler.capture.checks import check_rate, check_times, not_a_link
from profiler.capture.format import is_safe_name
from profiler.capture.jsonfile import expect_json, from_json_object, read_json_file
from profiler.errors import CaptureFormatError
from profiler.files.atomic import atomic_write_text

RUN_FORMAT_VERSION = 1

RUN_FILE = "run.json"
HOSTS_DIR = "hosts"
PROFILE_COPY = "application_profile.txt"
CLUSTER_COPY = "cluster.txt"

HOST_OK = "ok"
HOST_FAILED = "failed"
HOST_PARTIAL = "partial"  # profiled, but stopped early (Ctrl-C) or results incomplete
HOST_STATES: tuple[str, ...] = (HOST_OK, HOST_FAILED, HOST_PARTIAL)


@dataclass(frozen=True)
class HostOutcome:
    """What happened on one host of the run; ``host`` is its cluster.txt entry label."""

    host: str
    address: str  # what was connected to: "user@name:port", or "local"
    roles: tuple[str, ...] = ()
    state: str = HOST_FAILED  # "ok", "failed" or "partial"
    reason: str = ""  # why failed or partial; empty when ok
    clock_offset: float | None = None  # seconds, host clock minus coordinator clock
    start_time: float | None = None  # sampling window on the host (host clock, unix seconds)
    end_time: float | None = None
    # The host's private work directory while it may still hold the capture (set at deploy, cleared once
    # cleaned up): what `coordinator fetch` recovers after the coordinator died or lost the host.
    workdir: str = ""
    events: int | None = None  # events.json of its capture: the count, ± uncertainty, and how
    events_uncertainty: float | None = None
    events_method: str = ""

    @property
    def ok(self) -> bool:
        return self.state == HOST_OK

    @property
    def has_capture(self) -> bool:
        return self.state in (HOST_OK, HOST_PARTIAL)


@dataclass(frozen=True)
class RunInfo:
    """run.json: the whole coordinator run."""

    run_id: str
    cluster_file: str
    profile_name: str
    duration: float
    frequency: int
    labels: Mapping[str, str] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    start_time: float | None = None
    end_time: float | None = None
    complete: bool = False
    hosts: tuple[HostOutcome, ...] = ()
    format_version: int = RUN_FORMAT_VERSION

    def host(self, label: str) -> HostOutcome | None:
        return next((h for h in self.hosts if h.host == label), None)

    @property
    def failed_hosts(self) -> tuple[HostOutcome, ...]:
        return tuple(h for h in self.hosts if h.state != HOST_OK)

    def with_hosts(self, hosts: tuple[HostOutcome, ...]) -> RunInfo:
        return replace(self, hosts=hosts, complete=bool(hosts) and all(h.ok for h in hosts))


def new_run_id(now: float | None = None) -> str:
    """Sortable, filesystem-safe and unique enough for one user: ``20260122-014700``."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))


def host_capture_dir(run_dir: Path, host: str) -> Path:
    """Where the capture of ``host`` (its cluster.txt entry label) lives inside a run directory."""
    if not is_safe_name(host):
        raise CaptureFormatError(
            f"{Path(run_dir) / RUN_FILE}: host label {host!r} is not a safe directory name; "
            "fix the entry or re-run the profile"
        )
    advice = "a run directory's folders are its own: replace the link by the folder"
    return not_a_link(not_a_link(Path(run_dir) / HOSTS_DIR, advice) / host, advice)


def own_subdir(run_dir: Path, name: str) -> Path | None:
    """A folder the run directory holds (``tasks`` of an older analysis): None when absent; a link (to a
    folder elsewhere, which a rmtree would empty) or a file there is a CaptureFormatError naming it."""
    path = not_a_link(Path(run_dir) / name, "a run directory's folders are its own: remove the link")
    if not os.path.lexists(path):
        return None
    if not path.is_dir():
        raise CaptureFormatError(f"{path}: not a directory where the run keeps one; move it away")
    return path


def is_run_dir(path: Path) -> bool:
    return (Path(path) / RUN_FILE).is_file()


def run_info_to_dict(info: RunInfo) -> dict[str, Any]:
    payload = asdict(info)
    payload["labels"] = dict(info.labels)
    payload["versions"] = dict(info.versions)
    payload["hosts"] = [dict(asdict(h), roles=list(h.roles)) for h in info.hosts]
    return payload


def write_run(run_dir: Path, info: RunInfo) -> None:
    """Write run.json atomically (it is rewritten as hosts finish)."""
    text = json.dumps(run_info_to_dict(info), indent=1, sort_keys=True) + "\n"
    atomic_write_text(Path(run_dir) / RUN_FILE, text)


def read_run(run_dir: Path) -> RunInfo:
    path = Path(run_dir) / RUN_FILE
    payload = read_json_file(path, "is this a run directory written by `coordinator profile`?", "re-run the profile")
    payload = expect_json(payload, dict, path, "the file", "re-run the profile")
    version = payload.get("format_version")
    if version != RUN_FORMAT_VERSION or isinstance(version, bool):
        raise CaptureFormatError(
            f"{path}: format_version {version!r}, this version reads {RUN_FORMAT_VERSION}; "
            "use a matching coordinator version"
        )
    advice = "written by an incompatible coordinator version"
    hosts = []
    for entry in expect_json(payload.get("hosts"), list, path, "hosts", advice):
        entry = expect_json(entry, dict, path, "a host entry", advice)
        roles = expect_json(entry.get("roles", []), list, path, "roles", advice)
        hosts.append(from_json_object(HostOutcome, dict(entry, roles=tuple(roles)), path, advice))
    labels = expect_json(payload.get("labels", {}), dict, path, "labels", advice)
    versions = expect_json(payload.get("versions", {}), dict, path, "versions", advice)
    info: RunInfo = from_json_object(
        RunInfo, dict(payload, labels=dict(labels), versions=dict(versions), hosts=tuple(hosts)), path, advice
    )
    _check_consistent(info, path, "fix run.json or re-run the profile")
    return info


MAX_START_DELAY = 3600.0  # seconds: coordinator profile --start-delay's bound


def _check_consistent(info: RunInfo, path: Path, advice: str) -> None:
    """run.json agrees with itself: each host once (else its samples count twice), possible times. A run
    stopped during its start delay (a host refused, Ctrl-C) ends before the window it had planned."""
    check_times(path, info.start_time, info.end_time, advice, early_end=MAX_START_DELAY)
    check_rate(path, info.frequency, info.duration, advice)
    seen: set[str] = set()
    for host in info.hosts:
        if host.host in seen:
            raise CaptureFormatError(f"{path}: host {host.host!r} is listed twice; {advice}")
        seen.add(host.host)
        check_times(path, host.start_time, host.end_time, advice, f"host {host.host!r}: ")
        if host.state not in HOST_STATES:
            raise CaptureFormatError(
                f"{path}: host {host.host!r} has state {host.state!r}, not one of {', '.join(HOST_STATES)}; {advice}"
            )
