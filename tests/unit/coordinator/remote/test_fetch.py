"""`coordinator fetch` on run directories that need no host: nothing to fetch, a hostile work directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator import rundir
from coordinator.cli import main as coordinator_main
from coordinator.rundir import HostOutcome, RunInfo


def _run_dir(tmp_path: Path, workdir: str, state: str = "ok") -> Path:
    run_dir = tmp_path / "run"
    (run_dir / rundir.HOSTS_DIR).mkdir(parents=True)
    (run_dir / rundir.CLUSTER_COPY).write_text("root@10.0.0.1 worker name=node1\n")
    info = RunInfo("run", "cluster.txt", "p.txt", 8.0, 99, start_time=1.0)
    host = HostOutcome("node1", "root@10.0.0.1:22", ("worker",), state, "", workdir=workdir)
    rundir.write_run(run_dir, info.with_hosts((host,)))
    return run_dir


def test_nothing_to_fetch_when_no_host_left_a_work_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _run_dir(tmp_path, "")
    assert coordinator_main(["fetch", str(run_dir), "--quiet"]) == 0
    assert "nothing to fetch" in capsys.readouterr().out


@pytest.mark.parametrize("workdir", ["/etc", "/tmp/taskprof.x; rm -rf /", "/tmp/taskprof.x/../../etc", "relative"])
def test_a_work_directory_that_is_not_ours_is_refused_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workdir: str
) -> None:
    run_dir = _run_dir(tmp_path, workdir, state="failed")
    assert coordinator_main(["fetch", str(run_dir), "--quiet"]) == 6
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.json" in err[0] and "not a work directory" in err[0]


def test_local_host_takes_over_a_work_directory_left_by_a_dead_coordinator(tmp_path: Path) -> None:
    # GIVEN a work directory whose "profiler" (a process naming the status file, as `profiler run
    # --status-file` does) outlived the coordinator that started it
    import json
    import subprocess
    import sys
    import tempfile

    from coordinator.remote.cluster import parse_cluster
    from coordinator.remote.hosts import LocalHost

    workdir = Path(tempfile.mkdtemp(prefix="taskprof.", dir=tmp_path))
    status = workdir / "status.json"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(status)])
    try:
        status.write_text(json.dumps({"state": "sampling", "pid": orphan.pid}))
        (workdir / "out").mkdir()
        (workdir / "out" / "meta.json").write_text("{}")
        host = LocalHost(parse_cluster(["localhost"], "cluster.txt")[0])
        # WHEN a new LocalHost attaches to it
        host.attach(str(workdir))
        # THEN it sees the profiler alive, fetches what is there, stops it and removes the directory
        assert host.profiler_alive() and host.read_status() is not None
        host.fetch_capture(tmp_path / "fetched")
        assert (tmp_path / "fetched" / "meta.json").is_file()
        host.cleanup()
        assert orphan.wait(10) is not None and not workdir.exists()
        assert not host.profiler_alive()
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.parametrize("planted", ["link-host", "link-hosts", "file"])
def test_a_destination_that_is_a_link_or_a_file_is_refused_before_any_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str
) -> None:
    # GIVEN a run whose host left a work directory, and its capture's destination replaced by a link or file
    run_dir = _run_dir(tmp_path, "/tmp/taskprof.abcdef", state="failed")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hosts = run_dir / rundir.HOSTS_DIR
    if planted == "link-hosts":
        hosts.rmdir()
        hosts.symlink_to(elsewhere)
    elif planted == "link-host":
        (hosts / "node1").symlink_to(elsewhere)
    else:
        (hosts / "node1").write_text("mine")
    # WHEN fetched, THEN one error names the path before any host is reached, and nothing is written there
    assert coordinator_main(["fetch", str(run_dir), "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "coordinator fetch" in err[0], err
    assert "symbolic link" in err[0] or "not a directory" in err[0], err
    assert list(elsewhere.iterdir()) == []


def _capture_with_everything(out: Path) -> None:
    """A host's capture: what the analysis reads, the host's unmatched stacks, and a checkpoint journal."""
    (out / "pids" / "42").mkdir(parents=True)
    (out / "meta.json").write_text("{}")
    (out / "pids" / "42" / "stacks.tpc").write_bytes(b"table")
    (out / "node1_result.csv").write_text("rows\n")
    (out / "node1_unmatched.folded").write_text("worker;a;b 3\n")
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "journal.tpj").write_bytes(b"journal")


@pytest.mark.parametrize("everything", [False, True])
def test_the_fetch_leaves_what_the_analysis_does_not_read_on_the_host_unless_asked(
    tmp_path: Path, everything: bool
) -> None:
    import io
    import subprocess
    import tarfile

    from coordinator.remote import deploy
    from coordinator.remote.cluster import parse_cluster
    from coordinator.remote.hosts import LocalHost

    # GIVEN a work directory whose capture holds the host's unmatched stacks and a journal
    workdir = tmp_path / "taskprof.abc"
    _capture_with_everything(workdir / "out")
    expected = {"meta.json", "pids/42/stacks.tpc", "node1_result.csv"}
    if everything:
        expected.add("node1_unmatched.folded")
    # WHEN the local transport copies it, and the SSH transport's tar command streams it
    host = LocalHost(parse_cluster(["localhost"], "cluster.txt")[0])
    host.workdir = workdir
    host.fetch_capture(tmp_path / "local", everything)
    command = deploy.fetch_command(deploy.RemoteLayout(str(workdir)), False, everything)
    streamed = subprocess.run(["sh", "-c", command], capture_output=True, check=True).stdout
    (tmp_path / "ssh").mkdir()
    with tarfile.open(fileobj=io.BytesIO(streamed)) as archive:
        archive.extractall(tmp_path / "ssh", filter="data")
    # THEN both bring the same files: never the journal, the unmatched stacks only when asked for everything
    for dest in (tmp_path / "local", tmp_path / "ssh"):
        assert {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()} == expected
