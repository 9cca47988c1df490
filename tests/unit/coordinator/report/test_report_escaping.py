"""Hostile names (frames, tasks, labels, run id, profile text) never become markup in the report."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from coordinator.report.render import render_report
from tests.fixtures.report import HOSTILE_FRAMES, PROFILE, make_run_dir

HOSTILE_TASK = "\"><img src=x onerror=window.__pwned=4> '"
HOSTILE_LABEL = "</script><script>window.__pwned=5</script>"
HOSTILE_RUN_ID = "run<i onmouseover=window.__pwned=6>"
JAVA_SPECIALS = ("com/example/Event.<init>", "com/example/Event.<clinit>", "Ysb$$Lambda$0x00007f3c8c0a1b20.apply")
# Every element the templates write; anything else in the page came from data.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "link", "body", "div", "header", "h1", "h2", "h3", "ul", "li", "span", "dl",
    "dt", "dd", "nav", "a", "section", "p", "table", "thead", "tbody", "tr", "th", "td", "button", "code", "label",
    "select", "input", "details", "summary", "pre", "footer", "script", "br",
}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _hostile_run(tmp_path: Path) -> Path:
    run_dir = make_run_dir(tmp_path, labels={"note": HOSTILE_LABEL, "q\"uote": "it's"})
    profile = PROFILE + f"{HOSTILE_TASK}: com/evil/Frames.run\n# </pre><script>window.__pwned=7</script>\n"
    (run_dir / "application_profile.txt").write_text(profile, encoding="utf-8")
    run_json = json.loads((run_dir / "run.json").read_text())
    run_json["run_id"] = HOSTILE_RUN_ID
    (run_dir / "run.json").write_text(json.dumps(run_json))
    (run_dir / "summary.csv").unlink()  # tables from the host results, graphs from the new profile
    return run_dir


def test_hostile_names_stay_text(tmp_path: Path) -> None:
    index = render_report(_hostile_run(tmp_path), tmp_path / "out")
    page = index.read_text(encoding="utf-8")
    parser = _Collector()
    parser.feed(page)
    tags = [tag for tag, _ in parser.tags]
    assert set(tags) <= ALLOWED_TAGS, set(tags) - ALLOWED_TAGS
    assert tags.count("script") == 4  # the data island and three vendored/own scripts, nothing injected
    for tag, attrs in parser.tags:
        assert not any(name.startswith("on") for name, _ in attrs), (tag, attrs)
    # The data island survives as one JSON document with every name intact.
    island = parser.scripts[0]
    assert "</" not in island and "<" not in island
    payload = json.loads(island)
    frames = set(payload["frames"])
    for frame in (*HOSTILE_FRAMES, *JAVA_SPECIALS):
        assert any(frame in f for f in frames), frame
    assert HOSTILE_TASK in [t["name"] for t in payload["tasks"]]
    assert payload["runId"] == HOSTILE_RUN_ID
    # What a reader sees is the literal text.
    text = "".join(parser.text)
    assert HOSTILE_LABEL in text and HOSTILE_RUN_ID in text and HOSTILE_TASK in text
    assert "# </pre><script>window.__pwned=7</script>" in text


def test_candidate_patterns_show_hostile_frames_literally(tmp_path: Path) -> None:
    page = render_report(make_run_dir(tmp_path)).read_text(encoding="utf-8")
    parser = _Collector()
    parser.feed(page)
    assert {tag for tag, _ in parser.tags} <= ALLOWED_TAGS
    cells = "\n".join(parser.text)
    for frame in HOSTILE_FRAMES:  # unmatched leaves, so each is a candidate pattern
        assert f"\n{frame}\n" in f"\n{cells}\n", frame
        if "<" in frame:
            assert frame not in page  # only its escaped form is in the markup


def test_hostile_task_gets_its_own_stacks(tmp_path: Path) -> None:
    payload_page = render_report(_hostile_run(tmp_path), tmp_path / "out").read_text(encoding="utf-8")
    parser = _Collector()
    parser.feed(payload_page)
    payload = json.loads(parser.scripts[0])
    graph = next(g for g in payload["graphs"] if g["key"] == f"task:{HOSTILE_TASK}")
    assert graph["samples"] == 2 * sum(4 + i for i in range(len(HOSTILE_FRAMES)))
    buttons = [dict(attrs).get("data-task") for tag, attrs in parser.tags if tag == "button"]
    assert HOSTILE_TASK in buttons  # the attribute round-trips exactly
