"""The compact stack table (capture format 4): round trip, refusal of damaged files, and the same
analysis as the folded form of the same samples."""

from __future__ import annotations

import gzip
import hashlib
import random
import struct
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from coordinator.analysis.engines import analyze
from coordinator.analysis.timeline import SubWindow
from profiler.capture import format as capture
from profiler.capture import stacktable
from profiler.capture.folded import format_folded, read_folded
from profiler.capture.read import READABLE_VERSIONS, read_contexts, read_meta, read_pid_table, read_timeline
from profiler.capture.stackstore import StackStore
from profiler.capture.stacktable import (
    KERNEL,
    THREAD,
    StackTable,
    StackTableBuilder,
    decode_table,
    encode_table,
    encode_table_parts,
    gzip_parts,
    ordered_folded,
    read_table,
    table_from_folded,
    write_table,
)
from profiler.errors import CaptureFormatError
from profiler.files import atomic
from profiler.matching.matcher import Matcher, match_stacks, match_table
from profiler.symbols.frames import Frame
from profiler.symbols.symbolize import StackFolder, tabulate_store
from tests.fixtures.captures import PidSpec, to_compact, to_folded, write_capture
from tests.fixtures.exports import analysed_task_files

DATA = Path(__file__).resolve().parents[2] / "data"
TASK = "Executor task launch worker for task 0.0 in stage 3.0 (TID 7)"


def sample_table() -> tuple[Counter[str], Counter[tuple[int, str]], Counter[tuple[str, str]]]:
    folded = read_folded(DATA / "spark_executor_real.folded")
    timeline: Counter[tuple[int, str]] = Counter()
    for number, (stack, count) in enumerate(sorted(folded.items())):
        first = count // 2
        timeline[(number % 5, stack)] += first
        timeline[(number % 5 + 1, stack)] += count - first
    stack = max(folded, key=lambda s: folded[s])
    contexts = Counter({(TASK, stack): folded[stack] // 2, ("other task", stack): 1})
    return folded, timeline, contexts


def test_a_table_round_trips_folded_counts_timeline_and_contexts(tmp_path: Path) -> None:
    folded, timeline, contexts = sample_table()
    path = tmp_path / "stacks.tpc"
    write_table(path, table_from_folded(folded, timeline, contexts), atomic.atomic_write_chunks)
    table = read_table(path)
    assert table.folded() == +folded
    assert Counter({(i, s): n for i, s, n in table.timeline_entries()}) == +timeline
    assert table.context_counts() == contexts
    window: Counter[str] = Counter()
    for (interval, stack), count in timeline.items():
        if 2 <= interval <= 3:
            window[stack] += count
    assert table.folded(2, 3) == +window
    # AND the file is much smaller than the folded text of the same samples
    folded_bytes = len(format_folded(folded).encode()) + len(capture.format_timeline(timeline).encode())
    assert path.stat().st_size * 5 < folded_bytes


def test_the_table_is_encoded_and_compressed_in_parts_into_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the sample table, whose bytes main wrote as one joined array compressed at once (digests of
    # encode_table and gzip.compress(..., 6, mtime=0) at aebd5ee)
    table = table_from_folded(*sample_table())
    monkeypatch.setattr(stacktable, "SUFFIX_CHUNK", 97)  # many parts of the suffix array
    # WHEN it is encoded in parts and written through the atomic writer of parts
    parts = list(encode_table_parts(table))
    path = tmp_path / "stacks.tpc"
    write_table(path, table, atomic.atomic_write_chunks)
    # THEN the parts are the same bytes, and so is the file
    raw = b"".join(parts)
    assert len(parts) > 20  # the frame ids come a part at a time
    assert hashlib.sha256(raw).hexdigest()[:16] == "7afa57177b9cf49f"
    assert hashlib.sha256(path.read_bytes()).hexdigest()[:16] == "e16a0081aedc043f"
    assert path.read_bytes() == gzip.compress(encode_table(table), compresslevel=6, mtime=0)


def test_gzip_of_parts_is_gzip_of_their_join_however_they_are_cut() -> None:
    rng = random.Random(29)
    for _ in range(20):
        data = bytes(rng.choice(b"stack\x00\x01") for _ in range(rng.randint(0, 200_000)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 40))))
        parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        assert b"".join(gzip_parts(parts)) == gzip.compress(data, compresslevel=6, mtime=0)


def _tricky_table(rng: random.Random) -> StackTableBuilder:
    """Frames that sort differently alone and joined ('a' < 'a!' but 'a;x' > 'a!x'), one name under two
    kinds (two frame ids, one text), prefixes of other stacks, and many ties in the counts."""
    names = ["a", "a!", "a b", "", "ab", "b", "é", "a\x7f", "Z", "main", "k"]
    builder = StackTableBuilder(timeline=True)
    for _ in range(rng.randint(1, 300)):
        depth = rng.randint(0, 12)
        ids = [builder.frame(rng.choice(["t1", "t2"]), THREAD)]
        ids += [builder.frame(rng.choice(names), rng.choice(["jit", "native", KERNEL])) for _ in range(depth)]
        builder.add(rng.randint(0, 3), builder.stack(tuple(ids)), None, rng.choice([1, 1, 1, 2, 3, 7]))
    return builder


def test_unmatched_lines_from_table_ids_are_format_folded_of_the_merged_texts() -> None:
    rng = random.Random(40)
    for _ in range(40):
        # GIVEN one to three tables (a host's PIDs) and some of each table's stacks
        tables = [_tricky_table(rng).build() for _ in range(rng.randint(1, 3))]
        parts, merged = [], Counter[str]()
        for table in tables:
            counts = table.stack_counts()
            ids = [stack_id for stack_id in counts if rng.random() < 0.8]
            parts.append((table, table.frame_texts(), ids, [counts[i] for i in ids]))
            text = table.stack_text(table.frame_texts())
            for stack_id in ids:
                merged[text(stack_id)] += counts[stack_id]
        # WHEN their lines are ordered from the ids  THEN they are the merged texts' folded file, byte for byte
        assert "".join(ordered_folded(parts)) == format_folded(merged)


def test_unmatched_lines_keep_their_order_past_65536_frame_strings() -> None:
    builder = StackTableBuilder()
    root = builder.frame("t", THREAD)
    for number in range(40_000):  # 80,000 strings to rank: 4-byte ranks
        frame = builder.frame(f"f{number * 7919 % 40_000}", "jit")
        builder.add(0, builder.stack((root, frame, frame) if number % 3 else (root, frame)), None, 1 + number % 2)
    table = builder.build()
    counts = table.stack_counts()
    text = table.stack_text(table.frame_texts())
    merged = Counter({text(stack_id): count for stack_id, count in counts.items()})
    parts = [(table, table.frame_texts(), list(counts), list(counts.values()))]
    assert "".join(ordered_folded(parts)) == format_folded(merged)


def test_frames_are_stored_once_with_kind_and_module() -> None:
    builder = StackTableBuilder()
    root = builder.frame("Executor task launch worker", THREAD)
    run = builder.frame("JavaThread::run", "native", "libjvm.so")
    write = builder.frame("ksys_write", KERNEL)
    for leaf in ("a", "b", "c"):
        builder.add(0, builder.stack((root, run, builder.frame(leaf, "jit"), write)), None, 2)
    table = decode_table(encode_table(builder.build()), "x")
    assert len(table.names) == 6 and table.modules[run] == "libjvm.so" and table.kinds[write] == KERNEL
    assert table.folded() == Counter({f"Executor task launch worker;JavaThread::run;{leaf};ksys_write_[k]": 2
                                      for leaf in "abc"})


def test_built_stacks_sort_and_read_back_as_their_frame_id_tuples() -> None:
    # GIVEN stacks whose ids differ in each byte of a frame id and stacks that are prefixes of others
    stacks = [(0, 256), (0, 255, 7), (0, 65536), (0, 255), (0,), (1 << 24, 0), (0, 1 << 24), (2, 1, 0)]
    builder = StackTableBuilder()  # no frames: building reads stacks as ids only
    for stack in stacks:
        builder.add(0, builder.stack(stack), None, 1)
    # WHEN the table is built, THEN its stacks are in tuple order, read back as tuples, equal to a list
    table = builder.build()
    assert list(table.stacks) == sorted(stacks) and table.stacks[2] == (0, 255, 7)
    assert table.stacks == sorted(stacks) and sorted(stacks) == table.stacks
    assert [builder.stack_frames(builder.stack(stack)) for stack in stacks] == stacks


def rebuilt_clamped(table: StackTable, last: int) -> StackTable:
    """What ``clamped`` gave before it kept the table's stacks: the table rebuilt, every row of a later interval
    added to ``last``."""
    builder = StackTableBuilder(table.timeline)
    builder.adopt_frames(table)
    for interval, stack_id, context_id, count in zip(table.intervals, table.stack_ids, table.context_ids, table.counts):
        context = table.contexts[context_id - 1] if context_id else None
        builder.add(min(interval, last), builder.stack(table.stacks[stack_id]), context, count)
    return builder.build()


@pytest.mark.parametrize("last", [0, 2, 4, 5])
def test_a_clamped_table_is_the_rebuilt_one_and_keeps_the_stacks_it_had(last: int) -> None:
    # GIVEN a table with rows in intervals 0..5, contexts, and stacks spread over several intervals
    folded, timeline, contexts = sample_table()
    table = table_from_folded(folded, timeline, contexts)
    # WHEN its intervals past ``last`` are counted in ``last``
    clamped = table.clamped(last)
    # THEN it equals the table rebuilt that way (rows merged and in order), with no interval past last
    assert clamped == rebuilt_clamped(table, last)
    assert max(clamped.intervals) == min(last, max(table.intervals)) and clamped.samples == table.samples
    # AND its stacks are the table's own object, not a copy (a deep window's stacks are tens of MB)
    assert clamped.stacks is table.stacks and (last < 5 or clamped is table)


def test_the_builder_holds_a_deep_stack_in_about_2_bytes_a_frame() -> None:
    # a deep window's ~27 k stacks of ~490 frames were ~13 M tuple references (8 bytes each) in the post-run,
    # then 4 bytes a frame id; below 65,536 frames an id takes 2
    builder = StackTableBuilder()
    frames = [builder.frame(f"f{i}", "jit") for i in range(2000)]
    rng = random.Random(41)
    tracemalloc.start()
    stacks = [tuple(rng.choice(frames) for _ in range(490)) for _ in range(500)]
    before = tracemalloc.get_traced_memory()[0]
    for stack in stacks:
        builder.stack(stack)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held < 500 * 490 * 3, held  # tuples: 500 * 490 * 8 bytes and more
    # AND the table built from them reads back the same ids
    assert list(builder.build().stacks) == sorted(stacks)


def test_a_builder_past_65536_frames_widens_its_stacks_and_keeps_their_ids() -> None:
    # GIVEN stacks interned 2 bytes a frame id, then one whose id needs 4
    builder = StackTableBuilder()
    narrow = [(0, 1, 2), (0, 65535), (5,)]
    ids = [builder.stack(stack) for stack in narrow]
    wide = builder.stack((0, 65536, 1))
    # THEN the earlier stacks keep their ids and are found again; all sort and read back as tuples
    assert [builder.stack(stack) for stack in narrow] == ids and wide == 3
    assert [builder.stack_frames(i) for i in ids] == narrow
    for stack in [*narrow, (0, 65536, 1)]:
        builder.add(0, builder.stack(stack), None, 1)
    assert list(builder.build().stacks) == sorted([*narrow, (0, 65536, 1)])


def test_matching_by_frame_ids_gives_the_folded_result() -> None:
    folded, timeline, contexts = sample_table()
    matcher = Matcher(capture_profile())
    by_text = match_stacks(matcher, folded)
    by_ids = match_table(matcher, table_from_folded(folded, timeline, contexts))
    assert by_ids.task_samples == by_text.task_samples
    assert by_ids.multi_task_samples == by_text.multi_task_samples and by_ids.decided_over == by_text.decided_over
    assert by_ids.unmatched == by_text.unmatched
    assert {task: by_ids.task_stacks[task] for task in by_ids.task_stacks} == dict(by_text.task_stacks)


def capture_profile():  # type: ignore[no-untyped-def]
    from profiler.defaults import DEFAULT_PROFILE, data_file
    from profiler.matching.appprofile import load_profile

    return load_profile(data_file(DEFAULT_PROFILE))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda raw: raw[: len(raw) // 2], "truncated or corrupt"),
        (lambda raw: raw[:10] + bytes(b ^ 0xFF for b in raw[10:40]) + raw[40:], "truncated or corrupt"),
        (lambda raw: b"not gzip at all", "truncated or corrupt"),
        (lambda raw: gzip.compress(b"TPSTX" + gzip.decompress(raw)[5:]), "not a stack table"),
        (lambda raw: gzip.compress(gzip.decompress(raw)[:-3]), "cut short"),
        (lambda raw: gzip.compress(gzip.decompress(raw) + b"\0"), "bytes after the last row"),
    ],
)
def test_a_damaged_table_is_one_line_naming_the_file(tmp_path: Path, damage, message) -> None:  # type: ignore[no-untyped-def]
    folded, timeline, contexts = sample_table()
    path = tmp_path / "stacks.tpc"
    write_table(path, table_from_folded(folded, timeline, contexts), atomic.atomic_write_chunks)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CaptureFormatError) as caught:
        read_table(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_hostile_ids_are_refused_before_use() -> None:
    builder = StackTableBuilder()
    builder.add(0, builder.stack((builder.frame("t", THREAD), builder.frame("f", "jit"))), "ctx", 3)
    raw = bytearray(encode_table(builder.build()))
    # the last row's count is the last 8 bytes; its context id the 4 before the rows' stack ids ...
    bad_context = raw[:-12] + struct.pack("<I", 9) + raw[-8:]
    with pytest.raises(CaptureFormatError, match="context the table does not have"):
        decode_table(bytes(bad_context), "x.tpc")
    bad_stack = raw[:-16] + struct.pack("<I", 5) + raw[-12:]
    with pytest.raises(CaptureFormatError, match="stack the table does not have"):
        decode_table(bytes(bad_stack), "x.tpc")


def test_a_newer_table_version_is_refused_with_the_fix() -> None:
    raw = bytearray(encode_table(table_from_folded(Counter({"t;f": 1}))))
    raw[5] = 9
    with pytest.raises(CaptureFormatError, match=r"x.tpc: stack table version 9, this version reads 1; use a matching"):
        decode_table(bytes(raw), "x.tpc")


def test_a_newer_capture_format_is_refused(tmp_path: Path) -> None:
    write_capture(tmp_path, "h1", [PidSpec(100, {"t;f": 1})])
    meta = read_meta(tmp_path)
    text = (tmp_path / capture.META_FILE).read_text().replace(
        f'"format_version": {meta.format_version}', f'"format_version": {capture.FORMAT_VERSION + 1}'
    )
    atomic.atomic_write_text(tmp_path / capture.META_FILE, text)
    newer, readable = capture.FORMAT_VERSION + 1, ", ".join(map(str, READABLE_VERSIONS))
    with pytest.raises(CaptureFormatError, match=f"format_version {newer}, this version reads {readable}"):
        read_meta(tmp_path)


def test_summary_csv_is_identical_from_the_folded_and_the_compact_form(tmp_path: Path) -> None:
    # GIVEN the same samples as a folded capture and as a compact one
    folded, timeline, _contexts = sample_table()
    by_interval: dict[int, dict[str, int]] = {}
    for (interval, stack), count in timeline.items():
        by_interval.setdefault(interval, {})[stack] = count
    specs = [PidSpec(100, {}, cycles=1e9, cpu_seconds=0.5, timeline=by_interval),
             PidSpec(200, {}, cycles=2e8, cpu_seconds=0.1, timeline={0: {"GC Thread#0;GCTaskThread::run": 7}})]
    for form in ("folded", "compact"):
        write_capture(tmp_path / form / "cap", "h1", specs, stack_collection="ringbuf", duration=60.0)
        if form == "compact":
            to_compact(tmp_path / form / "cap")
    assert list((tmp_path / "compact").rglob("stacks.tpc")) and not list((tmp_path / "compact").rglob("*.folded"))
    # WHEN both are analysed (whole window, and a sub-window)
    for form in ("folded", "compact"):
        cap = tmp_path / form / "cap"  # the same run id (the directory's name) in both
        analyze([cap], out_dir=tmp_path / f"{form}-all", engine="in-process")
        analyze([cap], out_dir=tmp_path / f"{form}-sub", engine="in-process", window=SubWindow(10, 30))
    # THEN summary.csv and the task files are byte for byte the same
    for cut in ("all", "sub"):
        folded_out, compact_out = tmp_path / f"folded-{cut}", tmp_path / f"compact-{cut}"
        assert (folded_out / "summary.csv").read_bytes() == (compact_out / "summary.csv").read_bytes()
        assert (folded_out / "unmatched.folded").read_bytes() == (compact_out / "unmatched.folded").read_bytes()
        tasks = analysed_task_files(folded_out)
        assert tasks == analysed_task_files(compact_out) and any(tasks.values())


def test_a_compact_capture_converted_back_to_folded_analyses_the_same(tmp_path: Path) -> None:
    # GIVEN a compact capture with contexts and its folded twin
    folded, timeline, contexts = sample_table()
    by_interval: dict[int, dict[str, int]] = {}
    for (interval, stack), count in timeline.items():
        by_interval.setdefault(interval, {})[stack] = count
    for form in ("compact", "folded"):
        cap = write_capture(tmp_path / form / "cap", "h1", [PidSpec(100, {}, cycles=1e9, timeline=by_interval)],
                            stack_collection="ringbuf", duration=60.0)
        to_compact(cap)
        table = read_pid_table(cap, 100)
        assert table is not None
        builder_table = table_from_folded(table.folded(), Counter(
            {(i, s): n for i, s, n in table.timeline_entries()}), contexts)
        write_table(capture.table_path(cap, 100), builder_table, atomic.atomic_write_chunks)
        if form == "folded":
            to_folded(cap)
    # THEN the folded twin reads back the same contexts and timeline, and analyses to the same bytes
    assert read_contexts(tmp_path / "folded/cap", 100) == read_contexts(tmp_path / "compact/cap", 100)
    assert read_timeline(tmp_path / "folded/cap", 100, 1, 2) == read_timeline(
        tmp_path / "compact/cap", 100, 1, 2)
    for form in ("compact", "folded"):
        analyze([tmp_path / form / "cap"], out_dir=tmp_path / f"{form}-out", engine="in-process")
    assert (tmp_path / "folded-out/summary.csv").read_bytes() == (tmp_path / "compact-out/summary.csv").read_bytes()


def test_profiler_match_reads_a_table_by_its_content_and_a_capture_by_its_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from profiler.cli import main as profiler_main
    from profiler.defaults import DEFAULT_PROFILE, data_file

    folded, timeline, contexts = sample_table()
    (tmp_path / "s.folded").write_text(format_folded(folded), encoding="utf-8")
    write_table(tmp_path / "any-name.bin", table_from_folded(folded, timeline, contexts), atomic.atomic_write_chunks)
    cap = write_capture(tmp_path / "cap", "h1", [PidSpec(100, dict(folded))])
    to_compact(cap)
    outputs = []
    for source in ("s.folded", "any-name.bin", "cap"):
        csv_out = tmp_path / f"{source}.csv"
        assert profiler_main(["match", "--profile", str(data_file(DEFAULT_PROFILE)), str(tmp_path / source),
                              "--csv", str(csv_out)]) == 0
        outputs.append(csv_out.read_text())
    capsys.readouterr()
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].count("\n") > 3


def test_analyze_of_a_cut_table_is_exit_6_and_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from coordinator.cli import main as coordinator_main

    cap = write_capture(tmp_path / "cap", "h1", [PidSpec(100, {"t;f": 3}, cycles=1.0)])
    to_compact(cap)
    table = capture.table_path(cap, 100)
    table.write_bytes(table.read_bytes()[:20])
    assert coordinator_main(["analyze", str(cap), "--out", str(tmp_path / "out")]) == 6
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(table) in err and "truncated or corrupt" in err


class EpochNames:
    """Symbols whose JIT names change with the perf map: address A is ``old`` in epoch 0, ``new`` after."""

    def __init__(self) -> None:
        self.version = "old"

    def resolve(self, addr: int) -> Frame:
        return Frame(f"{self.version}::m{addr >> 12}", "jit") if addr < 0x10000 else Frame("start_thread", "native",
                                                                                         "libc.so.6")

    def set_perf_map(self, perf_map: object) -> None:
        self.version = str(perf_map)

    def close(self) -> None:
        pass


class TwoVersions:
    def map_for(self, epoch: int) -> str:
        return "old" if epoch == 0 else "new"


def test_the_table_names_each_epoch_with_its_perf_map_and_reuses_nothing_stale() -> None:
    # GIVEN one raw stack sampled in two perf-map epochs (its JIT frame renamed between them), in two
    # intervals, with and without a task context, and with a kernel part
    user = struct.pack("<2Q", 0x2000, 0x20000)  # leaf first: a JIT frame, then the thread's start
    kernel = struct.pack("<1Q", 0xFFFF0000)
    store = StackStore(10 * 10**9)
    store.begin(0)
    for time_s, epoch, context in ((1, 0, None), (12, 0, TASK), (25, 1, None), (26, 1, TASK)):
        store.add(7, 7, b"Executor task launch worker", time_s * 10**9, user, kernel, epoch, context=context)
    store.add(7, 7, b"Executor task launch worker", 27 * 10**9, user, -1, 1)

    class Kernel:
        def resolve(self, addr: int) -> str:
            return "ksys_read"

    folder = StackFolder(EpochNames(), Kernel(), 127, True, walker=True)
    # WHEN it is named into a table
    table = tabulate_store(store, 7, folder, TwoVersions(), None)  # type: ignore[arg-type]
    # THEN each epoch's samples carry that epoch's name, kernel parts and contexts stay with their rows
    root = "Executor task launch worker;start_thread"
    assert table.folded() == Counter({f"{root};old::m2;ksys_read_[k]": 2, f"{root};new::m2;ksys_read_[k]": 2,
                                      f"{root};new::m2": 1})
    assert table.context_counts() == Counter({(TASK, f"{root};old::m2;ksys_read_[k]"): 1,
                                              (TASK, f"{root};new::m2;ksys_read_[k]"): 1})
    assert sorted(set(table.intervals)) == [0, 1, 2]
    assert folder.stats_fields["lost_user_stack"] == 0


def test_a_table_within_intervals_keeps_only_their_rows_with_their_contexts() -> None:
    builder = StackTableBuilder()
    stack = builder.stack((builder.frame("Executor task launch worker", "thread"), builder.frame("run", "java")))
    builder.add(0, stack, TASK, 3)
    builder.add(1, stack, TASK, 4)
    builder.add(1, stack, None, 5)
    builder.add(2, stack, "other task", 6)
    table = builder.build()
    cut = table.within(1, 1)
    assert cut.samples == 9 and set(cut.intervals) == {1}
    assert cut.context_counts() == Counter({(TASK, "Executor task launch worker;run"): 4})
    assert table.within(0, 2).context_counts() == table.context_counts() and table.within(3, 9).samples == 0


def test_a_python_frame_kind_is_named_only_in_tables_that_have_one() -> None:
    builder = stacktable.StackTableBuilder()
    frames = [builder.frame("python3.11", stacktable.THREAD), builder.frame("py_split.parse (py_split.py:3)", "python")]
    builder.add(0, builder.stack(frames), None, 5)
    table = builder.build()
    decoded = stacktable.decode_table(stacktable.encode_table(table), "test")
    assert list(decoded.kinds) == list(table.kinds) and "python" in decoded.kinds
    plain = table_from_folded(*sample_table())
    assert b'"python"' not in stacktable.encode_table(plain)
