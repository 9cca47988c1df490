"""Full thread names over time (profiler/scope/threadnames.py) and the contexts they give the stack store."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.folded import format_folded
from profiler.capture.read import read_contexts
from profiler.capture.stackstore import StackStore
from profiler.errors import CaptureFormatError
from profiler.files import atomic
from profiler.scope.threadnames import NameHistory, comm_of, parse_thread_print, split_name

TASK = "Executor task launch worker for task 3.0 in stage 12.0 (TID 56)"
THREAD_PRINT = '''2026-11-23 18:00:00
Full thread dump OpenJDK 64-Bit Server VM (17.0.15+6-Debian-1deb12u1 mixed mode, sharing):

"main" #1 prio=5 os_prio=0 cpu=120.00ms elapsed=5.00s tid=0x00007f nid=0x4b21 waiting on condition  [0x7f]
   java.lang.Thread.State: TIMED_WAITING (sleeping)

"Executor task launch worker for task 3.0 in stage 12.0 (TID 56)" #58 daemon prio=5 os_prio=0 cpu=1.2ms \
elapsed=0.4s tid=0x00007f nid=0x4b53 runnable  [0x7f]
"a "quoted" name" #59 prio=5 os_prio=0 tid=0x1 nid=19300 runnable
"GC Thread#0" os_prio=0 cpu=3.00ms elapsed=5.00s tid=0x00007f nid=0x4b22 runnable
'''.replace("\\\n", "")


def test_thread_print_gives_tid_to_full_name_for_hex_and_decimal_nids() -> None:
    names = parse_thread_print(THREAD_PRINT)
    assert names == {0x4B21: "main", 0x4B53: TASK, 19300: 'a "quoted" name', 0x4B22: "GC Thread#0"}


def test_a_task_name_splits_into_a_stable_kind_and_its_context() -> None:
    assert split_name(TASK) == ("Executor task launch worker", TASK)
    assert split_name("Executor task launch worker-0") == ("Executor task launch worker-0", None)
    assert split_name("GC Thread#0") == ("GC Thread#0", None)
    assert comm_of(TASK) == b"Executor task l"


def test_a_sample_gets_the_name_its_thread_had_at_the_sample_time() -> None:
    history = NameHistory()
    history.seed(1, {7: "Executor task launch worker-0"}, read_at_ns=50)
    history.renamed(1, 7, 100, TASK)
    history.renamed(1, 7, 200, TASK.replace("TID 56", "TID 57"))
    assert history.label(1, 7, 99, b"Executor task l").kind == "Executor task launch worker-0"
    at_150 = history.label(1, 7, 150, b"Executor task l")
    assert (at_150.kind, at_150.context, at_150.full) == ("Executor task launch worker", TASK, True)
    assert "TID 57" in (history.label(1, 7, 250, b"Executor task l").context or "")
    # a name that does not agree with the kernel's comm is stale (a rename missed): the comm wins
    stale = history.label(1, 7, 250, b"other-thread")
    assert (stale.kind, stale.context, stale.full) == ("other-thread", None, False)
    # an unknown thread keeps its comm
    assert history.label(1, 8, 250, b"C2 CompilerThre").kind == "C2 CompilerThre"


def test_a_seed_read_after_a_rename_does_not_override_it() -> None:
    history = NameHistory()
    history.renamed(1, 7, 100, TASK)
    history.seed(1, {7: TASK, 8: "Long background thread name"}, read_at_ns=150)
    assert history.name_at(1, 7, 50) is None  # before the rename: not known, the comm stays
    assert history.name_at(1, 8, 1) == "Long background thread name"


def test_prune_keeps_only_the_name_in_force() -> None:
    history = NameHistory()
    for tid_no in range(100):
        history.renamed(1, 7, tid_no * 10, f"name {tid_no}")
    history.prune(before_ns=555)
    assert history.name_at(1, 7, 555) == "name 55" and history.name_at(1, 7, 990) == "name 99"
    assert history.name_at(1, 7, 540) is None  # forgotten (no sample this old is still to come)


def raw(*addrs: int) -> bytes:
    return struct.pack(f"<{len(addrs)}Q", *addrs)


def test_contexts_are_counted_beside_the_stacks_not_in_them() -> None:
    store = StackStore(interval_ns=10)
    store.begin(0)
    for tid_no in range(1000):
        store.add(1, 7, b"Executor task launch worker", tid_no, raw(1, 2), -1, 0, context=f"task (TID {tid_no})")
    store.add(1, 8, b"GC Thread#0", 5, raw(1, 2), -1)
    assert store.distinct_stacks == 2 and store.contexts == 1000
    assert sum(c for _k, _i, c in store.entries(1)) == 1001
    by_context = Counter({context: count for _k, _i, context, count in store.context_entries(1)})
    assert by_context["task (TID 999)"] == 1 and by_context[None] == 1


def test_contexts_file_round_trips_through_stack_line_numbers(tmp_path: Path) -> None:
    folded = Counter({"T;a;b": 5, "T;a;c": 3, "GC;g": 9})
    contexts = Counter({(TASK, "T;a;b"): 4, ("other", "T;a;b"): 1, (TASK, "T;a;c"): 3})
    text = format_folded(folded)
    atomic.atomic_write_text(capture.stacks_path(tmp_path, 42), text)
    atomic.atomic_write_text(capture.contexts_path(tmp_path, 42), capture.format_contexts(text, contexts))
    assert read_contexts(tmp_path, 42) == contexts
    assert read_contexts(tmp_path, 43) is None  # a v2 capture: no file, no contexts
    atomic.atomic_write_text(capture.contexts_path(tmp_path, 42), '{"contexts": ["x"], "rows": [[0, 9, 1]]}')
    with pytest.raises(CaptureFormatError, match=r"contexts.json: row 1 is not"):
        read_contexts(tmp_path, 42)


def test_a_thread_whose_java_name_never_reached_the_kernel_keeps_its_jcmd_name() -> None:
    # the launcher's main thread is "main" in Java and "java" in the kernel, and is never renamed
    history = NameHistory()
    history.seed(1, {5: "main"}, read_at_ns=10)
    assert history.label(1, 5, 20, b"java").kind == "main"
    # once the uprobe saw it renamed, the comm check applies again
    history.renamed(1, 5, 30, "worker-1")
    assert history.label(1, 5, 40, b"java").kind == "java"
