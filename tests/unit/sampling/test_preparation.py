"""Each target's preparation beside sampling (profiler/sampling/preparation.py): deadlines, one warning per
late, failed or refused target, and the sampler adding a target before its preparation is done."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from profiler.sampling.preparation import PreparationLimits, TargetPreparation
from profiler.sampling.sampler import StackSampler


class HangingTargets:
    """prepare(pid): the pids in ``hang`` block until released, those in ``fail`` raise, the others publish."""

    def __init__(self, hang: frozenset[int] = frozenset(), fail: frozenset[int] = frozenset()) -> None:
        self.hang, self.fail = hang, fail
        self.release = threading.Event()
        self.published: list[int] = []

    def prepare(self, pid: int) -> None:
        if pid in self.hang:
            self.release.wait(30)
        if pid in self.fail:
            raise ValueError(f"crafted .eh_frame of {pid}")
        self.published.append(pid)


def test_a_hanging_target_does_not_delay_another_targets_publication() -> None:
    # GIVEN two workers and a target whose preparation hangs (long before its deadline)
    targets = HangingTargets(hang=frozenset({1}))
    warnings: list[str] = []
    preparation = TargetPreparation(targets.prepare, warnings, PreparationLimits(deadline=30, workers=2))
    preparation.start()
    try:
        # WHEN both are submitted, the hanging one first
        preparation.submit(1)
        preparation.submit(2)
        # THEN the other is published while the first still runs, and nothing is reported yet
        assert preparation.wait([2], 10)
        assert targets.published == [2] and preparation.outcomes[1] == "running" and warnings == []
    finally:
        targets.release.set()
        preparation.stop()


def test_past_its_lease_a_slow_target_goes_on_beside_the_next_one_without_a_warning() -> None:
    # GIVEN one worker and a target whose preparation hangs past its lease, long before its deadline
    targets = HangingTargets(hang=frozenset({1}))
    warnings: list[str] = []
    preparation = TargetPreparation(targets.prepare, warnings, PreparationLimits(deadline=30, workers=1, lease=0.2))
    preparation.start()
    try:
        preparation.submit(1)
        preparation.submit(2)
        # THEN the next target is prepared beside it after the lease, not after the deadline
        began = time.monotonic()
        assert preparation.wait([2], 10)
        assert time.monotonic() - began < 5
        assert targets.published == [2] and preparation.outcomes[1] == "running" and warnings == []
        # AND the slow one still publishes when it finishes
        targets.release.set()
        assert preparation.wait([1], 10) and targets.published == [2, 1]
    finally:
        targets.release.set()
        preparation.stop()


def test_leases_never_run_more_than_workers_plus_the_late_cap_at_once() -> None:
    # GIVEN one worker, at most one late preparation, and three targets that all hang past their leases
    targets = HangingTargets(hang=frozenset({1, 2, 3}))
    warnings: list[str] = []
    limits = PreparationLimits(deadline=30, workers=1, max_late=1, lease=0.1)
    preparation = TargetPreparation(targets.prepare, warnings, limits)
    preparation.start()
    try:
        for pid in (1, 2, 3):
            preparation.submit(pid)
        # THEN two run (the first past its lease, the second holding the slot) and the third waits its turn
        waited = time.monotonic()
        while preparation.outcomes[2] != "running" and time.monotonic() - waited < 10:
            time.sleep(0.02)
        assert not preparation.wait([3], 0.5)
        assert preparation.outcomes == {1: "running", 2: "running", 3: "queued"} and warnings == []
        # AND once they finish it is prepared too
        targets.hang = frozenset()
        targets.release.set()
        assert preparation.wait([3], 10) and sorted(targets.published) == [1, 2, 3]
    finally:
        targets.release.set()
        preparation.stop()


def test_past_its_deadline_a_target_gives_up_its_slot_with_one_warning() -> None:
    # GIVEN one worker and a target that hangs past its deadline
    targets = HangingTargets(hang=frozenset({1}))
    warnings: list[str] = []
    preparation = TargetPreparation(targets.prepare, warnings, PreparationLimits(deadline=0.3, workers=1))
    preparation.start()
    try:
        preparation.submit(1)
        preparation.submit(2)
        # THEN at its deadline the next target gets the slot and is published; the late one is one line
        assert preparation.wait([2], 10)
        assert targets.published == [2] and preparation.outcomes[1] == "late"
        assert len(warnings) == 1 and warnings[0].startswith("pid 1: ") and "not done after 0.3 s" in warnings[0]
        # WHEN it finishes after all, what it built is still published, and no second line is written
        targets.release.set()
        waited = time.monotonic()
        while preparation.outcomes[1] == "late" and time.monotonic() - waited < 10:
            time.sleep(0.02)
        assert targets.published == [2, 1] and preparation.outcomes[1] == "ready" and len(warnings) == 1
    finally:
        targets.release.set()
        preparation.stop()


def test_a_failing_target_is_one_warning_and_the_others_are_prepared() -> None:
    targets = HangingTargets(fail=frozenset({3}))
    warnings: list[str] = []
    preparation = TargetPreparation(targets.prepare, warnings, PreparationLimits(deadline=30, workers=1))
    preparation.start()
    try:
        for pid in (3, 4, 3):  # submitted twice: prepared once
            preparation.submit(pid)
        assert preparation.wait([3, 4], 10)
        assert preparation.outcomes == {3: "failed", 4: "ready"} and targets.published == [4]
        assert warnings == [
            "pid 3: unwind preparation (CFI tables, JVM vmStructs) failed (ValueError: crafted .eh_frame of 3); "
            "its samples kept, frames unnamed where its tables are missing"
        ]
    finally:
        preparation.stop()


def test_targets_past_the_late_cap_are_refused_by_name() -> None:
    # GIVEN at most one late preparation tolerated; WHEN one hangs past its deadline
    targets = HangingTargets(hang=frozenset({1}))
    warnings: list[str] = []
    preparation = TargetPreparation(targets.prepare, warnings, PreparationLimits(deadline=0.2, workers=1, max_late=1))
    preparation.start()
    try:
        preparation.submit(1)
        preparation.submit(2)
        # THEN the next one is refused (no thread piles up behind a hostile target), with its own line
        assert preparation.wait([2], 10)
        assert preparation.outcomes == {1: "late", 2: "refused"} and targets.published == []
        assert [line.split(":")[0] for line in warnings] == ["pid 1", "pid 2"] and "refused" in warnings[1]
    finally:
        targets.release.set()
        preparation.stop()


class FakeTable:
    """A BPF hash map as bcc shows it (Key, Leaf, item access)."""

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}

    @staticmethod
    def Key(pid: int) -> int:  # bcc's name
        return pid

    @staticmethod
    def Leaf() -> object:  # bcc's name
        return object()

    def __getitem__(self, key: int) -> Any:
        return self.items[key]

    def __setitem__(self, key: int, value: Any) -> None:
        self.items[key] = value


class FakeBPF:
    def __init__(self) -> None:
        self.maps = {b"targets": FakeTable(), b"jvms": FakeTable()}

    def __getitem__(self, name: bytes) -> FakeTable:
        return self.maps[name]

    def cleanup(self) -> None:
        self.maps.clear()


class BlockedCfi:
    """A CFI loader whose tables take until released to build."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.loaded: list[int] = []
        self.warnings: list[str] = []

    def load_pid(self, pid: int) -> bool:
        self.release.wait(30)
        self.loaded.append(pid)
        return True

    def stop(self) -> None:
        pass


def test_the_sampler_samples_a_target_before_its_preparation_is_done() -> None:
    # GIVEN a started walker sampler (its BPF object faked) whose unwind tables take long to build
    sampler = StackSampler(thread_names=False)
    bpf, cfi = FakeBPF(), BlockedCfi()
    sampler._bpf, sampler._attached, sampler.walker.cfi = bpf, True, cfi  # type: ignore[assignment]
    sampler.walker.preparation.start()
    pid = os.getpid()
    try:
        # WHEN the target is added
        sampler.add_pid(pid)
        # THEN it is in the BPF program's targets at once (sampled), its preparation still running ...
        assert pid in bpf.maps[b"targets"].items and sampler.walker.preparation.outcomes[pid] in ("queued", "running")
        assert not sampler.prepare_unwinding([pid], wait=0.2)
        # ... and done once its tables are: not a JVM, so nothing published for the walker, no warning
        cfi.release.set()
        assert sampler.prepare_unwinding([pid], wait=10)
        assert cfi.loaded == [pid] and sampler.walker.preparation.outcomes[pid] == "ready"
        assert bpf.maps[b"jvms"].items == {} and pid in sampler.walker.jvms.errors and sampler.warnings == []
    finally:
        cfi.release.set()
        sampler.close()
