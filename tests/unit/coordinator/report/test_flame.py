"""Flamegraph trees: counts, interning, task colouring, pruning."""

from __future__ import annotations

from typing import Any

from coordinator.report.flame import (
    MIXED,
    FrameTable,
    StackClassifications,
    build_flamegraph,
    dropped_frame_name,
    prune_stacks,
)
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher

TASKS = ("Kafka", "Filter", "unmatched")


# A frame belongs to every task whose name it contains (literal patterns).
MATCHER = Matcher(parse_profile("Kafka: Kafka\nFilter: Filter\n"))


def _classifications() -> StackClassifications:
    return StackClassifications(MATCHER, TASKS)


def _node(tree: list[Any], frames: FrameTable, *path: str) -> list[Any]:
    node = tree
    for name in path:
        node = next(child for child in node[3] if frames.names[child[0]] == name)
    return node


def _build(counts: dict[str, int], max_stacks: int = 0) -> tuple[Any, FrameTable]:
    frames = FrameTable()
    graph = build_flamegraph(
        counts, _classifications(), frames, key="k", title="t", kind="pid", root_name="all", max_stacks=max_stacks
    )
    return graph, frames


def test_counts_are_inclusive_and_children_sorted_largest_first() -> None:
    graph, frames = _build({"main;a;b": 3, "main;a;c": 5, "main;d": 1})
    assert graph.samples == 9 and graph.tree[1] == 9
    main = _node(graph.tree, frames, "main")
    assert main[1] == 9
    a = _node(graph.tree, frames, "main", "a")
    assert a[1] == 8
    assert [frames.names[c[0]] for c in a[3]] == ["c", "b"]
    assert [frames.names[c[0]] for c in main[3]] == ["a", "d"]
    assert graph.max_depth == 3 and graph.stacks == 3


def test_frames_are_interned_once_across_graphs() -> None:
    frames = FrameTable()
    classifications = _classifications()
    for key in ("one", "two"):
        build_flamegraph(
            {"thread;run;Kafka.poll": 2, "thread;run;work": 1}, classifications, frames,
            key=key, title=key, kind="pid", root_name="all",
        )
    assert sorted(frames.names) == sorted({"all", "thread", "run", "Kafka.poll", "work"})


def test_frame_of_one_task_takes_its_colour_shared_frame_is_mixed_with_breakdown() -> None:
    kafka, filter_, unmatched = 0, 1, 2
    graph, frames = _build({"t1;loop;Kafka.poll;read": 4, "t1;loop;Filter.apply": 2, "t2;idle": 3})
    loop = _node(graph.tree, frames, "t1", "loop")
    assert loop[2] == MIXED and loop[4] == {str(kafka): 4, str(filter_): 2}
    poll = _node(graph.tree, frames, "t1", "loop", "Kafka.poll")
    assert poll[2] == kafka
    assert poll[5] == {str(kafka): 4}  # the deciding frame says so
    read = _node(graph.tree, frames, "t1", "loop", "Kafka.poll", "read")
    assert read[2] == kafka and len(read) == 4  # below the decider: coloured, not a decider
    idle = _node(graph.tree, frames, "t2", "idle")
    assert idle[2] == unmatched
    assert graph.tree[2] == MIXED


def test_leaf_most_match_decides_like_algorithm_1() -> None:
    classify = MATCHER.decide
    assert classify(["t", "Kafka.run", "Filter.apply", "x"]) == ("Filter", 2)
    assert classify(["t", "x"]) == ("unmatched", None)


def test_decide_agrees_with_match_and_explain() -> None:
    matcher = Matcher(parse_profile("Kafka: KafkaConsumer\nFilter: FilterExec, re:filter\\d\n"))
    classify = matcher.decide
    for stack in ("a;KafkaConsumer.poll;b", "a;KafkaConsumer.poll;filter1", "a;b", "FilterExec;KafkaConsumer"):
        task, decider = classify(stack.split(";"))
        assert task == matcher.match(stack)
        assert decider == matcher.explain(stack).frame_index


def test_pruning_keeps_largest_and_reports_the_rest() -> None:
    counts = {"a;x": 10, "a;y": 5, "a;z": 1, "b;w": 1, "b;v": 0}
    pruned = prune_stacks(counts, 2)
    assert pruned.kept == {"a;x": 10, "a;y": 5}
    assert (pruned.dropped_stacks, pruned.dropped_samples) == (2, 2)
    assert prune_stacks(counts, 0).kept == {k: v for k, v in counts.items() if v > 0}


def test_pruned_graph_keeps_the_total_and_names_the_option() -> None:
    graph, frames = _build({"a;x": 10, "a;y": 5, "a;z": 1, "b;w": 1}, max_stacks=2)
    assert graph.samples == 17 and graph.dropped_stacks == 2 and graph.dropped_samples == 2
    marker = _node(graph.tree, frames, dropped_frame_name(2, 2))
    assert marker[1] == 2 and marker[2] == MIXED
    assert "--max-stacks" in dropped_frame_name(2, 2)


def test_split_by_task_selects_by_classification() -> None:
    counts = {"t;Kafka.poll": 3, "t;Filter.apply": 2, "t;other": 1}
    assert _classifications().split_by_task(counts)["Kafka"] == {"t;Kafka.poll": 3}
    assert _classifications().split_by_task(counts)["unmatched"] == {"t;other": 1}


def test_without_a_profile_every_stack_is_unmatched() -> None:
    classifications = StackClassifications(None, TASKS)
    assert classifications.classify("t;Kafka.poll") == (TASKS.index("unmatched"), None)


def test_deep_stacks_do_not_recurse() -> None:
    deep = ";".join(f"f{i}" for i in range(5000))
    graph, _ = _build({deep: 1})
    assert graph.max_depth == 5000


def test_empty_counts_give_an_empty_root() -> None:
    graph, frames = _build({})
    assert graph.tree == [frames.intern("all"), 0, MIXED, [], {}] and graph.samples == 0 and graph.stacks == 0


def test_pruning_breaks_ties_by_stack_text() -> None:
    counts = {"c": 2, "b": 2, "a": 2, "big": 9}
    pruned = prune_stacks(counts, 3)
    assert pruned.kept == {"big": 9, "a": 2, "b": 2}
    assert (pruned.dropped_stacks, pruned.dropped_samples) == (1, 2)
