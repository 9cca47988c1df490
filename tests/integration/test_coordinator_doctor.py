"""`coordinator doctor` over a real sshd: the real `profiler doctor --json` runs on the host, one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.cli import main as coordinator_main
from coordinator.errors import HostUnreachable
from tests.fixtures.sshd import SshdFactory, free_port


def test_doctor_runs_on_every_host_and_prints_one_table(
    sshd_factory: SshdFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = sshd_factory.start()
    dead_port = free_port()
    cluster = sshd_factory.cluster_file(
        [
            host.cluster_line(sshd_factory.user_key),
            f"root@127.0.0.1:{dead_port} identity={sshd_factory.user_key} name=down",
        ]
    )
    known_hosts = sshd_factory.known_hosts([host])
    args = ["doctor", "--cluster", str(cluster), "--known-hosts", str(known_hosts)]
    code = coordinator_main([*args, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == HostUnreachable.exit_code
    assert report["down"]["error"] and str(dead_port) in report["down"]["error"]
    checks = {c["check"]: c["status"] for c in report["node1"]["checks"]}
    assert report["node1"]["error"] is None
    assert checks["privileges"] == "ok" and checks["bcc"] == "ok"
    assert host.leftovers() == []
    # the table form: checks down, hosts across
    coordinator_main(args)
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["check", "node1", "down"]
    assert table[1].split() == ["reachable", "ok", "fail"]
    assert any(line.split()[:2] == ["bcc", "ok"] for line in table)
