"""known_spes.txt: which processes belong to a stream processing engine, and in which role.

Pure parsing and classification; reading /proc is the scope analyzer's job (profiler/scope/analyzer.py).
The file format is documented in the header comment of known_spes.txt itself.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from ..errors import config_error
from ..files.textinput import BOM, check_line_lengths, read_text_input

ROLES = ("workload", "managing", "broker")
# The roles in scope unless --roles says otherwise: a Kafka broker serves many jobs and is only
# profiled when asked for (profiler run --roles workload,managing,broker).
DEFAULT_ROLES = ("workload", "managing")
CONDITION_KEYS = ("master", "class", "arg")
PARENT_PREFIX = "parent-of:"
SPARK_SUBMIT = "org.apache.spark.deploy.SparkSubmit"
SPARK_DEFAULT_MASTER = "local[*]"  # what SparkSubmit uses when nothing names a master
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class SpeKind:
    """One line of known_spes.txt."""

    engine: str
    role: str  # one of ROLES
    kind: str
    pattern: str  # glob over the entry points (without the parent-of: prefix)
    line: int
    conditions: tuple[tuple[str, str], ...] = ()
    parent_of: bool = False  # the line names the parent of a process matching pattern
    source: str = ""

    @property
    def sampled(self) -> bool:
        return self.role == "workload"


# ---------------------------------------------------------------- parsing


MAX_KNOWN_SPES_BYTES = 1024 * 1024
MAX_KNOWN_SPES_LINE = 4096


def parse_known_spes(text: str, source: str) -> tuple[SpeKind, ...]:
    """Parse known_spes.txt content; errors name ``source:line`` and the fix."""
    kinds: list[SpeKind] = []
    lines = text.removeprefix(BOM).splitlines()
    check_line_lengths(lines, source, MAX_KNOWN_SPES_LINE, "one process kind per line")
    for number, raw in enumerate(lines, start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) < 4:
            raise config_error(
                source,
                number,
                f"expected 'ENGINE ROLE KIND PATTERN [key=GLOB...]', got {len(fields)} field(s)",
                "write e.g. 'spark workload executor org.apache.spark.executor.CoarseGrainedExecutorBackend'",
            )
        engine, role, kind, pattern, *rest = fields
        if role not in ROLES:
            raise config_error(source, number, f"unknown role {role!r}", f"use one of {', '.join(ROLES)}")
        for label, value in (("engine", engine), ("kind", kind)):
            if not _NAME.match(value):
                raise config_error(
                    source,
                    number,
                    f"{label} {value!r} has characters other than letters, digits and ._+-",
                    f"rename the {label}",
                )
        parent_of = pattern.startswith(PARENT_PREFIX)
        if parent_of:
            pattern = pattern[len(PARENT_PREFIX) :]
        if not pattern or "=" in pattern:
            raise config_error(
                source,
                number,
                f"pattern {fields[3]!r} is empty or looks like a condition",
                "put the pattern (a main class, module or program) before the key=GLOB conditions",
            )
        conditions: list[tuple[str, str]] = []
        for item in rest:
            key, sep, glob = item.partition("=")
            if not sep or key not in CONDITION_KEYS or not glob:
                raise config_error(
                    source,
                    number,
                    f"bad condition {item!r}",
                    f"write key=GLOB with key one of {', '.join(CONDITION_KEYS)}",
                )
            conditions.append((key, glob))
        kinds.append(SpeKind(engine, role, kind, pattern, number, tuple(conditions), parent_of, source))
    if not kinds:
        raise config_error(source, None, "no process kinds defined", "add lines like 'spark workload executor CLASS'")
    return tuple(kinds)


def role_list(text: str) -> tuple[str, ...]:
    """argparse type of ``--roles``: a comma-separated list of ROLES, in the given order without
    repeats; the error names the word that is not a role."""
    roles = tuple(dict.fromkeys(word.strip() for word in text.split(",")))
    if not roles or "" in roles:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ROLE[,ROLE...] with ROLE one of {', '.join(ROLES)}")
    for role in roles:
        if role not in ROLES:
            raise argparse.ArgumentTypeError(f"{text!r}: unknown role {role!r}; use one of {', '.join(ROLES)}")
    return roles


def literal_glob(text: str) -> str:
    """A GLOB of a known_spes.txt condition that matches ``text`` (``*``, ``?`` and ``[`` bracketed);
    a blank, "|" or "#", which the line's syntax takes for itself, is matched by "?" instead."""
    out = []
    for char in text:
        if char in "*?[":
            out.append(f"[{char}]")
        elif char.isspace() or char in "|#":
            out.append("?")
        else:
            out.append(char)
    return "".join(out)


def _strip_comment(line: str) -> str:
    if line.lstrip().startswith("#"):
        return ""
    # " #" starts a trailing comment; "#" inside a pattern (rare) stays.
    cut = re.search(r"\s#", line)
    return line[: cut.start()] if cut else line


def load_known_spes(path: str | os.PathLike[str]) -> tuple[SpeKind, ...]:
    """Read and parse known_spes.txt (UTF-8, a BOM dropped, at most MAX_KNOWN_SPES_BYTES)."""
    fix = "pass an existing text file to --known-spes"
    text = read_text_input(path, "known_spes.txt", fix, max_bytes=MAX_KNOWN_SPES_BYTES)
    return parse_known_spes(text, str(path))


def default_known_spes_path() -> Path:
    """The top-level known_spes.txt of a source tree, else the copy shipped inside the package."""
    package_dir = Path(__file__).resolve().parent
    candidates = [
        package_dir.parent.parent / "known_spes.txt",
        package_dir / "known_spes.txt",
        Path(sys.prefix) / "share" / "spe-taskprof" / "known_spes.txt",
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[1]


# ---------------------------------------------------------------- entry points

# java launcher options that take the next argument as their value
_JAVA_VALUE_OPTIONS = frozenset(
    {
        "-cp",
        "-classpath",
        "--class-path",
        "-p",
        "--module-path",
        "--upgrade-module-path",
        "--add-modules",
        "--limit-modules",
        "--add-exports",
        "--add-opens",
        "--add-reads",
        "--patch-module",
        "--source",
        "--enable-native-access",
        "-splash",
    }
)
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")


@dataclass(frozen=True)
class EntryPoint:
    """What a command line runs: the names patterns are matched against, and the arguments after."""

    names: tuple[str, ...]
    args: tuple[str, ...]  # application arguments after the entry point
    jvm_options: tuple[str, ...] = ()
    main_class: str | None = None


def entry_point(cmdline: Sequence[str]) -> EntryPoint:
    if not cmdline:
        return EntryPoint((), ())
    program = cmdline[0]
    base = os.path.basename(program)
    names = [program, base]
    if base == "java" or base == "java.exe":
        return _java_entry(cmdline, names)
    if _PYTHON.match(base):
        return _python_entry(cmdline, names)
    return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[1:]))


def _java_entry(cmdline: Sequence[str], names: list[str]) -> EntryPoint:
    options: list[str] = []
    index = 1
    while index < len(cmdline):
        arg = cmdline[index]
        if arg == "-jar" and index + 1 < len(cmdline):
            jar = cmdline[index + 1]
            names += [jar, os.path.basename(jar)]
            return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[index + 2 :]), tuple(options))
        if arg in ("-m", "--module") and index + 1 < len(cmdline) or arg.startswith("--module="):
            value = arg.split("=", 1)[1] if arg.startswith("--module=") else cmdline[index + 1]
            rest = cmdline[index + 1 :] if arg.startswith("--module=") else cmdline[index + 2 :]
            module, _, main = value.partition("/")
            names.append(module)
            if main:
                names += [main, main.rsplit(".", 1)[-1]]
            return EntryPoint(tuple(dict.fromkeys(names)), tuple(rest), tuple(options), main or None)
        if arg in _JAVA_VALUE_OPTIONS:
            options += cmdline[index : index + 2]
            index += 2
            continue
        if arg.startswith("-") or arg.startswith("@"):
            options.append(arg)
            index += 1
            continue
        names += [arg, arg.rsplit(".", 1)[-1]] if not arg.endswith(".java") else [arg, os.path.basename(arg)]
        return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[index + 1 :]), tuple(options), arg)
    return EntryPoint(tuple(dict.fromkeys(names)), (), tuple(options))


def _python_entry(cmdline: Sequence[str], names: list[str]) -> EntryPoint:
    index = 1
    while index < len(cmdline):
        arg = cmdline[index]
        if arg == "--":
            index += 1
            break
        if arg.startswith("--"):  # --check-hash-based-pycs MODE is the only long option with a value
            index += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            # short options may be combined (-u -m mod == -um mod == -ummod)
            for position, flag in enumerate(arg[1:], start=1):
                if flag in "cmWX":
                    value = arg[position + 1 :]
                    consumed = 1
                    if not value:
                        value = cmdline[index + 1] if index + 1 < len(cmdline) else ""
                        consumed = 2
                    if flag == "m":
                        names.append(value)
                        return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[index + consumed :]))
                    if flag == "c":
                        return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[index + consumed :]))
                    index += consumed - 1
                    break
            index += 1
            continue
        break
    if index < len(cmdline):
        script = cmdline[index]
        names += [script, os.path.basename(script)]
        return EntryPoint(tuple(dict.fromkeys(names)), tuple(cmdline[index + 1 :]))
    return EntryPoint(tuple(dict.fromkeys(names)), ())


# ---------------------------------------------------------------- Spark facts from a command line


def _option_values(args: Sequence[str], long: str, short: str | None = None) -> list[str]:
    """Values of ``--opt V``, ``--opt=V`` (and ``-s V``) in order."""
    values: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == long or (short is not None and arg == short):
            if index + 1 < len(args):
                values.append(args[index + 1])
            index += 2
            continue
        if arg.startswith(long + "="):
            values.append(arg[len(long) + 1 :])
        index += 1
    return values


def spark_submit_conf(args: Sequence[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for item in _option_values(args, "--conf", "-c"):
        key, sep, value = item.partition("=")
        if sep:
            conf[key.strip()] = value
    return conf


def spark_master_from_args(args: Sequence[str]) -> str | None:
    """The master a spark-submit command line names, as SparkSubmitArguments resolves it: --master
    wins over --conf spark.master (last occurrence of each)."""
    masters = _option_values(args, "--master")
    if masters:
        return masters[-1]
    return spark_submit_conf(args).get("spark.master")


SPARK_ENVIRON = ("MASTER", "SPARK_CONF_DIR", "SPARK_HOME")  # all of a target's environment read here


def spark_properties_file(args: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The properties file SparkSubmit reads: --properties-file, else spark-defaults.conf in the conf dir."""
    files = _option_values(args, "--properties-file")
    if files:
        return files[-1]
    conf_dir = environ.get("SPARK_CONF_DIR")
    if not conf_dir and environ.get("SPARK_HOME"):
        conf_dir = os.path.join(environ["SPARK_HOME"], "conf")
    return os.path.join(conf_dir, "spark-defaults.conf") if conf_dir else None


def parse_spark_defaults_master(text: str) -> str | None:
    """spark.master from a Java-properties style spark-defaults.conf (``key value`` or ``key=value``)."""
    master = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"^spark\.master\s*(?:[=:]\s*|\s+)(\S+)", line)
        if match:
            master = match.group(1)
    return master


def default_spark_master(
    cmdline: Sequence[str], environ: Mapping[str, str], read_text: Callable[[str], str | None]
) -> str | None:
    """The master a SparkSubmit without --master/--conf spark.master falls back to (MASTER env, then the
    properties file); None when neither names one (SparkSubmit then uses local[*])."""
    entry = entry_point(cmdline)
    if environ.get("MASTER"):
        return environ["MASTER"]
    path = spark_properties_file(entry.args, environ)
    if path:
        text = read_text(path)
        if text:
            return parse_spark_defaults_master(text)
    return None


# ---------------------------------------------------------------- classification


def _glob_any(value: str, glob: str) -> bool:
    return any(fnmatchcase(value, alternative) for alternative in glob.split("|"))


def _matches(kind: SpeKind, entry: EntryPoint, default_master: str | None) -> bool:
    if not any(_glob_any(name, kind.pattern) for name in entry.names):
        return False
    for key, glob in kind.conditions:
        if key == "master":
            master = spark_master_from_args(entry.args) or default_master or SPARK_DEFAULT_MASTER
            if not _glob_any(master, glob):
                return False
        elif key == "class":
            classes = _option_values(entry.args, "--class")
            if not classes or not _glob_any(classes[-1], glob):
                return False
        elif key == "arg" and not any(_glob_any(arg, glob) for arg in entry.args):
            return False
    return True


def _best(candidates: list[SpeKind]) -> SpeKind | None:
    if not candidates:
        return None
    # most conditions first; among equals the earliest line (min keeps the first of equal keys)
    return min(candidates, key=lambda kind: (-len(kind.conditions), kind.line))


def classify(cmdline: Sequence[str], kinds: Sequence[SpeKind], default_master: str | None = None) -> SpeKind | None:
    """The known_spes.txt line a process with this command line belongs to, or None.

    ``default_master`` is the Spark master a SparkSubmit falls back to when its command line names
    none (MASTER env or spark-defaults.conf, see default_spark_master); None means Spark's local[*].
    """
    entry = entry_point(cmdline)
    return _best([k for k in kinds if not k.parent_of and _matches(k, entry, default_master)])


def classify_parent(
    cmdline: Sequence[str], kinds: Sequence[SpeKind], default_master: str | None = None
) -> SpeKind | None:
    """The parent-of: line that puts the PARENT of this process into the scope, or None."""
    entry = entry_point(cmdline)
    return _best([k for k in kinds if k.parent_of and _matches(k, entry, default_master)])


def required_fragments(kinds: Sequence[SpeKind]) -> tuple[str, ...] | None:
    """One text per pattern alternative that every command line matching it contains, or None when some
    alternative has no literal text (e.g. ``*``): then every command line is a candidate.

    Every entry point (argv[0], a main class, a jar, a module, a script, their file names) is a piece of
    one argument, so a command line holding none of these texts matches no line: the scope analyzer
    classifies only the command lines that hold one (a substring test instead of parsing every new
    process on the host)."""
    texts: list[str] = []
    for kind in kinds:
        for alternative in kind.pattern.split("|"):
            longest = max(_literal_runs(alternative), key=len, default="")
            if not longest:
                return None
            texts.append(longest)
    return tuple(dict.fromkeys(texts))


def engine_executable(name: str) -> bool:
    """Whether a process whose executable is called ``name`` (the /proc/PID/exe link's last part) can run
    an entry point that entry_point() reads past argv[0]: a JVM's main class or jar, a Python module or
    script."""
    base = name.removesuffix(" (deleted)")  # an executable replaced on disk (a JDK upgraded under a JVM)
    return base in ("java", "java.exe") or _PYTHON.match(base) is not None


def interpreted_entries_only(kinds: Sequence[SpeKind]) -> bool:
    """Whether every pattern names what only a JVM or Python runs (a dotted class, module, jar or script
    name, no path, no shell script): then only processes whose executable passes engine_executable() can
    match a line, and the scope reads no other command line. A pattern for a program's own name (no dot,
    a path, ``*.sh``) could match any executable: every command line is read, as before."""
    for kind in kinds:
        for alternative in kind.pattern.split("|"):
            if "." not in alternative or "/" in alternative or alternative.endswith(".sh"):
                return False
    return True


def _literal_runs(glob: str) -> list[str]:
    """The runs of a shell-style glob that match only themselves (fnmatch's rules: ``*`` and ``?`` are
    wildcards, ``[...]`` a set whose first character, after an optional ``!``, may be ``]``; a ``[``
    that no ``]`` closes is literal, but what follows it is left out here: shorter runs are safe)."""
    runs: list[str] = []
    current: list[str] = []
    index = 0
    while index < len(glob):
        char = glob[index]
        if char in "*?":
            runs.append("".join(current))
            current = []
        elif char == "[":
            runs.append("".join(current))
            current = []
            end = index + 1
            if end < len(glob) and glob[end] == "!":
                end += 1
            if end < len(glob) and glob[end] == "]":
                end += 1
            close = glob.find("]", end)
            if close < 0:
                break
            index = close
        else:
            current.append(char)
        index += 1
    else:
        runs.append("".join(current))
    return [run for run in runs if run]


def needs_spark_master(kinds: Sequence[SpeKind]) -> bool:
    return any(key == "master" for kind in kinds for key, _ in kind.conditions)


# ---------------------------------------------------------------- summaries

_CLASSPATH_OPTIONS = frozenset({"-cp", "-classpath", "--class-path", "--module-path", "-p"})


def summarize_cmdline(cmdline: Sequence[str], limit: int = 300) -> str:
    """A readable one-line command of at most ``limit`` characters. For a JVM the main class and its
    arguments are kept, of the JVM options only heap size and frame pointers (the rest are counted)."""
    if not cmdline:
        return ""
    entry = entry_point(cmdline)
    parts: list[str]
    if entry.main_class is not None or entry.jvm_options:
        kept = [o for o in entry.jvm_options if o.startswith(("-Xmx", "-Xms")) or "PreserveFramePointer" in o]
        elided = len(entry.jvm_options) - len(kept)
        parts = [os.path.basename(cmdline[0]), *kept]
        if elided:
            parts.append(f"[{elided} more JVM options]")
        head_index = len(cmdline) - len(entry.args) - 1
        if head_index >= 2 and cmdline[head_index - 1] in ("-jar", "-m", "--module"):
            parts.append(cmdline[head_index - 1])
        parts.append(cmdline[head_index] if head_index >= 1 else "")
        parts += entry.args
    else:
        parts = list(cmdline)
        for index, arg in enumerate(parts[:-1]):
            if index > 0 and arg in _CLASSPATH_OPTIONS:
                parts[index + 1] = f"<{len(parts[index + 1])} chars>"
    parts = [arg if len(arg) <= 120 else arg[:57] + "..." + arg[-60:] for arg in parts]
    text = " ".join(part for part in parts if part)
    if len(text) > limit:
        head_len = limit * 2 // 3
        text = text[:head_len] + " ... " + text[-(limit - head_len - 5) :]
    return text
