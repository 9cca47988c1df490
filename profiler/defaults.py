"""Where the default input files are: beside the package in a source tree or a shipped copy,
or under the installed data prefix; and the run's defaults that the sampler shares with
profiler/run/options.py (which declares every option of `profiler run` and otherwise holds its defaults)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_PROFILE = "application_profiles/spark_structured_streaming.txt"
DEFAULT_KNOWN_SPES = "known_spes.txt"
DEFAULT_FREQUENCY = 99  # samples per second per CPU
DEFAULT_PERF_MAP_REFRESH = 60.0  # seconds between Java perf-map refreshes; 0 = at the end only
DEFAULT_STACK_STORAGE_SIZE = 65536  # distinct stacks the stack map holds (--stack-collection stackmap)


def data_file(relative: str) -> Path:
    """First existing copy of a top-level data file; the source-tree path when none exists (for errors)."""
    package_dir = Path(__file__).resolve().parent
    candidates = [
        package_dir.parent / relative,  # source tree or a shipped directory with the files beside the package
        package_dir / "scope" / Path(relative).name,  # a copy shipped inside the package (known_spes.txt)
        Path(sys.prefix) / "share" / "spe-taskprof" / Path(relative).name,
    ]
    override = os.environ.get("TASKPROF_DATA")
    if override:
        candidates.insert(0, Path(override) / relative)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return candidates[0]
