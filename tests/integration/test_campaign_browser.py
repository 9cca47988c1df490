"""The campaign page and compare's differential flamegraph in a real headless Chromium, opened from disk:
they draw their figures (a panel per task with error bars, stacked totals; coloured frames), show
hostile names as text and log no error. Screenshots go to tests/artifacts/."""

from __future__ import annotations

from pathlib import Path

from coordinator.cli import main as coordinator_main
from tests.fixtures.browser import Chromium
from tests.fixtures.captures import gc_grown_runs, multi_run_hosts, write_run_dir

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
HOSTILE = "<img src=x onerror=alert(1)>"


def test_campaign_page_in_headless_chromium(tmp_path: Path, chromium: Chromium) -> None:
    # GIVEN two engines (one with a name that looks like markup) at three rates
    runs = []
    for index, (spe, rate) in enumerate([(s, r) for s in ("spark", HOSTILE) for r in ("5000", "10000", "20000")]):
        runs.append(
            write_run_dir(
                tmp_path / "runs" / f"r{index}",
                f"r{index}",
                multi_run_hosts(1 + index % 3),
                labels={"spe": spe, "rate": rate},
                events={"h1": int(rate), "h2": int(rate)},
            )
        )
    out = tmp_path / "campaign"
    assert coordinator_main(["campaign", *map(str, runs), "--out", str(out)]) == 0

    # WHEN Chromium opens the page from disk
    chromium.open((out / "report" / "index.html").as_uri())
    chromium.wait_for("document.body.getAttribute('data-rendered') === 'campaign'")

    # THEN a panel per task and one for the total, each with a line per engine and error bars per point
    assert chromium.evaluate("document.querySelectorAll('svg.task-panel').length") == 5
    assert (
        chromium.evaluate(
            "document.querySelector('svg.task-panel[data-task=\"GC\"]').querySelectorAll('path.series-line').length"
        )
        == 2
    )
    assert (
        chromium.evaluate(
            "document.querySelector('svg.task-panel[data-task=\"GC\"]').querySelectorAll('g.point').length"
        )
        == 6
    )
    assert chromium.evaluate("document.querySelectorAll('svg.task-panel[data-task=\"GC\"] line.error-bar').length") == 6
    # AND one stacked chart per engine, three bars of four tasks each; the hostile name is text
    assert chromium.evaluate("document.querySelectorAll('svg.stacked-panel').length") == 2
    assert chromium.evaluate("document.querySelectorAll('svg.stacked-panel rect').length") == 2 * 3 * 4
    assert chromium.evaluate("document.querySelectorAll('img').length") == 0
    assert HOSTILE in chromium.evaluate("document.getElementById('series-legend').textContent")
    assert chromium.errors() == []
    chromium.screenshot(ARTIFACTS / "campaign.png")


def test_differential_flamegraph_in_headless_chromium(tmp_path: Path, chromium: Chromium) -> None:
    # GIVEN two analysed runs: GC's share doubles, Deserialize's falls, Kafka's stays
    run_a, run_b = gc_grown_runs(tmp_path)
    out = tmp_path / "cmp"
    assert coordinator_main(["compare", str(run_a), str(run_b), "--out", str(out)]) == 0

    # WHEN Chromium opens the page
    chromium.open((out / "index.html").as_uri())
    chromium.wait_for("document.querySelectorAll('#diff-flame-chart g.frame').length > 4")

    # THEN GC's frames are red (grew), the JSON parser's blue (shrank), Kafka's pale (no significant change)
    def fill(name: str) -> str:
        return str(
            chromium.evaluate(
                "(() => { const g = Array.from(document.querySelectorAll('#diff-flame-chart g.frame'))"
                f".find(g => g.getAttribute('name') === {name!r});"
                " return g.querySelector('rect').getAttribute('fill'); })()"
            )
        )

    def rgb(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.removeprefix("rgb(").removesuffix(")").split(","))

    red, green, blue = rgb(fill("G1ParTask::work"))
    assert red > blue and red > green
    red, green, blue = rgb(fill("com.fasterxml.jackson.core.JsonParser.nextToken"))
    assert blue > red
    assert fill("org.apache.kafka.clients.consumer.KafkaConsumer.poll") in ("#e1e4e8", "rgb(225, 228, 232)")
    assert chromium.errors() == []
    chromium.screenshot(ARTIFACTS / "compare-diff-flamegraph.png")
