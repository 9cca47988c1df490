"""profiler/sampling/collect.py's end-of-run warnings (meta.json) hold no line for approximate inlined
names (issue 51): a JVM without DebugNonSafepoints is every production JVM, not a defect of the capture; the
share and the fix are the JVM's health line in the report and in profiler match (SamplerStats.inlining_health)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from profiler.capture.format import SamplerStats
from profiler.sampling.collect import end_of_run_warnings


def test_approximate_compiled_samples_are_a_health_line_not_an_end_of_run_warning() -> None:
    result = {
        pid: SamplerStats(pid=pid, samples=500, compiled_samples=400, compiled_approximate=n, approximate_bytes=n * 60)
        for pid, n in ((10, 396), (20, 20))
    }
    limits = SimpleNamespace(collection="ringbuf")
    warnings = end_of_run_warnings(result, Counter(), 0, limits, {})  # type: ignore[arg-type]
    assert warnings == []
    line = result[10].inlining_health()
    assert line is not None and line.startswith("99 % of 400 compiled samples in code without exact debug information")
    assert "--exact-inlining" in line
