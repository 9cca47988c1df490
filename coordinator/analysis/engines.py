"""The analysis job: folded stacks of whole archives matched to tasks with the host agent's own
matcher, summed per PID, written as summary.csv and per-task folded stacks.

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

from coordinator.analysis.inputs import PidTaskCounts, RunInput, read_inputs, read_pid_stacks, resolve_profile_text
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
from coordinator.rundir import RUN_FILE
from profiler.capture.format import FlinkSubtask, atomic_write_text, format_result_csv
from profiler.errors import CapabilityError, CaptureFormatError, ConfigError
from profiler.files.outputs import check_output_dir, mark_output_dir
from profiler.files.textinput import open_text
from profiler.matching.appprofile import parse_profile

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

APP_NAME = "taskprof-analyze"
# Output kinds of the matching step (one DataFrame carries all three, so the input is read once).
KIND_STACK = 0  # one distinct stack: its task and its samples over every input
KIND_PID = 1  # samples of one PID in one task (partial sums, added up on the driver)
KIND_ERROR = 2  # an input file that could not be read; ``stack`` holds the message
READ_BATCH_ROWS = 20_000
FILES_PER_SLICE = 16
# Below this much folded text on a local master, the job runs in this process with the same matcher
# and the same row code (byte-identical output) instead of paying ~10 s of JVM start-up: a single run
# is summarised in seconds; Spark is for archives.
IN_PROCESS_MAX_BYTES = 256 * 1024 * 1024
ENGINES = ("auto", "spark", "in-process")

RAW_SCHEMA = "pid_key int, digest binary, stack string, samples long, error string"
MATCHED_SCHEMA = "kind int, pid_key int, task int, stack string, samples long, multi long"


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


# ---------------------------------------------------------------- worker functions (run in Python workers)


def _read_stack_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """(pid_key, path, first, last) rows in, (pid_key, digest, stack, samples, error) rows out: one
    row per distinct stack of each file (of the intervals first..last of a timeline.folded when they
    are set, see read_pid_stacks), keyed by a 128-bit BLAKE2b digest of the stack. The text itself
    travels only with the first occurrence in this partition (the same stacks recur in every
    executor of an archive), so the JVM hashes and shuffles 16-byte keys, not kilobyte strings.
    A file that cannot be read gives one row with an empty digest and ``error`` set."""
    from hashlib import blake2b

    import pyarrow as pa

    from coordinator.analysis.inputs import read_pid_stacks

    rows: list[tuple[int, bytes, str | None, int, str | None]] = []
    digests: dict[str, bytes] = {}

    def flush() -> pa.RecordBatch:
        keys, digest_column, stacks, counts, errors = zip(*rows)
        rows.clear()
        return pa.RecordBatch.from_arrays(
            [
                pa.array(keys, pa.int32()),
                pa.array(digest_column, pa.binary()),
                pa.array(stacks, pa.string()),
                pa.array(counts, pa.int64()),
                pa.array(errors, pa.string()),
            ],
            names=["pid_key", "digest", "stack", "samples", "error"],
        )

    for batch in batches:
        columns = (batch.column(name).to_pylist() for name in ("pid_key", "path", "first", "last"))
        for key, path, first, last in zip(*columns):
            try:
                folded = read_pid_stacks(Path(path), None if first is None else (first, last))
            except CaptureFormatError as exc:
                rows.append((key, b"", None, 0, str(exc)))
                continue
            except OSError as exc:
                rows.append((key, b"", None, 0, f"{path}: cannot read ({exc.strerror or exc}); check the file"))
                continue
            for stack, count in folded.items():
                if count <= 0:
                    continue
                digest = digests.get(stack)
                if digest is None:
                    digest = digests[stack] = blake2b(stack.encode("utf-8"), digest_size=16).digest()
                    rows.append((key, digest, stack, count, None))
                else:
                    rows.append((key, digest, None, count, None))
            if len(rows) >= READ_BATCH_ROWS:
                yield flush()
    if rows:
        yield flush()


def _match_function(profile_broadcast: Any, task_count: int) -> Any:
    """The mapInArrow function of the matching step; the Matcher is built once per partition from
    the broadcast profile text and memoizes per distinct frame."""

    def match_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from profiler.matching.matcher import Matcher

        matcher = Matcher(parse_profile(profile_broadcast.value, "<application profile>"))
        classify = matcher.classify
        names = ["kind", "pid_key", "task", "stack", "samples", "multi"]
        for batch in batches:
            stacks = batch.column("stack").to_pylist()
            totals = batch.column("samples").to_numpy(zero_copy_only=False)
            errors = batch.column("error").to_pylist()
            error_messages = [e for s, e in zip(stacks, errors) if s is None and e is not None]
            if error_messages:
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([KIND_ERROR] * len(error_messages), pa.int32()),
                        pa.array([None] * len(error_messages), pa.int32()),
                        pa.array([None] * len(error_messages), pa.int32()),
                        pa.array(error_messages, pa.string()),
                        pa.array([0] * len(error_messages), pa.int64()),
                        pa.array([0] * len(error_messages), pa.int64()),
                    ],
                    names=names,
                )
            decided = [classify(s) if s is not None else (-1, False) for s in stacks]
            task = np.fromiter((d[0] for d in decided), dtype=np.int64, count=len(decided))
            multi = np.fromiter((d[1] for d in decided), dtype=np.bool_, count=len(decided))
            valid = task >= 0
            # One row per distinct stack (for the per-task folded files).
            stack_rows = int(valid.sum())
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(stack_rows, KIND_STACK, dtype=np.int32)),
                    pa.array([None] * stack_rows, pa.int32()),
                    pa.array(task[valid].astype(np.int32)),
                    pa.array([s for s in stacks if s is not None], pa.string()),
                    pa.array(totals[valid].astype(np.int64)),
                    pa.array(np.where(multi, totals, 0)[valid].astype(np.int64)),
                ],
                names=names,
            )
            # Samples per (PID, task): expand each stack's task over the PIDs that sampled it.
            refs = batch.column("refs")
            lengths = pc.list_value_length(refs).to_numpy(zero_copy_only=False)
            lengths = np.where(valid, np.nan_to_num(lengths.astype(np.float64)), 0).astype(np.int64)
            flat = pc.list_flatten(refs.filter(pa.array(valid)))
            pid_keys = flat.field("pid_key").to_numpy(zero_copy_only=False).astype(np.int64)
            samples = flat.field("samples").to_numpy(zero_copy_only=False).astype(np.int64)
            ref_task = np.repeat(task[valid], lengths[valid])
            ref_multi = np.repeat(multi[valid], lengths[valid])
            combined = pid_keys * (task_count + 1) + ref_task
            unique, inverse = np.unique(combined, return_inverse=True)
            # float64 bincount is exact below 2**53 samples
            sums = np.bincount(inverse, weights=samples, minlength=len(unique)).astype(np.int64)
            multi_sums = np.bincount(inverse, weights=np.where(ref_multi, samples, 0), minlength=len(unique)).astype(
                np.int64
            )
            n = len(unique)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(n, KIND_PID, dtype=np.int32)),
                    pa.array((unique // (task_count + 1)).astype(np.int32)),
                    pa.array((unique % (task_count + 1)).astype(np.int32)),
                    pa.array([None] * n, pa.string()),
                    pa.array(sums),
                    pa.array(multi_sums),
                ],
                names=names,
            )

    return match_batches


# ---------------------------------------------------------------- DataFrame steps


def stack_counts(spark: SparkSession, files: Sequence[tuple[int, str, int | None, int | None]]) -> DataFrame:
    """One row per (PID, distinct stack) of every stacks file (``pid_key, path, first, last``, the
    intervals set for a sub-window): ``pid_key, digest, stack (first occurrence per partition
    only), samples, error``."""
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
    return paths.mapInArrow(_read_stack_files, RAW_SCHEMA)


def match_stacks(stacks: DataFrame, profile_text: str, task_count: int) -> DataFrame:
    """Every distinct stack matched once (the host agent's Matcher), with the PIDs that sampled it
    expanded back into per-(PID, task) sums. Rows of kinds KIND_STACK, KIND_PID and KIND_ERROR."""
    from pyspark.sql import functions as F

    spark = stacks.sparkSession
    profile_broadcast = spark.sparkContext.broadcast(profile_text)
    # Every non-null stack of one digest is the same text, so first() is deterministic here.
    grouped = stacks.groupBy("digest").agg(
        F.first("stack", ignorenulls=True).alias("stack"),
        F.sum("samples").alias("samples"),
        F.collect_list(F.struct("pid_key", "samples")).alias("refs"),
        F.min("error").alias("error"),
    )
    return grouped.mapInArrow(_match_function(profile_broadcast, task_count), MATCHED_SCHEMA)


def pid_counts(matched: DataFrame, task_names: Sequence[str]) -> tuple[dict[int, PidTaskCounts], list[str]]:
    """Samples per (PID, task) and the read errors, collected to the driver (small)."""
    from pyspark.sql import functions as F

    summed = (
        matched.filter(F.col("kind") != KIND_STACK)
        .groupBy("kind", "pid_key", "task", "stack")
        .agg(F.sum("samples").alias("samples"), F.sum("multi").alias("multi"))
        .collect()
    )
    errors = sorted(str(row["stack"]) for row in summed if row["kind"] == KIND_ERROR)
    samples: dict[int, dict[str, int]] = {}
    multi: dict[int, dict[str, int]] = {}
    for row in summed:
        if row["kind"] != KIND_PID:
            continue
        task = task_names[row["task"]]
        samples.setdefault(row["pid_key"], {})[task] = int(row["samples"])
        multi.setdefault(row["pid_key"], {})[task] = int(row["multi"])
    return {key: PidTaskCounts(samples[key], multi.get(key, {})) for key in samples}, errors


def stack_totals(matched: DataFrame) -> tuple[int, int]:
    """(distinct stacks, samples) over all inputs."""
    from pyspark.sql import functions as F

    row = matched.filter(F.col("kind") == KIND_STACK).agg(F.count("*"), F.sum("samples")).collect()[0]
    return int(row[0]), int(row[1] or 0)


def sorted_unmatched_stacks(matched: DataFrame, unmatched: int) -> Iterator[tuple[str, int]]:
    """(stack, samples) of the stacks no task matched (task index ``unmatched``), most samples first,
    ties by stack text (Spark orders strings by UTF-8 bytes, the same as Python's code-point order).
    Only these come back to the driver: the tasks' stacks stay in the captures (the report and
    `coordinator export` derive them)."""
    from pyspark.sql import functions as F

    ordered = (
        matched.filter((F.col("kind") == KIND_STACK) & (F.col("task") == unmatched))
        .select("stack", "samples")
        .orderBy(F.col("samples").desc(), F.col("stack").asc())
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


def run_analysis(
    spark: SparkSession,
    runs: Sequence[RunInput],
    profile_text: str,
    profile_source: str,
    out_dir: Path,
    master: str,
    window: SubWindow | None = None,
) -> tuple[int, int]:
    """The job on an existing session: read, match, sum, write. Returns (distinct stacks, samples)."""
    _quiet_pyspark_warnings()
    profile = parse_profile(profile_text, profile_source)
    task_names = profile.result_task_names
    files = _stack_files(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".analysis-", dir=out_dir))
    try:
        file_names = task_file_names(profile.task_names)
        counts: dict[int, PidTaskCounts] = {}
        distinct = samples = 0
        if files:
            matched = match_stacks(stack_counts(spark, files), profile_text, len(profile.task_names))
            from pyspark import StorageLevel

            matched.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                counts, errors = pid_counts(matched, task_names)
                if errors:
                    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                    raise CaptureFormatError(errors[0] + more)
                distinct, samples = stack_totals(matched)
                _write_unmatched(scratch / UNMATCHED_FILE, sorted_unmatched_stacks(matched, len(profile.task_names)))
            finally:
                matched.unpersist()
        else:
            _write_unmatched(scratch / UNMATCHED_FILE, ())
        _write_summary(
            scratch, out_dir, runs, task_names, counts, profile_text, profile_source, file_names, master, window
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return distinct, samples


def _write_summary(
    scratch: Path,
    out_dir: Path,
    runs: Sequence[RunInput],
    task_names: Sequence[str],
    counts: Mapping[int, PidTaskCounts],
    profile_text: str,
    profile_source: str,
    file_names: Mapping[str, str],
    master: str,
    window: SubWindow | None,
) -> None:
    """summary.csv and analysis.json beside unmatched.folded in ``scratch``, then all moved into place
    (the tasks/ directory of an analysis before issue 29 goes: it held copies of the captures' stacks)."""
    ordered_runs = sorted(runs, key=lambda r: r.run)  # input order must not change the output
    from profiler.matching.matcher import Matcher

    matcher = Matcher(parse_profile(profile_text, "<application profile>"))  # off-CPU time's tasks
    rows = [row for run in ordered_runs for row in run_rows(run, task_names, counts, matcher)]
    atomic_write_text(scratch / SUMMARY_FILE, format_summary(rows, label_columns(runs)))
    atomic_write_text(
        scratch / ANALYSIS_FILE,
        analysis_record(runs, profile_text, profile_source, file_names, master, window),
    )
    if (out_dir / TASKS_DIR).is_dir():
        shutil.rmtree(out_dir / TASKS_DIR)
    for name in (UNMATCHED_FILE, ANALYSIS_FILE, SUMMARY_FILE):
        os.replace(scratch / name, out_dir / name)


def run_analysis_in_process(
    runs: Sequence[RunInput],
    profile_text: str,
    profile_source: str,
    out_dir: Path,
    master: str,
    window: SubWindow | None = None,
) -> tuple[int, int]:
    """The same job as run_analysis without Spark, for inputs small enough for one process: every
    distinct stack matched once by the same Matcher, the same sums, files and ordering."""
    from profiler.matching.matcher import Matcher

    profile = parse_profile(profile_text, profile_source)
    task_names = profile.result_task_names
    matcher = Matcher(profile)
    decided: dict[str, tuple[int, bool]] = {}
    unmatched: Counter[str] = Counter()
    unmatched_index = len(profile.task_names)
    total = 0
    counts: dict[int, PidTaskCounts] = {}
    for run in runs:
        for pid in run.pids:
            if pid.stacks is None:
                continue
            try:
                folded = read_pid_stacks(pid.stacks, pid.intervals)
            except OSError as exc:
                raise CaptureFormatError(f"{pid.stacks}: cannot read ({exc.strerror or exc}); check the file") from None
            samples: dict[str, int] = {}
            multi: dict[str, int] = {}
            for stack, count in folded.items():
                if count <= 0:
                    continue
                verdict = decided.get(stack)
                if verdict is None:
                    verdict = decided[stack] = matcher.classify(stack)
                index, is_multi = verdict
                task = task_names[index]
                samples[task] = samples.get(task, 0) + count
                multi[task] = multi.get(task, 0) + (count if is_multi else 0)
                total += count
                if index == unmatched_index:
                    unmatched[stack] += count
            if samples:
                counts[pid.key] = PidTaskCounts(samples, multi)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".analysis-", dir=out_dir))
    try:
        file_names = task_file_names(profile.task_names)
        _write_unmatched(scratch / UNMATCHED_FILE, sorted(unmatched.items(), key=lambda item: (-item[1], item[0])))
        _write_summary(
            scratch, out_dir, runs, task_names, counts, profile_text, profile_source, file_names, master, window
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return len(decided), total


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
    """Rewrite summary.csv with the runs' Spark stage rows after its other rows (in this process:
    contexts.json files are small next to the stacks, and each stack is matched once)."""
    from coordinator.analysis.stages import STAGE_COLUMNS, read_pid_stages, read_spark_index, stage_rows

    task_names, task_of = _task_classifier(profile_text, profile_source)
    extra = []
    label_names = label_columns(runs)
    for run in sorted(runs, key=lambda r: r.run):
        rows = stage_rows(run.run, task_names, read_pid_stages(run, task_of), read_spark_index(run))
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
    extra = []
    label_names = label_columns(runs)
    for run in sorted(runs, key=lambda r: r.run):
        chains = sorted({v.name for v in flink_vertices_of(run)})
        pids = read_pid_vertices(run, chains)
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
    from profiler.capture.format import read_flink_placement

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
    (coordinator/analysis/vertices.py); whole window only.
    """
    if not run_dirs:
        raise ConfigError("no run directory given; pass at least one RUN_DIR")
    if by not in (None, "stage", "vertex"):
        raise ConfigError(f"--by {by!r}: only 'stage' (Spark stages) and 'vertex' (Flink vertices) are known")
    if by is not None and window is not None and window.requested:
        raise ConfigError(f"--by {by} covers the whole window (thread contexts have no timeline); drop --from/--to")
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
    if choose_engine(engine, master, runs) == "in-process":
        distinct, samples = run_analysis_in_process(runs, profile_text, profile_source, target, master, window)
    elif spark is None:
        with spark_session(master) as session:
            session_seconds = time.monotonic() - started
            distinct, samples = run_analysis(session, runs, profile_text, profile_source, target, master, window)
    else:
        distinct, samples = run_analysis(spark, runs, profile_text, profile_source, target, master, window)
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
