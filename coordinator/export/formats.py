"""The export formats behind one interface, registered by name: ``coordinator export --format``'s choices,
the files the report writes beside its page and the checks of ``--out`` all come from ``FORMATS``.

This module is light (the standard library and profiler.files.outputs): the command's parser imports
it; a format imports what builds its content (speedscope.py, pprof.py, folded.py) only when it renders.
A run's off-CPU time is not a format of its own: speedscope and pprof carry it beside the samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Union

from profiler.errors import ConfigError
from profiler.files.atomic import atomic_write_bytes, atomic_write_text, staged_dir
from profiler.files.outputs import check_output_dir, check_output_file, folded_text, mark_output_dir

if TYPE_CHECKING:
    from coordinator.export.stacks import ExportSet

PER_TASK_SUFFIX = ".tasks"  # a format whose --per-task is a directory of one file per task

Content = Union[bytes, dict[str, str]]  # one file, or file name -> text of a directory (--per-task)


class ExportFormat:
    """One file format: its name (``--format``), the file name's suffix, its content for an export set,
    how a file of it starts (``is_own``: what ``--force`` may replace), writing it and the command that
    opens it. A format is a subclass registered in FORMATS; nothing else names formats."""

    name: ClassVar[str]
    suffix: ClassVar[str]
    magic: ClassVar[bytes] = b""  # how a file of this format starts (is_own)
    opens_with: ClassVar[str] = ""  # the command that opens ``{out}`` (next_step)
    per_task_dir: ClassVar[bool] = False  # --per-task writes a directory of one file per task
    in_report: ClassVar[bool] = False  # written beside the report, its flamegraphs link to it

    def render(self, export: ExportSet, per_task: bool = False) -> Content:
        raise NotImplementedError

    def is_own(self, head: bytes) -> bool:
        """Whether a file starting with ``head`` is an export of this format."""
        return bool(self.magic) and head.startswith(self.magic)

    def next_step(self, out: Path, per_task: bool) -> str:
        return self.opens_with.format(out=out)

    def output_suffix(self, per_task: bool) -> str:
        return PER_TASK_SUFFIX if per_task and self.per_task_dir else self.suffix

    def check_out(self, out: Path, per_task: bool, force: bool) -> None:
        """Before any work: ``--out`` is a file (a directory for a ``per_task_dir`` format's --per-task); an
        existing one is replaced with ``force`` only when it is an export of this format (or a directory
        this tool wrote)."""
        if per_task and self.per_task_dir:
            check_output_dir(out, "--out", force=force)
        else:
            check_output_file(out, "--out", force=force, signature=self.is_own)

    def write(self, content: Content, out: Path, force: bool = False, mode: int | None = 0o644) -> list[Path]:
        """Write one file, or a directory of per-task files replaced whole (files of another profile's
        tasks do not linger); an existing output needs ``force`` and must be an export (check_out)."""
        if isinstance(content, bytes):
            check_output_file(out, "--out", force=force, signature=self.is_own)
            atomic_write_bytes(out, content, mode)
            return [out]
        check_output_dir(out, "--out", force=force)
        with staged_dir(out) as staging:
            for name, text in content.items():
                atomic_write_text(staging / name, text, mode)
            mark_output_dir(staging, "coordinator export --per-task")
        return [out / name for name in content]


class Speedscope(ExportFormat):
    name = "speedscope"
    suffix = ".speedscope.json"
    magic = b'{"$schema"'
    opens_with = "open https://www.speedscope.app or `npx speedscope {out}` and load the file"
    in_report = True

    def render(self, export: ExportSet, per_task: bool = False) -> Content:
        from coordinator.export.speedscope import build_speedscope

        document = build_speedscope(export, per_task=per_task)
        return (json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")



class Pprof(ExportFormat):
    name = "pprof"
    suffix = ".pb.gz"
    magic = b"\x1f\x8b"  # gzip
    opens_with = "go tool pprof -tags {out}   (or -http=: -tagfocus=task=NAME; or push to Pyroscope)"
    in_report = True

    def render(self, export: ExportSet, per_task: bool = False) -> Content:
        from coordinator.export.pprof import pprof_bytes

        if per_task:
            raise ConfigError("--per-task: pprof keeps every task in one file, labelled; use -tagfocus=task=NAME")
        return pprof_bytes(export)



class Folded(ExportFormat):
    name = "folded"
    suffix = ".folded"
    opens_with = "flamegraph.pl {out} > flame.svg   (or inferno-flamegraph)"
    per_task_dir = True

    def render(self, export: ExportSet, per_task: bool = False) -> Content:
        from coordinator.export import folded

        return folded.folded_per_task(export) if per_task else folded.folded_text(export).encode("utf-8")

    def is_own(self, head: bytes) -> bool:
        return folded_text(head)

    def next_step(self, out: Path, per_task: bool) -> str:
        if per_task:
            return f"flamegraph.pl {out}/NAME.folded > NAME.svg   (or inferno-flamegraph)"
        return super().next_step(out, per_task)


FORMATS: dict[str, ExportFormat] = {}


def register(export_format: ExportFormat) -> ExportFormat:
    """Add a format under its name; a second format of the same name is a bug."""
    if export_format.name in FORMATS:
        raise ValueError(f"export format {export_format.name!r} registered twice")
    FORMATS[export_format.name] = export_format
    return export_format


for _format in (Speedscope(), Pprof(), Folded()):
    register(_format)


def export_format(name: str) -> ExportFormat:
    """The format registered as ``name``; one error line naming the choices otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"format {name!r}: use one of {', '.join(FORMATS)}") from None
