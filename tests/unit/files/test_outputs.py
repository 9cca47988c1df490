"""profiler/files/outputs.py: what an output path may be, and what --force may replace (issue 32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.errors import ConfigError, OutputExistsError
from profiler.files import atomic
from profiler.files.outputs import MARKER, check_output_dir, check_output_file, csv_header, folded_text, mark_output_dir


def test_a_new_path_or_an_empty_directory_is_fine(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "a" / "b", "--out", force=False) == tmp_path / "a" / "b"
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", "--out", force=False)
    check_output_file(tmp_path / "new.csv", "--csv", force=False)


def test_a_directory_holding_only_the_marker_is_empty(tmp_path: Path) -> None:
    mark_output_dir(tmp_path, "a test")
    check_output_dir(tmp_path, "--out", force=False)


@pytest.mark.parametrize("force", [False, True])
def test_the_users_directory_is_refused_even_with_force(tmp_path: Path, force: bool) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="did not write"):
        check_output_dir(tmp_path, "--out", force=force)


def test_a_directory_of_ours_needs_force_unless_it_is_a_previous_output_of_the_same_kind(tmp_path: Path) -> None:
    mark_output_dir(tmp_path, "a test")
    (tmp_path / "summary.csv").write_text("x")
    with pytest.raises(OutputExistsError, match="add --force"):
        check_output_dir(tmp_path, "--out", force=False, own_kind=("report.json",), replace_own=True)
    check_output_dir(tmp_path, "--out", force=True)
    (tmp_path / "report.json").write_text("{}")
    check_output_dir(tmp_path, "--out", force=False, own_kind=("report.json",), replace_own=True)


def test_kinds_are_checked(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="is a file, --out takes a directory"):
        check_output_dir(tmp_path / "file", "--out", force=True)
    with pytest.raises(OutputExistsError, match="is a directory, --csv takes a file name"):
        check_output_file(tmp_path, "--csv", force=True)
    with pytest.raises(ConfigError, match="is not a directory"):
        check_output_file(tmp_path / "file" / "x.csv", "--csv", force=True)


def test_a_file_is_replaced_only_when_it_is_the_tools_own(tmp_path: Path) -> None:
    signature = csv_header("task", "samples", "share")
    own, mine = tmp_path / "own.csv", tmp_path / "mine.csv"
    own.write_text("task,samples,share\r\nGC,1,1\n")
    mine.write_text("my,own,table\n")
    with pytest.raises(OutputExistsError, match="add --force"):
        check_output_file(own, "--csv", force=False, signature=signature)
    check_output_file(own, "--csv", force=True, signature=signature)
    check_output_file(own, "--csv", force=False, signature=signature, replace_own=True)
    for force in (False, True):
        with pytest.raises(OutputExistsError):
            check_output_file(mine, "--csv", force=force, signature=signature, replace_own=True)


def test_folded_signature() -> None:
    assert folded_text(b"") and folded_text(b"a;b 5\nc 1\n")
    assert not folded_text(b"my notes\n")
    assert folded_text((b"a;b 5\n" + b"x" * 5000)[:4096])  # the cut last line of a full head is not judged


def test_a_failed_demo_is_recognised_by_its_marker_only(tmp_path: Path) -> None:
    from coordinator.commands.demo import WORKLOAD_DIR, _is_failed_demo, _prepare_out

    out = tmp_path / "demo"
    _prepare_out(out, force=False)
    assert [p.name for p in out.iterdir()] == [MARKER]  # profile_cluster finds it empty
    (out / WORKLOAD_DIR).mkdir()
    assert _is_failed_demo(out)
    with pytest.raises(OutputExistsError, match="add --force"):
        _prepare_out(out, force=False)
    _prepare_out(out, force=True)
    users = tmp_path / "users"
    (users / WORKLOAD_DIR).mkdir(parents=True)  # a folder of the user's that happens to be named so
    assert not _is_failed_demo(users)
    with pytest.raises(OutputExistsError, match="did not write"):
        _prepare_out(users, force=True)
    assert (users / WORKLOAD_DIR).is_dir()


def test_a_run_directory_is_private_and_its_files_get_their_mode_from_the_descriptor(tmp_path: Path) -> None:
    # issue 27: modes are set with fchmod on what was opened or made, never chmod by path
    from profiler.run import runner

    out = tmp_path / "run"
    out.mkdir(mode=0o755)
    runner.prepare_output(out, force=False)
    assert out.stat().st_mode & 0o777 == 0o700
    atomic.atomic_write_text(out / "private.txt", "x")
    atomic.atomic_write_text(out / "served.html", "x", mode=0o644)
    assert (out / "private.txt").stat().st_mode & 0o777 == 0o600
    assert (out / "served.html").stat().st_mode & 0o777 == 0o644


def test_a_run_directory_that_is_a_link_is_refused_and_its_target_keeps_its_mode(tmp_path: Path) -> None:
    from profiler.run import runner

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (tmp_path / "run").symlink_to(target)
    with pytest.raises((ConfigError, OutputExistsError, OSError)):
        runner.prepare_output(tmp_path / "run", force=True)
    assert target.stat().st_mode & 0o777 == 0o755
