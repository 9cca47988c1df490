"""The page of `coordinator compare --out DIR`: the task table of the comparison and a differential
flamegraph of the two runs (frames coloured by the change of their share, pale when the change is
within sampling error), offline with the vendored d3 and d3-flame-graph."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from coordinator.report.flame import DEFAULT_MAX_STACKS, FrameTable, build_diff_flamegraph
from coordinator.report.render import _asset, template_environment
from profiler.capture import replace_dir

COMPARE_TEMPLATE = "compare.html"
COMPARE_ASSETS: tuple[str, ...] = ("compare.js", "report.css")
COMPARE_VENDOR: tuple[str, ...] = (
    "d3.min.js",
    "d3-flamegraph.min.js",
    "d3-flamegraph.css",
    "d3.LICENSE",
    "d3-flamegraph.LICENSE",
    "VERSIONS",
)
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
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        for name in COMPARE_ASSETS:
            (staging / name).write_bytes(_asset(name))
        (staging / "vendor").mkdir()
        for name in COMPARE_VENDOR:
            (staging / "vendor" / name).write_bytes(_asset(f"vendor/{name}"))
        (staging / "index.html").write_text(html, encoding="utf-8")
        (staging / COMPARE_MARKER).write_text("written by coordinator compare\n", encoding="utf-8")
        os.chmod(staging, 0o755)
        replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "index.html"
