"""Unwinding through code without frame pointers by .eh_frame tables in BPF (profiler/bpf/cfi_step.h),
on real processes, with the minimal walker of tests/fixtures/cfi_walker.py."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.cfi_walker import END_CFI, CfiWalker, Walk, cfi_walker

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF needs root")


@pytest.fixture(scope="module")
def fpless_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    binary = tmp_path_factory.mktemp("fpless") / "fpless_split"
    subprocess.run(
        ["gcc", "-O2", "-fomit-frame-pointer", "-pthread", "-o", str(binary), str(WORKLOADS / "fpless_split.c")],
        check=True,
        timeout=120,
    )
    return binary


@pytest.fixture
def walker() -> Iterator[CfiWalker]:
    with cfi_walker(frequency=499) as active:
        yield active


def _names(walker: CfiWalker, walk: Walk, pid: int) -> tuple[str, ...]:
    return tuple(walker.bpf.sym(pc, pid).decode() for pc in walk.pcs)


def test_fpless_call_paths_split_like_the_truth(walker: CfiWalker, fpless_binary: Path) -> None:
    # GIVEN a program built without frame pointers whose one worker thread burns CPU in one leaf reached
    # through two paths, 3:1, and measures the split itself
    process = subprocess.Popen(
        [str(fpless_binary), "6", "3", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "ready"
        walker.add_pid(process.pid)
        # WHEN its samples are walked until it has done its 6 s of CPU
        alpha_ns, beta_ns = (int(value) for value in process.stdout.readline().split())
        walks = [walk for walk in walker.walks() if walk.tgid == process.pid]
        stacks = Counter(_names(walker, walk, process.pid) + (str(walk.end),) for walk in walks)
    finally:
        if process.stdin:
            process.stdin.close()
        process.wait(timeout=30)
    # THEN every stack is whole (leaf → path → worker → start_thread → clone3, the outermost by CFI) ...
    assert len(walks) >= 300, f"only {len(walks)} samples"
    whole = [walk for walk in walks if walk.end == END_CFI]
    assert len(whole) / len(walks) >= 0.98, stacks.most_common(5)
    alpha = sum(n for stack, n in stacks.items() if stack[:2] == ("leaf", "path_alpha") and "clone3" in stack)
    beta = sum(n for stack, n in stacks.items() if stack[:2] == ("leaf", "path_beta") and "clone3" in stack)
    assert alpha + beta >= 0.9 * len(walks), stacks.most_common(5)
    # ... and the two paths split as the thread's own CPU clock says
    truth = alpha_ns / (alpha_ns + beta_ns)
    measured = alpha / (alpha + beta)
    z = (measured - truth) / math.sqrt(truth * (1 - truth) / (alpha + beta))
    assert abs(z) <= 4, f"alpha share {measured:.3f} vs truth {truth:.3f} (z = {z:.2f}, n = {alpha + beta})"
