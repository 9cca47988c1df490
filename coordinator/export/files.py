"""Where exports go: output names derived from the run and the selection. The formats, their checks
of ``--out`` and their writing are in formats.py; their content is pure (speedscope.py, pprof.py, folded.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.analysis.rows import BARE_CAPTURE_ANALYSIS_DIR
from coordinator.export.formats import Content, export_format
from coordinator.export.stacks import ExportSet
from profiler.capture.read import is_capture_dir

EXPORTS_DIR = "exports"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True)
class Selection:
    """What ``coordinator export`` was asked for (empty: everything)."""

    tasks: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()

    def stem(self, run_id: str) -> str:
        """``<run>[-host-H][-pid-P][-task-T]``, safe as a file name."""
        parts = [run_id]
        parts += [f"host-{h}" for h in self.hosts] + [f"pid-{p}" for p in self.pids] + [f"task-{t}" for t in self.tasks]
        return _UNSAFE.sub("_", "-".join(parts)).strip("._") or "export"


def default_exports_dir(run_dir: Path) -> Path:
    """RUN/exports, or <capture>/analysis/exports for a bare capture (a capture is never written to)."""
    run_dir = Path(run_dir)
    if is_capture_dir(run_dir) and not (run_dir / "run.json").is_file():
        return run_dir / BARE_CAPTURE_ANALYSIS_DIR / EXPORTS_DIR
    return run_dir / EXPORTS_DIR


def output_path(run_dir: Path, run_id: str, fmt: str, selection: Selection, per_task: bool) -> Path:
    return default_exports_dir(run_dir) / (selection.stem(run_id) + export_format(fmt).output_suffix(per_task))


def render(export: ExportSet, fmt: str, per_task: bool = False) -> Content:
    """The export's content in the format registered as ``fmt``: bytes of one file, or file name ->
    text for a directory (folded ``per_task``)."""
    return export_format(fmt).render(export, per_task)


def sizes(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
