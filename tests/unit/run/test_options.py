"""profiler run's options declared once (profiler/run/options.py): every option survives options -> argv ->
options through the agent's parser, the coordinator's parsers take their defaults from the declaration, and
no second literal default of a run option is written anywhere in profiler/ or coordinator/."""

from __future__ import annotations

import argparse
import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coordinator.remote import deploy
from coordinator.remote.hosts import run_request
from profiler.commands.run import RunCommand
from profiler.run.options import FORWARDED, RUN_OPTIONS, RunOptions, option_values, run_argv

REPO = Path(__file__).resolve().parents[3]
DECLARATION = REPO / "profiler" / "run" / "options.py"

# a value other than the default for every option (a new option without one fails the first test)
SAMPLES: dict[str, Any] = {
    "duration": 7.25,
    "out": Path("/tmp/elsewhere"),
    "profile": Path("/tmp/my_profile.txt"),
    "known_spes": Path("/tmp/my_spes.txt"),
    "pids": (5, 4242),
    "roles": ("workload", "managing", "broker"),
    "frequency": 199,
    "net": True,
    "exact_inlining": True,
    "counters": "proc",
    "off_cpu": True,
    "off_cpu_min_block_ms": 2.5,
    "off_cpu_sample_every": 4,
    "events": 1000,
    "host": "h2",
    "force": True,
    "max_stack_depth": 64,
    "interval": 2.5,
    "perf_map_refresh": 0.0,
    "stack_collection": "stackmap",
    "stack_walk": "kernel",
    "hotspot_unwind": False,
    "stack_storage_size": 1024,
    "checkpoint": 0.5,
    "exec_watch": False,
    "start_at": 1795929984.123,
    "status_file": Path("/tmp/status.json"),
    "start_file": Path("/tmp/start.txt"),
}


def base() -> RunOptions:
    return RunOptions(duration=3.0, out=Path("/tmp/cap"), profile=Path("p.txt"), known_spes=Path("k.txt"), host="h1")


def parsed(argv: list[str]) -> RunOptions:
    parser = argparse.ArgumentParser()
    RunCommand().prepare_parser(parser)
    return RunOptions.from_args(parser.parse_args(argv))


def test_every_option_has_a_sample_other_than_its_default() -> None:
    assert set(SAMPLES) == set(RUN_OPTIONS)
    for name, how in RUN_OPTIONS.items():
        assert SAMPLES[name] != how.default and SAMPLES[name] != getattr(base(), name), name


@pytest.mark.parametrize("name", list(RUN_OPTIONS))
def test_each_option_survives_options_to_argv_to_options(name: str) -> None:
    options = replace(base(), **{name: SAMPLES[name]})
    assert parsed(run_argv(options)) == options


def test_all_options_at_once_and_the_defaults_survive_the_round_trip() -> None:
    everything = replace(base(), **SAMPLES)
    assert parsed(run_argv(everything)) == everything
    assert parsed(run_argv(base())) == base()
    # only what differs from a default is said, besides what has none
    assert run_argv(base()) == [
        "--duration",
        "3.0",
        "--out",
        "/tmp/cap",
        "--profile",
        "p.txt",
        "--known-spes",
        "k.txt",
        "--host",
        "h1",
    ]


def test_the_coordinators_argv_gives_each_host_the_options_it_was_asked_with(tmp_path: Path) -> None:
    # GIVEN a request with every forwarded option away from its default
    forwarded = {name: SAMPLES[name] for name in FORWARDED if name not in ("duration", "profile", "known_spes")}
    request = run_request(SAMPLES["duration"], Path("mine.txt"), Path("spes.txt"), **forwarded)
    layout = deploy.RemoteLayout(str(tmp_path / "taskprof.x"))
    # WHEN the transport makes the line that starts profiler run on a host
    argv = deploy.profiler_run_args(layout, "node-1", request.options, 1795929984.5)
    # THEN the host parses exactly those options, with its own paths, label, status file and start
    assert argv[0] == "run"
    assert parsed(argv[1:]) == replace(
        request.options,
        out=Path(layout.out),
        profile=Path(layout.profile),
        known_spes=Path(layout.known_spes),
        host="node-1",
        status_file=Path(layout.status),
        start_at=1795929984.5,
        start_file=Path(layout.start),
        force=True,
    )


def test_the_coordinators_parsers_take_the_declared_defaults() -> None:
    from coordinator.commands.demo import DURATION, DemoCommand
    from coordinator.commands.profile import ProfileCommand

    profile = argparse.ArgumentParser()
    ProfileCommand().prepare_parser(profile)
    values = option_values(profile.parse_args(["--duration", "5"]), FORWARDED)
    for name in FORWARDED:
        if name not in ("duration", "pids"):
            assert values[name] == RUN_OPTIONS[name].default, name
    assert values["pids"] == ()
    demo = argparse.ArgumentParser()
    DemoCommand().prepare_parser(demo)
    shown = demo.parse_args([])
    assert (shown.duration, shown.frequency, shown.off_cpu, shown.roles) == (
        DURATION,
        RUN_OPTIONS["frequency"].default,
        False,
        RUN_OPTIONS["roles"].default,
    )


def literal_defaults(source: str) -> list[tuple[int, str]]:
    """Where ``source`` writes a run option's declared default again as a literal: argparse's default=
    for its flag, a parameter, field or keyword of its name, or ``.get("name", default)``; and a constructor
    parameter of its name with another number (a component contradicting the declaration). Only numbers:
    None, False or () start every switch and list, and a choice word such as "auto" is a component's
    own "decide for yourself"."""
    flags = {how.flag: name for name, how in RUN_OPTIONS.items()}
    telling = {
        name: how.default
        for name, how in RUN_OPTIONS.items()
        if isinstance(how.default, int | float) and not isinstance(how.default, bool)
    }

    def same(name: str | None, node: ast.AST | None) -> bool:
        if name not in telling or not isinstance(node, ast.Constant) or isinstance(node.value, bool):
            return False
        return bool(node.value == telling[name])

    def other(name: str | None, node: ast.AST | None) -> bool:
        number = isinstance(node, ast.Constant) and isinstance(node.value, int | float)
        return name in telling and number and not isinstance(node.value, bool) and not same(name, node)  # type: ignore[union-attr]

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            key = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
            flag_default = key in flags and any(k.arg == "default" and same(flags[key], k.value) for k in node.keywords)
            if node.func.attr == "add_argument" and flag_default:
                found.append((node.lineno, f"add_argument({key!r}, default=...)"))
            if node.func.attr == "get" and len(node.args) == 2 and same(key, node.args[1]):
                found.append((node.lineno, f".get({key!r}, ...)"))
        if isinstance(node, ast.keyword) and same(node.arg, node.value):
            found.append((node.value.lineno, f"{node.arg}=..."))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and same(node.target.id, node.value):
            found.append((node.lineno, f"{node.target.id}: ... = ..."))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            positional = node.args.posonlyargs + node.args.args
            pairs = list(zip(positional[len(positional) - len(node.args.defaults) :], node.args.defaults))
            pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
            found += [(node.lineno, f"{a.arg}=... in {node.name}()") for a, d in pairs if same(a.arg, d)]
            # a component's constructor that gives the option another literal default contradicts the declaration
            found += [
                (node.lineno, f"{a.arg}={d.value!r} in {node.name}(), declared {telling[a.arg]!r}")  # type: ignore[attr-defined]
                for a, d in pairs
                if node.name == "__init__" and other(a.arg, d)
            ]
    return found


def test_the_scan_finds_a_second_default() -> None:
    # the control: each form the scan looks for, written with perf_map_refresh's default
    source = (
        "def f(perf_map_refresh: float = 60.0) -> None: ...\n"
        "class A:\n    perf_map_refresh: float = 60.0\n"
        "g(perf_map_refresh=60.0)\n"
        "header.get('perf_map_refresh', 60.0)\n"
        "parser.add_argument('--perf-map-refresh', type=float, default=60.0)\n"
        "parser.add_argument('--frequency', default=99)\n"
        "class Sampler:\n    def __init__(self, stack_storage_size: int = 16384) -> None: ...\n"
    )
    assert len(literal_defaults(source)) == 7
    assert literal_defaults("g(perf_map_refresh=0.0)\nparser.add_argument('--cluster', default=None)\n") == []


def test_no_run_option_default_is_written_twice() -> None:
    offences = []
    for root in ("profiler", "coordinator"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == DECLARATION:
                continue
            where = path.relative_to(REPO)
            offences += [f"{where}:{line}: {what}" for line, what in literal_defaults(path.read_text())]
    assert not offences, "a run option's default belongs in profiler/run/options.py only:\n" + "\n".join(offences)
