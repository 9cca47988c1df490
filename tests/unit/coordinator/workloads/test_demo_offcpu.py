"""`coordinator demo --off-cpu` asks every host for `profiler run --off-cpu` (docs/offcpu.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from coordinator.commands.demo import DemoCommand
from coordinator.remote.hosts import RunRequest
from coordinator.remote.session import RunOptions


class _Started(Exception):
    """Raised by the stand-in for profile_cluster once it has seen the request."""


class _Engine:
    spe = "flink"
    profile = "profiles/ysb_flink.txt"
    events_source = "the generator"

    def wait_ready(self, timeout: float) -> None:
        pass

    def wait_processing(self, seconds: float) -> None:
        pass

    def check_running(self) -> None:
        pass

    def workload_pids(self) -> list[int]:
        return [1234]

    def known_spes(self) -> str:
        return "# test\n"


def profiled_with(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[RunRequest, RunOptions]]:
    """What `coordinator demo ARGV` hands profile_cluster (stopped there): the request and run options."""
    parser = argparse.ArgumentParser()
    DemoCommand().prepare_parser(parser)
    args = parser.parse_args([*argv, "--quiet"])
    seen: list[tuple[RunRequest, RunOptions]] = []

    def profile_cluster(hosts: object, request: RunRequest, out: Path, options: RunOptions) -> None:
        seen.append((request, options))
        raise _Started

    monkeypatch.setattr("coordinator.remote.session.profile_cluster", profile_cluster)
    with pytest.raises(_Started):
        DemoCommand.profile_running(args, tmp_path / "run", _Engine(), tmp_path, 1000)  # type: ignore[arg-type]
    return seen


@pytest.mark.parametrize(("argv", "off_cpu"), [(["--off-cpu"], True), ([], False)])
def test_demo_passes_off_cpu_to_every_hosts_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], off_cpu: bool
) -> None:
    assert [request.options.off_cpu for request, _ in profiled_with(argv, tmp_path, monkeypatch)] == [off_cpu]
