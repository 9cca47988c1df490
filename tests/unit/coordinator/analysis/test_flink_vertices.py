"""Flink samples by job vertex, subtask and operator (issue 22): task threads keyed by their chain with the
full name as context, the REST placement of subtasks on TaskManagers and their PIDs, and the vertex rows
of `coordinator analyze --by vertex`, on stacks and REST answers recorded from real Flink 2.3 runs."""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze, spark_session
from coordinator.analysis.flinkdraft import MAILBOX_WAIT, OPERATOR_UNKNOWN, operator_position
from coordinator.analysis.rows import ALL, read_summary
from coordinator.analysis.vertices import (
    ChainOperators,
    PidVertices,
    placement_of,
    subtask_stacks,
    task_thread_of,
    vertex_lines,
    vertex_rows,
)
from coordinator.cli import main as coordinator_main
from profiler.capture import format as capture
from profiler.capture.format import FlinkSubtask
from profiler.capture.offcpu import OffCpuEntry
from profiler.engines.flinkmetrics import (
    TaskThread,
    parse_task_thread,
    taskmanager_pids,
    taskmanagers_of,
    vertex_subtasks,
)
from profiler.files import atomic
from profiler.scope.threadnames import NameHistory, comm_of, split_name

DATA = Path(__file__).resolve().parents[3] / "data" / "flink"
SOURCE = (
    "Source: YSB generator -> DeserializeBolt -> EventFilterBolt -> ProjectionBolt -> RedisJoinBolt -> EnrichBolt"
    " -> EventTime"
)
WINDOW = "CampaignProcessor -> RedisResultSink: Writer"


def _recorded() -> tuple[list[str], list[PidVertices]]:
    """The YSB demo's task-thread samples per PID (contexts.json joined with stacks.folded)."""
    payload = json.loads((DATA / "ysb_subtasks.json").read_text())
    pids = []
    for pid, entry in sorted(payload["pids"].items()):
        contexts: Counter[tuple[str, str]] = Counter()
        for context, stack, count in entry["contexts"]:
            contexts[(context, stack)] += count
        subtasks = subtask_stacks(contexts, {}, payload["vertices"])
        pids.append(PidVertices("localhost", int(pid), entry["samples"], 1e9, 1.0, True, subtasks))
    return payload["vertices"], pids


def test_a_flink_task_thread_is_keyed_by_its_chain_with_the_full_name_as_context() -> None:
    name = "WindowSum -> Discard: Writer (2/4)#1"
    assert split_name(name) == ("WindowSum -> Discard: Writer", name)
    # Spark keeps its rule; other threads stay as they are
    assert (
        split_name("Executor task launch worker for task 3.0 in stage 1.0 (TID 7)")[0] == "Executor task launch worker"
    )
    assert split_name("Flink Netty Server (0) Thread 0") == ("Flink Netty Server (0) Thread 0", None)
    history = NameHistory()
    history.renamed(10, 11, 0, name)
    label = history.label(10, 11, 5, comm_of(name))
    assert (label.kind, label.context, label.full) == ("WindowSum -> Discard: Writer", name, True)


def test_subtasks_come_from_contexts_and_from_old_full_name_roots_never_from_helper_threads() -> None:
    chains = ["Map -> Sink: Out"]
    contexts = Counter(
        {
            ("Map -> Sink: Out (2/2)#0", "Map -> Sink: Out;a;b"): 3,
            ("OutputFlusher for Map -> Sink: Out (2/2)#0", "OutputFlusher for Map -> Sink: Out;c"): 5,
        }
    )
    stacks = {"Map -> Sink: Out (1/2)#1;a": 4, "GC Thread#0;gc": 9}
    found = subtask_stacks(contexts, stacks, chains)
    assert found == {
        TaskThread("Map -> Sink: Out", 2, 2, 0): Counter({"Map -> Sink: Out;a;b": 3}),
        TaskThread("Map -> Sink: Out", 1, 2, 1): Counter({"Map -> Sink: Out;a": 4}),
    }
    assert task_thread_of("Other -> Chain (1/1)#0", chains) is None
    assert task_thread_of("Other -> Chain (1/1)#0", ()) == parse_task_thread("Other -> Chain (1/1)#0")


def test_rest_placement_maps_each_subtask_to_its_taskmanager_and_the_pid_listening_on_its_ports() -> None:
    # GIVEN the REST answers and LISTEN sockets recorded on a real cluster (2 TaskManagers, parallelism 2)
    recorded = json.loads((DATA / "rest_placement.json").read_text())
    vertex_paths = [key for key in recorded if "/vertices/" in key]
    subtasks = [s for key in vertex_paths for s in vertex_subtasks(key.split("/")[2], recorded[key])]
    managers = taskmanagers_of(recorded["/taskmanagers"])
    listening = {int(pid): [port for _ip, port, _state in sockets] for pid, sockets in recorded["listen"].items()}
    # WHEN the TaskManagers are matched with the processes of this host
    mapped = {m.id: m.pid for m in taskmanager_pids(managers, listening)}
    # THEN every subtask (from 1, as in thread names) names a TaskManager, and each TaskManager one PID
    assert sorted((s.name, s.subtask) for s in subtasks) == [
        ("Source: GenSource -> ToKeyed", 1),
        ("Source: GenSource -> ToKeyed", 2),
        ("WindowSum -> Discard: Writer", 1),
        ("WindowSum -> Discard: Writer", 2),
    ]
    assert {s.taskmanager for s in subtasks} == set(mapped)
    assert sorted(pid for pid in mapped.values() if pid is not None) == sorted(map(int, recorded["listen"]))
    for manager in managers:
        assert manager.host == "127.0.0.1" and manager.rpc_port and manager.data_port
    # AND a process listening on the data port alone (a TaskManager of another host) is not taken
    only_data = {1: [managers[0].data_port or 0]}
    assert [m.pid for m in taskmanager_pids(managers[:1], only_data)] == [None]


def test_chain_operators_attribute_samples_leaf_first_and_count_the_rest_unknown() -> None:
    chains, pids = _recorded()
    stacks: Counter[str] = Counter()
    for pid in pids:
        for by_stack in pid.subtasks.values():
            stacks.update(by_stack)
    operators = ChainOperators(stacks, chains)
    assert operators.operators(SOURCE)[:2] == ("Source: YSB generator", "DeserializeBolt")
    assert "CampaignProcessor" in operators.operators(WINDOW)
    # a stack whose leaf side names the window operator goes to it, even below the sink's frames
    window_stack = next(s for s in stacks if s.startswith(WINDOW) and "WindowOperator" in s.rsplit(";", 3)[-3])
    assert operators.operator_of(WINDOW, window_stack) == "CampaignProcessor"
    assert operators.operator_of(WINDOW, f"{WINDOW};java.lang.Thread::run") == OPERATOR_UNKNOWN


def test_vertex_rows_give_one_row_per_subtask_and_operator_rows_that_add_up() -> None:
    chains, pids = _recorded()
    stacks: Counter[str] = Counter()
    for pid in pids:
        for by_stack in pid.subtasks.values():
            stacks.update(by_stack)
    placement = placement_of(
        [FlinkSubtask("j", "v", WINDOW, 1, 0, "tm-a"), FlinkSubtask("j", "v", WINDOW, 2, 0, "tm-b")]
    )
    rows = vertex_rows("run1", pids, placement, lambda stack: "Task", ChainOperators(stacks, chains))
    subtask_totals = [r for r in rows if r["pid"] != ALL and r["task"] == ALL and not r["operator"]]
    # THEN two subtasks per vertex, each in its own row with its PID, TaskManager and cycles
    assert sorted((r["vertex"], r["subtask"], r["pid"]) for r in subtask_totals) == [
        (WINDOW, "1/2", 4771),
        (WINDOW, "2/2", 4772),
        (SOURCE, "1/2", 4771),
        (SOURCE, "2/2", 4772),
    ]
    assert {r["taskmanager"] for r in subtask_totals if r["vertex"] == WINDOW} == {"tm-a", "tm-b"}
    assert all(r["cycles"] and r["samples"] > 0 for r in subtask_totals)
    for chain in chains:
        vertex = next(r for r in rows if r["vertex"] == chain and r["pid"] == ALL and not r["operator"])
        operator_rows = [r for r in rows if r["vertex"] == chain and r["pid"] == ALL and r["operator"]]
        assert sum(r["samples"] for r in operator_rows) == vertex["samples"]
        assert sum(r["share"] for r in operator_rows) == pytest.approx(1.0)
        assert vertex["samples"] == sum(r["samples"] for r in subtask_totals if r["vertex"] == chain)
    # AND the report's tables read the same rows back from summary.csv's text
    text_rows = [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]
    vertices, subtasks = vertex_lines(text_rows)
    assert {line.vertex for line in vertices} == set(chains) and len(subtasks) == 4
    assert all(0.0 <= line.unknown_share < 1.0 for line in vertices)


def _flink_run(tmp_path: Path) -> Path:
    """A bare Flink host capture whose TaskManagers' stacks and contexts are the recorded YSB ones."""
    host = tmp_path / "node1"
    host.mkdir(parents=True)
    chains, pids = _recorded()
    processes = []
    for pid in pids:
        stacks: Counter[str] = Counter()
        contexts: Counter[tuple[str, str]] = Counter()
        for thread, by_stack in pid.subtasks.items():
            name = f"{thread.chain} ({thread.subtask}/{thread.parallelism})#{thread.attempt}"
            stacks.update(by_stack)
            contexts.update({(name, s): c for s, c in by_stack.items()})
        stacks["GC Thread#0;gc_work"] += 7
        folded = "".join(f"{s} {c}\n" for s, c in sorted(stacks.items(), key=lambda i: (-i[1], i[0])))
        capture.pid_dir(host, pid.pid).mkdir(parents=True)
        atomic.atomic_write_text(capture.stacks_path(host, pid.pid), folded)
        atomic.atomic_write_text(capture.contexts_path(host, pid.pid), capture.format_contexts(folded, contexts))
        processes.append(capture.ProcessInfo(pid.pid, "workload", "flink", "taskmanager", "root", "java", 1.0, 31.0))
    capture.write_scope(host, processes)
    capture.write_meta(
        host,
        capture.RunMeta(
            "node1",
            "node1",
            "6.18",
            "0.1",
            99,
            30.0,
            1.0,
            31.0,
            "duration",
            "estimated",
            "tracepoint",
            thread_names="uprobe",
        ),
    )
    vertices = [capture.VertexWindow("j", "ysb", f"v{i}", chain, 2, i == 0) for i, chain in enumerate(chains)]
    capture.write_flink_vertices(host, vertices, [FlinkSubtask("j", "v1", WINDOW, 1, 0, "tm-a")])
    shutil.copy(Path(__file__).resolve().parents[4] / "application_profiles" / "flink.txt", host / capture.PROFILE_COPY)
    return host


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    """One local SparkSession for the module's two Spark analyses (analyze's engine uses a session already
    running, with the settings it would give its own): one JVM start-up instead of two."""
    with spark_session() as session:
        yield session


def _by_vertex_on_both_engines(run: Path, tmp_path: Path) -> list[str]:
    """summary.csv of ``analyze --by vertex`` with each engine (tmp_path/<engine>/summary.csv)."""
    texts = []
    for engine in ("in-process", "spark"):
        out = tmp_path / engine
        analyze([run], out_dir=out, engine=engine, by="vertex")
        texts.append((out / "summary.csv").read_text())
    return texts


def test_analyze_by_vertex_gives_the_same_summary_on_both_engines(spark: object, tmp_path: Path) -> None:
    run = _flink_run(tmp_path)
    texts = _by_vertex_on_both_engines(run, tmp_path)
    assert texts[0] == texts[1]
    with open(tmp_path / "spark" / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    subtasks = {(r["vertex"], r["subtask"]) for r in rows if r["vertex"] and r["subtask"] not in ("", "*")}
    assert len(subtasks) == 4
    assert {r["taskmanager"] for r in rows if r["vertex"] == WINDOW and r["subtask"] == "1/2"} == {"tm-a"}
    # vertex rows are never summed with the task rows
    assert all(not r.get("vertex") for r in read_summary(tmp_path / "spark" / "summary.csv"))


def test_by_stage_on_a_flink_run_and_by_vertex_on_another_run_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _flink_run(tmp_path)
    assert coordinator_main(["analyze", str(run), "--by", "stage", "--out", str(tmp_path / "a")]) != 0
    assert "use --by vertex" in capsys.readouterr().err
    (run / capture.FLINK_FILE).unlink()
    scope = run / "scope.json"
    scope.write_text(scope.read_text().replace('"flink"', '"spark"'))
    assert coordinator_main(["analyze", str(run), "--by", "vertex", "--out", str(tmp_path / "b")]) != 0
    assert "for Spark use --by stage" in capsys.readouterr().err


def test_placement_without_rest_is_a_warning_and_no_mapping() -> None:
    from profiler.engines.events import EventCounter
    from profiler.engines.flinkmetrics import FlinkJobManager, Vertex

    def refuse(url: str) -> object:
        raise OSError(f"connection refused: {url}")

    # GIVEN a JobManager that stopped answering before the window's end
    manager = FlinkJobManager("http://127.0.0.1:8081", refuse)
    manager.vertices[("j", "v")] = Vertex("j", "v", WINDOW, 2, False, ())
    manager.last_running = {"j"}
    counter = EventCounter()
    counter._flink[manager.base_url] = manager
    # WHEN the placement is asked for; THEN none, and a warning saying what still works
    assert counter.flink_placement() == ([], [])
    (warning,) = counter.warnings
    assert "not mapped to TaskManager ids" in warning and "task threads' names" in warning


CHAIN = "Source: Orders -> ParseOrder -> ValidOrder -> PriceOrder"
_OPS = "org.apache.flink.streaming.api.operators."
_TASK_ROOT = f"{CHAIN};java.lang.Thread::run [i];org.apache.flink.streaming.runtime.tasks.StreamTask::invoke [i]"
_SOURCE_ENTRY = (
    "org.apache.flink.streaming.runtime.io.StreamTaskSourceInput::emitNext [inlined];"
    f"{_OPS}SourceOperator::emitNext [inlined];"
    "org.apache.flink.connector.datagen.source.GeneratorSourceReader::pollNext"
)
_CHAINING = "org.apache.flink.streaming.runtime.tasks.ChainingOutput::pushToOperator [inlined]"


def _chain_stack(*frames: str) -> str:
    return ";".join((_TASK_ROOT, *frames))


def test_chain_operators_follow_flinks_operator_entries_where_the_jit_inlined_the_users_functions() -> None:
    # GIVEN stacks of a chain whose map/filter functions C2 inlined (frames marked [inlined]), and of
    # its task outside any operator
    in_parse = _chain_stack(_SOURCE_ENTRY, f"{_OPS}StreamMap::processElement [inlined]",
                            "taskprof.test.ChainJob$ParseOrder::map [inlined]", "taskprof.test.ChainJob::mix")
    # the output of ParseOrder, in ValidOrder's Flink frames (its filter function returned already)
    in_valid = _chain_stack(_SOURCE_ENTRY, f"{_OPS}StreamMap::processElement [inlined]", _CHAINING,
                            f"{_OPS}StreamFilter::processElement", "java.lang.Long::valueOf")
    # PriceOrder entered from a flatMap-like ValidOrder whose user frame stays on the stack (rootward)
    in_price = _chain_stack(_SOURCE_ENTRY, f"{_OPS}StreamMap::processElement", _CHAINING,
                            f"{_OPS}StreamFilter::processElement", "taskprof.test.ChainJob$ValidOrder::filter",
                            _CHAINING, f"{_OPS}StreamMap::processElement [inlined]",
                            f"{_OPS}StreamMap::processElement", "org.apache.flink.api.java.tuple.Tuple3::of")
    reading = _chain_stack("org.apache.flink.streaming.runtime.io.AbstractStreamTaskNetworkInput::emitNext",
                           "org.apache.flink.runtime.io.network.api.serialization.NonSpanningWrapper::readInto")
    waiting = _chain_stack("org.apache.flink.streaming.runtime.tasks.mailbox.TaskMailboxImpl::take [inlined]",
                           "jdk.internal.misc.Unsafe::park", "futex_wait_[k]")
    cut = f"{CHAIN};[unknown]"
    stacks = Counter({in_parse: 5, in_valid: 3, in_price: 2, reading: 1, waiting: 1, cut: 1})
    # WHEN the chain's operators are decided
    operators = ChainOperators(stacks, [CHAIN])
    # THEN the inlined user class names its operator, and the entered operator decides where no
    # deeper frame names one (its own Flink frames, or a user frame of an outer operator)
    assert operators.operators(CHAIN) == ("Source: Orders", "ParseOrder", "ValidOrder", "PriceOrder")
    assert operators.operator_of(CHAIN, in_parse) == "ParseOrder"
    assert operators.operator_of(CHAIN, in_valid) == "ValidOrder"
    assert operators.operator_of(CHAIN, in_price) == "PriceOrder"
    # AND the task reading input goes to the head, taking mail to the mailbox wait, the rest unknown
    assert operators.operator_of(CHAIN, reading) == "Source: Orders"
    assert operators.operator_of(CHAIN, waiting) == MAILBOX_WAIT
    assert operators.operator_of(CHAIN, cut) == OPERATOR_UNKNOWN


def test_an_operator_calling_its_superclass_is_entered_once() -> None:
    frames = [
        "T", f"{_OPS}AbstractStreamOperator::processWatermark", f"{_OPS}AbstractStreamOperator::processWatermark",
        "org.apache.flink.streaming.runtime.tasks.ChainingOutput::emitWatermark",
        "org.apache.flink.streaming.runtime.operators.sink.SinkWriterOperator::processElement [inlined]",
        "org.apache.flink.streaming.runtime.io.StreamTaskSourceInput::emitNext",  # not an operator's class
    ]
    assert operator_position(frames) == (2, 4)
    assert operator_position(["T", "a.b::c"]) == (0, None)


def test_operators_of_the_same_name_in_one_chain_are_one_row() -> None:
    chain = "Map -> Map -> Sink: Out"
    second_map = ";".join((
        chain, f"{_OPS}StreamMap::processElement", _CHAINING, f"{_OPS}StreamMap::processElement", "x.Y::z",
    ))
    operators = ChainOperators(Counter({second_map: 1}), [chain])
    assert operators.operators(chain) == ("Map", "Sink: Out")
    assert operators.operator_of(chain, second_map) == "Map"



def test_analyze_by_vertex_cuts_the_subtasks_blocked_time_the_same_on_both_engines(
    spark: object, tmp_path: Path
) -> None:
    # GIVEN a Flink capture whose first TaskManager measured off-CPU time: its window subtask 1/2 parked,
    # a subtask of the source blocked without ever being sampled, and a thread of no subtask waited
    run = _flink_run(tmp_path)
    _chains, pids = _recorded()
    pid = pids[0].pid
    window_1 = f"{WINDOW} (1/2)#0"
    source_2 = f"{SOURCE} (2/2)#0"
    entries = {
        0: [OffCpuEntry("park", f"{WINDOW};TaskMailboxImpl::take;Unsafe::park", 2_000_000_000, 4, window_1),
            OffCpuEntry("net", f"{SOURCE};KafkaConsumer::poll;ep_poll_[k]", 1_500_000_000, 3, source_2),
            OffCpuEntry("lock", "VM Thread;futex_wait_[k]", 5_000_000_000, 1)],
        1: [OffCpuEntry("park", f"{WINDOW};TaskMailboxImpl::take;Unsafe::park", 1_000_000_000, 2, window_1)],
    }
    capture.write_offcpu(run, pid, [e for interval in entries.values() for e in interval])
    capture.write_offcpu_timeline(run, pid, entries)
    # WHEN both engines cut the run by vertex
    texts = _by_vertex_on_both_engines(run, tmp_path)
    # THEN they agree, and the subtasks' rows hold their threads' blocked seconds by cause
    assert texts[0] == texts[1]
    with open(tmp_path / "spark" / "summary.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["vertex"]]
    subtask_all = {
        (r["vertex"], r["subtask"], r["pid"]): r for r in rows if r["task"] == ALL and not r["operator"]
    }
    assert float(subtask_all[(WINDOW, "1/2", str(pid))]["offcpu_park_seconds"]) == 3.0
    assert float(subtask_all[(SOURCE, "2/2", str(pid))]["offcpu_net_seconds"]) == 1.5
    assert float(subtask_all[(WINDOW, ALL, ALL)]["offcpu_seconds"]) == 3.0
    tasks = {r["task"] for r in rows if r["vertex"] == SOURCE and r["pid"] == str(pid) and r["offcpu_seconds"]}
    assert tasks - {ALL}, "the blocked time is also split by the profile's tasks"
    assert sum(float(r["offcpu_seconds"]) for r in rows if r["host"] == ALL and r["task"] == ALL
               and not r["operator"]) == 4.5  # the VM thread's wait belongs to no subtask
