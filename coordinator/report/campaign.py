"""The campaign page: cycles per event per task against a run label, one line per series, with 95 %
intervals, a stacked total per series, IPC and a table; written beside campaign.csv, offline."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from coordinator.analysis.campaign import CampaignRow, figure_data, level_table
from coordinator.analysis.rows import ALL
from coordinator.report.render import _asset, template_environment
from coordinator.report.view import task_colors
from profiler.capture import UNMATCHED, replace_dir

CAMPAIGN_TEMPLATE = "campaign.html"
CAMPAIGN_ASSETS: tuple[str, ...] = ("campaign.js", "report.css")
CAMPAIGN_VENDOR: tuple[str, ...] = ("d3.min.js", "d3.LICENSE", "VERSIONS")
CAMPAIGN_MARKER = ".spe-taskprof-campaign"


def render_campaign_html(rows: Sequence[CampaignRow], by: str, series: str, title: str) -> str:
    """The page's HTML; every datum enters the template through ``|tojson`` or autoescaped text."""
    payload = figure_data(rows, by, series)
    tasks = [t for t in payload["tasks"] if t != UNMATCHED] + [UNMATCHED]
    colors = task_colors(tasks)
    payload["colors"] = {task: colors.get(task, "#888888") for task in payload["tasks"]}
    levels, lines = level_table(rows, by, series)
    runs = [r for r in rows if r.task == ALL]
    return str(
        template_environment()
        .get_template(CAMPAIGN_TEMPLATE)
        .render(title=title, by=by, series=series, payload=payload, levels=levels, lines=lines, runs=runs)
    )


def render_campaign(out_dir: Path, rows: Sequence[CampaignRow], by: str, series: str, title: str) -> Path:
    """Write the page and its assets to ``out_dir`` (replaced as a whole); returns its index.html."""
    html = render_campaign_html(rows, by, series, title)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        for name in CAMPAIGN_ASSETS:
            (staging / name).write_bytes(_asset(name))
        (staging / "vendor").mkdir()
        for name in CAMPAIGN_VENDOR:
            (staging / "vendor" / name).write_bytes(_asset(f"vendor/{name}"))
        (staging / "index.html").write_text(html, encoding="utf-8")
        (staging / CAMPAIGN_MARKER).write_text(json.dumps({"by": by, "series": series}) + "\n", encoding="utf-8")
        os.chmod(staging, 0o755)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "index.html"
