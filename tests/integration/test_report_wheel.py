"""Render from an installed wheel, not the source tree: templates and vendored JavaScript must ship in
the package. Also `coordinator serve` from that install answers on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.report import make_run_dir, read_payload

REPO = Path(__file__).resolve().parents[2]
# The package is built from a copy of the tree so concurrent builds never share build/ or *.egg-info.
SKIP_IN_COPY = shutil.ignore_patterns(
    ".venv", ".git", "runs", "tests", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".mypy_cache", ".ruff_cache", "bench", "docs",
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with only the wheel installed (--no-deps); its dependencies (jinja2, psutil)
    come from the project venv's site-packages, appended to sys.path by a .pth file."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    shutil.copytree(REPO, source, ignore=SKIP_IN_COPY)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
         str(source)],
        check=True, timeout=300, capture_output=True,
    )
    wheel = next((root / "dist").glob("spe_taskprof-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, timeout=300, capture_output=True,
    )
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()
    Path(site, "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    shutil.rmtree(source)
    yield venv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_report_renders_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    # GIVEN a crafted run and a venv whose coordinator package comes from the wheel
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c",
         "import coordinator, coordinator.templates as t; print(coordinator.__file__); print(list(t.__path__)[0])"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=60,
    ).stdout.split()
    assert all(path.startswith(str(installed)) for path in where), where
    run_dir = make_run_dir(tmp_path / "runs")
    site = tmp_path / "site"

    # WHEN the installed console script renders and publishes it
    result = subprocess.run(
        [str(installed / "bin" / "coordinator"), "report", str(run_dir), "--publish", str(site)],
        capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120,
    )

    # THEN the report directory is complete and self-contained
    assert result.returncode == 0, result.stderr
    assert "report: wrote" in result.stdout
    report = run_dir / "report"
    vendored = installed.glob("lib/python*/site-packages/coordinator/templates/vendor")
    vendor_dir = next(vendored)
    for name in ("d3.min.js", "d3-flamegraph.min.js", "d3-flamegraph.css", "d3.LICENSE", "d3-flamegraph.LICENSE"):
        assert (report / "vendor" / name).read_bytes() == (vendor_dir / name).read_bytes(), name
    for name in ("index.html", "report.js", "report.css", "report.json"):
        assert (report / name).stat().st_size > 0, name
    payload = read_payload(report / "index.html")
    assert {g["key"] for g in payload["graphs"]} >= {"host:node1", "pid:node1:2201", "task:Kafka"}  # type: ignore[union-attr]
    assert (site / run_dir.name / "index.html").is_file() and (site / "index.html").is_file()


def test_serve_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<!DOCTYPE html><title>served</title>")
    server = subprocess.Popen(
        [str(installed / "bin" / "coordinator"), "serve", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # the ready handshake: the URL with the chosen port
        assert line.startswith("serve: ") and "http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "index.html", timeout=10) as response:
            assert response.status == 200
            assert b"<title>served</title>" in response.read()
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=10)
    assert server.returncode == 0
    assert "serve: stopped" in out
