"""``--publish DIR``: copy a rendered report into a web server's document root and rewrite the index
of all runs there; every replacement is a rename, so a reader never sees half a report."""

from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.report.render import REPORT_MARKER, REPORT_META, _asset, template_environment
from profiler.capture.jsonfile import expect_json, json_kind, read_json_file
from profiler.errors import CaptureFormatError, ConfigError, OutputExistsError
from profiler.files.atomic import atomic_write_text, staged_dir
from profiler.files.outputs import check_output_dir, is_ours, mark_output_dir

INDEX_FILE = "index.html"
_SAFE_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,199}$")


@dataclass(frozen=True)
class PublishedRun:
    """One line of the runs index, read from a published report's report.json."""

    run_id: str
    start_time: float | None
    started: str
    labels: tuple[tuple[str, str], ...]
    hosts_ok: int
    hosts_total: int
    top_tasks: tuple[tuple[str, float], ...]
    unmatched_share: float | None
    health_problems: int
    rendered_at: float


def _read_meta(report_dir: Path) -> dict[str, Any]:
    path = report_dir / REPORT_META
    meta: dict[str, Any] = expect_json(
        read_json_file(path, "render the report first with `coordinator report RUN_DIR`", "re-render the report"),
        dict,
        path,
        "the file",
        "re-render the report",
    )
    return meta


def _field(meta: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any, path: Path) -> Any:
    value = meta.get(name, default)
    if value is None and default is None:
        return None
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        raise CaptureFormatError(f"{path}: {name} is {json_kind(value)}, not a report's; re-render the report")
    if isinstance(value, float) and not math.isfinite(value):
        raise CaptureFormatError(f"{path}: {name} is not a finite number; re-render the report")
    return value


def _started(start: float | None, path: Path) -> str:
    if not start:
        return "—"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
    except (OverflowError, OSError, ValueError):
        raise CaptureFormatError(f"{path}: start_time {start!r} is not a possible time; re-render the report") from None


def published_run(meta: dict[str, Any], path: Path = Path(REPORT_META)) -> PublishedRun:
    """One index line from a report.json; any other shape (a foreign report.json) is a
    CaptureFormatError naming ``path``."""
    number = (int, float)
    start = _field(meta, "start_time", number, None, path)
    advice = "re-render the report"
    hosts = [expect_json(h, dict, path, "a host", advice) for h in _field(meta, "hosts", (list,), [], path)]
    tasks = [expect_json(t, dict, path, "a top task", advice) for t in _field(meta, "top_tasks", (list,), [], path)]
    return PublishedRun(
        run_id=str(_field(meta, "run_id", (str,), "?", path)),
        start_time=start,
        started=_started(start, path),
        labels=tuple(sorted((str(k), str(v)) for k, v in _field(meta, "labels", (dict,), {}, path).items())),
        hosts_ok=sum(1 for h in hosts if h.get("state") == "ok"),
        hosts_total=len(hosts),
        top_tasks=tuple(
            (str(_field(t, "task", (str,), "", path)), float(_field(t, "share", number, 0.0, path))) for t in tasks
        ),
        unmatched_share=_field(meta, "unmatched_share", number, None, path),
        health_problems=int(_field(meta, "health_problems", (int,), 0, path)),
        rendered_at=float(_field(meta, "rendered_at", number, 0.0, path)),
    )


def list_published(publish_root: Path, problems: list[str] | None = None) -> list[PublishedRun]:
    """Every published report under ``publish_root``, newest first (by start time, then render time).
    A damaged or foreign report.json is left out (its one-line reason appended to ``problems``): one
    entry must not take the whole index down."""
    runs = []
    for child in sorted(publish_root.iterdir()) if publish_root.is_dir() else []:
        if child.name.startswith(".") or not (child / REPORT_META).is_file():
            continue
        try:
            runs.append(published_run(_read_meta(child), child / REPORT_META))
        except CaptureFormatError as exc:
            if problems is not None:
                problems.append(f"{exc}; left out of the runs index")
    return sorted(runs, key=lambda r: (r.start_time or 0.0, r.rendered_at, r.run_id), reverse=True)


def check_publish_root(publish_root: Path) -> None:
    """Before any work: ``--publish DIR`` is a directory (or can be made) where index.html and
    report.css are ours to rewrite: new, empty, or already holding published reports."""
    publish_root = Path(publish_root)
    if publish_root.is_dir() and any(publish_root.iterdir()):
        ours = is_ours(publish_root) or any((child / REPORT_MARKER).is_file() for child in publish_root.iterdir())
        clash = [name for name in (INDEX_FILE, "report.css") if (publish_root / name).exists()]
        if clash and not ours:
            raise OutputExistsError(
                f"{publish_root / clash[0]}: not written by this tool, and publishing rewrites it; "
                "choose another --publish directory (an empty one, or one reports were published to)"
            )
        return
    check_output_dir(publish_root, "--publish", force=False)


def render_index(runs: list[PublishedRun]) -> str:
    env = template_environment()
    return str(env.get_template("index.html").render(runs=runs, generated=time.strftime("%Y-%m-%d %H:%M:%S")))


def publish(report_dir: Path, publish_root: Path, problems: list[str] | None = None) -> Path:
    """Copy ``report_dir`` to ``publish_root/<run-id>/`` and rewrite the runs index; returns the
    published report's index.html. Reports in the index that cannot be read add a line to ``problems``."""
    report_dir, publish_root = Path(report_dir), Path(publish_root)
    if not (report_dir / REPORT_MARKER).is_file():
        raise CaptureFormatError(f"{report_dir}: not a rendered report; run `coordinator report RUN_DIR` first")
    run_id = str(_read_meta(report_dir).get("run_id", ""))
    if not _SAFE_RUN_ID.match(run_id) or ".." in run_id:
        raise ConfigError(f"{report_dir / REPORT_META}: run id {run_id!r} is not a safe directory name; rename the run")
    check_publish_root(publish_root)
    target = publish_root / run_id
    if target.exists() and not (target / REPORT_MARKER).is_file():
        raise OutputExistsError(
            f"{target}: exists and is not a published report; refusing to replace it, rename it or publish elsewhere"
        )
    fresh = not publish_root.exists() or not any(publish_root.iterdir())
    publish_root.mkdir(parents=True, exist_ok=True)
    if fresh:  # a web root that holds other files is never marked as ours (--force must not replace it)
        mark_output_dir(publish_root, "coordinator report --publish")
    if target.resolve() == report_dir.resolve():
        raise ConfigError(f"{publish_root}: is where the report already lives; publish to another directory")
    with staged_dir(target) as staging:
        shutil.copytree(report_dir, staging, dirs_exist_ok=True)
    # World-readable: a web server serves them.
    atomic_write_text(publish_root / "report.css", _asset("report.css").decode("utf-8"), mode=0o644)
    atomic_write_text(publish_root / INDEX_FILE, render_index(list_published(publish_root, problems)), mode=0o644)
    return target / "index.html"
