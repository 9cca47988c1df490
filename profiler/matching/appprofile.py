"""Application profiles: the user's streaming tasks and the frame patterns that identify them.

Format (docs/matching.md): one task per line, ``Task: p1, p2`` or a bare line that is both task name
and pattern; ``#`` comment lines; literal case-sensitive substrings, ``re:`` for regular expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..capture.format import ALL_TASKS, UNMATCHED
from ..errors import config_error
from ..files.textinput import BOM, check_line_lengths, read_text_input

REGEX_PREFIX = "re:"
# The first colon followed by a space separates name and patterns, so C++ frames such as
# ``Thread::call_run`` (no space after the colons) stay bare patterns.
TASK_SEPARATOR = ": "
RESERVED_TASK_NAMES = (UNMATCHED, ALL_TASKS)
_ESCAPED_COMMA = "\\,"
# Bounds of a profile (real ones are a few KB, tens of tasks): the parse and the matcher's compiled
# form stay linear in these, and a file beyond them is one error line instead of minutes of work.
# The matcher compiles all literal patterns into one regex, and ``re`` compiles at a few microseconds
# per character: MAX_PATTERN_TOTAL keeps that under a second on a loaded host.
MAX_PROFILE_BYTES = 1024 * 1024
MAX_LINE_CHARS = 64 * 1024
MAX_PATTERN_CHARS = 4096
MAX_PATTERN_TOTAL = 64 * 1024
MAX_TASKS = 1000
MAX_PATTERNS = 10000
# A task name ending in this marks a *waiting* task (docs/matching.md, docs/offcpu.md): its patterns only
# say how a thread waits, so off-CPU matching passes them over. On-CPU matching ignores the mark.
WAITING_MARK = " [waiting]"
_UNESCAPED_COMMA = re.compile(r"(?<!\\),")


def nested_repeat(expression: str) -> bool:
    """True when a repeat (``*``, ``+``, ``{2,}`` …) holds another repeat, as in ``(a+)+`` or ``(.*x)*``:
    such an expression can backtrack exponentially on a frame it almost matches (ReDoS), and the matcher
    runs every user expression on every distinct frame of a capture. Possessive repeats and atomic groups
    (``a++``, ``(?>…)``) never backtrack and do not count. ``expression`` must compile."""
    from re import _constants as sre  # type: ignore[attr-defined]  # stdlib since 3.11
    from re import _parser as parser  # type: ignore[attr-defined]

    def depth(items: object, level: int) -> int:
        worst = level
        for op, av in items:  # type: ignore[attr-defined]
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
                worst = max(worst, depth(av[2], level + (1 if av[1] > 1 else 0)))
            elif op in (sre.POSSESSIVE_REPEAT, sre.ATOMIC_GROUP):
                continue
            elif op is sre.SUBPATTERN:
                worst = max(worst, depth(av[3], level))
            elif op is sre.BRANCH:
                worst = max([worst, *(depth(branch, level) for branch in av[1])])
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                worst = max(worst, depth(av[1], level))
            elif op is sre.GROUPREF_EXISTS:
                worst = max([worst, *(depth(branch, level) for branch in av[1:] if branch is not None)])
        return worst

    return depth(parser.parse(expression), 0) >= 2


@dataclass(frozen=True)
class Pattern:
    """One pattern of a task: a literal substring, or a regular expression when ``regex``."""

    text: str  # without the "re:" prefix
    regex: bool
    line: int

    @property
    def spelled(self) -> str:
        """The pattern as written in a profile."""
        return f"{REGEX_PREFIX}{self.text}" if self.regex else self.text


@dataclass(frozen=True)
class Task:
    name: str
    patterns: tuple[Pattern, ...]
    line: int
    waiting: bool = False  # marked ``[waiting]``: off-CPU matching passes its patterns over


@dataclass(frozen=True)
class ApplicationProfile:
    tasks: tuple[Task, ...]
    source: str  # file path, or "<string>"

    @property
    def task_names(self) -> tuple[str, ...]:
        """Task names in profile order, without ``unmatched``."""
        return tuple(task.name for task in self.tasks)

    @property
    def waiting_task_names(self) -> tuple[str, ...]:
        """The tasks marked ``[waiting]``, in profile order."""
        return tuple(task.name for task in self.tasks if task.waiting)

    @property
    def result_task_names(self) -> tuple[str, ...]:
        """Task names of a match result: profile order, then ``unmatched``."""
        return (*self.task_names, UNMATCHED)

    def format(self) -> str:
        """Profile text that parses back to the same tasks and patterns (comments are not kept)."""
        lines = []
        for task in self.tasks:
            spelled = [p.spelled.replace(",", _ESCAPED_COMMA) for p in task.patterns]
            mark = WAITING_MARK if task.waiting else ""
            lines.append(f"{task.name}{mark}{TASK_SEPARATOR}{', '.join(spelled)}")
        return "\n".join(lines) + "\n"


def literal_key(text: str) -> str:
    """Literal patterns treat '/' and '.' as the same character (Java class names are spelled
    ``a/b/C`` by some symbolizers and ``a.b.C`` by others); this is the normalized form."""
    return text.replace("/", ".")


def _split_patterns(spec: str) -> list[str]:
    return [part.replace(_ESCAPED_COMMA, ",").strip() for part in _UNESCAPED_COMMA.split(spec)]


def _parse_pattern(raw: str, source: str, number: int, task: str) -> Pattern:
    if not raw:
        raise config_error(
            source, number, f"empty pattern in task {task!r}",
            "remove the extra comma (write '\\,' for a literal comma)",
        )
    if len(raw) > MAX_PATTERN_CHARS:
        raise config_error(
            source, number, f"a pattern of {len(raw)} characters in task {task!r}, more than {MAX_PATTERN_CHARS}",
            "match a shorter part of the frame",
        )
    if ";" in raw:
        raise config_error(
            source, number, f"pattern {raw!r} contains ';', which separates frames and never occurs inside one",
            "match a single frame per pattern",
        )
    if raw.startswith(REGEX_PREFIX):
        expression = raw[len(REGEX_PREFIX):]
        if not expression:
            raise config_error(source, number, f"empty regular expression in task {task!r}", "write re:EXPRESSION")
        try:
            compiled = re.compile(expression)
        except re.error as exc:
            raise config_error(
                source, number, f"invalid regular expression {expression!r} ({exc})", "fix the expression after 're:'"
            ) from None
        if nested_repeat(expression):
            raise config_error(
                source, number, f"regular expression {expression!r} repeats a repeat (as in (a+)+), which can take "
                "exponential time on a frame it almost matches",
                "repeat once (a+), or make the inner repeat possessive (a++) or atomic ((?>...))",
            )
        if compiled.search("") is not None:
            raise config_error(
                source, number, f"regular expression {expression!r} matches the empty string, so every frame",
                "make it require at least one character",
            )
        return Pattern(expression, True, number)
    return Pattern(raw, False, number)


def parse_profile(text: str, source: str = "<string>") -> ApplicationProfile:
    """Parse an application profile; raises ConfigError ``source:line: problem; fix`` on any mistake."""
    tasks: list[Task] = []
    task_lines: dict[str, int] = {}
    # normalized pattern -> (task, line): one pattern belongs to one task only
    pattern_owner: dict[tuple[bool, str], tuple[str, int]] = {}
    pattern_chars = 0
    lines = text.removeprefix(BOM).splitlines()
    check_line_lengths(lines, source, MAX_LINE_CHARS, "one task per line, with shorter patterns")
    for number, raw_line in enumerate(lines, start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, spec = line.partition(TASK_SEPARATOR)
        waiting = False
        if sep:
            name = name.strip()
            if name.endswith(WAITING_MARK):
                name, waiting = name[: -len(WAITING_MARK)].rstrip(), True
            raw_patterns = _split_patterns(spec)
            if not spec.strip():
                raise config_error(source, number, f"task {name!r} has no patterns", f"write '{name}: pattern, ...'")
        elif line.endswith(":") and not line.endswith("::"):
            name = line[:-1].strip()
            raise config_error(
                source, number, f"task {name!r} has no patterns", f"write '{name}: pattern, ...' or drop the colon"
            )
        else:
            # A bare line is both the task name and its single pattern (reference profile files).
            name, raw_patterns = line, [line]
        if not name:
            raise config_error(source, number, "missing task name before ': '", "write 'Task name: pattern, ...'")
        if name in RESERVED_TASK_NAMES:
            raise config_error(source, number, f"task name {name!r} is reserved", "choose another task name")
        if name in task_lines:
            raise config_error(
                source, number, f"task {name!r} is already defined on line {task_lines[name]}",
                "merge the patterns into one line",
            )
        task_lines[name] = number
        if len(task_lines) > MAX_TASKS:
            raise config_error(source, number, f"more than {MAX_TASKS} tasks", "merge tasks into fewer ones")
        patterns: list[Pattern] = []
        for raw in raw_patterns:
            pattern = _parse_pattern(raw, source, number, name)
            key = (pattern.regex, pattern.text if pattern.regex else literal_key(pattern.text))
            owner = pattern_owner.get(key)
            if owner is not None:
                if owner[0] == name:
                    continue  # the same pattern twice in one task changes nothing
                raise config_error(
                    source, number, f"pattern {raw!r} is already a pattern of task {owner[0]!r} (line {owner[1]})",
                    "keep each pattern under one task",
                )
            pattern_owner[key] = (name, number)
            pattern_chars += len(pattern.text)
            if len(pattern_owner) > MAX_PATTERNS or pattern_chars > MAX_PATTERN_TOTAL:
                raise config_error(
                    source, number, f"more than {MAX_PATTERNS} patterns or {MAX_PATTERN_TOTAL} characters of patterns",
                    "use fewer, shorter patterns",
                )
            patterns.append(pattern)
        tasks.append(Task(name, tuple(patterns), number, waiting))
    if not tasks:
        raise config_error(
            source, 1, "no task defined (the profile is empty or only comments)",
            "add one line per task, e.g. 'GC: GC Thread, G1'",
        )
    return ApplicationProfile(tuple(tasks), source)


def load_profile(path: str | Path) -> ApplicationProfile:
    """Read and parse a profile file; an unreadable, oversized or non-UTF-8 file is a ConfigError
    naming the path (a BOM is dropped)."""
    text = read_text_input(
        path,
        "the application profile",
        "check the path and its permissions",
        max_bytes=MAX_PROFILE_BYTES,
    )
    return parse_profile(text, str(path))
