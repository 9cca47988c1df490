"""Writing exports: output names derived from the run and the selection, no overwrite without
``force``, atomic writes. The formats themselves are pure (speedscope.py, pprof.py, folded.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from coordinator.analysis.rows import BARE_CAPTURE_ANALYSIS_DIR
from coordinator.export.stacks import ExportSet
from profiler.capture.format import is_capture_dir
from profiler.errors import ConfigError
from profiler.files.atomic import atomic_write_bytes, atomic_write_text, staged_dir
from profiler.files.outputs import (
    Signature,
    check_output_dir,
    check_output_file,
    folded_text,
    mark_output_dir,
    text_prefix,
)

FORMATS: tuple[str, ...] = ("speedscope", "pprof", "folded")
SUFFIXES = {"speedscope": ".speedscope.json", "pprof": ".pb.gz", "folded": ".folded"}
PER_TASK_SUFFIX = ".tasks"  # folded --per-task: a directory of one file per task
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
    suffix = PER_TASK_SUFFIX if per_task and fmt == "folded" else SUFFIXES[fmt]
    return default_exports_dir(run_dir) / (selection.stem(run_id) + suffix)


def render(export: ExportSet, fmt: str, per_task: bool = False) -> bytes | dict[str, str]:
    """The export's content: bytes of one file, or file name -> text for folded ``per_task``."""
    if fmt == "speedscope":
        from coordinator.export.speedscope import build_speedscope

        document = build_speedscope(export, per_task=per_task)
        return (json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
    if fmt == "pprof":
        from coordinator.export.pprof import pprof_bytes

        if per_task:
            raise ConfigError("--per-task: pprof keeps every task in one file, labelled; use -tagfocus=task=NAME")
        return pprof_bytes(export)
    if fmt == "folded":
        from coordinator.export.folded import folded_per_task, folded_text

        return folded_per_task(export) if per_task else folded_text(export).encode("utf-8")
    raise ConfigError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")


_SIGNATURES: dict[str, Signature] = {
    "speedscope": text_prefix(b'{"$schema"'),
    "pprof": text_prefix(b"\x1f\x8b"),  # gzip
    "folded": folded_text,
}


def check_export_out(out: Path, fmt: str, per_task: bool, force: bool) -> None:
    """Before any work: ``--out`` is a file (a directory for folded ``--per-task``); an existing one is
    replaced with ``force`` only when it is an export of that format (or a directory this tool wrote)."""
    if per_task and fmt == "folded":
        check_output_dir(out, "--out", force=force)
    else:
        check_output_file(out, "--out", force=force, signature=_SIGNATURES.get(fmt))


def write_export(
    content: bytes | dict[str, str], out: Path, force: bool = False, mode: int | None = 0o644
) -> list[Path]:
    """Write one file, or a directory of per-task files; an existing output needs ``force`` and must
    be an export (check_export_out)."""
    if isinstance(content, bytes):
        check_output_file(out, "--out", force=force)
        atomic_write_bytes(out, content, mode)
        return [out]
    check_output_dir(out, "--out", force=force)
    # A directory of per-task files is replaced whole: files of another profile's tasks do not linger.
    with staged_dir(out) as staging:
        for name, text in content.items():
            atomic_write_text(staging / name, text, mode)
        mark_output_dir(staging, "coordinator export --per-task")
    return [out / name for name in content]


def sizes(paths: Sequence[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
