"""The page of `coordinator compare --out DIR`: the task table of the comparison and a differential
flamegraph of the two runs (frames coloured by the change of their share, pale when the change is
within sampling error), offline with the vendored d3 and d3-flame-graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coordinator.report.flame import DEFAULT_MAX_STACKS, FrameTable, build_diff_flamegraph
from coordinator.report.render import VENDOR_FILES, template_environment, write_page

COMPARE_TEMPLATE = "compare.html"
COMPARE_ASSETS: tuple[str, ...] = ("compare.js", "report.css")
COMPARE_MARKER = ".spe-taskprof-compare"


def diff_payload(
    stacks_a: Mapping[str, int], stacks_b: Mapping[str, int], level: float, max_stacks: int = DEFAULT_MAX_STACKS
) -> dict[str, Any]:
    """The page's JSON: the interned frame names and the merged tree (coordinator.report.flame)."""
    frames = FrameTable()
    graph = build_diff_flamegraph(stacks_a, stacks_b, frames, level, max_stacks)
    return {
        "frames": frames.names,
        "tree": graph.tree,
        "samplesA": graph.samples_a,
        "samplesB": graph.samples_b,
        "droppedStacks": graph.dropped_stacks,
        "level": level,
    }


def render_compare(
    out_dir: Path,
    rows: Sequence[Mapping[str, Any]],
    stacks_a: Mapping[str, int],
    stacks_b: Mapping[str, int],
    names: tuple[str, str],
    level: float,
) -> Path:
    """Write the page and its assets to ``out_dir`` (replaced as a whole); returns its index.html."""
    payload = {**diff_payload(stacks_a, stacks_b, level), "nameA": names[0], "nameB": names[1]}
    html = str(
        template_environment()
        .get_template(COMPARE_TEMPLATE)
        .render(rows=rows, name_a=names[0], name_b=names[1], level=level, payload=payload)
    )
    return write_page(out_dir, html, COMPARE_ASSETS, VENDOR_FILES, COMPARE_MARKER, "written by coordinator compare\n")
