"""A compromised host's capture over real SSH: the host's own tar streams a link out of the capture (to
the coordinator's run directory); the coordinator refuses it with one line and writes nothing outside
RUN/hosts/<host>/ (a file written through such a link: tests/unit/coordinator/remote/test_untar.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from coordinator.remote.cluster import parse_cluster
from coordinator.remote.ssh import SshHost, SshOptions
from coordinator.remote.untar import CaptureRefused
from tests.fixtures.sshd import SshdFactory


def test_a_capture_with_a_link_out_is_refused_and_nothing_lands_outside(
    sshd_factory: SshdFactory, tmp_path: Path
) -> None:
    # GIVEN a host whose work directory's capture holds a link to the coordinator's run directory above
    # the host's own, beside a file named like the run's summary
    host = sshd_factory.start()
    run_dir = tmp_path / "run"
    dest = run_dir / "hosts" / "node1"
    workdir = Path(tempfile.mkdtemp(prefix="taskprof.", dir=host.session_tmp))
    capture = workdir / "out"
    capture.mkdir()
    (capture / "meta.json").write_text("{}\n")
    (capture / "a-link").symlink_to(run_dir)
    (capture / "z-forged").mkdir()
    (capture / "z-forged" / "summary.csv").write_text("forged\n")
    spec = parse_cluster([host.cluster_line(sshd_factory.user_key)], "cluster.txt")[0]
    transport = SshHost(spec, SshOptions(known_hosts=tmp_path / "known_hosts", accept_new_hosts=True))
    transport.connect()
    try:
        transport.attach(str(workdir))
        # WHEN the coordinator fetches it
        with pytest.raises(CaptureRefused) as refused:
            transport.fetch_capture(dest, everything=True)
    finally:
        transport.close()
    # THEN one line names the host, the member and why; nothing was written outside the host's directory
    message = str(refused.value)
    assert "\n" not in message and spec.label in message and "a-link" in message and "symbolic link" in message
    assert {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")} <= {"hosts", "hosts/node1"} | {
        f"hosts/node1/{name}" for name in ("meta.json", "z-forged", "z-forged/summary.csv")
    }
    assert not (run_dir / "summary.csv").exists()
