"""Application profile syntax and its one-line errors with file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.errors import ConfigError
from profiler.matching.appprofile import ApplicationProfile, Pattern, Task, load_profile, nested_repeat, parse_profile


def test_task_with_several_patterns_and_bare_lines() -> None:
    profile = parse_profile(
        "# comment\n\nKafka: org/apache/kafka, KafkaConsumer\n  Thread::call_run  \nre:^C2 Compiler\n", "p.txt"
    )
    assert profile.task_names == ("Kafka", "Thread::call_run", "re:^C2 Compiler")
    assert profile.source == "p.txt"
    assert profile.tasks[0] == Task(
        "Kafka", (Pattern("org/apache/kafka", False, 3), Pattern("KafkaConsumer", False, 3)), 3
    )
    # a bare line is both the task name and its only pattern (reference profiles load unchanged)
    assert profile.tasks[1] == Task("Thread::call_run", (Pattern("Thread::call_run", False, 4),), 4)
    assert profile.tasks[2].patterns == (Pattern("^C2 Compiler", True, 5),)


@pytest.mark.parametrize(
    "line, name, patterns",
    [
        ("GC: GC Thread, G1", "GC", [("GC Thread", False), ("G1", False)]),
        ("JIT: re:^C[12] CompilerThre", "JIT", [("^C[12] CompilerThre", True)]),
        ("Thread::call_run", "Thread::call_run", [("Thread::call_run", False)]),
        # first ": " separates; later ones are part of the pattern
        ("A: x: y", "A", [("x: y", False)]),
        # a bare line keeps its commas
        ("foo, bar", "foo, bar", [("foo, bar", False)]),
        # escaped comma inside a pattern
        ("Sig: f(int\\, long)", "Sig", [("f(int, long)", False)]),
        ("R: re:a{1\\,3}b", "R", [("a{1,3}b", True)]),
        ("Wait: pthread_cond_timedwait,epoll_wait", "Wait", [("pthread_cond_timedwait", False), ("epoll_wait", False)]),
        ("Same: x, x", "Same", [("x", False)]),
        ("Nul: a\x00b, c", "Nul", [("a\x00b", False), ("c", False)]),
        ("GC Thread#0", "GC Thread#0", [("GC Thread#0", False)]),
    ],
)
def test_line_syntax(line: str, name: str, patterns: list[tuple[str, bool]]) -> None:
    (task,) = parse_profile(line).tasks
    assert task.name == name
    assert [(p.text, p.regex) for p in task.patterns] == patterns


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "prof.txt:1: no task defined"),
        ("# only a comment\n\n", "prof.txt:1: no task defined"),
        ("A: x\nB: re:foo(\n", "prof.txt:2: invalid regular expression 'foo('"),
        ("A: x\nB: y\nA: z\n", "prof.txt:3: task 'A' is already defined on line 1; merge"),
        ("A: x\nB: y, x\n", "prof.txt:2: pattern 'x' is already a pattern of task 'A' (line 1); keep"),
        ("A: kafka/common/Sel\nB: kafka.common.Sel\n", "prof.txt:2: pattern 'kafka.common.Sel' is already"),
        ("A: x\nx\n", "prof.txt:2: pattern 'x' is already a pattern of task 'A'"),
        ("A: x,,y\n", "prof.txt:1: empty pattern in task 'A'"),
        ("A: x, \n", "prof.txt:1: empty pattern in task 'A'"),
        ("A:\n", "prof.txt:1: task 'A' has no patterns"),
        ("A: \n", "prof.txt:1: task 'A' has no patterns"),
        ("\n\n: x\n", "prof.txt:3: missing task name"),
        ("unmatched: x\n", "prof.txt:1: task name 'unmatched' is reserved"),
        ("*: x\n", "prof.txt:1: task name '*' is reserved"),
        ("A: re:\n", "prof.txt:1: empty regular expression"),
        ("A: re:.*\n", "prof.txt:1: regular expression '.*' matches the empty string"),
        ("A: a;b\n", "prof.txt:1: pattern 'a;b' contains ';'"),
        ("A: x\nB: re:(a+)+b\n", "prof.txt:2: regular expression '(a+)+b' repeats a repeat"),
        ("A: re:x(?:[a-z]*q)*y\n", "prof.txt:1: regular expression 'x(?:[a-z]*q)*y' repeats a repeat"),
    ],
)
def test_errors_are_one_line_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_profile(text, "prof.txt")
    text_of_error = str(info.value)
    assert text_of_error.startswith(message), text_of_error
    assert "\n" not in text_of_error
    assert "; " in text_of_error  # problem; fix


def test_load_profile_reads_file_and_reports_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    path.write_text("GC: G1\n", encoding="utf-8")
    assert load_profile(path).source == str(path)
    assert load_profile(str(path)).task_names == ("GC",)
    with pytest.raises(ConfigError, match=r"missing\.txt: cannot read the application profile"):
        load_profile(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path)  # a directory
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"GC: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_profile(bad)
    broken = tmp_path / "broken.txt"
    broken.write_text("A: x\nB: re:[\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{broken}:2: invalid regular expression"):
        load_profile(broken)


def test_format_round_trips() -> None:
    profile = parse_profile("A: x, re:a{1\\,3}\nThread::call_run\nB: f(int\\, long)\n")
    again = parse_profile(profile.format())
    assert [(t.name, [(p.text, p.regex) for p in t.patterns]) for t in again.tasks] == [
        (t.name, [(p.text, p.regex) for p in t.patterns]) for t in profile.tasks
    ]
    assert isinstance(again, ApplicationProfile)


def test_a_repeat_in_a_repeat_is_refused_unless_it_cannot_backtrack() -> None:
    # GIVEN the classic catastrophic shapes and their safe spellings
    assert nested_repeat("(a+)+") and nested_repeat("(.*x)*") and nested_repeat("(x(y+)z)*")
    assert not nested_repeat("a+b+") and not nested_repeat("(ab)*") and not nested_repeat("(a++)+")
    assert not nested_repeat("(?>a+)+") and not nested_repeat("(a?)+")
    # THEN a safe one parses, and the refused one would indeed take exponential time (not run here)
    assert parse_profile("A: re:(?>[a-z]+\\.)+Kafka\n").tasks[0].patterns[0].regex
