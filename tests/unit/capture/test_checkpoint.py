"""The checkpoint journal (round trip, torn tail, corrupted record, empty), the ELF symbol reader, and
`profiler recover` on a journal written by the real writer for a process that never existed."""

from __future__ import annotations

import ctypes
import struct
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from profiler.capture import format as capture
from profiler.capture.checkpoint import CheckpointWriter, checkpoint_dir, executable_maps, journal_path
from profiler.capture.folded import format_folded
from profiler.capture.format import CounterValue, PidCounters, ProcessInfo
from profiler.capture.journal import Checkpoint, JournalError, encode_checkpoint, encode_header, read_journal
from profiler.capture.read import (
    read_capture,
    read_counters,
    read_meta,
    read_overhead,
    read_sampler_stats,
    read_scope,
    read_stack_counts,
)
from profiler.capture.stackstore import SamplerCheckpoint, StackStore, StoreDelta
from profiler.capture.timeline import CounterReading
from profiler.cli import main as profiler_main
from profiler.errors import CaptureFormatError
from profiler.matching.appprofile import parse_profile
from profiler.run.recovery import load_replayed, recover_capture, replay
from profiler.run.runner import Components, Runner
from profiler.symbols.elfsyms import OfflineSymbols, demangle, parse_maps, read_elf_symbols, symbols_of_file
from profiler.symbols.frames import Frame
from tests.unit.run.test_runner import PROFILE_TEXT, FakeSampler, make

GONE_PID = 4_000_000  # above pid_max: never a live process


def addrs(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def filled_store() -> StackStore:
    store = StackStore(int(1e9))
    store.track_deltas = True
    store.begin(0)
    return store


def entries(store: StackStore, pid: int) -> Counter[tuple[object, ...]]:
    found: Counter[tuple[object, ...]] = Counter()
    for key, interval, context, count in store.context_entries(pid):
        flat = (key.tgid, key.comm, bytes(b"".join(key.user)) if isinstance(key.user, tuple) else key.user)
        found[(*flat, key.kernel, key.walk_end, interval, context)] += count
    return found


def two_checkpoints() -> tuple[StackStore, bytes, list[bytes]]:
    """A store fed in two rounds, and its journal: header, then one checkpoint per round."""
    store = filled_store()
    store.add(7, 70, b"worker", 100, addrs(0x1000, 0x2000), -1, context="task 1")
    store.add(7, 71, b"worker", 200, addrs(0x1000, 0x2000), addrs(0xFFFF0000), epoch=1)
    deep = addrs(*range(0x5000, 0x5000 + 8 * 70, 8))  # chunked in the store
    store.add(8, 80, b"main", 1_500_000_000, deep, -14, walk_end=2)
    first = encode_checkpoint(Checkpoint(1.0, store.take_delta(), {"processes": []}))
    store.add(7, 70, b"worker", 2_100_000_000, addrs(0x1000, 0x2000), -1, context="task 1")
    store.add(7, 70, b"worker", 2_200_000_000, addrs(0x3000), -1, context="task 2")
    second = encode_checkpoint(Checkpoint(2.0, store.take_delta(), {"processes": []}))
    return store, encode_header({"interval": 1.0}), [first, second]


def test_journal_round_trip_rebuilds_the_store() -> None:
    store, header, records = two_checkpoints()
    journal = read_journal(header + b"".join(records))
    assert journal.damage is None and len(journal.checkpoints) == 2
    replayed = replay(journal)
    assert replayed.time == 2.0 and replayed.store.samples == store.samples == 5
    for pid in (7, 8):
        assert entries(replayed.store, pid) == entries(store, pid)


def test_a_delta_after_the_first_holds_only_what_changed() -> None:
    store, _header, _records = two_checkpoints()
    assert store.take_delta() == StoreDelta()
    store.add(7, 70, b"worker", 2_300_000_000, addrs(0x3000), -1, context="task 2")
    delta = store.take_delta()
    assert delta.keys == () and delta.contexts == () and delta.samples == 1


def test_a_torn_tail_is_dropped_and_said() -> None:
    _store, header, (first, second) = two_checkpoints()
    for cut in (1, len(second) // 2, len(second) - 1):
        journal = read_journal(header + first + second[:cut])
        assert len(journal.checkpoints) == 1 and journal.damage is not None and "torn" in journal.damage


def test_a_corrupted_record_ends_the_journal_there() -> None:
    _store, header, (first, second) = two_checkpoints()
    damaged = bytearray(first)
    damaged[len(damaged) // 2] ^= 0xFF
    journal = read_journal(header + bytes(damaged) + second)
    assert journal.checkpoints == () and journal.damage is not None and "checksum" in journal.damage
    journal = read_journal(header + first + b"garbage!" * 4 + second)
    assert len(journal.checkpoints) == 1 and "damaged record header" in (journal.damage or "")


def test_an_empty_or_headless_journal_is_refused() -> None:
    with pytest.raises(JournalError, match="empty"):
        read_journal(b"")
    _store, _header, (first, _second) = two_checkpoints()
    with pytest.raises(JournalError, match="not a header"):
        read_journal(first)


def test_a_journal_error_is_one_line_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal_path(tmp_path).parent.mkdir()
    journal_path(tmp_path).write_bytes(b"")
    with pytest.raises(CaptureFormatError, match=r"journal.tpj: empty journal"):
        load_replayed(tmp_path)
    journal_path(tmp_path).write_bytes(encode_header({}))
    with pytest.raises(CaptureFormatError, match="no whole checkpoint.*shorter --checkpoint"):
        load_replayed(tmp_path)
    assert profiler_main(["recover", str(tmp_path)]) == CaptureFormatError.exit_code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "journal.tpj" in err and "Traceback" not in err
    missing = tmp_path / "other"
    missing.mkdir()
    with pytest.raises(CaptureFormatError, match="no checkpoint journal"):
        load_replayed(missing)


# ---------------------------------------------------------------- ELF symbols


def libc_function(name: str) -> tuple[int, str]:
    """The address of a libc function in this process, and this process's executable maps."""
    address = ctypes.cast(getattr(ctypes.CDLL("libc.so.6"), name), ctypes.c_void_p).value
    assert address is not None
    return address, executable_maps(Path("/proc/self/maps").read_text())


def test_elf_symbols_name_a_libc_function_from_saved_maps() -> None:
    address, maps = libc_function("getpid")
    symbols = OfflineSymbols(maps)
    frame = symbols.resolve(address + 1)
    assert frame.kind == "native" and frame.name.lstrip("_") in ("getpid", "GI_getpid", "GI___getpid"), frame
    assert symbols.resolve(0x10).name == "[unknown]"


def test_elf_reader_on_bytes_and_junk() -> None:
    libc = next(m.path for m in parse_maps(Path("/proc/self/maps").read_text()) if "libc.so" in m.path)
    image = Path(libc).read_bytes()
    parsed = read_elf_symbols(lambda offset, size: image[offset : offset + size])
    assert parsed == symbols_of_file(libc) and len(parsed.starts) > 1000
    with pytest.raises(ValueError, match="not an ELF"):
        read_elf_symbols(lambda offset, size: b"junk"[offset : offset + size])


def test_a_saved_library_path_through_a_link_planted_since_is_not_read(tmp_path: Path) -> None:
    # GIVEN a saved mapping's path whose directory is now a link (to a root-only file's directory, say)
    libc = Path(next(m.path for m in parse_maps(Path("/proc/self/maps").read_text()) if "libc.so" in m.path))
    (tmp_path / "lib").symlink_to(libc.parent)
    symbols_of_file.cache_clear()
    # THEN recovery reads nothing through it (the kernel gave us the path resolved: a link is new), nor a
    # relative path, while the real path still reads
    assert symbols_of_file(str(tmp_path / "lib" / libc.name)) is None
    assert symbols_of_file(libc.name) is None
    assert symbols_of_file(str(libc)) is not None


def test_demangle_reads_as_bcc_does() -> None:
    assert demangle("_ZN10JavaThread3runEv") == "JavaThread::run()"
    assert demangle("start_thread") == "start_thread"
    assert demangle("_Znot-a-name") == "_Znot-a-name"


# ---------------------------------------------------------------- recover on a written journal


class FakeKernel:
    def resolve(self, addr: int) -> str:
        return f"kfunc_{addr:x}"


def write_journal(out: Path, maps: str, address: int) -> None:
    """What a run sampling GONE_PID for two checkpoints writes (the real writer, fake contents)."""
    now = time.time()
    process = ProcessInfo(GONE_PID, "workload", "spark", "executor", "root", "java", now - 5, now - 5)
    counters = PidCounters(GONE_PID, {"cycles": CounterValue(2e9, True, 1, 1)}, 2e9, False, cpu_seconds=1.0)
    store = filled_store()
    writer = CheckpointWriter(checkpoint_dir(out))
    writer.begin({"host": "node9", "start_time": now - 5, "duration": 60.0, "interval": 1.0,
                  "profile_text": "Getpid: getpid\n", "checkpoint": 2.0, "stack_walk": "kernel"})  # fmt: skip
    writer._maps_pending[GONE_PID] = (None, maps)  # as note_process() saves a live process's maps
    for round_ in range(2):
        for _ in range(10 + round_):
            store.add(GONE_PID, 1, b"Executor task launch worker", round_ * 1_000_000_000, addrs(address + 1), -1)
        taken = SamplerCheckpoint(store.take_delta(), 0, {GONE_PID: 0}, {})
        readings = {GONE_PID: [CounterReading(round_, 1e9 * (round_ + 1), None, 0.5 * (round_ + 1))]}
        writer.write(taken, [process], {GONE_PID: counters}, readings, ["a warning"], "hardware", when=now - 3 + round_)
    writer.close()
    assert writer.cost.count == 2 and writer.cost.bytes > 0


def test_recover_writes_a_capture_marked_recovered(tmp_path: Path) -> None:
    # GIVEN the journal of a run killed after two checkpoints, its process gone
    address, maps = libc_function("getpid")
    write_journal(tmp_path, maps, address)
    # WHEN it is recovered
    result = recover_capture(tmp_path, kernel=FakeKernel)
    # THEN an ordinary capture holds every sample, named offline, marked as recovered
    assert result.samples == 21 and result.checkpoints == 2 and result.symbolized == {GONE_PID: "offline"}
    loaded = read_capture(tmp_path)
    meta = loaded.meta
    assert meta.host == "node9" and meta.stopped_by == "recovered" and meta.end_time == pytest.approx(result.end_time)
    assert any(w.startswith("recovered from checkpoint 2") and "samples after it are lost" in w for w in meta.warnings)
    assert "a warning" in meta.warnings and meta.cycles_source == "hardware"
    folded = format_folded(read_stack_counts(capture.table_path(tmp_path, GONE_PID)))
    assert "getpid" in folded and folded.rstrip().endswith(" 21")
    assert read_sampler_stats(tmp_path, GONE_PID).samples == 21  # type: ignore[union-attr]
    rows = (tmp_path / capture.result_file_name("node9")).read_text()
    assert "Getpid" in rows
    # AND a second recovery refuses to overwrite it
    with pytest.raises(Exception, match="already holds a capture"):
        recover_capture(tmp_path, kernel=FakeKernel)


def test_recover_command_keeps_what_the_torn_tail_did_not_reach(tmp_path: Path) -> None:
    address, maps = libc_function("getpid")
    write_journal(tmp_path, maps, address)
    path = journal_path(tmp_path)
    path.write_bytes(path.read_bytes()[:-7])  # killed in the middle of the second checkpoint
    assert profiler_main(["recover", str(tmp_path), "--quiet"]) == 0
    meta = read_meta(tmp_path)
    assert any("journal's tail was unreadable" in w for w in meta.warnings)
    assert read_sampler_stats(tmp_path, GONE_PID).samples == 10  # type: ignore[union-attr]
    assert not checkpoint_dir(tmp_path).exists()


# ---------------------------------------------------------------- the runner's checkpoints (fake components)


class JournalSampler(FakeSampler):
    """FakeSampler whose "reader thread" files 5 samples of pid 101 into a real store before each checkpoint."""

    def __init__(self) -> None:
        super().__init__({101: Counter({"main;run;burnAlpha": 3})})
        self.store = filled_store()

    def checkpoint(self) -> SamplerCheckpoint:  # type: ignore[override]
        for _ in range(5):
            self.store.add(101, 1, b"main", 0, addrs(0x1000, 0x2000), -1)
        return SamplerCheckpoint(self.store.take_delta(), 0, {101: 0}, {})


class NamedFrames:
    def resolve(self, addr: int) -> Frame:
        return Frame({0x1000: "burnAlpha", 0x2000: "run"}.get(addr, "[unknown]"), "native")

    def set_perf_map(self, perf_map: object) -> None:
        return None

    def close(self) -> None:
        return None


def runner_with_checkpoints(tmp_path: Path, duration: float) -> tuple[Runner, Components, Path]:
    runner, components, out = make(tmp_path, duration=duration)
    components.sampler = JournalSampler()
    runner.options = replace(runner.options, checkpoint=0.5)
    return runner, components, out


def test_the_runner_checkpoints_on_its_ticks_and_drops_the_journal_once_the_capture_is_written(
    tmp_path: Path,
) -> None:
    runner, _components, out = runner_with_checkpoints(tmp_path, 1.6)
    runner.run(parse_profile(PROFILE_TEXT))
    overhead = read_overhead(out)
    assert overhead is not None and 2 <= overhead.checkpoints <= 4 and overhead.checkpoint_bytes > 0
    assert not checkpoint_dir(out).exists()


def test_the_heap_freed_by_each_checkpoint_and_each_batch_is_given_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import profiler.run.window as window_module

    # GIVEN a window with checkpoints and ticks (a native-name batch on each), glibc's trims counted
    trims: list[str] = []
    monkeypatch.setattr(window_module, "release_freed_memory", lambda: trims.append("trim"))
    runner, _components, out = runner_with_checkpoints(tmp_path, 1.6)
    # WHEN it runs
    runner.run(parse_profile(PROFILE_TEXT))
    # THEN the heap was trimmed once before the window, then after each batch and after each checkpoint
    overhead = read_overhead(out)
    assert overhead is not None and overhead.checkpoints >= 2 and overhead.name_batches >= 1
    assert len(trims) == 1 + overhead.name_batches + overhead.checkpoints


def test_a_window_cut_short_is_recovered_up_to_its_last_checkpoint(tmp_path: Path) -> None:
    # GIVEN the window ran (checkpoints on the runner's ticks) but the capture was never written: a kill
    runner, components, out = runner_with_checkpoints(tmp_path, 1.6)
    runner._window(components)
    taken = runner.journal.cost.count if runner.journal is not None else 0
    assert taken >= 2 and not (out / capture.META_FILE).exists()
    # WHEN it is recovered
    result = recover_capture(out, kernel=FakeKernel, symbols=lambda pid, saved: (NamedFrames(), "offline"))
    # THEN every sample filed before the last checkpoint is there, matched, with the scope and counters
    assert result.samples == 5 * taken and result.checkpoints == taken
    assert format_folded(read_stack_counts(capture.table_path(out, 101))) == f"main;run;burnAlpha {5 * taken}\n"
    assert {p.pid for p in read_scope(out)} == {101, 102, 200}
    assert read_counters(out, 101) is not None
    rows = (out / "h1_result.csv").read_text()
    assert f"101,workload,spark,Alpha,{5 * taken}," in rows


def test_a_hostile_journal_names_no_file_outside_its_directory(tmp_path: Path) -> None:
    # GIVEN a journal whose host label and perf-map copy name try to leave the directory
    _store, _header, (first, _second) = two_checkpoints()
    journal_path(tmp_path).parent.mkdir()
    journal_path(tmp_path).write_bytes(encode_header({"host": "../../evil"}) + first)
    with pytest.raises(CaptureFormatError, match="not a safe directory name"):
        load_replayed(tmp_path)
    state = {"perf_maps": {"7": [[1, "../../../etc/shadow"], [2, "perf-7-1.map"]]}}
    hostile = encode_checkpoint(Checkpoint(1.0, StoreDelta(), state))
    replayed = replay(read_journal(encode_header({}) + hostile))
    assert replayed.perf_maps == {7: [(1, None), (2, "perf-7-1.map")]}
    bad_pid = {"processes": [{"pid": "../../x", "role": "workload", "engine": "e", "kind": "k", "user": "u",
                              "cmdline": "c", "first_seen": 0, "last_seen": 0}]}  # fmt: skip
    with pytest.raises(ValueError, match="no valid pid"):
        replay(read_journal(encode_header({}) + encode_checkpoint(Checkpoint(1.0, StoreDelta(), bad_pid))))
