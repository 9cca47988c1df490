"""Generations of Java method names (profiler/unwind/hotspot.py): an address freed by one class and reused by
the next names each class's samples right, and nothing is named from a generation that is over."""

from __future__ import annotations

import json
import struct
from collections import Counter
from types import SimpleNamespace

import pytest

from profiler.capture.format import SamplerStats
from profiler.capture.stackstore import INTERPRETED_TAG, NO_UNLOADS, StackStore, join_epoch, split_epoch
from profiler.symbols.frames import Frame
from profiler.symbols.symbolize import StackFolder, tabulate_store
from profiler.unwind.codecache import COMPILE_ID_SHIFT, COMPILED_TAG
from profiler.unwind.hotspot import LATE, REUSED, JvmNames, MethodNamer
from profiler.unwind.recorded import NOT_SAVED, RecordedNames

X, Y = 0x7000, 0x7100  # two Method* addresses


class Metaspace:
    """What the JVM's memory says each Method* is right now (the test reuses addresses at will)."""

    def __init__(self) -> None:
        self.methods = {X: "a.Alpha::spin", Y: "a.Alpha::other"}


class FakeNamer(MethodNamer):
    """MethodNamer reading names from a Metaspace instead of /proc/PID/mem."""

    def __init__(self, space: Metaspace, unloads: Counter_ | None = None, exact: bool = False) -> None:
        super().__init__(None, SimpleNamespace(code_cache=None), unloads=unloads)  # type: ignore[arg-type]
        self.space = space
        self.classes_unloaded()
        self.unloads_address = 0x1000 if exact else None

    def _read(self, method: int) -> str | None:
        return self.space.methods.get(method)


class Counter_:
    """hsperfdata's java.cls.unloadedClasses."""

    def __init__(self, value: int) -> None:
        self.value = value

    def read(self) -> int | None:
        return self.value

    def close(self) -> None:
        pass


def jvm_names(namer: MethodNamer) -> JvmNames:
    jvms = JvmNames(lambda pid, layout, address: None)
    jvms.add(9, namer)
    return jvms


def test_each_generation_keeps_its_names_and_a_past_one_reads_nothing() -> None:
    space = Metaspace()
    namer = FakeNamer(space)
    assert namer.name(X) == "a.Alpha::spin"
    # WHEN classes unload and X's memory is reused by another class
    namer.new_generation()
    space.methods[X] = "b.Beta::spin"
    # THEN the new generation reads X afresh and the old one keeps its name
    assert namer.name(X, 1) == "b.Beta::spin" and namer.name(X, 0) == "a.Alpha::spin"
    # and a Method* the old generation never read stays unnamed there (never read now: it may be reused)
    assert namer.name(Y, 0) is None and namer.cause(Y, 0, "x") == LATE
    assert namer.name(Y) == "a.Alpha::other"


def test_exact_generations_follow_the_count_each_sample_carries() -> None:
    space, counter = Metaspace(), Counter_(5)
    namer = FakeNamer(space, counter, exact=True)
    jvms = jvm_names(namer)
    stack = struct.pack("<Q", INTERPRETED_TAG | X)
    # GIVEN samples at count 5: generation 0, named at first sight while the JVM still counts 5
    assert jvms.generation_of(9, 100, 5) == 0
    assert jvms.first_in_generation(9, 0, stack) and not jvms.first_in_generation(9, 0, stack)
    jvms.note_stack(9, [X])
    # WHEN the JVM unloads (count 6) and reuses X for Beta, a sample at count 6 opens generation 1
    counter.value = 6
    space.methods[X] = "b.Beta::spin"
    assert jvms.generation_of(9, 50, 6) == 1  # by count, not by time
    assert jvms.first_in_generation(9, 1, stack)
    jvms.note_stack(9, [X])
    # THEN each generation names X as it was; a late sample of count 5 is still generation 0
    assert jvms.generation_of(9, 200, 5) == 0 and not jvms.first_in_generation(9, 0, stack)
    assert namer.name(X, 0) == "a.Alpha::spin" and namer.name(X, 1) == "b.Beta::spin"
    # and polls change nothing in this mode: nothing is REUSED
    jvms.poll_unloads()
    assert REUSED not in namer.failures.values() and namer.generation == 1


def test_exact_mode_reads_no_name_once_the_count_moved() -> None:
    space, counter = Metaspace(), Counter_(5)
    namer = FakeNamer(space, counter, exact=True)
    jvms = jvm_names(namer)
    assert jvms.generation_of(9, 100, 5) == 0
    # GIVEN the JVM unloaded classes after the sample and before the reader names it
    counter.value = 6
    space.methods[X] = "b.Beta::spin"
    jvms.note_stack(9, [X])
    # THEN generation 0 names nothing (LATE), and never Beta
    assert namer.name(X, 0) is None and namer.cause(X, 0, "x") == LATE
    assert namer.generation == 1 and jvms.generation_of(9, 300, 6) == 1
    # a sample of an older count seen only now gets a generation of its own that names nothing
    late = jvms.generation_of(9, 400, 4)
    assert late not in (0, 1) and namer.name(X, late) is None


def test_polled_generations_begin_at_the_poll_and_an_ambiguous_name_is_reused() -> None:
    space, counter = Metaspace(), Counter_(5)
    namer = FakeNamer(space, counter)  # the counter's file is not mapped: polled
    jvms = jvm_names(namer)
    assert jvms.generation_of(9, 100, NO_UNLOADS) == 0
    jvms.note_stack(9, [X, Y])
    # WHEN classes unload and X is reused before the poll notices
    counter.value = 6
    space.methods[X] = "b.Beta::spin"
    jvms.poll_unloads()
    # THEN X is ambiguous in generation 0 (REUSED), Y keeps its name; later samples are generation 1
    assert namer.name(X, 0) is None and namer.cause(X, 0, "x") == REUSED
    assert namer.name(Y, 0) == "a.Alpha::other"
    start = jvms._starts[9][0]
    assert jvms.generation_of(9, start - 1, NO_UNLOADS) == 0 and jvms.generation_of(9, start, NO_UNLOADS) == 1
    assert namer.name(X, 1) == "b.Beta::spin"


def test_without_a_counter_a_changed_name_starts_a_generation() -> None:
    space = Metaspace()
    namer = FakeNamer(space)
    jvms = jvm_names(namer)
    jvms.note_stack(9, [X])
    space.methods[X] = "b.Beta::spin"
    jvms.note_stack(9, [X])
    assert namer.generation == 1 and namer.cause(X, 0, "x") == REUSED and namer.name(X) == "b.Beta::spin"


def test_epochs_hold_perf_map_version_and_generation() -> None:
    assert split_epoch(join_epoch(3, 7)) == (3, 7)
    assert split_epoch(join_epoch(70000, 1)) == (65535, 1)  # saturates instead of spilling into the other


class Symbols:
    def set_perf_map(self, perf_map: object) -> None:
        pass

    def resolve(self, addr: int) -> Frame:
        return Frame("start_thread", "native")


def test_one_stored_stack_names_each_generation_with_its_own_class() -> None:
    # GIVEN one raw stack (X, then the thread's start) sampled before and after X was reused
    space = Metaspace()
    namer = FakeNamer(space)
    namer.name(X)
    namer.new_generation()
    space.methods[X] = "b.Beta::spin"
    namer.name(X)
    user = struct.pack("<2Q", INTERPRETED_TAG | X, 0x20000)
    store = StackStore(10 * 10**9)
    store.begin(0)
    for time_s, generation in ((1, 0), (2, 0), (3, 1)):
        store.add(7, 7, b"worker", time_s * 10**9, user, -1, join_epoch(0, generation))
    folder = StackFolder(Symbols(), None, 127, True, walker=True, methods=namer)  # type: ignore[arg-type]
    # WHEN named into a table
    table = tabulate_store(store, 7, folder, None, None)
    # THEN each generation's samples carry that generation's class
    assert table.folded() == Counter(
        {"worker;start_thread;a.Alpha::spin [i]": 2, "worker;start_thread;b.Beta::spin [i]": 1}
    )


def test_the_names_learned_go_to_the_journal_and_name_a_recovered_capture() -> None:
    space = Metaspace()
    namer = FakeNamer(space)
    jvms = JvmNames(lambda pid, layout, address: None)
    jvms.keep_log = True
    jvms.add(9, namer)
    # GIVEN names learned in two generations, one withdrawn (reused)
    jvms.note_stack(9, [X, Y])
    first = jvms.take_names()[9]
    space.methods[X] = "b.Beta::spin"
    jvms.note_stack(9, [X])  # no counter: the changed name starts generation 1
    second = jvms.take_names()[9]
    assert first.names == ((0, X, "a.Alpha::spin"), (0, Y, "a.Alpha::other")) and first.code_low is None
    assert (0, X, None) in second.names and (1, X, "b.Beta::spin") in second.names
    assert jvms.take_names()[9].names == ()  # each name goes to one checkpoint only
    # WHEN a recovery replays both checkpoints' records
    recorded = RecordedNames()
    for delta in (first, second):
        recorded.apply(json.loads(json.dumps({"code_low": delta.code_low, "names": delta.names, "chains": []})))
    # THEN each generation names as the window did, and a withdrawn name stays unnamed
    assert recorded.name(X, 0) is None and recorded.name(Y, 0) == "a.Alpha::other"
    assert recorded.name(X, 1) == "b.Beta::spin" and recorded.cause(X, 0, "x") == NOT_SAVED


def test_recorded_compiled_frames_are_named_from_their_saved_chain() -> None:
    recorded = RecordedNames()
    low = 0x7F00_0000_0000
    recorded.apply({"code_low": low, "names": [[0, X, "a.Alpha::outer"], [0, Y, "a.Alpha::inner"]],
                    "chains": [[low + 0x40, 17, [Y, X]]]})  # fmt: skip
    value = COMPILED_TAG | 17 << COMPILE_ID_SHIFT | 0x40
    assert recorded.compiled_names(value, 0) == (low + 0x40, ["a.Alpha::inner [inlined]", "a.Alpha::outer"], "")
    assert recorded.compiled_names(COMPILED_TAG | 18 << COMPILE_ID_SHIFT | 0x40, 0)[1:] == ([], NOT_SAVED)


@pytest.mark.parametrize(
    "damage",
    [
        {"names": [[0, -1, "a.B::c"]]},
        {"names": [[0, X, "a\x00b"]]},
        {"names": [[0, X, 5]]},
        {"chains": [[1, 2, ["x"]]]},
        {"code_low": "0x1000"},
        {"borrowed": [[1, 2, -3]]},
        {"borrowed": [[1, 2]]},
    ],
)
def test_damaged_saved_names_are_refused(damage: dict) -> None:
    with pytest.raises(ValueError):
        RecordedNames().apply(damage)


def test_exact_mode_drops_names_read_across_an_unload() -> None:
    # GIVEN the JVM unloads classes while the reader is reading a new stack's names
    space, counter = Metaspace(), Counter_(5)
    namer = FakeNamer(space, counter, exact=True)
    jvms = jvm_names(namer)
    jvms.note_stack(9, [X])
    read = namer._read

    def unloading_read(method: int) -> str | None:
        counter.value = 6
        return read(method)

    namer._read = unloading_read  # type: ignore[method-assign]
    jvms.note_stack(9, [Y])
    # THEN the name read across the unload is withdrawn (LATE), the one read before stays
    assert namer.name(X, 0) == "a.Alpha::spin"
    assert namer.name(Y, 0) is None and namer.cause(Y, 0, "x") == LATE


class CountingCode:
    """A code cache whose frames' chains are counted as they are looked up (CompiledNamer's interface)."""

    def __init__(self, chains: dict[int, tuple[int, ...]]) -> None:
        self.layout = SimpleNamespace(low=0)
        self.chains, self.failures, self.lookups = chains, {}, Counter()
        self.borrowed: dict[tuple[int, int], int] = {}
        self.log: list[tuple[int, int, tuple[int, ...]]] | None = None
        self.borrowed_log: list[tuple[int, int, int]] | None = None

    def methods_of(self, pc: int, compile_id: int) -> tuple[int, ...]:
        self.lookups[pc] += 1
        return self.chains.get(pc, ())


def test_a_compiled_frame_is_read_once_per_generation_and_a_frame_without_code_again() -> None:
    space = Metaspace()
    namer = FakeNamer(space)
    code = namer.compiled = CountingCode({0x40: (Y, X)})  # type: ignore[assignment]
    jvms = jvm_names(namer)
    known, unknown = COMPILED_TAG | 17 << COMPILE_ID_SHIFT | 0x40, COMPILED_TAG | 18 << COMPILE_ID_SHIFT | 0x80
    # WHEN three stacks hold the same compiled frame, and one a frame whose code is not found yet
    for _ in range(3):
        jvms.note_stack(9, [], [known, unknown])
    # THEN the known frame's chain is looked up and named once, the unknown frame every time
    assert code.lookups == {0x40: 1, 0x80: 3}
    assert namer.names == {X: "a.Alpha::spin", Y: "a.Alpha::other"}
    assert namer.compiled_names(known)[1] == ["a.Alpha::other [inlined]", "a.Alpha::spin"]  # one more lookup
    # WHEN classes unload (a new generation) and X's memory is reused
    namer.new_generation()
    space.methods[X] = "b.Beta::spin"
    jvms.note_stack(9, [], [known])
    # THEN the frame is read again into the new generation, and the old one keeps its names
    assert code.lookups[0x40] == 3 and namer.names[X] == "b.Beta::spin" and namer.name(X, 0) == "a.Alpha::spin"


def test_the_stacks_remembered_as_named_in_a_generation_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import profiler.unwind.hotspot as hotspot

    monkeypatch.setattr(hotspot, "SEEN_STACKS", 3)
    namer = FakeNamer(Metaspace(), Counter_(5), exact=True)
    jvms = jvm_names(namer)
    stacks = [struct.pack("<Q", INTERPRETED_TAG | X + 8 * n) for n in range(5)]
    # GIVEN three stacks remembered as named in generation 0
    assert all(jvms.first_in_generation(9, 0, s) for s in stacks[:3])
    assert not any(jvms.first_in_generation(9, 0, s) for s in stacks[:3])
    # WHEN a fourth comes, the memory starts over (it never holds more than SEEN_STACKS) ...
    assert jvms.first_in_generation(9, 0, stacks[3])
    assert len(jvms._seen[9]) == 1
    # THEN a stack forgotten so is named again once (reading only what is not named yet), then remembered
    assert jvms.first_in_generation(9, 0, stacks[0]) and not jvms.first_in_generation(9, 0, stacks[0])


def test_a_compiled_frame_named_from_a_borrowed_scope_is_marked_and_counted_per_sample() -> None:
    # GIVEN a JVM with two compiled pcs of one nmethod: a return address (its own PcDesc) and a pc in a
    # loop whose scope came from the safepoint poll 48 bytes further on
    namer = FakeNamer(Metaspace())
    code = namer.compiled = CountingCode({0x40: (Y, X), 0x80: (X,)})  # type: ignore[assignment]
    code.borrowed[(0x80, 17)] = 48
    exact, approximate = (COMPILED_TAG | 17 << COMPILE_ID_SHIFT | pc for pc in (0x40, 0x80))
    store = StackStore(10 * 10**9)
    store.begin(0)
    for value, samples in ((exact, 1), (approximate, 3)):
        for time_s in range(samples):
            store.add(7, 7, b"worker", time_s * 10**9, struct.pack("<2Q", value, 0x20000), -1, join_epoch(0, 0))
    folder = StackFolder(Symbols(), None, 127, True, walker=True, methods=namer)  # type: ignore[arg-type]
    # WHEN named into a table
    table = tabulate_store(store, 7, folder, None, None)
    # THEN the borrowed frame's innermost name carries the mark, and the samples are counted
    assert table.folded() == Counter({
        "worker;start_thread;a.Alpha::spin;a.Alpha::other [inlined]": 1,
        "worker;start_thread;a.Alpha::spin [approx]": 3,
    })  # fmt: skip
    fields = folder.stats_fields
    assert (fields["compiled_samples"], fields["compiled_approximate"], fields["approximate_bytes"]) == (4, 3, 144)
    stats = SamplerStats(pid=7, samples=4, **{k: v for k, v in fields.items() if k in ("compiled_samples",
                         "compiled_approximate", "approximate_bytes")})  # type: ignore[arg-type]  # fmt: skip
    line = stats.inlining_health()
    assert line is not None and line.startswith("75 % of 4 compiled samples in code without exact debug")
    assert "mean 48 bytes" in line and "--exact-inlining" in line and "DebugNonSafepoints" in line
    assert SamplerStats(pid=7, compiled_samples=4).inlining_health() is None
    # AND a recovered capture marks it as the window did, from the journal's records of both
    recorded = RecordedNames()
    recorded.apply({"code_low": 0, "names": [[0, X, "a.Alpha::spin"]], "chains": [[0x80, 17, [X]]],
                    "borrowed": [[0x80, 17, 48]]})  # fmt: skip
    assert recorded.compiled_names(approximate, 0)[1] == ["a.Alpha::spin [approx]"]
    assert recorded.borrowed(approximate) == 48
    old_journal = RecordedNames()  # written before the borrowed records existed: names unmarked
    old_journal.apply({"code_low": 0, "names": [[0, X, "a.Alpha::spin"]], "chains": [[0x80, 17, [X]]]})
    assert old_journal.compiled_names(approximate, 0)[1] == ["a.Alpha::spin"] and old_journal.borrowed(approximate) == 0


def test_the_borrowed_scopes_go_to_the_journal_with_their_chains() -> None:
    # GIVEN a namer logging for the journal whose code cache noted a borrowed scope while naming a chain
    namer = FakeNamer(Metaspace())
    code = namer.compiled = CountingCode({})  # type: ignore[assignment]
    code.log, code.borrowed_log = [(0x80, 17, (X,))], [(0x80, 17, 48)]
    jvms = JvmNames(lambda pid, layout, address: None)
    jvms.keep_log = True
    jvms.add(9, namer)
    assert code.log == [] and code.borrowed_log == []  # the log starts with the JVM's first checkpoint
    code.log.append((0x80, 17, (X,)))
    code.borrowed_log.append((0x80, 17, 48))
    # WHEN a checkpoint takes what was learned
    delta = jvms.take_names()[9]
    # THEN both go, once
    assert delta.chains == ((0x80, 17, (X,)),) and delta.borrowed == ((0x80, 17, 48),)
    assert jvms.take_names()[9].borrowed == ()


def test_exact_mode_reads_the_count_only_for_a_stack_with_something_to_name() -> None:
    # GIVEN a JVM counting unloads per sample, and a counter that counts its reads (each a pread of hsperfdata)
    space = Metaspace()

    class ReadCounter(Counter_):
        reads = 0

        def read(self) -> int | None:
            ReadCounter.reads += 1
            return self.value

    counter = ReadCounter(5)
    namer = FakeNamer(space, counter, exact=True)
    jvms = jvm_names(namer)
    jvms.generation_of(9, 100, 5)
    jvms.note_stack(9, [X])
    before = ReadCounter.reads
    # WHEN new stacks hold only frames named (or failed) already in this generation
    space.methods.pop(Y)
    jvms.note_stack(9, [Y])  # Y fails (stale): a failure counts as read
    after_failure = ReadCounter.reads
    jvms.note_stack(9, [X, Y])
    jvms.note_stack(9, [Y, X])
    # THEN the counter is not read for them, and the names are as before
    assert after_failure == before + 2 and ReadCounter.reads == after_failure
    assert namer.name(X, 0) == "a.Alpha::spin" and namer.name(Y, 0) is None
