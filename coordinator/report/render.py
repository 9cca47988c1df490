"""The report's entry point: build the view of a run, render it with the package's templates, copy the
vendored assets and write the report directory atomically.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from importlib import resources
from json.encoder import encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from coordinator.analysis.load import RunData, load_run, load_run_offcpu, load_run_stacks, load_timeline
from coordinator.export.files import Selection
from coordinator.export.stacks import ExportSet
from coordinator.report.flame import DEFAULT_MAX_STACKS
from coordinator.report.formats import format_bytes, format_number, format_share, format_si
from coordinator.report.model import ReportView
from coordinator.report.view import build_view
from profiler.capture.format import UNMATCHED
from profiler.capture.offcpu import OffCpuEntry
from profiler.files.atomic import atomic_write_bytes, staged_dir
from profiler.files.outputs import check_output_dir, mark_output_dir

REPORT_MARKER = ".spe-taskprof-report"
REPORT_META = "report.json"
# Files copied beside every report so it works offline (from coordinator.templates).
STATIC_FILES: tuple[str, ...] = ("report.js", "report.css")
VENDOR_FILES: tuple[str, ...] = (
    "d3.min.js",
    "d3-flamegraph.min.js",
    "d3-flamegraph.css",
    "d3.LICENSE",
    "d3-flamegraph.LICENSE",
    "VERSIONS",
)
# ---------------------------------------------------------------- rendering


_COMPILED: dict[str, bytes] = {}  # templates compiled in this process, by jinja's key (name, file); see below


def _compiled_templates() -> Any:
    """A bytecode cache in memory for the environments of ``template_environment`` (all with the same
    options): a template is compiled once a process, not at every page (0.1 s each; the test suite
    renders hundreds of pages). Jinja checks each entry's source checksum, so an edited template compiles again."""
    import jinja2

    class InMemory(jinja2.BytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            if bucket.key in _COMPILED:
                bucket.bytecode_from_string(_COMPILED[bucket.key])

        def dump_bytecode(self, bucket: Any) -> None:
            _COMPILED[bucket.key] = bucket.bytecode_to_string()

    return InMemory()


def template_environment() -> Any:
    """jinja2 over the templates shipped in the package; autoescaping on for every template."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("coordinator.templates", "."),
        bytecode_cache=_compiled_templates(),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=visible_text,
    )
    env.filters["si"] = format_si
    env.filters["share"] = format_share
    env.filters["number"] = format_number
    env.filters["bytes"] = format_bytes
    env.policies["json.dumps_kwargs"] = {"sort_keys": False, "separators": (",", ":")}
    env.policies["json.dumps_function"] = deep_json_dumps
    return env


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def visible_text(value: Any) -> Any:
    """A value as a page shows it: control characters of a text (a NUL in a frame name of a hostile
    capture, which autoescaping leaves raw) written as ``\x00``; markup and other values unchanged."""
    import markupsafe

    if isinstance(value, str) and not isinstance(value, markupsafe.Markup) and _CONTROL.search(value):
        return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", value)
    return value


class _Literal(str):
    """JSON text to emit as is (a bracket, a separator, a key) among the values deep_json_dumps encodes."""


def deep_json_dumps(value: Any, **options: Any) -> str:
    """``json.dumps``, also of nesting deeper than the interpreter's recursion limit (a flame graph of a stack
    of thousands of frames: two levels of lists a frame): the C encoder first, an iterative walk when it
    gives up. Same text either way."""
    try:
        return json.dumps(value, **options)
    except RecursionError:
        return iterative_json_dumps(value, **options)


def iterative_json_dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` by a walk that keeps its own stack (never recurses)."""
    item_separator, key_separator = options.get("separators") or (", ", ": ")
    scalar_options = {key: option for key, option in options.items() if key != "separators"}
    encode_text = encode_basestring_ascii if options.get("ensure_ascii", True) else encode_basestring
    close_list, close_dict, separator = _Literal("]"), _Literal("}"), _Literal(item_separator)
    constants = {None: "null", True: "true", False: "false"}
    out: list[str] = []
    append = out.append
    pending: list[Any] = [value]
    push = pending.append
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is _Literal:
            append(item)
        elif kind is int:
            append(int.__repr__(item))
        elif kind is str:
            append(encode_text(item))
        elif kind is list or kind is tuple:
            append("[")
            push(close_list)
            for index in range(len(item) - 1, 0, -1):
                push(item[index])
                push(separator)
            if item:
                push(item[0])
        elif kind is dict:
            append("{")
            push(close_dict)
            entries = sorted(item.items()) if options.get("sort_keys") else list(item.items())
            for index in range(len(entries) - 1, -1, -1):
                key, entry = entries[index]
                push(entry)
                if type(key) is not str:  # as json: None, True and False as null, true, false
                    key = constants[key] if key is None or type(key) is bool else str(key)
                text = encode_text(key)
                push(_Literal((item_separator if index else "") + text + key_separator))
        elif item is None or kind is bool:
            append(constants[item])
        else:
            append(json.dumps(item, **scalar_options))
    return "".join(out)


def _asset(name: str) -> bytes:
    return resources.files("coordinator.templates").joinpath(name).read_bytes()



def write_page(
    out_dir: Path, html: str, assets: Sequence[str], vendor: Sequence[str], marker: str, marker_text: str
) -> Path:
    """One standalone page (campaign, comparison) with its assets, written to ``out_dir`` as a whole:
    staged beside it, then swapped in, so a reader never sees half a page. Returns its index.html."""
    with staged_dir(out_dir) as staging:
        for name in assets:
            (staging / name).write_bytes(_asset(name))
        (staging / "vendor").mkdir()
        for name in vendor:
            (staging / "vendor" / name).write_bytes(_asset(f"vendor/{name}"))
        (staging / "index.html").write_text(html, encoding="utf-8")
        (staging / marker).write_text(marker_text, encoding="utf-8")
        mark_output_dir(staging, marker_text.strip())
    return out_dir / "index.html"


def _copy_assets(target: Path) -> None:
    for name in STATIC_FILES:
        (target / name).write_bytes(_asset(name))
    (target / "vendor").mkdir()
    for name in VENDOR_FILES:
        (target / "vendor" / name).write_bytes(_asset(f"vendor/{name}"))


def payload_size(view: ReportView) -> int:
    """Bytes of the JSON the page carries (shown on the page and in report.json)."""
    return len(deep_json_dumps(view.payload, separators=(",", ":")).encode("utf-8"))


def render_html(view: ReportView, payload_bytes: int | None = None) -> str:
    """The report page."""
    env = template_environment()
    size = payload_size(view) if payload_bytes is None else payload_bytes
    return str(env.get_template("report.html").render(view=view, payload=view.payload, payload_bytes=size))


def report_summary(view: ReportView, run: RunData, payload_bytes: int = 0) -> dict[str, Any]:
    """report.json beside the page: what the runs index of ``--publish`` lists."""
    start = run.info.start_time if run.info is not None else None
    if start is None:
        start = next((h.capture.meta.start_time for h in run.hosts if h.capture is not None), None)
    top = sorted(
        (line for line in view.cluster_tasks if line.share is not None and line.task != UNMATCHED),
        key=lambda line: -(line.share or 0.0),
    )[:3]
    return {
        "run_id": view.run_id,
        "start_time": start,
        "labels": dict(view.labels),
        "hosts": [{"name": h.name, "state": h.state} for h in view.hosts],
        "top_tasks": [{"task": line.task, "share": line.share} for line in top],
        "unmatched_share": next((line.share for line in view.cluster_tasks if line.task == UNMATCHED), None),
        "health_problems": sum(1 for line in view.health if line.level in ("warn", "bad")),
        "rendered_at": time.time(),
        "payload_bytes": payload_bytes,
        "flamegraphs": len(view.payload["graphs"]),
        "flamegraphs_pruned": sum(1 for g in view.payload["graphs"] if g["droppedStacks"]),
        "max_stacks": view.payload["maxStacks"],
    }


def export_files(
    run: RunData,
    stacks: Mapping[str, Mapping[int, Mapping[str, int]]],
    offcpu: Mapping[str, Mapping[int, Sequence[OffCpuEntry]]] | None = None,
) -> tuple[ExportSet, dict[str, tuple[str, bytes]]] | None:
    """The run's speedscope and pprof exports the flamegraphs link to (format -> (path relative to
    the report, content)); None without a profile or stacks. One file per format for the whole run,
    not one per graph: the report grows by about one copy of the stacks (docs/exports.md). ``offcpu``:
    the blocked time the report draws (host -> pid -> entries), carried by the files too."""
    from coordinator.export.files import EXPORTS_DIR
    from coordinator.export.formats import FORMATS
    from coordinator.export.stacks import export_set_of

    if run.profile_text is None or not any(stacks.values()):
        return None
    export = export_set_of(run, stacks, offcpu)
    stem = Selection().stem(run.run_id)
    files = {}
    for fmt in (f for f in FORMATS.values() if f.in_report):
        content = fmt.render(export)
        assert isinstance(content, bytes)  # one file per format without --per-task
        files[fmt.name] = (f"{EXPORTS_DIR}/{stem}{fmt.suffix}", content)
    return export, files


def render_report(
    run_dir: Path,
    out_dir: Path | None = None,
    max_stacks: int = DEFAULT_MAX_STACKS,
    *,
    force: bool = False,
) -> Path:
    """Render the report of a run directory or host capture; returns the path of its index.html.

    ``out_dir`` defaults to ``run_dir/report``. A previous report there is replaced atomically; another
    directory this tool wrote needs ``force``; a directory of the user's is refused (profiler.files.outputs).
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "report"
    # a previous report is replaced; another directory of ours only with --force; the user's never
    check_output_dir(out_dir, "--out", force=force, own_kind=(REPORT_MARKER,), replace_own=True)
    run = load_run(run_dir)
    problems: list[str] = []
    stacks = load_run_stacks(run, problems)
    timelines = {h.name: load_timeline(h.capture, problems) for h in run.hosts if h.capture is not None}
    offcpu = load_run_offcpu(run, problems)
    view = build_view(
        run,
        stacks,
        max_stacks=max_stacks,
        problems=problems,
        timelines={name: t for name, t in timelines.items() if t is not None},
        offcpu=offcpu,
    )
    exports = export_files(run, stacks, offcpu)
    if exports:
        from coordinator.export.links import graph_links

        paths = {fmt: path for fmt, (path, _) in exports[1].items()}
        links = graph_links((g["key"] for g in view.payload["graphs"]), exports[0], paths)
        view = replace(view, payload={**view.payload, "exports": links})
    payload_bytes = payload_size(view)
    html = render_html(view, payload_bytes)
    with staged_dir(out_dir) as staging:
        _copy_assets(staging)
        for relative, content in (exports[1].values() if exports else ()):
            atomic_write_bytes(staging / relative, content, 0o644)
        (staging / "index.html").write_text(html, encoding="utf-8")
        summary = report_summary(view, run, payload_bytes)
        summary["exports_bytes"] = sum(len(content) for _, content in exports[1].values()) if exports else 0
        (staging / REPORT_META).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        (staging / REPORT_MARKER).write_text("written by coordinator report\n", encoding="utf-8")
        mark_output_dir(staging, "coordinator report")
    return out_dir / "index.html"
