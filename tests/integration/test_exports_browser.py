"""Exports in a real browser: the report's links to its speedscope and pprof files, and a speedscope
export opened in speedscope's own viewer (1.25.0, vendored in tests/data/speedscope/viewer) in
headless Chromium (Debian's chromium, tests/fixtures/browser.py) without errors."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.report.render import render_report
from tests.fixtures.browser import Chromium
from tests.fixtures.report import HOSTILE_FRAMES, make_run_dir

VIEWER = Path(__file__).resolve().parents[1] / "data" / "speedscope" / "viewer"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"  # gitignored screenshots
LINKS = "Array.from(document.querySelectorAll('#graph-exports a')).map(a => [a.getAttribute('href'), a.textContent])"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on 127.0.0.1 (speedscope fetches #profileURL=, which a file://
    page may not) and its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_report_links_each_flamegraph_to_its_exports(tmp_path: Path, chromium: Chromium) -> None:
    # GIVEN a report of a run whose frames look like markup
    run_dir = make_run_dir(tmp_path / "runs")
    index = render_report(run_dir)
    # WHEN Chromium opens it from disk
    chromium.open(index.as_uri())
    chromium.wait_for("document.querySelectorAll('#graph-exports a').length")
    # THEN the default (host) graph links both files, which exist beside the page
    links = chromium.evaluate(LINKS)
    assert [text for _, text in links] == ["speedscope file", "pprof file"]
    for href, _ in links:
        assert (index.parent / href).is_file(), href
    assert "-tagfocus=host=^node1$" in chromium.evaluate("document.getElementById('graph-exports').textContent")
    # AND switching to a PID's graph names that PID's speedscope profile and pprof filter
    chromium.evaluate(
        "(() => { const s = document.getElementById('graph-select'); s.value = 'pid:node1:2201';"
        " s.dispatchEvent(new Event('change')); })()"
    )
    text = chromium.wait_for(
        "(t => t.includes('2201') && t)(document.getElementById('graph-exports').textContent)"
    )
    assert "profile “node1 PID 2201 (spark executor)”" in text
    assert "-tagfocus=process=^node1:2201$" in text
    assert chromium.evaluate("typeof window.__pwned") == "undefined"
    assert chromium.errors() == []


def test_speedscope_export_opens_in_the_speedscope_viewer(
    tmp_path: Path, chromium: Chromium, served: tuple[Path, str]
) -> None:
    # GIVEN a speedscope export of a run with hostile frame names, beside speedscope's viewer
    root, base = served
    run_dir = make_run_dir(tmp_path / "runs")
    shutil.copytree(VIEWER, root, dirs_exist_ok=True)
    assert main(["export", str(run_dir), "--format", "speedscope", "--out", str(root / "run.speedscope.json")]) == 0
    document = json.loads((root / "run.speedscope.json").read_text(encoding="utf-8"))
    # WHEN the viewer loads it
    chromium.open(f"{base}/index.html#profileURL={base}/run.speedscope.json")
    # THEN it shows the run's first profile, draws it, and reports no error
    title = chromium.wait_for("document.title.includes('spe-taskprof') && document.title", timeout=30)
    assert document["name"] in title
    assert chromium.wait_for("document.querySelectorAll('canvas').length", timeout=30) >= 1
    page_text = chromium.evaluate("document.body.innerText")
    assert document["profiles"][0]["name"] in page_text
    assert "Something went wrong" not in page_text and "Failed to load" not in page_text
    assert chromium.evaluate("typeof window.__pwned") == "undefined"
    assert chromium.errors() == []
    chromium.screenshot(ARTIFACTS / "speedscope.png")
    # the hostile frames reach the viewer as data (it draws names on a canvas, never as markup)
    names = {frame["name"] for frame in document["shared"]["frames"]}
    assert set(HOSTILE_FRAMES) & names
