"""profiler/sampling/collect.py's end-of-run warnings (meta.json): a JVM whose compiled samples were mostly
named from a borrowed scope is named with the share and the fix (issue 51)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from profiler.capture.format import SamplerStats
from profiler.sampling.collect import end_of_run_warnings


def test_a_jvm_with_approximate_compiled_samples_gets_one_warning_and_a_nearly_exact_one_none() -> None:
    result = {
        pid: SamplerStats(pid=pid, samples=500, compiled_samples=400, compiled_approximate=n, approximate_bytes=n * 60)
        for pid, n in ((10, 396), (20, 20))
    }
    limits = SimpleNamespace(collection="ringbuf")
    warnings = end_of_run_warnings(result, Counter(), 0, limits, {})  # type: ignore[arg-type]
    assert len(warnings) == 1
    assert warnings[0].startswith("pid 10: 99 % of 400 compiled samples in code without exact debug information")
    assert "--exact-inlining" in warnings[0]
