"""``--publish DIR``: copy a rendered report into a web server's document root and rewrite the index
of all runs there; every replacement is a rename, so a reader never sees half a report."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.report.render import REPORT_MARKER, REPORT_META, _asset, template_environment
from profiler.capture.format import atomic_write_text, read_json_file, replace_dir
from profiler.errors import CaptureFormatError, ConfigError

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
    meta: dict[str, Any] = read_json_file(
        path, "render the report first with `coordinator report RUN_DIR`", "re-render the report"
    )
    return meta


def published_run(meta: dict[str, Any]) -> PublishedRun:
    start = meta.get("start_time")
    hosts = meta.get("hosts") or []
    return PublishedRun(
        run_id=str(meta.get("run_id", "?")),
        start_time=start,
        started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)) if start else "—",
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        hosts_ok=sum(1 for h in hosts if h.get("state") == "ok"),
        hosts_total=len(hosts),
        top_tasks=tuple((str(t["task"]), float(t["share"])) for t in meta.get("top_tasks") or []),
        unmatched_share=meta.get("unmatched_share"),
        health_problems=int(meta.get("health_problems") or 0),
        rendered_at=float(meta.get("rendered_at") or 0.0),
    )


def list_published(publish_root: Path) -> list[PublishedRun]:
    """Every published report under ``publish_root``, newest first (by start time, then render time)."""
    runs = []
    for child in sorted(publish_root.iterdir()) if publish_root.is_dir() else []:
        if child.name.startswith(".") or not (child / REPORT_META).is_file():
            continue
        try:
            runs.append(published_run(_read_meta(child)))
        except (CaptureFormatError, KeyError, TypeError, ValueError):
            continue  # a damaged entry must not take the whole index down
    return sorted(runs, key=lambda r: (r.start_time or 0.0, r.rendered_at, r.run_id), reverse=True)


def render_index(runs: list[PublishedRun]) -> str:
    env = template_environment()
    return str(env.get_template("index.html").render(runs=runs, generated=time.strftime("%Y-%m-%d %H:%M:%S")))


def publish(report_dir: Path, publish_root: Path) -> Path:
    """Copy ``report_dir`` to ``publish_root/<run-id>/`` and rewrite the runs index; returns the
    published report's index.html."""
    report_dir, publish_root = Path(report_dir), Path(publish_root)
    if not (report_dir / REPORT_MARKER).is_file():
        raise CaptureFormatError(f"{report_dir}: not a rendered report; run `coordinator report RUN_DIR` first")
    run_id = str(_read_meta(report_dir).get("run_id", ""))
    if not _SAFE_RUN_ID.match(run_id) or ".." in run_id:
        raise ConfigError(f"{report_dir / REPORT_META}: run id {run_id!r} is not a safe directory name; rename the run")
    publish_root.mkdir(parents=True, exist_ok=True)
    target = publish_root / run_id
    if target.resolve() == report_dir.resolve():
        raise ConfigError(f"{publish_root}: is where the report already lives; publish to another directory")
    staging = Path(tempfile.mkdtemp(prefix=f".{run_id}.new-", dir=publish_root))
    try:
        shutil.copytree(report_dir, staging, dirs_exist_ok=True)
        staging.chmod(0o755)
        replace_dir(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # World-readable: a web server serves them.
    atomic_write_text(publish_root / "report.css", _asset("report.css").decode("utf-8"), mode=0o644)
    atomic_write_text(publish_root / INDEX_FILE, render_index(list_published(publish_root)), mode=0o644)
    return target / "index.html"
