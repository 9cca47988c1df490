"""The campaign page: cycles per event per task against a run label, one line per series, with 95 %
intervals, a stacked total per series, IPC and a table; written beside campaign.csv, offline."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from coordinator.analysis.campaign import CampaignRow, figure_data, level_table
from coordinator.analysis.rows import ALL
from coordinator.report.render import template_environment, write_page
from coordinator.report.view import task_colors
from profiler.capture.format import UNMATCHED

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
    marker_text = json.dumps({"by": by, "series": series}) + "\n"
    return write_page(out_dir, html, CAMPAIGN_ASSETS, CAMPAIGN_VENDOR, CAMPAIGN_MARKER, marker_text)
