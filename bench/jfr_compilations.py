"""What a JVM's JIT compiled, minute by minute, read from outside the JVM: compilations per tier,
first compilations against tier-ups and re-compilations of a method, the code's origin (Spark's
generated classes, Janino, Hadoop, Kafka, Jackson, Scala, the demo's own sink, java.*), code made not entrant,
deoptimization reasons and the code-cache sweeper's flushes. Two inputs:

- a JFR recording (RECORDING.jfr, `jcmd PID JFR.start settings=bench/jfr_compilations.jfc ...`): also
  compile times and deoptimization reasons. Caution: on JDK 17 the first JFR.start in a running JVM
  deoptimizes every compiled method (JFR retransforms its event classes, and the JVM's first class
  redefinition marks all nmethods: "Marked all nmethods for deopt"), so the minutes after it are not
  the JVM's own;
- a unified JIT log (any other file name), switched on in a running JVM without that side effect:
  `jcmd PID VM.log output=FILE what=jit+compilation=debug decorators=timemillis`: compilations and
  code made not entrant (no reasons, no compile times).

usage: .venv/bin/python bench/jfr_compilations.py RECORDING [--codelist FILE] [--since EPOCH_S]
                                                  [--window START END]
  --codelist  `jcmd PID Compiler.codelist` taken when the JFR recording began: the nmethods compiled
              before it, so that a method compiled again inside the recording counts as a re-compilation
              (a unified log is started with the JVM's first second instead)
  --since     minutes are counted from this unix time (the JVM's start), else from the first event
  --window    also one line for the compilations between two unix times (a profiled window: run.json's
              start_time and end_time)

docs/demo.md ("What the JIT compiles after 300 s (JFR)") shows what it printed for the Kafka demo.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

EVENTS = (
    "jdk.Compilation",
    "jdk.Deoptimization",
    "jdk.SweepCodeCache",
    "jdk.CodeCacheFull",
    "jdk.ClassLoad",
    "jdk.ClassUnload",
    "jdk.CompilationFailure",
)
# The origin of a compiled method, by its class's name; first match wins (generated code before Spark's,
# Flink's shaded Netty before Flink's own).
FAMILIES = (
    ("GeneratedClass", ("org.apache.spark.sql.catalyst.expressions.GeneratedClass",)),
    ("Spark", ("org.apache.spark.",)),
    ("Kafka", ("org.apache.kafka.",)),
    ("Jackson", ("com.fasterxml.jackson.",)),
    ("Scala", ("scala.",)),
    ("ysb (demo)", ("ysb.",)),
    # Spark's code-generation compiler (it compiles each newly generated class) and Hadoop's file
    # system under the checkpoint and the state store
    ("Janino", ("org.codehaus.janino.", "org.codehaus.commons.compiler.")),
    ("Hadoop", ("org.apache.hadoop.",)),
    ("Netty", ("io.netty.", "org.apache.flink.shaded.netty4.")),
    ("Flink", ("org.apache.flink.",)),
    ("Pekko", ("org.apache.pekko.",)),
    ("JFR", ("jdk.jfr.",)),
    ("java/jdk", ("java.", "javax.", "jdk.", "sun.", "com.sun.")),
)
# C1 tiers 1-3 and C2's tier 4 (HotSpot's CompLevel); an OSR compilation is counted apart.
TIERS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Compilation:
    at: float  # unix time the compilation began
    compile_id: int
    method: str  # "java.lang.String.hashCode()I"
    level: int
    osr: bool
    duration_ms: float
    code_size: int
    succeeded: bool


@dataclass(frozen=True)
class Deoptimization:
    at: float
    compile_id: int  # the nmethod that was left (its root method may differ from ``method``)
    method: str  # where the trap is (an inlined callee, or the root)
    reason: str
    action: str


@dataclass(frozen=True)
class Invalidation:
    """An nmethod made not entrant (unified log): a deoptimization, a tier's code replaced by the next
    tier's, a dependency broken or the sweeper's cold-code flushing."""

    at: float
    compile_id: int
    method: str
    level: int


@dataclass(frozen=True)
class Sweep:
    at: float
    swept: int
    flushed: int
    zombified: int


@dataclass(frozen=True)
class Recording:
    compilations: tuple[Compilation, ...]
    deoptimizations: tuple[Deoptimization, ...]
    sweeps: tuple[Sweep, ...]
    classes_loaded: tuple[float, ...]  # times
    classes_unloaded: tuple[float, ...]
    code_cache_full: int
    failures: int
    invalidations: tuple[Invalidation, ...] = ()


@dataclass(frozen=True)
class Kind:
    """What one compilation is in the method's history: its first compilation, a tier-up (compiled
    before, but not at this tier: 3 -> 4 is the normal way), or a re-compilation (compiled at this tier
    before: its code was deoptimized, flushed or replaced)."""

    name: str  # "first", "tier-up", "again"
    after_deopt: bool  # "again" with a deoptimization of the method's earlier code in between


def parse_time(text: str) -> float:
    """Unix time of a JFR JSON timestamp ("2026-11-27T02:45:01.123456789Z" or with an offset); digits
    past microseconds are dropped (datetime holds six)."""
    text = text.replace("Z", "+00:00")
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    return datetime.fromisoformat(text).timestamp()


def parse_duration_ms(value: Any) -> float:
    """A JFR JSON duration ("PT0.001234S", or nanoseconds as a number) in milliseconds."""
    if isinstance(value, (int, float)):
        return float(value) / 1e6
    match = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?", str(value))
    if match is None:
        return 0.0
    hours, minutes, seconds = (float(part) if part else 0.0 for part in match.groups())
    return (hours * 3600 + minutes * 60 + seconds) * 1000.0


def method_name(method: Mapping[str, Any] | None) -> str:
    """``package.Class.name(descriptor)`` of a JFR method value."""
    if not method:
        return "?"
    owner = method.get("type") or {}
    class_name = str(owner.get("name", "?")).replace("/", ".")
    return f"{class_name}.{method.get('name', '?')}{method.get('descriptor', '')}"


def family(method: str) -> str:
    for name, prefixes in FAMILIES:
        if method.startswith(prefixes):
            return name
    return "other"


def parse_recording(events: Iterable[Mapping[str, Any]]) -> Recording:
    """The events of ``jfr print --json`` (recording.events) as records; other types are skipped."""
    compilations, deopts, sweeps, loaded, unloaded = [], [], [], [], []
    full = failures = 0
    for event in events:
        kind, values = event.get("type"), event.get("values") or {}
        if kind == "jdk.Compilation":
            compilations.append(Compilation(
                parse_time(values["startTime"]), int(values["compileId"]), method_name(values.get("method")),
                int(values.get("compileLevel", 0)), bool(values.get("isOsr")),
                parse_duration_ms(values.get("duration", 0)), int(values.get("codeSize", 0)),
                bool(values.get("succeded", values.get("succeeded", True))),
            ))
        elif kind == "jdk.Deoptimization":
            deopts.append(Deoptimization(
                parse_time(values["startTime"]), int(values.get("compileId", -1)), method_name(values.get("method")),
                str(values.get("reason", "?")), str(values.get("action", "?")),
            ))
        elif kind == "jdk.SweepCodeCache":
            sweeps.append(Sweep(parse_time(values["startTime"]), int(values.get("sweptCount", 0)),
                                int(values.get("flushedCount", 0)), int(values.get("zombifiedCount", 0))))
        elif kind == "jdk.ClassLoad":
            loaded.append(parse_time(values["startTime"]))
        elif kind == "jdk.ClassUnload":
            unloaded.append(parse_time(values["startTime"]))
        elif kind == "jdk.CodeCacheFull":
            full += 1
        elif kind == "jdk.CompilationFailure":
            failures += 1
    return Recording(tuple(sorted(compilations, key=lambda c: c.at)), tuple(sorted(deopts, key=lambda d: d.at)),
                     tuple(sweeps), tuple(loaded), tuple(unloaded), full, failures)


# One line of -Xlog:jit+compilation=debug with decorators=timemillis (unix ms) or uptime (s) first
# (JDK 17's CompileTask::print_ul):
# "[1795747275123ms]  162 %     4       java.util.HashMap::clear @ 33 (50 bytes)[   made not entrant]";
# native wrappers print "(native)" instead of the size and are left out.
_LOG_LINE = re.compile(
    r"^\[(?P<time>[\d.]+)(?P<unit>ms|s)\](?:\[[^\]]*\])*\s+(?P<id>\d+)\s(?P<flags>[ %sb!n]{5})\s(?P<level>[0-4])\s+"
    r"(?P<owner>\S+)::(?P<name>\S+)(?: @ \d+)? \((?P<size>\d+) bytes\)(?P<rest>.*)$"
)


def parse_unified_log(lines: Iterable[str]) -> Recording:
    """Compilations and code made not entrant of a unified JIT log (see the module's docstring). The
    log has no descriptors: a method is named with its bytecode size ("java.lang.String.indexOf/24B")
    so that overloads stay apart (those of one size are counted as one method)."""
    compilations, invalidations = [], []
    for line in lines:
        match = _LOG_LINE.match(line)
        if match is None:
            continue
        at = float(match["time"]) / (1000.0 if match["unit"] == "ms" else 1.0)
        method = f"{match['owner']}.{match['name']}/{match['size']}B"
        compile_id, level = int(match["id"]), int(match["level"])
        if "made not entrant" in match["rest"]:
            invalidations.append(Invalidation(at, compile_id, method, level))
        elif not match["rest"].strip():
            compilations.append(Compilation(at, compile_id, method, level, "%" in match["flags"], 0.0, 0, True))
    return Recording(tuple(sorted(compilations, key=lambda c: c.at)), (), (), (), (), 0, 0,
                     tuple(sorted(invalidations, key=lambda i: i.at)))


def parse_codelist(text: str) -> dict[int, tuple[str, int]]:
    """compile id -> (method, level) of `jcmd PID Compiler.codelist`'s lines
    ("<id> <level> <state> <Class.method(desc)> [<begin>, <code>, <end>]")."""
    nmethods = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            nmethods[int(fields[0])] = (fields[3], int(fields[1]))
    return nmethods


# Deoptimization actions that throw the nmethod away (maybe_recompile and none only count the trap).
INVALIDATING_ACTIONS = ("reinterpret", "make_not_entrant", "recompile")


def code_left(recording: Recording) -> list[tuple[float, int, str]]:
    """(time, compile id, method) of each nmethod given up: JFR's deoptimizations whose action drops
    the code (the method is the trap's, maybe an inlined callee; classify maps the compile id to its
    root), and the unified log's code made not entrant."""
    left = [(d.at, d.compile_id, d.method) for d in recording.deoptimizations if d.action in INVALIDATING_ACTIONS]
    left += [(i.at, i.compile_id, i.method) for i in recording.invalidations]
    return sorted(left)


def classify(compilations: Iterable[Compilation], left: Iterable[tuple[float, int, str]],
             before: Mapping[int, tuple[str, int]] = {}) -> list[tuple[Compilation, Kind]]:
    """Each compilation (in time order) with its Kind. ``left``: code_left. ``before``: nmethods
    compiled before the recording began (parse_codelist), so that their methods are not counted as
    first compilations. OSR compilations have a history of their own (a method's OSR code and its
    normal code coexist)."""
    levels: dict[tuple[str, bool], set[int]] = defaultdict(set)  # tiers a method was compiled at so far
    for method, level in before.values():
        levels[(method, False)].add(level)
    root_of = {compile_id: method for compile_id, (method, _) in before.items()}
    latest = {method: compile_id for compile_id, (method, _) in sorted(before.items())}
    deopted: set[str] = set()  # methods whose current code was given up since their last compilation
    pending = list(left)
    next_left = 0
    kinds = []
    for compilation in sorted(compilations, key=lambda c: c.at):
        while next_left < len(pending) and pending[next_left][0] <= compilation.at:
            _, compile_id, method = pending[next_left]
            root = root_of.get(compile_id, method)
            # a lower tier's code replaced by the next tier's is not the method's code given up
            if latest.get(root, compile_id) == compile_id:
                deopted.add(root)
            next_left += 1
        seen = levels[(compilation.method, compilation.osr)]
        if not seen:
            kind = Kind("first", False)
        elif compilation.level not in seen:
            kind = Kind("tier-up", False)
        else:
            kind = Kind("again", compilation.method in deopted)
        kinds.append((compilation, kind))
        if compilation.succeeded:
            seen.add(compilation.level)
            root_of[compilation.compile_id] = compilation.method
            if not compilation.osr:
                latest[compilation.method] = compilation.compile_id
            deopted.discard(compilation.method)
    return kinds


# The kind columns of both tables, in order; a re-compilation after a deoptimization has its own.
KIND_COLUMNS = ("first", "tier-up", "again", "again (deopt)")


def kind_column(kind: Kind) -> str:
    return "again (deopt)" if kind.after_deopt else kind.name


def minute_of(at: float, origin: float) -> int:
    return int((at - origin) // 60)


def minute_rows(recording: Recording, kinds: list[tuple[Compilation, Kind]], origin: float) -> list[dict[str, Any]]:
    """One row per minute since ``origin``: compilations by tier and OSR, by kind, compile ms, the
    top origins, deoptimizations, sweeper flushes and classes loaded."""
    rows: dict[int, dict[str, Any]] = defaultdict(lambda: {
        "compilations": 0, "osr": 0, "compile_ms": 0.0, "tiers": Counter(), "kinds": Counter(),
        "families": Counter(), "deopts": 0, "not_entrant": 0, "flushed": 0, "classes": 0,
    })
    for compilation, kind in kinds:
        row = rows[minute_of(compilation.at, origin)]
        row["compilations"] += 1
        row["osr"] += compilation.osr
        row["compile_ms"] += compilation.duration_ms
        row["tiers"][compilation.level] += 1
        row["kinds"][kind_column(kind)] += 1
        row["families"][family(compilation.method)] += 1
    for deopt in recording.deoptimizations:
        rows[minute_of(deopt.at, origin)]["deopts"] += 1
    for invalidation in recording.invalidations:
        rows[minute_of(invalidation.at, origin)]["not_entrant"] += 1
    for sweep in recording.sweeps:
        rows[minute_of(sweep.at, origin)]["flushed"] += sweep.flushed
    for at in recording.classes_loaded:
        rows[minute_of(at, origin)]["classes"] += 1
    return [{"minute": minute} | rows[minute] for minute in sorted(rows)]


def format_minutes(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| minute | compilations | tier 1 / 2 / 3 / 4 | OSR | first / tier-up / again / again after a deopt "
        "| compile ms | top origins | deopts (JFR) | made not entrant (log) | sweeper flushed | classes loaded |",
        "|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        tiers = " / ".join(str(row["tiers"][tier]) for tier in TIERS)
        kinds = " / ".join(str(row["kinds"][k]) for k in KIND_COLUMNS)
        origins = ", ".join(f"{name} {count}" for name, count in row["families"].most_common(4))
        lines.append(
            f"| {row['minute']} | {row['compilations']} | {tiers} | {row['osr']} | {kinds} "
            f"| {row['compile_ms']:.0f} | {origins} | {row['deopts']} | {row['not_entrant']} | {row['flushed']} "
            f"| {row['classes']} |"
        )
    return "\n".join(lines)


def format_summary(recording: Recording, kinds: list[tuple[Compilation, Kind]], top: int = 10) -> str:
    """Distinct methods against compilations, compilations per method, deoptimization reasons and
    actions, the methods compiled most often, the sweeper's totals."""
    per_method = Counter(c.method for c in recording.compilations)
    again = Counter(c.method for c, kind in kinds if kind.name == "again")
    reasons = Counter((d.reason, d.action) for d in recording.deoptimizations)
    deopt_families = Counter(family(d.method) for d in recording.deoptimizations)
    histogram = Counter(min(n, 5) for n in per_method.values())
    lines = [
        f"compilations {len(recording.compilations)}, distinct methods {len(per_method)}, "
        f"re-compilations {sum(again.values())} of {len(again)} methods, failures {recording.failures}",
        "methods by compilations in the recording (5 = 5 or more): "
        + ", ".join(f"{n}: {histogram[n]}" for n in sorted(histogram)),
        f"deoptimizations {len(recording.deoptimizations)}; reason/action, top {top}: "
        + "; ".join(f"{reason}/{action} {count}" for (reason, action), count in reasons.most_common(top)),
        "deoptimizations by origin of the trapping method: "
        + ", ".join(f"{name} {count}" for name, count in deopt_families.most_common()),
        f"made not entrant (log) {len(recording.invalidations)}; "
        f"sweeps {len(recording.sweeps)}, flushed {sum(s.flushed for s in recording.sweeps)}, "
        f"zombified {sum(s.zombified for s in recording.sweeps)}; code cache full {recording.code_cache_full}; "
        f"classes loaded {len(recording.classes_loaded)}, unloaded {len(recording.classes_unloaded)}",
        f"compiled most often, top {top}: "
        + "; ".join(f"{method} {count}" for method, count in per_method.most_common(top)),
        "compilations by origin: "
        + ", ".join(f"{name} {count}" for name, count in Counter(family(c.method) for c, _ in kinds).most_common()),
    ]
    return "\n".join(lines)


def format_window(kinds: list[tuple[Compilation, Kind]], start: float, end: float) -> str:
    """The compilations between two unix times (a profiled window: run.json's start_time and
    end_time) in one line: per minute, by tier, by kind and by origin; from a JFR recording also
    their compile time, by tier and by origin (a unified log has none)."""
    inside = [(c, kind) for c, kind in kinds if start <= c.at <= end]
    tiers = Counter(c.level for c, _ in inside)
    kind_counts = Counter(kind_column(kind) for _, kind in inside)
    families = Counter(family(c.method) for c, _ in inside)
    per_minute = len(inside) * 60.0 / max(end - start, 1e-9)
    line = (
        f"window {end - start:.0f} s: {len(inside)} compilations ({per_minute:.0f} a minute); "
        f"tier 1 / 2 / 3 / 4: {' / '.join(str(tiers[t]) for t in TIERS)}; "
        f"first / tier-up / again / again after a deopt: "
        f"{' / '.join(str(kind_counts[k]) for k in KIND_COLUMNS)}; "
        f"origins: {', '.join(f'{name} {count}' for name, count in families.most_common())}"
    )
    tier_ms: Counter[int] = Counter()
    family_ms: Counter[str] = Counter()
    for compilation, _ in inside:
        tier_ms[compilation.level] += compilation.duration_ms
        family_ms[family(compilation.method)] += compilation.duration_ms
    total_ms = sum(tier_ms.values())
    if not total_ms:
        return line
    return (
        f"{line}; compile ms {total_ms:.0f}, tier 1 / 2 / 3 / 4: "
        f"{' / '.join(f'{tier_ms[t]:.0f}' for t in TIERS)}; "
        f"by origin: {', '.join(f'{name} {ms:.0f}' for name, ms in family_ms.most_common())}"
    )


def read_recording(path: Path, jfr: str) -> Recording:
    """The recording's compilation events, through the JDK's ``jfr print --json``."""
    output = subprocess.run(
        [jfr, "print", "--json", "--events", ",".join(EVENTS), str(path)],
        check=True, capture_output=True, text=True,
    ).stdout
    return parse_recording(json.loads(output)["recording"]["events"])


def default_jfr() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "jfr" if java_home else None
    return str(candidate) if candidate and candidate.exists() else (shutil.which("jfr") or "jfr")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jfr_compilations", description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--codelist", type=Path, help="jcmd PID Compiler.codelist at the recording's start")
    parser.add_argument("--since", type=float, help="count minutes from this unix time (the JVM's start)")
    parser.add_argument("--window", type=float, nargs=2, metavar=("START", "END"),
                        help="also the compilations between two unix times (run.json's start_time, end_time)")
    parser.add_argument("--jfr", default=default_jfr(), help="the JDK's jfr tool (default: $JAVA_HOME/bin/jfr)")
    args = parser.parse_args(argv)
    jfr_file = args.recording.suffix == ".jfr"
    if jfr_file:
        recording = read_recording(args.recording, args.jfr)
    else:
        with args.recording.open(errors="replace") as log:
            recording = parse_unified_log(log)
    if args.codelist and not jfr_file:
        parser.error("--codelist goes with a JFR recording; start the unified log with the JVM instead")
    before = parse_codelist(args.codelist.read_text()) if args.codelist else {}
    kinds = classify(recording.compilations, code_left(recording), before)
    times = [c.at for c in recording.compilations] or [0.0]
    origin = args.since if args.since is not None else min(times)
    print(format_minutes(minute_rows(recording, kinds, origin)))
    print()
    print(format_summary(recording, kinds))
    if args.window:
        print(format_window(kinds, *args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
