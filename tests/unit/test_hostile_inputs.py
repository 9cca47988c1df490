"""Hostile inputs corpus: every input file and argument of the CLIs, broken on purpose.

Each case builds its inputs in a sandbox (tmp_path/sandbox, also the working directory), runs the
real CLI in this process and checks what a user would see: the expected exit code, exactly one line
on stderr when it fails (``prog command: error: file[:line]: ...``, or argparse's usage + error),
no traceback, no hang (an alarm guards every case) and no file written outside the sandbox's output
directories. docs/reliability.md counts these cases per class; keep its table in step.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from coordinator import cli as coordinator_cli
from profiler import cli as profiler_cli
from profiler.capture.format import FORMAT_VERSION as CAPTURE_FORMAT_VERSION
from profiler.run import runner as run_runner
from tests.fixtures.captures import (
    KNOWN_PROFILE,
    TINY_PID_100,
    PidSpec,
    write_capture,
    write_run_dir,
)

OK = 0
BAD_INPUT = 2  # ConfigError, and argparse's own errors
BAD_CAPTURE = 6  # CaptureFormatError
OUTPUT_EXISTS = 5  # OutputExistsError
GUARD_SECONDS = 60  # a hang fails the case instead of CI; no case comes near it

# Paths that an escape (traversal, absolute label) would write; each must still be absent afterwards.
ESCAPE_NAME = "HOSTILE-ESCAPE"
SHADOW = "/etc/shadow"

RUN = "runs/r1"  # the sandbox's run directory (relative to the sandbox)
HOST_DIR = f"{RUN}/hosts/h1"
PID_DIR = f"{HOST_DIR}/pids/100"
UNREACHABLE_CLUSTER = "127.0.0.1:1 worker\n"  # nothing listens there: validation must fail first


@dataclass(frozen=True)
class Case:
    """One hostile input: ``build`` prepares the sandbox and returns the CLI's argv."""

    name: str
    cli: str  # "profiler" or "coordinator"
    build: Callable[[Path], list[str]]
    codes: tuple[int, ...]  # accepted exit codes
    stderr_names: str = ""  # a text the error line must contain (the file's name), when it fails
    kept: tuple[str, ...] = ()  # the user's files (relative to the sandbox) that must be left as they were
    warns: str = ""  # a text stderr must contain when the command succeeds (a one-line warning)


# ---------------------------------------------------------------- sandbox builders


def write(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def tiny_run(sandbox: Path, timeline: bool = False) -> Path:
    spec = TINY_PID_100
    options: dict[str, object] = {}
    if timeline:
        parts = {interval: dict(TINY_PID_100.stacks) for interval in range(3)}
        spec = PidSpec(pid=100, timeline=parts, cycles=1e9)
        options = {"stack_collection": "ringbuf", "duration": 30.0}
    return write_run_dir(sandbox / RUN, "r1", {"h1": [spec]}, **options)


def bare_capture(sandbox: Path) -> Path:
    return write_capture(sandbox / "cap", "h1", [TINY_PID_100])


def run_with(relative: str, content: bytes | str, timeline: bool = False) -> Callable[[Path], Path]:
    """A tiny run whose file ``relative`` (below the run directory) is replaced by ``content``."""

    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox, timeline)
        write(run / relative, content)
        return run

    return build


def run_json_with(**changes: object) -> Callable[[Path], Path]:
    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox)
        payload = json.loads((run / "run.json").read_text())
        payload.update(changes)
        (run / "run.json").write_text(json.dumps(payload))
        return run

    return build


def run_with_link(relative: str, target: str) -> Callable[[Path], Path]:
    """A tiny run whose file ``relative`` is a symlink to ``target`` (absolute, or below the sandbox)."""

    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox)
        link = run / relative
        if link.exists() or link.is_symlink():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        destination = Path(target) if target.startswith("/") else sandbox / target
        if not destination.is_absolute() or not str(destination).startswith("/etc"):
            write(destination, "outside;the;run 5\n")
        link.symlink_to(destination)
        return run

    return build


def analyze(make_run: Callable[[Path], Path], *extra: str) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["analyze", str(make_run(sandbox)), *extra]


def report(make_run: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["report", str(make_run(sandbox))]


def export(make_run: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["export", str(make_run(sandbox)), "--format", "pprof"]


def draft(make_run: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["draft-profile", str(make_run(sandbox))]


def summary_of(content: bytes | str) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        run = tiny_run(sandbox)
        write(run / "summary.csv", content)
        return ["summary", str(run)]

    return build


def match_file(content: bytes | str) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        profile = write(sandbox / "profile.txt", KNOWN_PROFILE)
        return ["match", "--profile", str(profile), str(write(sandbox / "in.folded", content))]

    return build


def match_run(make_run: Callable[[Path], Path]) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        profile = write(sandbox / "profile.txt", KNOWN_PROFILE)
        return ["match", "--profile", str(profile), str(make_run(sandbox))]

    return build


def compare_summary(content: bytes | str) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        good = write(sandbox / "a.csv", "run,host,pid,task,samples,cycles\nr,*,*,Kafka,5,10\nr,*,*,*,5,10\n")
        return ["compare", str(good), str(write(sandbox / "b.csv", content))]

    return build


def profile_cmd(
    cluster: bytes | str = UNREACHABLE_CLUSTER,
    profile: bytes | str | None = None,
    known: bytes | str | None = None,
    *extra: str,
) -> Callable[[Path], list[str]]:
    """`coordinator profile` with one bad input and hosts that cannot be reached: the input error must come first."""

    def build(sandbox: Path) -> list[str]:
        argv = ["profile", "--duration", "1", "--quiet", "--no-analyze", "--connect-timeout", "1"]
        argv += ["--out", str(sandbox / "out"), "--known-hosts", str(sandbox / "known_hosts")]
        argv += ["--cluster", str(write(sandbox / "cluster.txt", cluster))]
        if profile is not None:
            argv += ["--profile", str(write(sandbox / "profile.txt", profile))]
        if known is not None:
            argv += ["--known-spes", str(write(sandbox / "known_spes.txt", known))]
        return argv + list(extra)

    return build


def doctor_cmd(cluster: bytes | str) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["doctor", "--cluster", str(write(sandbox / "cluster.txt", cluster))]


# ---------------------------------------------------------------- the corpus

LONG_FRAME = "x" * (4 * 1024 * 1024)  # a 4 MB line
FOLDED: list[tuple[str, bytes | str, int]] = [
    ("nul-in-frame", b"a;b\x00c 5\n", OK),
    ("invalid-utf8", b"a;\xff\xfeb 5\n", OK),
    ("crlf", "a;b 5\r\nc;d 2\r\n", OK),
    ("cr-only", "a;b 5\rc;d 2\r", OK),
    ("bom", "\ufeffa;b 5\n", OK),
    ("4mb-line", f"a;{LONG_FRAME} 3\n", OK),
    ("empty-file", "", OK),
    ("zero-count", "a;b 0\n", OK),
    ("no-count", "a;b\n", BAD_CAPTURE),
    ("count-only", " 5\n", BAD_CAPTURE),
    ("negative-count", "a;b -5\n", BAD_CAPTURE),
    ("plus-count", "a;b +5\n", BAD_CAPTURE),
    ("float-count", "a;b 5.0\n", BAD_CAPTURE),
    ("huge-count", "a;b 99999999999999999999999999999\n", BAD_CAPTURE),
    ("superscript-count", "a;b \u00b2\n", BAD_CAPTURE),
    ("arabic-digit-count", "a;b \u0663\n", BAD_CAPTURE),
    ("tab-separated", "a;b\t5\n", BAD_CAPTURE),
    ("binary-garbage", bytes(range(256)) * 4, BAD_CAPTURE),
]

TIMELINE: list[tuple[str, str, int]] = [
    ("interval-not-a-number", "x a;b 1\n", BAD_CAPTURE),
    ("no-count", "0 a;b\n", BAD_CAPTURE),
    ("negative-count", "0 a;b -1\n", BAD_CAPTURE),
    ("negative-interval", "-1 a;b 1\n", BAD_CAPTURE),
    ("huge-count", "0 a;b 99999999999999999999999999999\n", BAD_CAPTURE),
    ("no-stack", "0 7\n", BAD_CAPTURE),
]

JSON_GARBAGE: list[tuple[str, str]] = [
    ("not-json", "{not json"),
    ("list", "[]"),
    ("null", "null"),
    ("string", '"x"'),
    ("nan", "NaN"),
]

META_FIELDS: list[tuple[str, dict[str, object]]] = [
    ("format-version-99", {"format_version": 99}),
    ("format-version-string", {"format_version": "2"}),
    ("start-time-string", {"start_time": "yesterday"}),
    ("end-time-null", {"end_time": None}),
    ("frequency-list", {"frequency": [99]}),
    ("interval-zero", {"interval": 0, "stack_collection": "ringbuf", "format_version": 2}),
    ("interval-negative", {"interval": -10, "stack_collection": "ringbuf", "format_version": 2}),
    ("host-traversal", {"host": "../../../etc/passwd"}),
    ("host-absolute", {"host": "/etc/passwd"}),
    ("warnings-number", {"warnings": 5}),
]

PER_PID_JSON: list[tuple[str, str, str]] = [
    ("counters-empty-object", "counters.json", "{}"),
    ("counters-events-string", "counters.json", '{"pid": 100, "events": "x", "cycles": 1, "cycles_estimated": false}'),
    (
        "counters-cycles-string",
        "counters.json",
        '{"pid": 100, "events": {}, "cycles": "many", "cycles_estimated": false}',
    ),
    ("sampler-samples-string", "sampler.json", '{"pid": 100, "samples": "many"}'),
    ("sampler-list", "sampler.json", "[1, 2]"),
    ("counters-timeline-list", "counters_timeline.json", "[]"),
    ("counters-timeline-rows-string", "counters_timeline.json", '{"interval": 10, "rows": "x"}'),
    ("counters-timeline-row-types", "counters_timeline.json", '{"interval": 10, "rows": [{"interval": "a"}]}'),
]

HOST_JSON: list[tuple[str, str, str]] = [
    ("scope-object", "scope.json", '{"pid": 100}'),
    (
        "scope-pid-traversal",
        "scope.json",
        '[{"pid": "../../../../etc", "role": "workload", "engine": "spark", "kind": "executor", "user": "u", '
        '"cmdline": "c", "first_seen": 0, "last_seen": 1}]',
    ),
    ("scope-row-string", "scope.json", '["x"]'),
    ("events-list", "events.json", "[]"),
    ("events-count-string", "events.json", '{"count": "many", "source": "x"}'),
    ("overhead-timeline-number", "overhead.json", '{"timeline": 5}'),
    ("overhead-list", "overhead.json", "[]"),
]

RUN_JSON: list[tuple[str, dict[str, object]]] = [
    ("format-version-string", {"format_version": "1"}),
    ("hosts-string", {"hosts": "h1"}),
    ("hosts-of-numbers", {"hosts": [1]}),
    ("host-traversal", {"hosts": [{"host": "../../x", "address": "local", "state": "ok"}]}),
    ("host-absolute", {"hosts": [{"host": "/etc", "address": "local", "state": "ok"}]}),
    ("host-slash", {"hosts": [{"host": "a/b", "address": "local", "state": "ok"}]}),
    ("host-newline", {"hosts": [{"host": "h1\n", "address": "local", "state": "ok"}]}),
    ("host-nul", {"hosts": [{"host": "h\u0000", "address": "local", "state": "ok"}]}),
    ("labels-string", {"labels": "abc"}),
    ("labels-list", {"labels": [1, 2]}),
    ("run-id-traversal", {"run_id": "../../" + ESCAPE_NAME}),
    ("run-id-number", {"run_id": 5}),
    ("duration-string", {"duration": "ten"}),
]

CLUSTER: list[tuple[str, bytes | str]] = [
    ("empty", ""),
    ("nul-in-host", b"work\x00er1 worker\n"),
    ("name-traversal", "127.0.0.1:1 name=../../x\n"),
    ("name-absolute", "127.0.0.1:1 name=/etc/passwd\n"),
    ("name-slash", "127.0.0.1:1 name=a/b\n"),
    ("name-nul", b"127.0.0.1:1 name=a\x00b\n"),
    ("host-with-slash", "a/b:22\n"),
    ("port-out-of-range", "127.0.0.1:99999\n"),
    ("bad-user", "r;m -rf@127.0.0.1:1\n"),
    ("unknown-key", "127.0.0.1:1 proxy=x\n"),
    ("python-injection", "127.0.0.1:1 python=/usr/bin/python3;reboot\n"),
    ("invalid-utf8", b"\xff\xfe127.0.0.1:1\n"),
    ("1mb-line", "h" * (1024 * 1024) + "\n"),
    ("cr-separated-duplicate", "127.0.0.1:1\r127.0.0.1:1\n"),
]

PROFILES: list[tuple[str, bytes | str]] = [
    ("empty", ""),
    ("invalid-utf8", b"Task: \xff\xfe\n"),
    ("bad-regex", "Task: re:(unclosed\n"),
    ("reserved-name", "unmatched: x\n"),
]

KNOWN_SPES: list[tuple[str, bytes | str]] = [
    ("empty", ""),
    ("invalid-utf8", b"spark workload executor \xff\xfe\n"),
    ("too-few-fields", "spark workload\n"),
    ("nul", b"spark workload exec\x00utor X\n"),
]

COMPARE_SUMMARIES: list[tuple[str, bytes | str, int]] = [
    ("garbage", "no,csv,here\n1,2,3\n", BAD_CAPTURE),
    ("nul", b"run,host,pid,task,samples,cycles\nr,*,*,K\x00afka,5,10\nr,*,*,*,5,10\n", OK),
    ("invalid-utf8", b"run,host,pid,task,samples,cycles\nr,*,*,\xff,5,10\n", BAD_CAPTURE),
    ("samples-not-a-number", "run,host,pid,task,samples,cycles\nr,*,*,Kafka,many,10\nr,*,*,*,5,10\n", BAD_CAPTURE),
    ("empty", "", BAD_CAPTURE),
    ("header-only", "run,host,pid,task,samples,cycles\n", BAD_CAPTURE),
]


def corpus() -> Iterator[Case]:
    for name, content, code in FOLDED:
        yield Case(f"folded/{name}/match", "profiler", match_file(content), (code,), "in.folded")
        if name in ("nul-in-frame", "invalid-utf8", "no-count", "negative-count", "huge-count", "superscript-count"):
            yield Case(
                f"folded/{name}/analyze",
                "coordinator",
                analyze(run_with("hosts/h1/pids/100/stacks.folded", content)),
                (code,),
                "stacks.folded",
            )
    for name, content, code in TIMELINE:
        make = run_with("hosts/h1/pids/100/timeline.folded", content, timeline=True)
        yield Case(
            f"timeline/{name}/analyze",
            "coordinator",
            analyze(make, "--from", "0", "--to", "10"),
            (code,),
            "timeline.folded",
        )
        yield Case(f"timeline/{name}/report", "coordinator", report(make), (OK, code), "timeline.folded")
    for file_name in (
        "meta.json",
        "scope.json",
        "counters.json",
        "sampler.json",
        "events.json",
        "overhead.json",
        "counters_timeline.json",
        "run.json",
    ):
        relative = {
            "run.json": "run.json",
            "meta.json": "hosts/h1/meta.json",
            "scope.json": "hosts/h1/scope.json",
            "events.json": "hosts/h1/events.json",
            "overhead.json": "hosts/h1/overhead.json",
        }.get(file_name, f"hosts/h1/pids/100/{file_name}")
        for name, content in JSON_GARBAGE:
            timeline = file_name == "counters_timeline.json"  # read only for a sub-window
            make = run_with(relative, content, timeline)
            window = ("--from", "0", "--to", "10") if timeline else ()
            codes = (OK,) if (file_name, name) == ("scope.json", "list") else (BAD_CAPTURE,)  # [] is no process
            yield Case(f"{file_name}/{name}/analyze", "coordinator", analyze(make, *window), codes, file_name)
            yield Case(f"{file_name}/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), file_name)
            # a whole-window export never reads the time series; the rest must name the damaged file
            yield Case(
                f"{file_name}/{name}/export", "coordinator", export(make), (OK,) if timeline else codes, file_name
            )
            # a capture without processes has nothing to draft from: a one-line error, not an empty draft
            draft_codes = (OK,) if timeline else (BAD_INPUT,) if codes == (OK,) else codes
            yield Case(f"{file_name}/{name}/draft-profile", "coordinator", draft(make), draft_codes, "")
    for name, changes in META_FIELDS:
        make = meta_with(changes)
        yield Case(f"meta.json/{name}/analyze", "coordinator", analyze(make), (BAD_CAPTURE,), "meta.json")
        yield Case(f"meta.json/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), "meta.json")
    for name, file_name, content in PER_PID_JSON + HOST_JSON:
        relative = (
            f"hosts/h1/{file_name}"
            if file_name in ("scope.json", "events.json", "overhead.json")
            else (f"hosts/h1/pids/100/{file_name}")
        )
        make = run_with(relative, content, timeline=file_name == "counters_timeline.json")
        window = ("--from", "0", "--to", "10") if file_name == "counters_timeline.json" else ()
        yield Case(f"{file_name}/{name}/analyze", "coordinator", analyze(make, *window), (BAD_CAPTURE,), file_name)
        yield Case(f"{file_name}/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), file_name)
    for name, changes in RUN_JSON:
        make = run_json_with(**changes)
        codes = (OK,) if name == "run-id-traversal" else (BAD_CAPTURE,)  # the id is a value, never a path
        yield Case(f"run.json/{name}/analyze", "coordinator", analyze(make), codes, "run.json")
        yield Case(f"run.json/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), "")
    for name, relative, target in (
        ("stacks-to-shadow", "hosts/h1/pids/100/stacks.folded", SHADOW),
        ("stacks-outside-run", "hosts/h1/pids/100/stacks.folded", "outside/stacks.folded"),
        ("meta-to-shadow", "hosts/h1/meta.json", SHADOW),
        ("counters-to-shadow", "hosts/h1/pids/100/counters.json", SHADOW),
        ("profile-copy-to-shadow", "application_profile.txt", SHADOW),
        ("host-profile-copy-to-shadow", "hosts/h1/application_profile.txt", SHADOW),
    ):
        make = run_with_link(relative, target)
        # a host's profile copy is read only when the run has none
        codes = (OK, BAD_CAPTURE) if name.startswith("host-profile") else (BAD_CAPTURE,)
        yield Case(f"symlink/{name}/analyze", "coordinator", analyze(make), codes, Path(relative).name)
        yield Case(f"symlink/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), "")
        if relative.endswith("stacks.folded"):
            yield Case(f"symlink/{name}/match", "profiler", match_run(make), (BAD_CAPTURE,), "stacks.folded")
    for name, text in CLUSTER:
        yield Case(f"cluster.txt/{name}/profile", "coordinator", profile_cmd(text), (BAD_INPUT,), "cluster.txt")
        yield Case(f"cluster.txt/{name}/doctor", "coordinator", doctor_cmd(text), (BAD_INPUT,), "cluster.txt")
    yield Case("cluster.txt/directory/profile", "coordinator", cluster_is_directory, (BAD_INPUT,), "cluster.txt")
    for name, text in PROFILES:
        yield Case(f"profile/{name}/profile", "coordinator", profile_cmd(profile=text), (BAD_INPUT,), "profile.txt")
        yield Case(f"profile/{name}/analyze", "coordinator", analyze_with_profile(text), (BAD_INPUT,), "profile.txt")
        yield Case(f"profile/{name}/match", "profiler", match_with_profile(text), (BAD_INPUT,), "profile.txt")
    # A NUL inside a pattern is a legal (never matching) pattern (test_appprofile); it must not break anything.
    yield Case("profile/nul/analyze", "coordinator", analyze_with_profile(b"Task: a\x00b\n"), (OK,), "")
    yield Case("profile/nul/match", "profiler", match_with_profile(b"Task: a\x00b\n"), (OK,), "")
    yield Case("profile/directory/profile", "coordinator", profile_is_directory, (BAD_INPUT,), "profile")
    for name, text in KNOWN_SPES:
        yield Case(f"known_spes/{name}/profile", "coordinator", profile_cmd(known=text), (BAD_INPUT,), "known_spes.txt")
    for name, text, code in COMPARE_SUMMARIES:
        yield Case(f"summary.csv/{name}/compare", "coordinator", compare_summary(text), (code,), "b.csv")
        yield Case(f"summary.csv/{name}/summary", "coordinator", summary_of(text), (code,), "summary.csv")
    for name, value in (
        ("newline", "load=5\nk"),
        ("nul", "load=a\x00b"),
        ("traversal-key", "../../x=1"),
        ("slash-key", "a/b=1"),
        ("no-equals", "load"),
        ("too-long", "load=" + "x" * 201),
    ):
        yield Case(
            f"label/{name}/profile",
            "coordinator",
            profile_cmd(UNREACHABLE_CLUSTER, None, None, "--label", value),
            (BAD_INPUT,),
            "",
        )
        yield Case(f"label/{name}/analyze", "coordinator", analyze(tiny_run, "--label", value), (BAD_INPUT,), "")
    yield Case(
        "label/traversal-value/analyze",
        "coordinator",
        analyze(tiny_run, "--label", "k=../../" + ESCAPE_NAME),
        (OK,),
        "",
    )
    yield Case(
        "label/absolute-value/analyze", "coordinator", analyze(tiny_run, "--label", "k=/tmp/" + ESCAPE_NAME), (OK,), ""
    )
    yield Case(
        "capture/bare-meta-host-traversal/report", "coordinator", bare_capture_meta_host, (BAD_CAPTURE,), "meta.json"
    )
    for name, content in JOURNALS:
        yield Case(f"journal/{name}/recover", "profiler", recover_journal(content), (BAD_CAPTURE,), "journal.tpj")
    yield Case("journal/a-directory/recover", "profiler", recover_journal(None), (BAD_CAPTURE,), "journal.tpj")
    yield Case("journal/link-to-shadow/recover", "profiler", recover_journal(SHADOW), (BAD_CAPTURE,), "journal.tpj")
    yield Case(
        "journal/none/recover", "profiler", lambda sandbox: ["recover", str(sandbox)], (BAD_CAPTURE,), "journal.tpj"
    )
    yield Case("journal/dir-is-a-capture/recover", "profiler", lambda sandbox: ["recover", str(bare_capture(sandbox))],
               (OUTPUT_EXISTS,), "meta.json")  # fmt: skip


def _journals() -> list[tuple[str, bytes]]:
    import zlib

    from profiler.capture.journal import Checkpoint, encode_checkpoint, encode_header, encode_record
    from profiler.capture.stackstore import StoreDelta

    good = encode_checkpoint(Checkpoint(1.0, StoreDelta(), {}))
    return [
        ("empty", b""),
        ("garbage", b"\x00\xff" * 300),
        ("header-only", encode_header({"host": "h1"})),
        ("header-not-json", encode_record(1, b"{not json")),
        ("header-a-list", encode_record(1, b"[1, 2]")),
        ("version-99", encode_record(1, b'{"journal_version": 99}')),
        ("host-traversal", encode_header({"host": "../../" + ESCAPE_NAME}) + good),
        ("checkpoint-first", good),
        ("torn-first-checkpoint", encode_header({}) + good[:-3]),
        ("checkpoint-not-zlib", encode_header({}) + encode_record(2, b"not zlib")),
        ("checkpoint-state-a-list", encode_header({}) + encode_record(2, zlib.compress(b"\x02\x00\x00\x00[]"))),
    ]


JOURNALS = _journals()


def recover_journal(content: bytes | str | None) -> Callable[[Path], list[str]]:
    """`profiler recover out` with out/checkpoint/journal.tpj holding ``content`` (None: a directory;
    a str: a symbolic link to that path)."""

    def build(sandbox: Path) -> list[str]:
        journal = sandbox / "out" / "checkpoint" / "journal.tpj"
        journal.parent.mkdir(parents=True)
        if content is None:
            journal.mkdir()
        elif isinstance(content, str):
            journal.symlink_to(content)
        else:
            journal.write_bytes(content)
        return ["recover", str(sandbox / "out")]

    return build


def meta_with(changes: dict[str, object]) -> Callable[[Path], Path]:
    def build(sandbox: Path) -> Path:
        timeline = changes.get("stack_collection") == "ringbuf"
        run = tiny_run(sandbox, timeline)
        meta = run / "hosts/h1/meta.json"
        payload = json.loads(meta.read_text())
        payload.update(changes)
        meta.write_text(json.dumps(payload))
        return run

    return build


def cluster_is_directory(sandbox: Path) -> list[str]:
    (sandbox / "cluster.txt").mkdir()
    argv = profile_cmd()(sandbox / "unused")
    return [*argv[: argv.index("--cluster")], "--cluster", str(sandbox / "cluster.txt")]


def profile_is_directory(sandbox: Path) -> list[str]:
    (sandbox / "profile").mkdir()
    return [*profile_cmd()(sandbox), "--profile", str(sandbox / "profile")]


def analyze_with_profile(text: bytes | str) -> Callable[[Path], list[str]]:
    return lambda sandbox: ["analyze", str(tiny_run(sandbox)), "--profile", str(write(sandbox / "profile.txt", text))]


def match_with_profile(text: bytes | str) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        stacks = write(sandbox / "in.folded", "a;b 5\n")
        return ["match", "--profile", str(write(sandbox / "profile.txt", text)), str(stacks)]

    return build


def bare_capture_meta_host(sandbox: Path) -> list[str]:
    directory = bare_capture(sandbox)
    meta = directory / "meta.json"
    payload = json.loads(meta.read_text())
    payload["host"] = "../../" + ESCAPE_NAME
    meta.write_text(json.dumps(payload))
    write(sandbox / (ESCAPE_NAME + "_result.csv"), "host,pid\n")  # what the traversal would read
    return ["report", str(directory)]


# ---------------------------------------------------------------- round two (issue 32): generated classes

TARGET = "dest/target"  # where an output option points in the output-path cases
USER_NOTES = "the user's own notes\n"


@dataclass(frozen=True)
class OutputOption:
    """A command's output option: what it takes (a file or a directory) and how argv is built."""

    name: str
    cli: str
    kind: str  # "file" or "dir"
    has_force: bool
    argv: Callable[[Path, str], list[str]]  # (sandbox, target) -> argv


def _summaries(sandbox: Path) -> list[str]:
    csv_text = "run,host,pid,task,samples,cycles\nr,*,*,Kafka,5,10\nr,*,*,*,5,10\n"
    return [str(write(sandbox / "a.csv", csv_text)), str(write(sandbox / "b.csv", csv_text.replace("5", "7")))]


def _match_argv(option: str) -> Callable[[Path, str], list[str]]:
    def argv(sandbox: Path, target: str) -> list[str]:
        profile = write(sandbox / "profile.txt", KNOWN_PROFILE)
        return ["match", "--profile", str(profile), str(tiny_run(sandbox) / "hosts/h1"), option, target]

    return argv


def _profile_argv(sandbox: Path, target: str) -> list[str]:
    argv = profile_cmd()(sandbox)
    argv[argv.index("--out") + 1] = target
    return argv


OUTPUT_OPTIONS = [
    OutputOption("analyze--out", "coordinator", "dir", False, lambda s, t: ["analyze", str(tiny_run(s)), "--out", t]),
    OutputOption("compare--csv", "coordinator", "file", True, lambda s, t: ["compare", *_summaries(s), "--csv", t]),
    OutputOption("compare--out", "coordinator", "dir", True, lambda s, t: ["compare", *_summaries(s), "--out", t]),
    OutputOption("report--out", "coordinator", "dir", True, lambda s, t: ["report", str(tiny_run(s)), "--out", t]),
    OutputOption(
        "report--publish", "coordinator", "dir", False, lambda s, t: ["report", str(tiny_run(s)), "--publish", t]
    ),
    OutputOption(
        "export--out",
        "coordinator",
        "file",
        True,
        lambda s, t: ["export", str(tiny_run(s)), "--format", "pprof", "--out", t],
    ),
    OutputOption(
        "export--per-task",
        "coordinator",
        "dir",
        True,
        lambda s, t: ["export", str(tiny_run(s)), "--format", "folded", "--per-task", "--out", t],
    ),
    OutputOption(
        "draft-profile--out", "coordinator", "file", True, lambda s, t: ["draft-profile", str(tiny_run(s)), "--out", t]
    ),
    OutputOption(
        "campaign--out",
        "coordinator",
        "dir",
        True,
        lambda s, t: ["campaign", str(tiny_run(s)), "--by", "x", "--out", t],
    ),
    OutputOption("profile--out", "coordinator", "dir", True, _profile_argv),
    OutputOption("demo--out", "coordinator", "dir", True, lambda s, t: ["demo", "--duration", "1", "--out", t]),
    OutputOption("match--csv", "profiler", "file", True, _match_argv("--csv")),
    OutputOption("match--unmatched", "profiler", "file", True, _match_argv("--unmatched")),
    OutputOption("run--out", "profiler", "dir", True, lambda s, t: ["run", "--duration", "1", "--out", t]),
]


def _place_user_files(sandbox: Path, variant: str) -> str:
    """Put the user's files where ``variant`` says; returns the path given to the option."""
    target = sandbox / TARGET
    if variant == "a-directory":
        target.mkdir(parents=True)
    elif variant == "a-directory-of-user-files":
        write(target / "notes.txt", USER_NOTES)
    elif variant == "user-files-named-like-outputs":  # what a report or analysis would write there
        write(target / "index.html", "<p>mine</p>\n")
        write(target / "tasks" / "mine.folded", "a;b 5\n")
        write(target / "summary.csv", "my,own,table\n")
    elif variant == "a-user-file":
        write(target, USER_NOTES)
    elif variant == "a-link-to-a-user-file":
        write(sandbox / "dest" / "mine.txt", USER_NOTES)
        target.symlink_to(sandbox / "dest" / "mine.txt")
    elif variant == "a-link-to-a-user-directory":
        write(sandbox / "dest" / "mine" / "notes.txt", USER_NOTES)
        target.symlink_to(sandbox / "dest" / "mine")
    elif variant == "under-a-file":  # the parent of the output is a file
        write(sandbox / "dest", USER_NOTES)
        return str(target / "x")
    return str(target)


OUTPUT_VARIANTS = {
    # variant: exit code, for (file outputs, directory outputs); None: not a case of that kind
    "a-directory": (OUTPUT_EXISTS, None),
    "a-directory-of-user-files": (OUTPUT_EXISTS, OUTPUT_EXISTS),
    "user-files-named-like-outputs": (None, OUTPUT_EXISTS),
    "a-user-file": (OUTPUT_EXISTS, OUTPUT_EXISTS),
    "a-link-to-a-user-file": (OUTPUT_EXISTS, OUTPUT_EXISTS),
    "a-link-to-a-user-directory": (None, OUTPUT_EXISTS),
    "under-a-file": (BAD_INPUT, BAD_INPUT),
}


PUBLISH_BESIDE = {
    "a-directory-of-user-files": "dest/target/notes.txt",
    "a-link-to-a-user-directory": "dest/mine/notes.txt",
}


def output_cases() -> Iterator[Case]:
    for option in OUTPUT_OPTIONS:
        for variant, codes in OUTPUT_VARIANTS.items():
            code = codes[0] if option.kind == "file" else codes[1]
            if code is None:
                continue
            for force in (False, True) if option.has_force else (False,):

                def build(
                    sandbox: Path, option: OutputOption = option, variant: str = variant, force: bool = force
                ) -> list[str]:
                    argv = option.argv(sandbox, _place_user_files(sandbox, variant))
                    return argv + ["--force"] * force

                suffix = "/force" if force else ""
                kept = ("dest",)
                if option.name == "report--publish" and variant in PUBLISH_BESIDE:
                    # a web root with other files: the report goes beside them, none is touched
                    code, kept = OK, (PUBLISH_BESIDE[variant],)
                yield Case(f"output/{option.name}/{variant}{suffix}", option.cli, build, (code,), "dest", kept)


BOM = "\ufeff"


def _bom_json(relative: str, crlf: bool = False) -> Callable[[Path], Path]:
    """A tiny run whose JSON file ``relative`` starts with a BOM (and has CRLF line ends)."""

    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox)
        text = (run / relative).read_text(encoding="utf-8")
        write(run / relative, BOM + (text.replace("\n", "\r\n") if crlf else text))
        return run

    return build


BOM_JSON = ["run.json", "hosts/h1/meta.json", "hosts/h1/scope.json", "hosts/h1/pids/100/counters.json",
            "hosts/h1/pids/100/sampler.json"]  # fmt: skip


def bom_cases() -> Iterator[Case]:
    """A byte-order mark (and CRLF) on every text input: handled as without it (test_bom_never_changes_a_result
    checks the results are equal)."""
    for relative in BOM_JSON:
        for crlf in (False, True):
            name = f"bom/{Path(relative).name}{'-crlf' if crlf else ''}"
            make = _bom_json(relative, crlf)
            yield Case(f"{name}/analyze", "coordinator", analyze(make), (OK,))
            yield Case(f"{name}/report", "coordinator", report(make), (OK,))
            yield Case(f"{name}/export", "coordinator", export(make), (OK,))
            yield Case(f"{name}/draft-profile", "coordinator", draft(make), (OK,))
    for crlf in (False, True):
        text = BOM + (KNOWN_PROFILE.replace("\n", "\r\n") if crlf else KNOWN_PROFILE)
        suffix = "-crlf" if crlf else ""
        yield Case(f"bom/profile{suffix}/analyze", "coordinator", analyze_with_profile(text), (OK,))
        yield Case(f"bom/profile{suffix}/match", "profiler", match_with_profile(text), (OK,))
        good = "run,host,pid,task,samples,cycles\nr,*,*,Kafka,5,10\nr,*,*,*,5,10\n"
        csv_text = BOM + (good.replace("\n", "\r\n") if crlf else good)
        yield Case(f"bom/summary.csv{suffix}/compare", "coordinator", compare_summary(csv_text), (OK,))
        yield Case(f"bom/summary.csv{suffix}/summary", "coordinator", summary_of(csv_text), (OK,))


def _tasks(count: int, patterns: int = 1, width: int = 8) -> str:
    return "".join(
        f"T{t}: " + ", ".join(f"p{t}_{i}_".ljust(width, "x") for i in range(patterns)) + "\n" for t in range(count)
    )


MIB = 1024 * 1024
PROFILE_SIZES: list[tuple[str, str, int]] = [
    ("10mb-one-line", "Task: " + "x," * (5 * MIB) + "x\n", BAD_INPUT),
    ("10mb-one-pattern", "Task: " + "x" * (10 * MIB) + "\n", BAD_INPUT),
    ("2mb-of-comments", "# a comment\n" * (2 * MIB // 12) + "GC: GC Thread\n", BAD_INPUT),
    ("line-of-70k", "Task: " + ", ".join(f"p{i}" for i in range(10000)) + "\n", BAD_INPUT),
    ("pattern-of-4097", "Task: " + "y" * 4097 + "\n", BAD_INPUT),
    ("regex-of-4097", "Task: re:" + "y" * 4097 + "\n", BAD_INPUT),
    ("1001-tasks", _tasks(1001), BAD_INPUT),
    ("10001-patterns", _tasks(500, 21), BAD_INPUT),
    ("70k-of-patterns", _tasks(20, 4, 900), BAD_INPUT),
    ("pattern-of-4096", "Task: " + "y" * 4096 + "\n", OK),
    ("1000-tasks", _tasks(1000), OK),
    ("60k-of-patterns", _tasks(16, 4, 900), OK),
    ("deep-trie", "Task: " + ", ".join("x" * i + "y" for i in range(1, 200)) + "\n", OK),
]
TEXT_SIZES: list[tuple[str, str]] = [
    ("10mb-one-line", "h" * (10 * MIB) + "\n"),
    ("line-of-4097", "h" * 4097 + "\n"),
    ("2mb-of-lines", "# comment\n" * (2 * MIB // 10)),
]


def size_cases() -> Iterator[Case]:
    for name, text, code in PROFILE_SIZES:
        yield Case(f"size/profile/{name}/analyze", "coordinator", analyze_with_profile(text), (code,), "profile.txt")
        yield Case(f"size/profile/{name}/match", "profiler", match_with_profile(text), (code,), "profile.txt")
        if code != OK:  # (an accepted profile would start profiling unreachable hosts)
            yield Case(f"size/profile/{name}/profile", "coordinator", profile_cmd(profile=text), (code,), "profile.txt")
    for name, text in TEXT_SIZES:
        yield Case(f"size/cluster.txt/{name}/profile", "coordinator", profile_cmd(text), (BAD_INPUT,), "cluster.txt")
        yield Case(f"size/cluster.txt/{name}/doctor", "coordinator", doctor_cmd(text), (BAD_INPUT,), "cluster.txt")
        known = "spark workload executor " + text if name != "2mb-of-lines" else text
        yield Case(
            f"size/known_spes/{name}/profile", "coordinator", profile_cmd(known=known), (BAD_INPUT,), "known_spes.txt"
        )


RUN_JSON_ROUND_TWO: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("host-twice", lambda run: run.update(hosts=run["hosts"] * 2)),
    ("host-twice-other-state", lambda run: run.update(hosts=run["hosts"] + [dict(run["hosts"][0], state="failed")])),
    ("start-1e300", lambda run: run.update(start_time=1e300)),
    ("start-negative", lambda run: run.update(start_time=-1e18)),
    ("start-year-3001", lambda run: run.update(start_time=32535216000.0)),
    ("end-before-start", lambda run: run.update(end_time=run["start_time"] - 7200)),  # past any start delay
    ("host-start-1e300", lambda run: run["hosts"][0].update(start_time=1e300)),
    ("host-end-before-start", lambda run: run["hosts"][0].update(start_time=1_700_000_100.0, end_time=1.0)),
    ("host-state-unknown", lambda run: run["hosts"][0].update(state="exploded")),
    ("format-version-2", lambda run: run.update(format_version=2)),
    ("frequency-0", lambda run: run.update(frequency=0)),
    ("duration-1e300", lambda run: run.update(duration=1e300)),
]
META_ROUND_TWO: list[tuple[str, dict[str, object]]] = [
    ("start-1e300", {"start_time": 1e300, "end_time": 1e300}),
    ("start-negative", {"start_time": -5.0}),
    ("end-before-start", {"end_time": 1.0}),
    ("format-version-next", {"format_version": CAPTURE_FORMAT_VERSION + 1}),
    ("format-version-1000", {"format_version": 1000}),
    ("frequency-0", {"frequency": 0}),
    ("frequency-negative", {"frequency": -99}),
    ("duration-requested-negative", {"duration_requested": -1.0}),
]
VERSIONED_FILES: list[tuple[str, str, str]] = [
    ("flink-version-99", "flink.json", '{"format_version": 99, "vertices": []}'),
    ("flink-version-3", "flink.json", '{"format_version": 3, "vertices": []}'),
    ("flink-version-string", "flink.json", '{"format_version": "2", "vertices": []}'),
    ("flink-version-true", "flink.json", '{"format_version": true, "vertices": []}'),
    ("spark-version-99", "spark.json", '{"format_version": 99, "plans": []}'),
]


def run_json_edit(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Path]:
    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox)
        payload = json.loads((run / "run.json").read_text())
        edit(payload)
        (run / "run.json").write_text(json.dumps(payload))
        return run

    return build


def archive_commands(make: Callable[[Path], Path]) -> list[tuple[str, str, Callable[[Path], list[str]]]]:
    """Every command that reads a run archive, on the run ``make`` builds."""
    return [
        ("analyze", "coordinator", analyze(make)),
        ("export", "coordinator", export(make)),
        ("draft-profile", "coordinator", draft(make)),
        ("compare", "coordinator", lambda s: ["compare", _summaries(s)[0], str(make(s))]),
        ("campaign", "coordinator", lambda s: ["campaign", str(make(s)), "--by", "x", "--out", str(s / "out")]),
    ]


def archive_cases() -> Iterator[Case]:
    for name, edit in RUN_JSON_ROUND_TWO:
        make = run_json_edit(edit)
        for command, cli, build in archive_commands(make):
            yield Case(f"archive/run.json/{name}/{command}", cli, build, (BAD_CAPTURE,), "run.json")
        yield Case(f"archive/run.json/{name}/report", "coordinator", report(make), (BAD_CAPTURE,), "run.json")
        yield Case(
            f"archive/run.json/{name}/fetch", "coordinator", lambda s, make=make: ["fetch", str(make(s))],
            (BAD_CAPTURE,), "run.json",
        )  # fmt: skip
    for name, changes in META_ROUND_TWO:
        make = meta_with(changes)
        for command, cli, build in archive_commands(make):
            yield Case(f"archive/meta.json/{name}/{command}", cli, build, (BAD_CAPTURE,), "meta.json")
        yield Case(f"archive/meta.json/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), "meta.json")
        yield Case(f"archive/meta.json/{name}/match", "profiler", match_run(make), (BAD_CAPTURE,), "meta.json")
    for name, file_name, content in VERSIONED_FILES:
        make = run_with(f"hosts/h1/{file_name}", content)
        if file_name == "flink.json":  # read by every command; spark.json only by draft-profile and --by stage
            for command, cli, build in archive_commands(make):
                yield Case(f"archive/{file_name}/{name}/{command}", cli, build, (BAD_CAPTURE,), file_name)
        yield Case(f"archive/{file_name}/{name}/draft-profile", "coordinator", draft(make), (BAD_CAPTURE,), file_name)
        yield Case(f"archive/{file_name}/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), file_name)
    for name, header in (
        ("no-cycles", "host,pid,task,samples\n"),
        ("no-task", "host,pid,samples,cycles\n"),
        ("another-table", "name,value\na,1\n"),
        ("empty", ""),
    ):
        yield Case(
            f"archive/result-csv/{name}/report", "coordinator", bare_result_csv(header), (BAD_CAPTURE,), "_result.csv"
        )
        make = run_with("summary.csv", header.replace("host", "run,host"))
        yield Case(f"archive/summary.csv/{name}/report", "coordinator", report(make), (BAD_CAPTURE,), "summary.csv")
        yield Case(f"archive/summary.csv/{name}/summary", "coordinator", lambda s, make=make: ["summary", str(make(s))],
                   (BAD_CAPTURE,), "summary.csv")  # fmt: skip


def bare_result_csv(content: str) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        capture = bare_capture(sandbox)
        write(capture / "h1_result.csv", content)
        return ["report", str(capture)]

    return build


FOREIGN_REPORTS: list[tuple[str, str]] = [
    ("a-list", "[1, 2]"),
    ("hosts-strings", '{"run_id": "x", "hosts": ["h1", "h2"]}'),
    ("top-tasks-numbers", '{"run_id": "x", "top_tasks": [1, 2]}'),
    ("top-task-share-string", '{"run_id": "x", "top_tasks": [{"task": "a", "share": "most"}]}'),
    ("start-1e300", '{"run_id": "x", "start_time": 1e300}'),
    ("labels-list", '{"run_id": "x", "labels": ["a"]}'),
    ("run-id-number", '{"run_id": 5}'),
    ("health-string", '{"run_id": "x", "health_problems": "many"}'),
    ("not-json", "{not json"),
]


def publish_into(setup: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    def build(sandbox: Path) -> list[str]:
        site = sandbox / "site"
        site.mkdir()
        setup(site)
        return ["report", str(tiny_run(sandbox)), "--publish", str(site)]

    return build


def _foreign_report(content: str) -> Callable[[Path], None]:
    def setup(site: Path) -> None:
        write(site / "other" / ".spe-taskprof-report", "written by coordinator report\n")
        write(site / "other" / "report.json", content)

    return setup


def publish_cases() -> Iterator[Case]:
    for name, content in FOREIGN_REPORTS:
        # the foreign entry is left out of the runs index with a one-line warning naming it
        yield Case(f"publish/foreign-report.json/{name}", "coordinator", publish_into(_foreign_report(content)),
                   (OK,), warns="other/report.json")  # fmt: skip
    yield Case("publish/user-index.html", "coordinator",
               publish_into(lambda site: write(site / "index.html", "<p>my site</p>\n")), (OUTPUT_EXISTS,),
               "index.html", ("site/index.html",))  # fmt: skip
    yield Case("publish/user-dir-named-as-run", "coordinator",
               publish_into(lambda site: write(site / "r1" / "notes.txt", USER_NOTES)), (OUTPUT_EXISTS,), "r1",
               ("site/r1",))  # fmt: skip


def round_two() -> Iterator[Case]:
    yield from output_cases()
    yield from bom_cases()
    yield from size_cases()
    yield from archive_cases()
    yield from publish_cases()


# ---------------------------------------------------------------- round three: stack tables (issue 47)
# The tables are crafted here, below the project's writer (profiler/capture/stacktable.py): the bytes of
# docs/capture-format.md's stack table, built by hand, so that what the writer never produces can be sent.

REAL_FOLDED = Path(__file__).resolve().parents[1] / "data" / "spark_executor_real.folded"
REAL_INTERVALS = 3


@dataclass
class Table:
    """A stack table's parts as the file holds them; rows in the order given (not sorted, not merged)."""

    names: list[str]
    kinds: list[int]
    stacks: list[list[int]]
    rows: list[tuple[int, int, int, int]]  # interval, stack, context, samples
    contexts: list[str]
    timeline: bool = True
    header_changes: dict[str, Any] | None = None

    def encode(self) -> bytes:
        import struct

        header: dict[str, Any] = {
            "names": self.names, "kinds": self.kinds, "kind_names": ["thread", "native", "jit", "anon", "unknown",
            "gap", "kernel", "lost"], "modules": [0] * len(self.names), "module_names": [""],
            "contexts": self.contexts, "timeline": self.timeline, "stacks": len(self.stacks),
            "stack_frames": sum(map(len, self.stacks)), "rows": len(self.rows),
        }  # fmt: skip
        header.update(self.header_changes or {})
        text = json.dumps(header).encode("utf-8")
        parts = [struct.pack("<5sBI", b"TPSTK", 1, len(text)), text]
        # every stack stored whole (prefix 0): a valid prefix coding the writer does not choose
        parts.append(struct.pack(f"<{len(self.stacks)}I", *[0] * len(self.stacks)))
        parts.append(struct.pack(f"<{len(self.stacks)}I", *map(len, self.stacks)))
        frames = [frame for stack in self.stacks for frame in stack]
        parts.append(struct.pack(f"<{len(frames)}I", *frames))
        for column, code in ((0, "I"), (1, "I"), (2, "I"), (3, "Q")):
            parts.append(struct.pack(f"<{len(self.rows)}{code}", *(row[column] for row in self.rows)))
        return b"".join(parts)


def real_table() -> Table:
    """A real executor's stacks (tests/data), spread over three intervals, every fifth row with a context."""
    names: dict[str, int] = {}
    stacks: list[list[int]] = []
    rows = []
    for number, line in enumerate(REAL_FOLDED.read_text(encoding="utf-8").splitlines()):
        stack, count = line.rsplit(" ", 1)
        stacks.append([names.setdefault(frame, len(names)) for frame in stack.split(";")])
        rows.append((number % REAL_INTERVALS, number, 1 if number % 5 == 0 else 0, int(count)))
    kinds = [0 if any(stack[0] == index for stack in stacks) else 2 for index in range(len(names))]
    context = "Executor task launch worker for task 3.0 in stage 1.0 (TID 7)"
    return Table(list(names), kinds, stacks, sorted(rows), [context])


REAL_SAMPLES = sum(int(line.rsplit(" ", 1)[1]) for line in REAL_FOLDED.read_text(encoding="utf-8").splitlines())


def table_run(
    sandbox: Path, table: Table | None = None, raw: bytes | None = None, meta: dict[str, Any] | None = None
) -> Path:
    """A run whose one PID's stacks are ``table`` (or the gzip bytes ``raw``) in a format 5 capture of three
    10 s intervals; ``meta``: changes to its meta.json."""
    import gzip

    run = write_run_dir(sandbox / RUN, "r1", {"h1": [PidSpec(pid=100, stacks={"t;f": 1}, cycles=1e9)]},
                        stack_collection="ringbuf", duration=30.0)  # fmt: skip
    pid_dir = run / "hosts/h1/pids/100"
    (pid_dir / "stacks.folded").unlink()
    content = raw if raw is not None else gzip.compress((table or real_table()).encode(), mtime=0)
    (pid_dir / "stacks.tpc").write_bytes(content)
    payload = json.loads((run / "hosts/h1/meta.json").read_text())
    payload.update({"intervals": REAL_INTERVALS, **(meta or {})})
    (run / "hosts/h1/meta.json").write_text(json.dumps(payload))
    return run


def edited(edit: Callable[[Table], None], meta: dict[str, Any] | None = None) -> Callable[[Path], Path]:
    def build(sandbox: Path) -> Path:
        table = real_table()
        edit(table)
        return table_run(sandbox, table, meta=meta)

    return build


Rows = list[tuple[int, int, int, int]]


def _rows(change: Callable[[Rows], Rows]) -> Callable[[Table], None]:
    def edit(table: Table) -> None:
        table.rows = change(table.rows)

    return edit


def _name(index: int, text: str, field: str = "names") -> Callable[[Table], None]:
    def edit(table: Table) -> None:
        getattr(table, field)[index] = text

    return edit


def _header(**changes: Any) -> Callable[[Table], None]:
    def edit(table: Table) -> None:
        table.header_changes = changes

    return edit


def stacks_replaced_by(kind: str) -> Callable[[Path], Path]:
    """stacks.tpc as a directory, a FIFO, or a link (to a FIFO, to a regular file inside the capture)."""

    def build(sandbox: Path) -> Path:
        run = table_run(sandbox)
        table = run / "hosts/h1/pids/100/stacks.tpc"
        if kind == "directory":
            table.unlink()
            table.mkdir()
            (table / "inside").write_text("x\n")
        elif kind == "fifo":
            table.unlink()
            os.mkfifo(table)
        elif kind == "link-to-fifo":
            os.mkfifo(run / "hosts/h1/fifo")
            table.unlink()
            table.symlink_to(run / "hosts/h1/fifo")
        elif kind == "link-inside":
            table.rename(run / "hosts/h1/elsewhere.tpc")
            table.symlink_to(run / "hosts/h1/elsewhere.tpc")
        return run

    return build


def gzip_bomb(kind: str, total: int = 2 << 30) -> bytes:
    """A gzip stream inflating to ``total`` bytes (2 GiB), never the whole in memory here either.

    Deflating 2 GiB costs tens of seconds a bomb; the stream is built from one block instead: each 1 MiB
    block of zeros is deflated after a full flush, which resets the compressor, so every block's bytes are
    the same and are repeated (checked on the first two); the trailer's CRC and size are the whole
    content's (test_a_gzip_bomb_inflates_to_its_size inflates small ones)."""
    import struct
    import zlib

    if kind == "zeros":
        head = b""
    else:
        # a valid header announcing either a small table ("padded": 2 GiB of rows after it) or 2 GiB of rows
        rows = 1 if kind == "padded" else (total // 20)
        text = json.dumps({"names": ["t"], "kinds": [0], "kind_names": ["thread"], "modules": [0],
                           "module_names": [""], "contexts": [], "timeline": True, "stacks": 1,
                           "stack_frames": 1, "rows": rows}).encode()  # fmt: skip
        head = struct.pack("<5sBI", b"TPSTK", 1, len(text)) + text + struct.pack("<3I", 0, 1, 0)
    block = bytes(min(1 << 20, total))
    blocks, rest = divmod(total - len(head), len(block))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip header and trailer are ours
    gzip_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, mtime 0, unknown OS
    parts = [gzip_header, compressor.compress(head), compressor.flush(zlib.Z_FULL_FLUSH)]
    deflated = [compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH) for _ in range(min(2, blocks))]
    assert len(set(deflated)) <= 1, "a full flush did not reset the compressor"
    parts += deflated + deflated[:1] * (blocks - len(deflated))
    parts += [compressor.compress(block[:rest]), compressor.flush()]
    parts.append(struct.pack("<II", crc32_of_zeros(total - len(head), zlib.crc32(head)), total & 0xFFFFFFFF))
    return b"".join(parts)


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector, row = vector >> 1, row + 1
    return total


def crc32_of_zeros(count: int, crc: int = 0) -> int:
    """``zlib.crc32(bytes(count), crc)`` in O(log count) (2 GiB of zeros take zlib seconds): the CRC
    register's operator for one zero bit (as zlib's crc32_combine builds it), squared to bytes and powers."""
    register = crc ^ 0xFFFFFFFF
    operator = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        operator = [_gf2_times(operator, row) for row in operator]
    while count:
        if count & 1:
            register = _gf2_times(operator, register)
        count >>= 1
        operator = [_gf2_times(operator, row) for row in operator]
    return register ^ 0xFFFFFFFF


def test_a_gzip_bomb_inflates_to_its_size() -> None:
    import gzip
    import zlib

    # GIVEN bombs of 3 MiB + 5 bytes (two 1 MiB blocks deflated, a third repeated, then a part)
    total = (3 << 20) + 5
    for kind in ("zeros", "padded", "announced"):
        # WHEN gzip inflates one (it checks the stream, its CRC and its size)
        content = gzip.decompress(gzip_bomb(kind, total=total))
        # THEN it is the table's header (none for "zeros"), then zeros to the size
        assert len(content) == total
        assert content.startswith(b"TPSTK" if kind != "zeros" else b"\0")
        assert len(content.rstrip(b"\0")) < 1024
    for count, crc in ((0, 0), (1, 0), (12345, 0xDEADBEEF), (1 << 20, 0xFFFFFFFF)):
        assert crc32_of_zeros(count, crc) == zlib.crc32(bytes(count), crc)


def deep_table(depth: int) -> Table:
    """One thread with a stack of ``depth`` frames (each frame its own name), 7 samples, and a short stack."""
    leaf = "org.apache.kafka.clients.consumer.KafkaConsumer.poll"
    names = ["Executor task l"] + [f"f{i}" for i in range(depth - 1)] + [leaf]
    return Table(names, [0] + [2] * depth, [list(range(depth + 1)), [0, depth]], [(0, 0, 0, 7), (0, 1, 0, 3)], [])


TABLE_EDITS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("a-directory", stacks_replaced_by("directory"), "stacks.tpc"),
    ("a-fifo", stacks_replaced_by("fifo"), "stacks.tpc"),
    ("a-link-to-a-fifo", stacks_replaced_by("link-to-fifo"), "stacks.tpc"),
    ("a-link-inside-the-capture", stacks_replaced_by("link-inside"), "stacks.tpc"),
    ("row-twice", edited(_rows(lambda rows: sorted(rows + rows[5:6]))), "stacks.tpc"),
    ("rows-unsorted", edited(_rows(lambda rows: rows[::-1])), "stacks.tpc"),
    ("interval-past-meta", edited(_rows(lambda rows: rows[:-1] + [(REAL_INTERVALS,) + rows[-1][1:]])), "stacks.tpc"),
    ("interval-2^32-1", edited(_rows(lambda rows: rows[:-1] + [((1 << 32) - 1,) + rows[-1][1:]])), "stacks.tpc"),
    ("nul-in-frame", edited(_name(3, "java.lang.Thr\x00ead.run")), "stacks.tpc"),
    ("surrogate-in-frame", edited(_name(3, "java.lang.\ud800Thread.run")), "stacks.tpc"),
    ("nul-in-context", edited(_name(0, "Executor task launch worker\x00", "contexts")), "stacks.tpc"),
    ("surrogate-in-context", edited(_name(0, "Executor \udfff", "contexts")), "stacks.tpc"),
    ("meta-format-2", edited(lambda table: None, {"format_version": 2}), "meta.json"),
    ("meta-format-3", edited(lambda table: None, {"format_version": 3}), "meta.json"),
    ("meta-intervals-2^40", edited(lambda table: None, {"intervals": 1 << 40}), "meta.json"),
    ("rows-announced-past-the-bytes", edited(_header(rows=10**6)), "stacks.tpc"),
    ("rows-announced-past-the-bound", edited(_header(rows=1 << 31)), "stacks.tpc"),
    ("frames-announced-past-the-bound", edited(_header(stack_frames=1 << 31)), "stacks.tpc"),
]


def table_and_folded(sandbox: Path) -> Path:
    run = table_run(sandbox)
    write(run / "hosts/h1/pids/100/stacks.folded", "t;f 5\n")
    return run


def tasks_link(sandbox: Path) -> Path:
    """A run whose ``tasks`` folder (an older analysis's) is a link to a directory of the user's."""
    run = tiny_run(sandbox)
    write(sandbox / "mine" / "notes.txt", USER_NOTES)
    (run / "tasks").symlink_to(sandbox / "mine")
    return run


def hosts_link(sandbox: Path) -> Path:
    """A run whose ``hosts`` folder is a link to captures elsewhere."""
    run = tiny_run(sandbox)
    (run / "hosts").rename(sandbox / "elsewhere")
    (run / "hosts").symlink_to(sandbox / "elsewhere")
    return run


def analysis_window(window: object) -> Callable[[Path], Path]:
    """A run analysed before, whose analysis.json's window is ``window``."""

    def build(sandbox: Path) -> Path:
        run = tiny_run(sandbox)
        assert coordinator_cli.main(["analyze", str(run)]) == OK
        record = json.loads((run / "analysis.json").read_text())
        record["window"] = window
        (run / "analysis.json").write_text(json.dumps(record))
        return run

    return build


WINDOWS: list[tuple[str, object]] = [
    ("a-string", "0-10"),
    ("from-a-string", {"from": "zero", "to": 10, "hosts": []}),
    ("hosts-a-string", {"from": 0, "to": 10, "hosts": "h1"}),
    ("first-interval-a-string", {"from": 0, "to": 10, "hosts": [{"run": "r1", "host": "h1", "first_interval": "0",
                                                                  "last_interval": 1, "whole_window": False}]}),
    ("first-after-last", {"from": 0, "to": 10, "hosts": [{"run": "r1", "host": "h1", "first_interval": 5,
                                                           "last_interval": 1, "whole_window": False}]}),
    ("no-intervals", {"from": 0, "to": 10, "hosts": [{"run": "r1", "host": "h1", "whole_window": False}]}),
]  # fmt: skip


def round_three() -> Iterator[Case]:
    for name, make, file_name in TABLE_EDITS:
        for command, cli, build in archive_commands(make):
            yield Case(f"table/{name}/{command}", cli, build, (BAD_CAPTURE,), file_name)
        # the report draws what it can: the PID's stacks (or the host) are left out and the health panel says why
        yield Case(f"table/{name}/report", "coordinator", report(make), (OK, BAD_CAPTURE), file_name)
        # profiler match (profiler/commands/match.py): one line too; a directory given to it is a bad argument
        yield Case(f"table/{name}/match", "profiler", match_run(make), (BAD_INPUT, BAD_CAPTURE), file_name)
    for command, cli, build in archive_commands(table_and_folded):
        yield Case(f"table/beside-stacks.folded/{command}", cli, build, (BAD_CAPTURE,), "stacks.folded")
    yield Case("rundir/tasks-a-link/analyze", "coordinator", analyze(tasks_link), (BAD_CAPTURE,), "tasks",
               ("mine",))  # fmt: skip
    for command, cli, build in archive_commands(hosts_link):
        yield Case(f"rundir/hosts-a-link/{command}", cli, build, (BAD_CAPTURE,), "hosts")
    for name, window in WINDOWS:
        make = analysis_window(window)
        yield Case(f"analysis.json/window-{name}/report", "coordinator", report(make), (BAD_CAPTURE,), "analysis.json")
        yield Case(f"analysis.json/window-{name}/export", "coordinator", export(make), (BAD_CAPTURE,), "analysis.json")
        yield Case(f"analysis.json/window-{name}/compare", "coordinator",
                   lambda s, make=make: ["compare", _summaries(s)[0], str(make(s)), "--out", str(s / "out")],
                   (BAD_CAPTURE,), "analysis.json")  # fmt: skip


CASES = list(corpus()) + list(round_two()) + list(round_three())  # round_two: issue 32's classes; three: 47's
# Reports of inputs that are odd but harmless: nothing to flag.
REPORT_UNFLAGGED = {
    "scope.json/list/report",  # [] is a capture without processes
    "run.json/run-id-traversal/report",  # the id is shown, never used as a path
    "symlink/host-profile-copy-to-shadow/report",  # the run's own copy comes first; the link is not read
    "output/report--publish/a-directory-of-user-files",  # published beside the user's files
    "output/report--publish/a-link-to-a-user-directory",
} | {case.name for case in CASES if case.name.startswith("bom/")}  # a BOM changes nothing: nothing to flag


# ---------------------------------------------------------------- the check


def _files(root: Path) -> set[Path]:
    return {Path(dirpath) / name for dirpath, dirs, names in os.walk(root) for name in (*names, *dirs)}


def _snapshot(path: Path) -> object:
    """A user's file or directory, as content: what must not change."""
    if path.is_symlink():
        return ("link", os.readlink(path), _snapshot(path.resolve()) if path.exists() else None)
    if path.is_dir():
        return {child.name: _snapshot(child) for child in sorted(path.iterdir())}
    return path.read_bytes() if path.exists() else None


@pytest.fixture
def alarm() -> Iterator[None]:
    def hang(signum: int, frame: object) -> None:
        raise AssertionError(f"no answer within {GUARD_SECONDS} s: a hang")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(GUARD_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_input(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], alarm: None
) -> None:
    # GIVEN a sandbox with the hostile input, as the working directory
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    monkeypatch.chdir(sandbox)
    argv = case.build(sandbox)
    before = _files(tmp_path)
    kept = {name: _snapshot(sandbox / name) for name in case.kept}
    main = profiler_cli.main if case.cli == "profiler" else coordinator_cli.main
    # the output checks are the case, not the privileges: unprivileged, `profiler run` would refuse first
    # (that refusal: tests/integration/test_profiler_run_cli.py)
    monkeypatch.setattr(run_runner, "check_privileges", lambda: None)

    # WHEN the real CLI runs on it
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse rejects an argument
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err

    # THEN the exit code is the expected one, with one error line and no traceback
    assert "Traceback" not in err, err
    assert code in case.codes, f"exit {code}, expected {case.codes}: {err}"
    lines = [line for line in err.splitlines() if line.strip()]
    if code != OK:
        errors = [line for line in lines if ": error: " in line]
        assert len(errors) == 1, err
        if not errors[0].startswith("usage:"):  # argparse prints its usage lines first
            assert lines[-1] == errors[0], err
            if not any(line.startswith("usage:") for line in lines):
                assert len(lines) == 1, err
        assert case.stderr_names in errors[0], err
        assert SHADOW not in err or "root:" not in err, "the content of a linked file leaked into the message"
    if code == OK and case.warns:
        assert case.warns in err and len(lines) == 1, err
    elif code == OK and argv[0] == "report":  # the report draws what it can and flags the rest
        summary = json.loads((sandbox / RUN / "report" / "report.json").read_text())
        flagged = summary["health_problems"] or any(host["state"] != "ok" for host in summary["hosts"])
        assert flagged or case.name in REPORT_UNFLAGGED, summary
    # AND nothing was written outside the sandbox, nor at the places an escape would write
    written = _files(tmp_path) - before
    outputs = [sandbox / RUN, sandbox / "out", sandbox / "cap", sandbox / "site", sandbox / "dest"]
    # AND the user's own files are there as they were (--force never removes them)
    assert {name: _snapshot(sandbox / name) for name in case.kept} == kept
    assert all(any(out == path or out in path.parents for out in outputs) for path in written), sorted(written)
    assert not (tmp_path / ESCAPE_NAME).exists()
    assert not Path("/tmp", ESCAPE_NAME).exists()


# ---------------------------------------------------------------- a BOM never changes a result (issue 32)

SPOILERS: dict[str, Callable[[str], str]] = {
    "bom": lambda text: BOM + text,
    "bom-crlf": lambda text: BOM + text.replace("\n", "\r\n"),
}


def _spoil_in_run(relative: str) -> Callable[[Path, Callable[[str], str]], list[str]]:
    """analyze of a tiny run whose ``relative`` file is spoiled: its summary.csv is the result."""

    def build(sandbox: Path, spoil: Callable[[str], str]) -> list[str]:
        run = tiny_run(sandbox)
        (run / relative).write_bytes(spoil((run / relative).read_text(encoding="utf-8")).encode("utf-8"))
        return ["analyze", RUN, "--out", "out"]

    return build


def _profile_to(command: str) -> Callable[[Path, Callable[[str], str]], list[str]]:
    def build(sandbox: Path, spoil: Callable[[str], str]) -> list[str]:
        tiny_run(sandbox)
        write(sandbox / "profile.txt", spoil(KNOWN_PROFILE))
        if command == "match":
            return ["match", "--profile", "profile.txt", f"{RUN}/hosts/h1", "--csv", "out/summary.csv"]
        return ["analyze", RUN, "--profile", "profile.txt", "--out", "out"]

    return build


def _summary_to_compare(sandbox: Path, spoil: Callable[[str], str]) -> list[str]:
    write(sandbox / "a.csv", "run,host,pid,task,samples,cycles\nr,*,*,Kafka,5,10\nr,*,*,*,5,10\n")
    write(sandbox / "b.csv", spoil("run,host,pid,task,samples,cycles\nr,*,*,Kafka,7,20\nr,*,*,*,9,30\n"))
    return ["compare", "a.csv", "b.csv", "--csv", "out/summary.csv"]


BOM_RESULTS: dict[str, tuple[str, Callable[[Path, Callable[[str], str]], list[str]]]] = {
    "profile/analyze": ("coordinator", _profile_to("analyze")),
    "profile/match": ("profiler", _profile_to("match")),
    "summary.csv/compare": ("coordinator", _summary_to_compare),
    **{f"{Path(relative).name}/analyze": ("coordinator", _spoil_in_run(relative)) for relative in BOM_JSON},
    "stacks.folded/analyze": ("coordinator", _spoil_in_run("hosts/h1/pids/100/stacks.folded")),
}
BOM_PAIRS = [(name, spoiler) for name in BOM_RESULTS for spoiler in SPOILERS]


@pytest.mark.parametrize("name, spoiler", BOM_PAIRS, ids=[f"{n}/{s}" for n, s in BOM_PAIRS])
def test_bom_never_changes_a_result(name: str, spoiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the same input twice, once as written and once with a BOM (and CRLF line ends)
    cli, build = BOM_RESULTS[name]
    main = profiler_cli.main if cli == "profiler" else coordinator_cli.main
    results = []
    for spoil in (lambda text: text, SPOILERS[spoiler]):
        sandbox = tmp_path / str(len(results))
        sandbox.mkdir()
        monkeypatch.chdir(sandbox)
        # WHEN the command reads it
        assert main(build(sandbox, spoil)) == OK
        results.append((sandbox / "out" / "summary.csv").read_bytes())
    # THEN the result is the same, byte for byte
    assert results[0] == results[1]


@pytest.mark.parametrize("spoiler", SPOILERS)
def test_bom_never_changes_cluster_or_known_spes(spoiler: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.remote.cluster import load_cluster
    from profiler.defaults import DEFAULT_KNOWN_SPES, data_file
    from profiler.scope.spes import load_known_spes

    monkeypatch.chdir(tmp_path)
    known = data_file(DEFAULT_KNOWN_SPES).read_text(encoding="utf-8")
    cluster = "worker1 worker name=w1\nroot@10.0.0.2:2222 worker\n"
    for text, load in ((cluster, load_cluster), (known, load_known_spes)):
        write(tmp_path / "plain.txt", text)
        write(tmp_path / "spoiled.txt", SPOILERS[spoiler](text))
        plain, spoiled = load("plain.txt"), load("spoiled.txt")  # type: ignore[operator]
        assert repr(spoiled).replace("spoiled.txt", "plain.txt") == repr(plain)


# ---------------------------------------------------------------- round three: odd but valid, bombs, depth


@pytest.mark.parametrize("command", ["analyze", "report", "export"])
def test_a_real_table_crafted_by_hand_gives_its_numbers(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a real executor's stacks as a table built below the writer (whole stacks, no shared prefixes)
    monkeypatch.chdir(tmp_path)
    run = table_run(tmp_path)
    # WHEN a command reads it, THEN it counts every sample once
    if command == "analyze":
        assert coordinator_cli.main(["analyze", str(run)]) == OK
        rows = (run / "summary.csv").read_text().splitlines()
        header = rows[0].split(",")
        totals = [dict(zip(header, row.split(","))) for row in rows[1:]]
        assert {int(r["samples"]) for r in totals if r["host"] == "h1" and r["task"] == "*"} == {REAL_SAMPLES}
    elif command == "report":
        assert coordinator_cli.main(["report", str(run)]) == OK
        page = (run / "report" / "index.html").read_text()
        assert "left out" not in page and f"of {REAL_SAMPLES})" in page  # the JIT line counts every sample
    else:
        assert coordinator_cli.main(["export", str(run), "--format", "folded"]) == OK
        (exported,) = (run / "exports").glob("*.folded")
        assert sum(int(line.rsplit(" ", 1)[1]) for line in exported.read_text().splitlines()) == REAL_SAMPLES


def test_the_spark_engines_reader_refuses_what_the_commands_refuse(tmp_path: Path) -> None:
    """The PySpark engine's workers read each stacks file with decide.TaskDecider.read (engines._decide_function),
    as the in-process engine does: every table refused above is refused there with the same line."""
    from coordinator.analysis.decide import TaskDecider
    from profiler.capture.stacktable import read_table
    from profiler.errors import CaptureFormatError
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    decider = TaskDecider(Matcher(parse_profile(KNOWN_PROFILE, "profile")))
    for name, make, file_name in TABLE_EDITS:
        sandbox = tmp_path / name
        sandbox.mkdir()
        table = make(sandbox) / "hosts/h1/pids/100/stacks.tpc"
        if file_name == "meta.json":
            continue  # read_capture refuses it before any stacks file is read (the table cases above)
        messages = []
        for read in (decider.read, read_table):
            with pytest.raises(CaptureFormatError) as caught:
                read(table)
            messages.append(str(caught.value))
        assert messages[0] == messages[1] and messages[0].startswith(f"{table}: ") and "\n" not in messages[0]


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {kind: gzip_bomb(kind) for kind in ("zeros", "padded", "announced")}


@pytest.mark.parametrize("kind", ["zeros", "padded", "announced"])
def test_a_gzip_bomb_is_refused_within_a_second_and_100_mb(kind: str, bombs: dict[str, bytes], tmp_path: Path) -> None:
    import subprocess
    import sys

    # GIVEN a capture whose table inflates to 2 GiB (zeros; a small table then 2 GiB; a header announcing 2 GiB)
    run = table_run(tmp_path, raw=bombs[kind])
    table = run / "hosts/h1/pids/100/stacks.tpc"
    # WHEN a fresh process reads it (its peak RSS is the reader's own)
    probe = (
        "import sys, time\n"
        "from profiler.capture.stacktable import read_table\n"
        "from profiler.errors import CaptureFormatError\n"
        "def peak():\n    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "before = peak()\n"
        "start = time.perf_counter()\n"
        "try:\n    read_table(__import__('pathlib').Path(sys.argv[1]))\n"
        "except CaptureFormatError as exc:\n    print(exc)\n"
        "print(time.perf_counter() - start, before, peak())\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe, str(table)], capture_output=True, text=True, timeout=60,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True)  # fmt: skip
    message, figures = done.stdout.splitlines()
    seconds, rss_before_kib, rss_peak_kib = (float(x) for x in figures.split())
    # THEN it is refused with one line naming the file, within 1 s and 100 MB
    assert message.startswith(f"{table}: ") and "re-fetch" in message, message
    assert seconds < 1.0, seconds
    assert rss_peak_kib < 100 * 1024, (rss_before_kib, rss_peak_kib)
    assert rss_peak_kib - rss_before_kib < 20 * 1024, (rss_before_kib, rss_peak_kib)


DEEP_FRAMES = 10_000  # 20 times the depth where the report's JSON recursed (2 lists a frame); > recursion limit


@pytest.mark.parametrize("command", ["report", "export-speedscope", "export-pprof", "export-folded"])
def test_a_very_deep_stack_is_drawn_and_exported_without_recursion(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], alarm: None
) -> None:
    # GIVEN a capture with one stack of DEEP_FRAMES frames (7 samples, Kafka at its leaf) and a short one (3)
    monkeypatch.chdir(tmp_path)
    run = table_run(tmp_path, deep_table(DEEP_FRAMES))
    # WHEN the report or an export is written
    argv = ["report", str(run)] if command == "report" else ["export", str(run), "--format", command.split("-")[1]]
    assert coordinator_cli.main(argv) == OK, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err
    # THEN the numbers are the stacks' (the deep stack's leaf decides its task)
    if command == "report":
        page = (run / "report" / "index.html").read_text()
        assert "left out" not in page
        assert f"[{DEEP_FRAMES + 1 - 2048} frames not drawn]" in page
    elif command == "export-folded":
        (exported,) = (run / "exports").glob("*.folded")
        counts = sorted(int(line.rsplit(" ", 1)[1]) for line in exported.read_text().splitlines())
        assert counts == [3, 7]
        assert max(line.count(";") for line in exported.read_text().splitlines()) >= DEEP_FRAMES
    else:
        assert any((run / "exports").iterdir())


def test_the_report_of_a_deep_stack_keeps_its_colour(tmp_path: Path) -> None:
    from coordinator.report.flame import MAX_DRAWN_DEPTH, FrameTable, StackClassifications, build_flamegraph
    from profiler.matching.appprofile import parse_profile
    from profiler.matching.matcher import Matcher

    # GIVEN a stack deeper than the flame graph draws, its task decided by its leaf
    names = deep_table(MAX_DRAWN_DEPTH * 3).names
    matcher = Matcher(parse_profile(KNOWN_PROFILE, "profile"))
    classifications = StackClassifications(matcher, matcher.result_names)
    frames = FrameTable()
    # WHEN it is drawn
    stack = ";".join(names)
    graph = build_flamegraph({stack: 5}, classifications, frames, key="k", title="t", kind="cpu", root_name="all")
    # THEN it is drawn MAX_DRAWN_DEPTH + 1 frames deep and its leaf keeps the task's colour
    node, depth = graph.tree, 0
    while node[3]:
        node, depth = node[3][0], depth + 1
    assert depth == MAX_DRAWN_DEPTH + 1
    assert frames.names[node[0]].endswith("KafkaConsumer.poll") and node[2] == list(matcher.result_names).index("Kafka")


def test_a_nul_in_a_folded_frame_is_shown_never_written_raw_into_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a folded capture (format 1-3 readers keep NUL: test FOLDED nul-in-frame) whose unmatched frame holds a NUL
    monkeypatch.chdir(tmp_path)
    run = tiny_run(tmp_path)
    stacks = run / "hosts/h1/pids/100/stacks.folded"
    stacks.write_bytes(stacks.read_bytes() + b"Executor task l;x\x00y 4\n")
    # WHEN the report is written
    assert coordinator_cli.main(["report", str(run)]) == OK
    # THEN the page shows it escaped, with no raw control character
    page = (run / "report" / "index.html").read_bytes()
    assert b"\x00" not in page and b"x\\x00y" in page
