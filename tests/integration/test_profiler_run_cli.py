"""`profiler run` refuses bad input and missing privileges with one line, before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from profiler.cli import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "profiler", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_not_root_names_the_missing_capability(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    os.chmod(tmp_path, 0o777)
    result = run_cli("run", "--duration", "1", "--out", str(out), user=65534)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "CAP_BPF" in lines[0] and "CAP_PERFMON" in lines[0]
    assert not out.exists()


def test_existing_output_refused_without_force(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cap"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code = main(["run", "--duration", "1", "--out", str(out)])
    assert code == 5
    err = capsys.readouterr().err
    assert "--force" in err and (out / "keep.txt").read_text() == "precious"


def test_bad_profile_is_one_line_with_file_and_line(tmp_path: Path, capsys) -> None:
    profile = tmp_path / "bad_profile.txt"
    profile.write_text("Good: fine\nBad: re:([unclosed\n")
    out = tmp_path / "cap"
    code = main(["run", "--duration", "1", "--out", str(out), "--profile", str(profile)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{profile}:2" in err
    assert not out.exists()


def test_missing_pid_is_refused_before_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cap"
    code = main(["run", "--duration", "1", "--out", str(out), "--pid", "4194304"])
    assert code == 2 and "4194304" in capsys.readouterr().err
    assert not out.exists()
