"""The analysis job: the stacks of whole archives matched to tasks with the host agent's own matcher
(stack tables by frame ids, folded files stack by stack: decide.TaskDecider), summed per PID, written as
summary.csv, analysis.json and unmatched.folded.

On Spark for archives, or in this process (``run_analysis_in_process``, no JVM) for small inputs on
a local master, with the same matcher, sums, files and byte-identical output (``choose_engine``).
The analysis's only pyspark import (lazy, so importing this module stays cheap; the demo workloads in
sparkcluster.py and ysb/ import it for their own jobs). The DataFrame steps are small functions;
``analyze`` is the entry point used by ``coordinator analyze``, ``profile`` and ``compare``.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.analysis.decide import PidTaskSums, TaskDecider
from coordinator.analysis.inputs import PidTaskCounts, RunInput, read_inputs, resolve_profile_text
from coordinator.analysis.rows import (
    ANALYSIS_FILE,
    BARE_CAPTURE_ANALYSIS_DIR,
    SUMMARY_FILE,
    TASKS_DIR,
    UNMATCHED_FILE,
    analysis_record,
    format_summary,
    label_columns,
    run_rows,
    task_file_names,
    window_notes,
)
from coordinator.analysis.timeline import SubWindow
from coordinator.rundir import RUN_FILE, own_subdir
from profiler.capture.format import FlinkSubtask, format_result_csv
from profiler.errors import CapabilityError, CaptureFormatError, ConfigError
from profiler.files.atomic import atomic_write_text
from profiler.files.outputs import check_output_dir, mark_output_dir
from profiler.files.textinput import open_text
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

APP_NAME = "taskprof-analyze"
# Row kinds of the job's one DataFrame (the input is read once; everything else is small).
KIND_PID = 1  # samples of one PID in one task (pid_key, task, samples, multi)
KIND_ERROR = 2  # an input file that could not be read; ``stack`` holds the message
KIND_UNMATCHED = 3  # samples of one unmatched stack in one partition (digest; stack text on its first row)
KIND_FINGERPRINT = 4  # distinct stacks of a partition: their fingerprints packed in ``digest`` (int64 LE)
FINGERPRINTS_PER_ROW = 1 << 20
READ_BATCH_ROWS = 20_000
FILES_PER_SLICE = 16
# Below this much stack data on a local master, the job runs in this process with the same reader, matcher
# and row code (byte-identical output) instead of paying ~10 s of JVM start-up: a single run is summarised
# in seconds; Spark is for archives.
IN_PROCESS_MAX_BYTES = 256 * 1024 * 1024
ENGINES = ("auto", "spark", "in-process")

DECIDED_COLUMNS = ("kind", "pid_key", "task", "digest", "stack", "samples", "multi")
DECIDED_SCHEMA = "kind int, pid_key int, task int, digest binary, stack string, samples long, multi long"


@dataclass(frozen=True)
class AnalysisStats:
    runs: int
    hosts: int
    pids: int
    samples: int
    distinct_stacks: int
    session_seconds: float  # starting the JVM and the SparkSession (0 when one was passed in)
    job_seconds: float  # reading, matching, summing and writing


@dataclass(frozen=True)
class AnalysisOutput:
    summary_csv: Path
    unmatched_file: Path
    out_dir: Path
    analysis_json: Path
    stats: AnalysisStats
    window_notes: tuple[str, ...] = ()  # the sub-window used per host (window_notes)


# ---------------------------------------------------------------- session


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


_LOG4J = """\
rootLogger.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _code_zip(directory: Path) -> Path:
    """profiler/ and coordinator/ as one zip, so executors on other machines import the same matcher."""
    archive = directory / "taskprof-code.zip"
    root = Path(__file__).resolve().parents[2]  # the directory holding profiler/ and coordinator/
    with zipfile.ZipFile(archive, "w") as zf:
        for package in ("profiler", "coordinator"):
            for path in sorted((root / package).rglob("*.py")):
                zf.write(path, path.relative_to(root).as_posix())
    return archive


def _quiet_pyspark_warnings() -> None:
    # pyspark warns about pandas >= 3 on every Arrow call; the pipeline does not use pandas.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


def _launch_jvm_quietly(settings: Mapping[str, str], log_path: Path) -> None:
    """Start the py4j JVM of this process (once) with its stderr in ``log_path``: Spark's start-up
    chatter and later log lines go to the log file, not the user's terminal, and nothing else of
    the process is redirected (the coordinator prints progress from other threads meanwhile)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:  # a JVM of an earlier session in this process
            return
        conf = SparkConf(loadDefaults=False)
        conf.setAll(list(settings.items()))
        with open(log_path, "ab") as log:
            SparkContext._gateway = launch_gateway(conf, popen_kwargs={"stderr": log})
        SparkContext._jvm = SparkContext._gateway.jvm


@contextmanager
def spark_session(master: str = "local[*]", conf: Mapping[str, str] | None = None) -> Iterator[SparkSession]:
    """One quiet SparkSession (no UI, errors only, JVM output in a log file), stopped on exit.
    ``conf``: extra Spark settings, applied last."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    _quiet_pyspark_warnings()
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        # Someone else's session runs in this process (Spark allows one): use it, leave it running.
        yield SparkSession.builder.getOrCreate()
        return
    scratch = Path(tempfile.mkdtemp(prefix="taskprof-spark-"))
    log4j = scratch / "log4j2.properties"
    log4j.write_text(_LOG4J, encoding="utf-8")
    spark_log = scratch / "spark.log"
    java_options = f"-Dlog4j.configurationFile=file:{log4j} -Dlog4j2.configurationFile=file:{log4j}"
    settings = {
        "spark.master": master,
        "spark.app.name": APP_NAME,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    if _is_local(master):
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.memory"] = os.environ.get("TASKPROF_DRIVER_MEMORY", "3g")
    settings.update(conf or {})
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        _launch_jvm_quietly(settings, spark_log)
        spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - py4j and pyspark fail in many ways; one CapabilityError with the log
        tail = spark_log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
        shutil.rmtree(scratch, ignore_errors=True)
        raise CapabilityError(
            f"Spark master {master!r}: the session did not start ({exc.__class__.__name__}: "
            f"{' | '.join(tail) or exc}); check Java 17 and the master URL"
        ) from None
    try:
        spark.sparkContext.setLogLevel("ERROR")
        if not _is_local(master):
            spark.sparkContext.addPyFile(str(_code_zip(scratch)))
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * parallelism)))
        yield spark
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- worker function (runs in Python workers)


def _decided_rows(
    key: int, sums: PidTaskSums, seen: set[bytes]
) -> Iterator[tuple[int, int | None, int | None, bytes | None, str | None, int, int]]:
    """DECIDED_SCHEMA rows of one PID: its samples per task, then its unmatched stacks keyed by a 128-bit
    BLAKE2b digest of their text, the text travelling only with a digest's first row in the partition."""
    from hashlib import blake2b

    for task, (samples, multi) in enumerate(zip(sums.samples, sums.multi)):
        if samples:
            yield KIND_PID, key, task, None, None, samples, multi
    for stack, samples in sums.unmatched.items():
        digest = blake2b(stack.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        first = digest not in seen
        seen.add(digest)
        yield KIND_UNMATCHED, None, None, digest, stack if first else None, samples, 0


def _record_batch(rows: Sequence[tuple[Any, ...]]) -> pa.RecordBatch:
    import pyarrow as pa

    types = (pa.int32(), pa.int32(), pa.int32(), pa.binary(), pa.string(), pa.int64(), pa.int64())
    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(column, kind) for column, kind in zip(columns, types)], names=list(DECIDED_COLUMNS)
    )


def _fingerprint_rows(fingerprints: set[int]) -> Iterator[tuple[Any, ...]]:
    """A partition's distinct stack fingerprints packed as little-endian int64s, FINGERPRINTS_PER_ROW a row."""
    import numpy as np

    values = np.fromiter(fingerprints, dtype=np.int64, count=len(fingerprints))
    for start in range(0, len(values), FINGERPRINTS_PER_ROW):
        packed = values[start : start + FINGERPRINTS_PER_ROW].astype("<i8").tobytes()
        yield KIND_FINGERPRINT, None, None, packed, None, 0, 0


def _decide_function(profile_broadcast: Any) -> Any:
    """The mapInArrow function of the job: (pid_key, path, first, last) rows in, DECIDED_SCHEMA rows out.
    Each file is read in the form it is stored (decide.TaskDecider: a stack table's frames matched once,
    its stacks decided by frame ids) with one Matcher per partition, memoized over its files. Only sums,
    unmatched stacks and the partition's distinct stack fingerprints go back to the JVM; a file that
    cannot be read gives one KIND_ERROR row with the message in ``stack``."""

    def decide_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decider = TaskDecider(Matcher(parse_profile(profile_broadcast.value, "<application profile>")))
        rows: list[tuple[Any, ...]] = []
        seen: set[bytes] = set()
        fingerprints: set[int] = set()
        for batch in batches:
            columns = (batch.column(name).to_pylist() for name in ("pid_key", "path", "first", "last"))
            for key, path, first, last in zip(*columns):
                try:
                    sums = decider.read(Path(path), None if first is None else (first, last))
                except CaptureFormatError as exc:
                    rows.append((KIND_ERROR, key, None, None, str(exc), 0, 0))
                    continue
                rows.extend(_decided_rows(key, sums, seen))
                fingerprints |= sums.fingerprints
                if len(rows) >= READ_BATCH_ROWS:
                    yield _record_batch(rows)
                    rows.clear()
        rows.extend(_fingerprint_rows(fingerprints))
        for start in range(0, len(rows), READ_BATCH_ROWS):
            yield _record_batch(rows[start : start + READ_BATCH_ROWS])

    return decide_batches


# ---------------------------------------------------------------- DataFrame steps


def decide_stacks(
    spark: SparkSession, files: Sequence[tuple[int, str, int | None, int | None]], profile_text: str
) -> DataFrame:
    """Every stacks file (``pid_key, path, first, last``, the intervals set for a sub-window) read and
    decided in the Python workers: DECIDED_SCHEMA rows of kinds KIND_PID, KIND_UNMATCHED,
    KIND_FINGERPRINT and KIND_ERROR."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    schema = StructType([
        StructField("pid_key", IntegerType(), False),
        StructField("path", StringType(), False),
        StructField("first", IntegerType(), True),
        StructField("last", IntegerType(), True),
    ])
    parallelism = spark.sparkContext.defaultParallelism
    # Enough slices to keep every core busy, few enough that small inputs need one Python task.
    slices = max(1, min(math.ceil(len(files) / FILES_PER_SLICE), 4 * parallelism))
    paths = spark.createDataFrame(list(files), schema).repartition(slices)
    profile_broadcast = spark.sparkContext.broadcast(profile_text)
    return paths.mapInArrow(_decide_function(profile_broadcast), DECIDED_SCHEMA)


def pid_counts(
    decided: DataFrame, task_names: Sequence[str]
) -> tuple[dict[int, PidTaskCounts], list[str], int]:
    """Samples per (PID, task), the read errors and the number of distinct stacks (by their fingerprints,
    decide.stack_fingerprint), collected to the driver in one pass: a few rows per PID and one per
    partition's packed fingerprints, summed here (no grouping in the JVM)."""
    import numpy as np
    from pyspark.sql import functions as F

    rows = (
        decided.filter(F.col("kind").isin(KIND_PID, KIND_ERROR, KIND_FINGERPRINT))
        .select("kind", "pid_key", "task", "digest", "stack", "samples", "multi")
        .collect()
    )
    errors = sorted(str(row["stack"]) for row in rows if row["kind"] == KIND_ERROR)
    packed = [np.frombuffer(row["digest"], dtype="<i8") for row in rows if row["kind"] == KIND_FINGERPRINT]
    distinct = len(np.unique(np.concatenate(packed))) if packed else 0
    summed: dict[tuple[int, int], list[int]] = {}
    for row in rows:
        if row["kind"] == KIND_PID:
            slot = summed.setdefault((row["pid_key"], row["task"]), [0, 0])
            slot[0] += row["samples"]
            slot[1] += row["multi"]
    samples: dict[int, dict[str, int]] = {}
    multi: dict[int, dict[str, int]] = {}
    for (key, task), (count, in_others) in sorted(summed.items()):
        samples.setdefault(key, {})[task_names[task]] = count
        multi.setdefault(key, {})[task_names[task]] = in_others
    return {key: PidTaskCounts(samples[key], multi[key]) for key in samples}, errors, distinct


def sorted_unmatched_stacks(decided: DataFrame) -> Iterator[tuple[str, int]]:
    """(stack, samples) of the stacks no task matched, merged over every input, most samples first, ties
    by stack text (Spark orders strings by UTF-8 bytes, the same as Python's code-point order). Only these
    come back to the driver: the tasks' stacks stay in the captures (the report and `coordinator export`
    derive them)."""
    from pyspark.sql import functions as F

    # Every non-null stack of one digest is the same text, so first() is deterministic here.
    ordered = (
        decided.filter(F.col("kind") == KIND_UNMATCHED)
        .groupBy("digest")
        .agg(F.first("stack", ignorenulls=True).alias("stack"), F.sum("samples").alias("samples"))
        .orderBy(F.col("samples").desc(), F.col("stack").asc())
        .select("stack", "samples")
    )
    for row in ordered.toLocalIterator(prefetchPartitions=True):
        yield str(row[0]), int(row[1])


# ---------------------------------------------------------------- the whole job


def _default_out_dir(runs: Sequence[RunInput]) -> Path:
    if len(runs) != 1:
        raise ConfigError(f"{len(runs)} runs given: say where the combined analysis goes with --out DIR")
    run = runs[0]
    if (run.directory / "run.json").is_file():
        return run.directory
    return run.directory / BARE_CAPTURE_ANALYSIS_DIR  # a bare host capture stays untouched


def _check_out_dir(out_dir: Path, runs: Sequence[RunInput]) -> None:
    """A new directory, a run directory or a previous analysis (replaced); never a host capture, nor a
    directory of the user's own files (profiler.files.outputs)."""
    check_output_dir(out_dir, "--out", force=False, own_kind=(RUN_FILE, ANALYSIS_FILE), replace_own=True)
    own_subdir(out_dir, TASKS_DIR)  # a link there is refused before any work, never removed through
    for run in runs:
        for host in run.hosts:
            if host.capture_dir is not None and out_dir.resolve() == host.capture_dir.resolve():
                raise ConfigError(
                    f"{out_dir}: is a host capture; the raw capture is never written to, choose another --out"
                )


def _write_unmatched(unmatched_tmp: Path, stacks: Iterable[tuple[str, int]]) -> None:
    """Stream the sorted unmatched stacks into unmatched.folded (the input of new profile patterns)."""
    with open(unmatched_tmp, "w", encoding="utf-8") as handle:
        for stack, count in stacks:
            handle.write(f"{stack} {count}\n")


def _stack_files(runs: Sequence[RunInput]) -> list[tuple[int, str, int | None, int | None]]:
    """(pid_key, path, first interval, last interval) of every PID with stacks; no intervals: all."""
    return [
        (p.key, str(p.stacks), *(p.intervals or (None, None)))
        for run in runs
        for p in run.pids
        if p.stacks is not None
    ]


@dataclass(frozen=True)
class AnalysisJob:
    """What either engine (run_analysis on Spark, run_analysis_in_process) reads and where it writes."""

    runs: Sequence[RunInput]
    profile_text: str
    profile_source: str
    out_dir: Path
    master: str  # recorded in analysis.json
    window: SubWindow | None = None


def run_analysis(spark: SparkSession, job: AnalysisJob) -> tuple[int, int]:
    """The job on an existing session: read, match, sum, write. Returns (distinct stacks, samples)."""
    _quiet_pyspark_warnings()
    task_names = parse_profile(job.profile_text, job.profile_source).result_task_names
    files = _stack_files(job.runs)
    with _scratch_in(job.out_dir) as scratch:
        counts: dict[int, PidTaskCounts] = {}
        distinct = samples = 0
        if files:
            decided = decide_stacks(spark, files, job.profile_text)
            from pyspark import StorageLevel

            decided.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                counts, errors, distinct = pid_counts(decided, task_names)
                if errors:
                    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                    raise CaptureFormatError(errors[0] + more)
                samples = sum(sum(c.samples.values()) for c in counts.values())
                _write_unmatched(scratch / UNMATCHED_FILE, sorted_unmatched_stacks(decided))
            finally:
                decided.unpersist()
        else:
            _write_unmatched(scratch / UNMATCHED_FILE, ())
        _write_summary(scratch, job, counts)
    return distinct, samples


@contextmanager
def _scratch_in(out_dir: Path) -> Iterator[Path]:
    """A scratch directory inside ``out_dir`` (the same file system: _write_summary moves its files into
    place), removed when the block ends whether or not it raised."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".analysis-", dir=out_dir))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_summary(scratch: Path, job: AnalysisJob, counts: Mapping[int, PidTaskCounts]) -> None:
    """summary.csv and analysis.json beside unmatched.folded in ``scratch``, then all moved into place
    (the tasks/ directory of an analysis before issue 29 goes: it held copies of the captures' stacks)."""
    runs, out_dir = job.runs, job.out_dir
    ordered_runs = sorted(runs, key=lambda r: r.run)  # input order must not change the output
    profile = parse_profile(job.profile_text, job.profile_source)
    task_names, file_names = profile.result_task_names, task_file_names(profile.task_names)
    matcher = Matcher(profile)  # off-CPU time's tasks
    rows = [row for run in ordered_runs for row in run_rows(run, task_names, counts, matcher)]
    atomic_write_text(scratch / SUMMARY_FILE, format_summary(rows, label_columns(runs)))
    atomic_write_text(
        scratch / ANALYSIS_FILE,
        analysis_record(runs, job.profile_text, job.profile_source, file_names, job.master, job.window),
    )
    tasks = own_subdir(out_dir, TASKS_DIR)
    if tasks is not None:
        shutil.rmtree(tasks)
    for name in (UNMATCHED_FILE, ANALYSIS_FILE, SUMMARY_FILE):
        os.replace(scratch / name, out_dir / name)


def run_analysis_in_process(job: AnalysisJob) -> tuple[int, int]:
    """The same job as run_analysis without Spark, for inputs small enough for one process: every stacks
    file read and decided by the same reader (decide.TaskDecider), the same sums, files and ordering."""
    profile = parse_profile(job.profile_text, job.profile_source)
    task_names = profile.result_task_names
    decider = TaskDecider(Matcher(profile))
    unmatched: Counter[str] = Counter()
    fingerprints: set[int] = set()
    total = 0
    counts: dict[int, PidTaskCounts] = {}
    for run in job.runs:
        for pid in run.pids:
            if pid.stacks is None:
                continue
            sums = decider.read(pid.stacks, pid.intervals)
            if sums.total:
                counts[pid.key] = PidTaskCounts(*sums.by_task(task_names))
            total += sums.total
            unmatched.update(sums.unmatched)
            fingerprints |= sums.fingerprints
    with _scratch_in(job.out_dir) as scratch:
        _write_unmatched(scratch / UNMATCHED_FILE, sorted(unmatched.items(), key=lambda item: (-item[1], item[0])))
        _write_summary(scratch, job, counts)
    return len(fingerprints), total


def _task_classifier(profile_text: str, profile_source: str) -> tuple[tuple[str, ...], Callable[[str], str]]:
    """The profile's result task names, and the task a folded stack is counted in (each stack matched once)."""
    from profiler.matching.matcher import Matcher

    profile = parse_profile(profile_text, profile_source)
    task_names = tuple(profile.result_task_names)
    matcher = Matcher(profile)
    decided: dict[str, str] = {}

    def task_of(stack: str) -> str:
        task = decided.get(stack)
        if task is None:
            task = decided[stack] = task_names[matcher.classify(stack)[0]]
        return task

    return task_names, task_of


def _append_cut_rows(summary: Path, extra: Sequence[Mapping[str, Any]], cut_columns: Sequence[str]) -> None:
    """Rewrite summary.csv with ``extra`` rows (a cut: stage or vertex) after its rows, the cut's columns
    placed after ``host_state``."""
    from coordinator.analysis.rows import read_summary

    with open_text(summary, newline="") as handle:
        header = next(csv.reader(handle))
    at = header.index("host_state") + 1
    columns = (*header[:at], *cut_columns, *header[at:])
    atomic_write_text(summary, format_result_csv([*read_summary(summary), *extra], columns))


def _add_stage_rows(summary: Path, runs: Sequence[RunInput], profile_text: str, profile_source: str) -> None:
    """Rewrite summary.csv with the runs' Spark stage rows after its other rows (in this process: the
    samples with a thread context are few next to the stacks, and each stack is decided once)."""
    from coordinator.analysis.stages import STAGE_COLUMNS, read_pid_stages, read_spark_index, stage_rows

    profile = parse_profile(profile_text, profile_source)
    decider = TaskDecider(Matcher(profile))
    extra = []
    label_names = label_columns(runs)
    for run in sorted(runs, key=lambda r: r.run):
        rows = stage_rows(run.run, profile.result_task_names, read_pid_stages(run, decider), read_spark_index(run))
        labels = {label_names[key]: value for key, value in run.labels.items()}
        extra += [{**row, **labels} for row in rows]
    _append_cut_rows(summary, extra, STAGE_COLUMNS)


def _add_vertex_rows(summary: Path, runs: Sequence[RunInput], profile_text: str, profile_source: str) -> None:
    """Rewrite summary.csv with the runs' Flink vertex and subtask rows after its other rows (in this
    process, as the stage rows: both engines give the same file)."""
    from coordinator.analysis.flinkdraft import flink_vertices_of
    from coordinator.analysis.vertices import (
        VERTEX_COLUMNS,
        ChainOperators,
        placement_of,
        read_pid_vertices,
        vertex_rows,
    )

    _task_names, task_of = _task_classifier(profile_text, profile_source)
    matcher = Matcher(parse_profile(profile_text, profile_source))
    extra = []
    label_names = label_columns(runs)
    for run in sorted(runs, key=lambda r: r.run):
        chains = sorted({v.name for v in flink_vertices_of(run)})
        pids = read_pid_vertices(run, chains, matcher)
        stacks: Counter[str] = Counter()
        for pid in pids:
            for by_stack in pid.subtasks.values():
                stacks.update(by_stack)
        chains = chains or sorted({thread.chain for pid in pids for thread in pid.subtasks})
        rows = vertex_rows(run.run, pids, placement_of(_flink_subtasks(run)), task_of, ChainOperators(stacks, chains))
        labels = {label_names[key]: value for key, value in run.labels.items()}
        extra += [{**row, **labels} for row in rows]
    _append_cut_rows(summary, extra, VERTEX_COLUMNS)


def _flink_subtasks(run: RunInput) -> list[FlinkSubtask]:
    from profiler.capture.read import read_flink_placement

    return [s for host in run.hosts if host.capture_dir is not None for s in read_flink_placement(host.capture_dir)[0]]


def _check_engine_of_cut(by: str, runs: Sequence[RunInput]) -> None:
    """--by stage is for Spark runs, --by vertex for Flink runs: one line naming the other option."""
    from coordinator.analysis.flinkdraft import flink_vertices_of

    for run in runs:
        flink = bool(flink_vertices_of(run)) or any(pid.process.engine == "flink" for pid in run.pids)
        if by == "stage" and flink:
            raise ConfigError(f"--by stage: {run.run} is a Flink run (no Spark stages); use --by vertex")
        if by == "vertex" and not flink:
                raise ConfigError(
                f"--by vertex: {run.run} is not a Flink run (no flink.json, no Flink process); for Spark use --by stage"
            )


def stacks_bytes(runs: Sequence[RunInput]) -> int:
    """Total size of the folded stack files an analysis would read."""
    total = 0
    for run in runs:
        for pid in run.pids:
            if pid.stacks is not None:
                try:
                    total += pid.stacks.stat().st_size
                except OSError:
                    pass
    return total


def choose_engine(engine: str, master: str, runs: Sequence[RunInput]) -> str:
    """ "spark" or "in-process": auto picks in-process for a local master and small inputs."""
    if engine not in ENGINES:
        raise ConfigError(f"engine {engine!r}: use one of {', '.join(ENGINES)}")
    if engine != "auto":
        return engine
    if master.startswith("local") and stacks_bytes(runs) <= IN_PROCESS_MAX_BYTES:
        return "in-process"
    return "spark"


def analyze(
    run_dirs: Sequence[Path],
    out_dir: Path | None = None,
    profile: Path | None = None,
    master: str = "local[*]",
    labels: Mapping[str, str] | None = None,
    *,
    spark: SparkSession | None = None,
    engine: str = "auto",
    window: SubWindow | None = None,
    by: str | None = None,
) -> AnalysisOutput:
    """Analyse run directories (or bare host captures) with ``profile`` (default: the runs' own
    copy) on Spark; writes summary.csv, tasks/<task>.folded, unmatched.folded and analysis.json to
    ``out_dir`` (default: the run directory when one run is given). The raw captures are only read.

    ``spark``: an existing session to use (it is left running); otherwise one is started on
    ``master`` and stopped at the end. ``engine``: "spark", "in-process" (same code and output,
    no JVM) or "auto": Spark when a session is handed in, else in-process for a local master and at
    most IN_PROCESS_MAX_BYTES of stacks. ``window``: restrict every capture to the intervals
    overlapping ``--from``/``--to`` (analysis.json records which); a capture without a timeline
    is a ConfigError before any stack is read. ``by="stage"``: summary.csv gains Spark stage rows
    (coordinator/analysis/stages.py), ``by="vertex"`` Flink vertex and subtask rows
    (coordinator/analysis/vertices.py); both over the sub-window too, on-CPU and off-CPU columns.
    """
    if not run_dirs:
        raise ConfigError("no run directory given; pass at least one RUN_DIR")
    if by not in (None, "stage", "vertex"):
        raise ConfigError(f"--by {by!r}: only 'stage' (Spark stages) and 'vertex' (Flink vertices) are known")
    runs = read_inputs([Path(p) for p in run_dirs], labels, window)
    if by is not None:
        _check_engine_of_cut(by, runs)
    profile_text, profile_source = resolve_profile_text(runs, profile)
    parse_profile(profile_text, profile_source)  # a bad profile fails before Spark starts
    target = Path(out_dir) if out_dir is not None else _default_out_dir(runs)
    _check_out_dir(target, runs)
    started = time.monotonic()
    session_seconds = 0.0
    if engine == "auto" and spark is not None:
        engine = "spark"  # a session handed in is meant to be used
    job = AnalysisJob(runs, profile_text, profile_source, target, master, window)
    if choose_engine(engine, master, runs) == "in-process":
        distinct, samples = run_analysis_in_process(job)
    elif spark is None:
        with spark_session(master) as session:
            session_seconds = time.monotonic() - started
            distinct, samples = run_analysis(session, job)
    else:
        distinct, samples = run_analysis(spark, job)
    if not (target / RUN_FILE).is_file():
        mark_output_dir(target, "coordinator analyze")
    if by == "stage":
        _add_stage_rows(target / SUMMARY_FILE, runs, profile_text, profile_source)
    elif by == "vertex":
        _add_vertex_rows(target / SUMMARY_FILE, runs, profile_text, profile_source)
    job_seconds = time.monotonic() - started - session_seconds
    stats = AnalysisStats(
        runs=len(runs),
        hosts=sum(len(r.hosts) for r in runs),
        pids=sum(len(r.pids) for r in runs),
        samples=samples,
        distinct_stacks=distinct,
        session_seconds=session_seconds,
        job_seconds=job_seconds,
    )
    return AnalysisOutput(
        summary_csv=target / SUMMARY_FILE,
        unmatched_file=target / UNMATCHED_FILE,
        out_dir=target,
        analysis_json=target / ANALYSIS_FILE,
        stats=stats,
        window_notes=tuple(window_notes(runs)),
    )
