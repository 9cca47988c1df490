"""profiler/files/atomic.py: a file or a directory tree is replaced whole or not at all."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from profiler.files.atomic import atomic_write_lines, atomic_write_text, staged_dir


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_atomic_write_is_private_unless_told_and_leaves_no_temporary(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.txt", "old\n")
    atomic_write_text(tmp_path / "a.txt", "new\n")
    atomic_write_lines(tmp_path / "b.txt", (f"{n}\n" for n in range(5)), batch_chars=3)
    atomic_write_text(tmp_path / "served.txt", "page\n", mode=0o644)
    assert (tmp_path / "a.txt").read_text() == "new\n"
    assert (tmp_path / "b.txt").read_text() == "0\n1\n2\n3\n4\n"
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "served.txt").stat().st_mode) == 0o644
    assert _names(tmp_path) == ["a.txt", "b.txt", "served.txt"]


def test_staged_dir_swaps_the_whole_tree(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.folded").write_text("a 1\n")
    with staged_dir(target) as staging:
        (staging / "fresh.folded").write_text("b 2\n")
        assert _names(target) == ["stale.folded"]  # the old tree until the block ends
    assert _names(target) == ["fresh.folded"]  # nothing of the old tree lingers
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert _names(tmp_path) == ["out"]


def test_staged_dir_keeps_the_old_tree_when_the_block_raises(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "kept.folded").write_text("a 1\n")
    with pytest.raises(RuntimeError), staged_dir(target) as staging:
        (staging / "half.folded").write_text("b")
        raise RuntimeError("killed mid-write")
    assert _names(target) == ["kept.folded"]
    assert _names(tmp_path) == ["out"]  # the staging directory is gone
