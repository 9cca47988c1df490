"""What the report's flamegraphs link to: the run's speedscope and pprof exports written beside the
page, and per graph what to pick in them (speedscope's profile, pprof's -tagfocus). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.export.stacks import ExportSet


def _tagfocus(key: str, value: str) -> str:
    """pprof's filter for one exact label value: -tagfocus takes a regular expression, and one key
    (a second -tagfocus replaces the first)."""
    import re

    return f"-tagfocus={key}=^{re.escape(value)}$"


def graph_links(graph_keys: Iterable[str], export: ExportSet, files: Mapping[str, str]) -> dict[str, Any]:
    """The payload's ``exports``: ``files`` (format -> path relative to the page) and, per graph key
    (``host:H``, ``pid:H:P``, ``task:T``; ``offcpu-pid:H:P`` and ``offcpu-task:T`` when the export carries
    blocked time), the speedscope profile to pick and the pprof command."""
    labels = {(p.host, str(p.pid)): p.label for p in export.processes}
    pprof = files.get("pprof", "")
    hints: dict[str, dict[str, str]] = {}
    for key in graph_keys:
        kind, _, rest = key.partition(":")
        offcpu = kind.startswith("offcpu-")
        if offcpu and not export.offcpu:
            continue  # blocked time left out of the files: a link would open a profile without it
        kind = kind.removeprefix("offcpu-")
        # the off-CPU profiles follow each process's own, named like it with this suffix (speedscope.py)
        suffix, index = (" off-CPU", "-sample_index=off_cpu ") if offcpu else ("", "")
        if kind == "pid":
            host, _, pid = rest.rpartition(":")
            focus = _tagfocus("process", f"{host}:{pid}")
            profile = labels.get((host, pid), "")
            speedscope = f"profile “{profile}{suffix}”" if profile else ""
        elif kind == "host":
            focus = _tagfocus("host", rest)
            speedscope = f"the profiles of {rest}"
        elif kind == "task":
            focus = _tagfocus("task", rest)
            speedscope = f"root frame [task: {rest}] in each{suffix} profile"
        else:
            continue
        hints[key] = {"speedscope": speedscope, "pprof": f"go tool pprof {index}{focus} -http=: {pprof}"}
    return {"files": dict(files), "graphs": hints}
