"""--exact-inlining (issue 51) on the InlineTruth ground truth: kernels C2 inlines into InlineTruth::drive,
on a JVM started with no flag at all. Without the opt-in every kernel sample is charged to drive; with
DebugNonSafepoints written into the running JVM before its JIT compiles drive, the kernels' shares match
the JVM's own measurement. Figures: bench/bench_exact_inlining.py, docs/unwinding.md."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from profiler.capture.format import SamplerStats
from profiler.sampling.sampler import StackSampler
from profiler.unwind import debugflag, hotspot
from tests.fixtures import inline_truth
from tests.integration.test_walker import _sample

SECONDS, MIN_SAMPLES = 8, 600


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return inline_truth.compile_inline_truth(tmp_path_factory.mktemp("inline_truth"))


@pytest.fixture
def started() -> Iterator[list[inline_truth.InlineTruthJvm]]:
    jvms: list[inline_truth.InlineTruthJvm] = []
    yield jvms
    for jvm in jvms:
        jvm.kill()


@dataclass
class Measured:
    counts: dict[str, int]
    worst: float
    unmatched: float
    stats: SamplerStats  # the JVM's: its health line (inlining_health)
    warnings: list[str]  # the sampler's end-of-run warnings (meta.json)
    workers_approximate: float  # the workers' compiled samples marked [approx]


def _measure(jvm: inline_truth.InlineTruthJvm) -> Measured:
    sampler = StackSampler(perf_map_mode="none")
    collected = _sample(sampler, jvm.pid, SECONDS, MIN_SAMPLES, on_begin=jvm.reset)
    counts = inline_truth.kernel_counts(collected.folded)
    _z, worst, unmatched = inline_truth.shares_vs_truth(counts, jvm.shares())
    approximate, compiled = inline_truth.approximate_workers(collected.folded)
    assert compiled > 0.9 * sum(counts.values()), (compiled, counts)
    return Measured(dict(counts), worst, unmatched, collected.stats, sampler.warnings, approximate / compiled)


def test_without_the_opt_in_the_kernels_are_charged_to_their_caller(classpath, started):
    # GIVEN a JVM started with no flag, warmed up: C2 inlined the kernels into drive's loop
    jvm = inline_truth.start_inline_truth(classpath)
    started.append(jvm)
    # WHEN sampled
    measured = _measure(jvm)
    counts = measured.counts
    # THEN (the case the opt-in is for) nearly every worker sample is named after drive, not a kernel
    assert measured.unmatched >= 0.9, counts
    assert counts.get("drive", 0) >= 0.9 * sum(counts.values()), counts
    # AND the names say they are approximate: the workers' compiled frames are marked, and the JVM's health
    # line (the report's and profiler match's, from sampler.json) gives the share and the fix; not an end-of-run
    # warning of the capture: a JVM without the flag is every production JVM, not a defect of this capture
    assert measured.workers_approximate >= 0.9, measured
    stats = measured.stats
    assert stats.approximate_share() >= 0.9, stats
    line = stats.inlining_health()
    assert line is not None and "methods inlined there may be charged to their caller" in line, line
    assert "--exact-inlining" in line, line
    assert not any(f"pid {jvm.pid}: " in w and "debug information" in w for w in measured.warnings), measured.warnings


def test_the_flag_written_before_the_jit_compiles_names_the_kernels_exactly(classpath, started):
    writes: list[debugflag.FlagWrite] = []

    def enable(pid: int) -> None:
        writes.append(inline_truth.enable_soon(pid))

    # GIVEN the same JVM, no flag on its command line; DebugNonSafepoints written right after its exec
    jvm = inline_truth.start_inline_truth(classpath, on_started=enable)
    started.append(jvm)
    assert writes and writes[0].before == 0, writes
    # WHEN sampled after its warm-up
    measured = _measure(jvm)
    counts = measured.counts
    # THEN the kernels' shares match the JVM's measurement; what is left to drive is drive's own loop
    # (7-9 % on JDK 17 and 25 with -XX:+DebugNonSafepoints on the command line as with the opt-in)
    assert measured.worst <= 4, counts
    assert measured.unmatched <= 0.15, counts
    # AND the compiled code is dense: hardly a compiled sample is approximate, and no warning says otherwise
    assert measured.workers_approximate <= 0.1, measured
    assert measured.stats.approximate_share() <= 0.1, measured.stats
    assert not any("debug information" in w for w in measured.warnings), measured.warnings
    # and the JVM gets its own value back at the end
    assert debugflag.restore(writes[0])
    memory = hotspot.ProcessMemory(jvm.pid)
    try:
        assert memory.read(writes[0].address, 1) == b"\0"
    finally:
        memory.close()
