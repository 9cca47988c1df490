"""Every matching rule of Algorithm 1, table-driven, plus match_stacks and candidate patterns."""

from __future__ import annotations

import pickle
import re
from collections import Counter
from pathlib import Path

import pytest

from profiler.capture.folded import format_folded, read_folded
from profiler.capture.stacktable import table_from_folded
from profiler.errors import CaptureFormatError
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import (
    Matcher,
    StackAccumulator,
    candidate_patterns,
    literal_alternation,
    literal_searcher,
    match_folded_files,
    match_stacks,
    match_table,
    unmatched_folded_lines,
)

PROFILE = """\
# tasks listed in priority order for frames that match several
Kafka: org/apache/kafka, KafkaConsumer
Deserialize: JacksonParser, re:\\bJsonToStructs\\b
GC: GC Thread, G1ParTask, re:^G1[ ]
JIT: re:^C[12] CompilerThre
Wait: pthread_cond_timedwait, futex_wait_[k]
Thread::call_run
Net: re:^tcp_\\w+_\\[k\\]$
"""


@pytest.fixture(scope="module")
def matcher() -> Matcher:
    return Matcher(parse_profile(PROFILE, "test.txt"))


@pytest.mark.parametrize(
    "rule, stack, task",
    [
        # leaf-first: the frame nearest the leaf decides, whatever the root-side frames say
        ("leaf-first", "Executor task;org.apache.kafka.clients.Fetcher.fetch;JacksonParser.parse", "Deserialize"),
        ("leaf-first", "Executor task;JacksonParser.parse;org.apache.kafka.clients.Fetcher.fetch", "Kafka"),
        ("leaf-first, unmatched leaf frames are skipped", "t;KafkaConsumer.poll;a;b;c", "Kafka"),
        # in-frame priority: several tasks in one frame -> earliest in the profile
        ("in-frame priority", "t;org.apache.kafka.JacksonParser.x", "Kafka"),
        ("in-frame priority", "t;x;G1ParTask::work(pthread_cond_timedwait)", "GC"),
        # thread names take part as the root frame
        ("thread name", "GC Thread#0;Thread::call_run;WorkerThread::run", "Thread::call_run"),
        ("thread name", "GC Thread#0;WorkerThread::run", "GC"),
        ("thread name regex", "C2 CompilerThre;Compile::Optimize", "JIT"),
        ("thread name regex anchored", "xC2 CompilerThre;Compile::Optimize", "unmatched"),
        ("regex with space", "G1 Refine#0;x", "GC"),
        ("regex with space", "G1Refine#0;x", "unmatched"),
        # dotted and slashed Java class names are the same for literal patterns
        ("slashed pattern, dotted frame", "t;org.apache.kafka.common.network.Selector.poll", "Kafka"),
        ("slashed pattern, slashed frame", "t;Lorg/apache/kafka/common/network/Selector;::poll", "Kafka"),
        ("mixed spelling", "t;org/apache.kafka/common.Selector", "Kafka"),
        # literal patterns are case-sensitive substrings
        ("case-sensitive", "t;kafkaconsumer.poll", "unmatched"),
        ("substring", "t;my.KafkaConsumerWrapper.poll", "Kafka"),
        ("literal dot is not a wildcard", "t;orgXapacheXkafka", "unmatched"),
        # regex word boundaries and kernel suffixes are visible to patterns
        ("regex", "t;o.a.s.sql.catalyst.expressions.JsonToStructs.nullSafeEval", "Deserialize"),
        ("regex", "t;o.a.s.JsonToStructsX", "unmatched"),
        ("kernel frame literal with suffix", "t;Unsafe_Park;futex_wait_[k]", "Wait"),
        ("kernel frame literal without suffix in frame", "t;futex_wait", "unmatched"),
        ("kernel regex", "t;sendmsg;tcp_sendmsg_[k]", "Net"),
        ("kernel regex anchored", "t;sendmsg;tcp_sendmsg_[k]x", "unmatched"),
        ("no frame matches", "Executor task;java.lang.Thread.run;Foo.bar", "unmatched"),
        ("single frame", "GC Thread#3", "GC"),
        ("empty stack", "", "unmatched"),
    ],
)
def test_rules(matcher: Matcher, rule: str, stack: str, task: str) -> None:
    assert matcher.match(stack) == task, rule
    assert matcher.explain(stack).task == task, rule


def test_matching_is_independent_of_memo_state() -> None:
    stacks = ["t;org.apache.kafka.JacksonParser.x", "GC Thread#0;a", "t;a", "t;JacksonParser.p;a"]
    first = Matcher(parse_profile(PROFILE))
    expected = [first.match(s) for s in stacks]
    second = Matcher(parse_profile(PROFILE))
    assert [second.match(s) for s in reversed(stacks)][::-1] == expected


def test_bare_reference_profile_loads_and_matches() -> None:
    reference = "KafkaConsumer\nJacksonParser\nThread::call_run\n"
    matcher = Matcher(parse_profile(reference))
    assert matcher.task_names == ("KafkaConsumer", "JacksonParser", "Thread::call_run")
    assert matcher.match("t;a.JacksonParser.parse") == "JacksonParser"
    assert matcher.match("VM Thread;Thread::call_run;VMThread::loop") == "Thread::call_run"


def test_explain_names_the_deciding_frame_and_the_others(matcher: Matcher) -> None:
    stack = "GC Thread#0;org.apache.kafka.X;JacksonParser.parse;plain"
    explanation = matcher.explain(stack)
    assert explanation.task == "Deserialize"
    assert explanation.frame_index == 2
    assert explanation.frame == "JacksonParser.parse"
    assert explanation.patterns == ("JacksonParser",)
    assert explanation.other_tasks == ("Kafka", "GC")
    assert [m.index for m in explanation.matches] == [2, 1, 0]
    assert explanation.multi_task
    assert "frame 2 'JacksonParser.parse' matches JacksonParser" in explanation.describe()
    unmatched = matcher.explain("a;b")
    assert (unmatched.task, unmatched.frame_index, unmatched.matches) == ("unmatched", None, ())
    assert "no frame matches" in unmatched.describe()


def test_match_stacks_counts_multi_task_and_keeps_stacks(matcher: Matcher) -> None:
    counts = {
        "Executor task;org.apache.kafka.Fetcher;JacksonParser.parse": 5,  # Deserialize, multi (Kafka)
        "Executor task;JacksonParser.parse": 3,  # Deserialize
        "GC Thread#0;G1ParTask::work": 7,  # GC in two frames of one task: not multi
        "Executor task;Foo.bar": 2,  # unmatched
        "Executor task;Baz.qux": 4,  # unmatched
        "Executor task;Unused": 0,  # ignored
        "t;org.apache.kafka.JacksonParser": 1,  # Kafka, two tasks in one frame: not multi
    }
    result = match_stacks(matcher, counts)
    assert list(result.task_samples) == [*matcher.task_names, "unmatched"]
    assert result.task_samples == {
        "Kafka": 1, "Deserialize": 8, "GC": 7, "JIT": 0, "Wait": 0, "Thread::call_run": 0, "Net": 0, "unmatched": 6,
    }
    assert result.total_samples == 22
    assert result.multi_task_samples == 5
    assert result.task_multi_samples["Deserialize"] == 5
    assert result.decided_over == Counter({("Deserialize", "Kafka"): 5})
    assert result.unmatched == Counter({"Executor task;Baz.qux": 4, "Executor task;Foo.bar": 2})
    assert result.task_stacks["GC"] == Counter({"GC Thread#0;G1ParTask::work": 7})
    assert result.task_stacks["unmatched"] is result.unmatched
    assert result.share("GC") == pytest.approx(7 / 22)
    empty = match_stacks(matcher, {})
    assert empty.total_samples == 0 and empty.share("GC") is None
    assert list(empty.task_samples.values()) == [0] * 8


def test_candidate_patterns_are_top_self_frames() -> None:
    unmatched = {"t;a;leaf1": 3, "t;b;leaf1": 4, "t;leaf2": 5, "u;leaf3": 5, "v;w;leaf4": 1}
    assert candidate_patterns(unmatched, top=3) == [("leaf1", 7), ("leaf2", 5), ("leaf3", 5)]
    assert candidate_patterns(unmatched, top=0) == []
    assert candidate_patterns({}) == []
    kernel = {"t;user1;page_fault_[k];clear_page_[k]": 4, "t;user2;[unknown]": 3, "t;x;[unknown]": 1, "k_[k]": 1}
    assert candidate_patterns(kernel) == [("user1", 4), ("user2", 3), ("k_[k]", 1), ("x", 1)]
    assert candidate_patterns(kernel, user_only=False) == [
        ("[unknown]", 4), ("clear_page_[k]", 4), ("k_[k]", 1)
    ]


def test_matcher_pickles_for_spark(matcher: Matcher) -> None:
    stack = "t;org.apache.kafka.JacksonParser.x"
    clone = pickle.loads(pickle.dumps(matcher))
    assert clone.match(stack) == matcher.match(stack) == "Kafka"
    assert clone.task_names == matcher.task_names


@pytest.mark.parametrize(
    "words, text, found",
    [
        (["abc", "abd", "xyz"], "..abd..", True),
        (["abc", "abd", "xyz"], "..ab..", False),
        (["a.b", "a+b"], "axb", False),
        (["a.b", "a+b"], "za+b", True),
        (["ab", "abc"], "ab", True),
        (["[k]", "$$anon$1"], "Foo$$anon$1.apply", True),
    ],
)
def test_literal_alternation(words: list[str], text: str, found: bool) -> None:
    expression = literal_alternation(words)
    assert expression is not None
    assert (re.search(expression, text) is not None) is found
    assert literal_searcher(words)(text) is found


def test_literal_searcher_survives_deep_tries() -> None:
    words = ["a" * i + "b" for i in range(1, 250)]
    assert literal_alternation(words) is None
    search = literal_searcher(words)
    assert search("x" + "a" * 200 + "b")
    assert not search("a" * 600)
    matcher = Matcher(parse_profile("Deep: " + ", ".join(words)))
    assert matcher.match("t;" + "a" * 3 + "b;c") == "Deep"
    assert matcher.match("t;c") == "unmatched"


def test_accumulator_reads_folded_files_like_read_folded(matcher: Matcher, tmp_path: Path) -> None:
    first = tmp_path / "a.folded"
    first.write_text("t;JacksonParser.parse 4\n\nGC Thread#0;x 2\r\nt;x 3\nt;x 1\nt;y 0\n", encoding="utf-8")
    second = tmp_path / "b.folded"
    second.write_text("t;JacksonParser.parse 1\n", encoding="utf-8")
    streamed = match_folded_files(matcher, [first, second])
    both: Counter[str] = read_folded(first) + read_folded(second)
    via_counter = match_stacks(matcher, both)
    assert streamed.task_samples == via_counter.task_samples
    assert streamed.task_samples["Deserialize"] == 5 and streamed.task_samples["unmatched"] == 4
    assert streamed.unmatched == Counter({"t;x": 4})  # duplicate lines are merged
    assert dict(streamed.task_stacks) == dict(via_counter.task_stacks)
    accumulator = StackAccumulator(matcher)
    accumulator.add("GC Thread#0;y", 2)
    accumulator.add_items([("t;JacksonParser", 3), ("t;z", -1)])
    partial = accumulator.result()
    assert partial.task_samples["GC"] == 2 and partial.task_samples["Deserialize"] == 3
    accumulator.add("GC Thread#0;y", 1)  # an accumulator keeps going after result()
    assert accumulator.result().task_stacks["GC"] == Counter({"GC Thread#0;y": 3})
    assert partial.task_stacks["GC"] == Counter({"GC Thread#0;y": 2})


@pytest.mark.parametrize(
    "line, message",
    [
        ("a;b notanumber", "x.folded:2: not a folded stack line"),
        ("a;b -3", "x.folded:2: not a folded stack line"),
        ("12", "x.folded:2: not a folded stack line"),
        ("a;b 1.5", "x.folded:2: not a folded stack line"),
    ],
)
def test_accumulator_rejects_bad_lines_with_file_and_line(matcher: Matcher, line: str, message: str) -> None:
    with pytest.raises(CaptureFormatError, match=re.escape(message)):
        StackAccumulator(matcher).add_folded_lines(["t;x 1\n", line + "\n"], "x.folded")


def test_classify_reports_multi_task_as_bool(matcher: Matcher) -> None:
    assert matcher.classify("GC Thread#0;JacksonParser") == (1, True)
    assert matcher.classify("t;JacksonParser") == (1, False)
    assert matcher.classify_mask("GC Thread#0;org.apache.kafka.A;JacksonParser") == (1, 0b101)
    assert matcher.classify("nothing") == (len(matcher.task_names), False)
    assert matcher.frame_tasks("org.apache.kafka.JacksonParser") == ("Kafka", "Deserialize")


@pytest.mark.parametrize(
    "text",
    [
        "t;JacksonParser 3",  # no newline at the end of the file
        "t;JacksonParser 3\r\n",
        "t; 2\n",  # an empty leaf frame is still a stack
        "thread with spaces;frame with spaces (int, long) 7\n",
        "a 1\n\n\n",
        "GC Thread#0;x 0\nt;y 5\n",
    ],
)
def test_fast_line_path_agrees_with_read_folded(matcher: Matcher, tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.folded"
    path.write_bytes(text.encode("utf-8"))
    streamed = match_folded_files(matcher, [path])
    reference = match_stacks(matcher, read_folded(path))
    assert streamed.task_samples == reference.task_samples
    assert {t: dict(c) for t, c in streamed.task_stacks.items()} == {
        t: dict(c) for t, c in reference.task_stacks.items()
    }


def test_a_hosts_unmatched_lines_come_from_its_tables_ids_as_its_merged_text_would(matcher: Matcher) -> None:
    # GIVEN two PIDs' tables sharing an unmatched stack, and a result matched from text
    first = Counter({"t;Foo.bar": 2, "t;Baz.qux": 4, "t;KafkaConsumer.poll": 9, "t;a b": 1, "t;a": 1})
    second = Counter({"t;Foo.bar": 3, "u;x": 5, "GC Thread#1;y": 7})
    by_table = [match_table(matcher, table_from_folded(counts)) for counts in (first, second)]
    merged = Counter({"t;Foo.bar": 5, "t;Baz.qux": 4, "t;a b": 1, "t;a": 1, "u;x": 5})
    # WHEN the unmatched lines are written from the tables (no Counter of texts is built)
    lines = "".join(unmatched_folded_lines(by_table))
    # THEN they are the merged Counter's folded text, and each result's unmatched Counter is still there
    assert lines == format_folded(merged) == "t;Foo.bar 5\nu;x 5\nt;Baz.qux 4\nt;a 1\nt;a b 1\n"
    assert by_table[0].unmatched == Counter({"t;Foo.bar": 2, "t;Baz.qux": 4, "t;a b": 1, "t;a": 1})
    # a result from text, or one whose unmatched Counter was built, goes through the Counter: the same text
    assert "".join(unmatched_folded_lines([*by_table, match_stacks(matcher, Counter({"t;Foo.bar": 1}))])) == (
        format_folded(merged + Counter({"t;Foo.bar": 1}))
    )
    assert "".join(unmatched_folded_lines(by_table)) == lines
