"""cluster.txt parsing and validation, run.json round trip, and the quoting of remote shell lines."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from coordinator import rundir
from coordinator.remote import deploy
from coordinator.remote.cluster import HostSpec, load_cluster, parse_cluster
from coordinator.remote.hosts import run_request
from profiler.errors import CaptureFormatError, ConfigError
from profiler.run.options import RunOptions


def parse(text: str) -> list[HostSpec]:
    return parse_cluster(text.splitlines(), "cluster.txt")


def test_full_syntax() -> None:
    hosts = parse(
        "# the cluster\n"
        "localhost\n"
        "\n"
        "alice@worker1.example.org:2222 worker kafka identity=~/.ssh/k  # comment\n"
        "10.0.0.5 master name=m1 python=/opt/py/bin/python3\n"
        "[fe80::1]:22 worker\n"
    )
    local, worker, master, v6 = hosts
    assert local.is_local and local.address == "local" and local.label == "localhost"
    assert (worker.user, worker.hostname, worker.port) == ("alice", "worker1.example.org", 2222)
    assert worker.roles == ("worker", "kafka")
    assert worker.identity == "~/.ssh/k" and worker.label == "worker1.example.org_2222"
    assert worker.source == "cluster.txt:4" and not worker.is_local
    assert master.label == "m1" and master.python == "/opt/py/bin/python3" and master.port == 22
    assert v6.hostname == "fe80::1" and v6.address == "[fe80::1]:22"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("h:0", 1, "bad port"),
        ("h:65536", 1, "bad port"),
        ("h:22x", 1, "bad port"),
        ("ok\nh colour=red", 2, "unknown key 'colour'"),
        ("h\nh worker", 2, "duplicate host"),
        ("h:2200\nh:2200 name=other", 2, "duplicate host"),
        ("a name=x\nb name=x", 2, "duplicate host 'x'"),
        ("h;reboot", 1, "bad host name"),
        ("$(touch /tmp/x)", 1, "bad host name"),
        ("h `id`", 1, "bad role"),
        ("r@@h", 1, "bad user name"),
        ("h name=../../etc", 1, "bad host label"),
        ("h name=a/b", 1, "bad host label"),
        ("h python=python3;id", 1, "bad python"),
        ("h identity=", 1, "empty value"),
        ("h name=a name=b", 1, "given twice"),
        ("-oProxyCommand=x", 1, "bad host name"),
    ],
)
def test_bad_lines_name_file_line_and_fix(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith(f"cluster.txt:{line}: ") and words in message and "; " in message


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no hosts"):
        parse("# nothing\n\n")
    with pytest.raises(ConfigError, match="not found"):
        load_cluster(tmp_path / "absent.txt")


def test_only_bare_localhost_is_local() -> None:
    assert parse("localhost")[0].is_local
    for entry in ("root@localhost", "localhost:22", "localhost identity=/k", "127.0.0.1"):
        assert not parse(entry)[0].is_local, entry


def test_the_shipped_cluster_file_is_local(repo_root: Path) -> None:
    hosts = load_cluster(repo_root / "cluster.txt")
    assert [h.label for h in hosts] == ["localhost"] and hosts[0].is_local


def test_run_json_round_trip(tmp_path: Path) -> None:
    info = rundir.RunInfo(
        run_id="r1",
        cluster_file="cluster.txt",
        profile_name="p.txt",
        duration=5.0,
        frequency=99,
        labels={"load": "50k"},
        versions={"coordinator": "0.1.0"},
        start_time=1.0,
        end_time=7.5,
        hosts=(
            rundir.HostOutcome("a", "root@a:22", ("worker",), "ok", "", 0.001, 1.0, 6.0),
            rundir.HostOutcome("b", "b:22", (), "failed", "cannot connect"),
        ),
    ).with_hosts(
        (
            rundir.HostOutcome("a", "root@a:22", ("worker",), "ok", "", 0.001, 1.0, 6.0),
            rundir.HostOutcome("b", "b:22", (), "failed", "cannot connect"),
        )
    )
    assert not info.complete
    rundir.write_run(tmp_path, info)
    assert rundir.is_run_dir(tmp_path)
    assert rundir.read_run(tmp_path) == info
    assert rundir.host_capture_dir(tmp_path, "a") == tmp_path / "hosts" / "a"
    with pytest.raises(CaptureFormatError):
        rundir.host_capture_dir(tmp_path, "../x")
    (tmp_path / "run.json").write_text('{"format_version": 99}')
    with pytest.raises(CaptureFormatError, match="format_version"):
        rundir.read_run(tmp_path)


def request(**options: object) -> RunOptions:
    """profiler run's options as the coordinator asks every host (3 s), before the transport's paths."""
    return run_request(3.0, Path("profile.txt"), Path("known_spes.txt"), **options).options


HOSTILE = "x'; touch /tmp/pwned; echo '$(id)`id`\"\n"


def test_remote_lines_quote_every_value(tmp_path: Path) -> None:
    # GIVEN a work directory and a label full of shell syntax (validation forbids them; quoting must hold anyway)
    layout = deploy.RemoteLayout(str(tmp_path / f"taskprof.{HOSTILE}"))
    args = deploy.profiler_run_args(layout, HOSTILE, request(pids=(5,)), 123.0)
    line = deploy.start_command(layout, "/usr/bin/python3", args, needs_sudo=False)
    # THEN the shell sees the hostile text as single words: parse the line back
    words = shlex.split(line.split(" sh -c ", 1)[1].rsplit(" > ", 1)[0])
    inner = shlex.split(words[0])
    assert HOSTILE in inner and "--host" in inner and inner[inner.index("--host") + 1] == HOSTILE
    assert deploy.signal_command(layout, "INT", True).count("sudo -n kill -INT") == 1
    with pytest.raises(ValueError):
        deploy.signal_command(layout, "HUP; rm -rf /", False)


def test_cleanup_refuses_foreign_directories() -> None:
    for workdir in ("/", "/tmp", "/home/alice", "/tmp/taskprof.abc/../..", "/tmp/taskprof.x/"):
        with pytest.raises(ValueError):
            deploy.cleanup_command(deploy.RemoteLayout(workdir), False)


def test_probe_output_parsing() -> None:
    facts = deploy.parse_probe("1000\nsudo-ok\n/usr/bin/python3\n/tmp/taskprof.AbC123\n")
    assert facts is not None and facts.uid == 1000 and facts.sudo_ok and facts.python == "/usr/bin/python3"
    assert deploy.parse_probe("1000\nsudo-no\n\n/tmp/taskprof.x\n") is not None
    assert deploy.parse_probe("garbage") is None
    assert deploy.parse_probe("0\nsudo-ok\n/usr/bin/python3\n/etc\n") is None


def test_bundle_holds_the_agent_package_without_caches() -> None:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(deploy.build_bundle())) as bundle:
        names = bundle.getnames()
        spes = bundle.extractfile("profiler/scope/known_spes.txt")
        assert spes is not None  # the one top-level known_spes.txt, where the host agent looks without the tree
        assert spes.read() == (Path(__file__).resolve().parents[4] / "known_spes.txt").read_bytes()
    assert "profiler/__main__.py" in names and "profiler/run/runner.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # every room of the package and its data files: the BPF C, known_spes.txt, the agent's sources
    for shipped in ("profiler/capture/format.py", "profiler/sampling/stack_walk.c", "profiler/sampling/targets.h",
                    "profiler/unwind/cfi_step.h",
                    "profiler/scope/known_spes.txt", "profiler/scope/exec_watch.c", "profiler/symbols/agent/Makefile"):
        assert shipped in names, shipped


def test_off_cpu_reaches_the_host_agent_only_when_asked(tmp_path: Path) -> None:
    from profiler.commands.run import RunCommand

    layout = deploy.RemoteLayout(str(tmp_path / "taskprof.x"))
    assert "--off-cpu" not in deploy.profiler_run_args(layout, "h", request(), None)
    args = deploy.profiler_run_args(layout, "h", request(off_cpu=True), None)
    assert args.count("--off-cpu") == 1
    # the host agent's parser takes what the coordinator sends
    parser = argparse.ArgumentParser()
    RunCommand().prepare_parser(parser)
    assert parser.parse_args(args[1:]).off_cpu is True


def test_roles_reach_the_host_agent_only_when_not_the_default(tmp_path: Path) -> None:
    from profiler.commands.run import RunCommand

    layout = deploy.RemoteLayout(str(tmp_path / "taskprof.x"))
    assert "--roles" not in deploy.profiler_run_args(layout, "h", request(roles=("workload", "managing")), None)
    args = deploy.profiler_run_args(layout, "h", request(roles=("workload", "managing", "broker")), None)
    assert args[args.index("--roles") + 1] == "workload,managing,broker"
    parser = argparse.ArgumentParser()
    RunCommand().prepare_parser(parser)
    assert parser.parse_args(args[1:]).roles == ("workload", "managing", "broker")
    default_roles = parser.parse_args(deploy.profiler_run_args(layout, "h", request(), None)[1:]).roles
    assert default_roles == ("workload", "managing")
