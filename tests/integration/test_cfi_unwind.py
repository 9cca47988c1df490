"""Unwinding through code without frame pointers by .eh_frame tables in BPF (profiler/unwind/cfi_step.h),
on real processes, with the minimal walker of tests/fixtures/cfi_walker.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fixtures.cfi_walker import END_CFI, CfiWalker, Walk, cfi_walker
from tests.fixtures.sampling import assert_shares_match

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"

@pytest.fixture(scope="module")
def fpless_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.fail("gcc not installed: scripts/setup.sh installs it (build-essential)")
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


@contextmanager
def fpless_program(binary: Path, seconds: int, alpha: int, beta: int) -> Iterator[subprocess.Popen[str]]:
    """The FP-less program burning ``seconds`` of CPU over its two paths ``alpha``:``beta``, once it said "ready";
    it prints the two paths' CPU (ns, by its thread's own clock) when done, and ends when its stdin closes."""
    process = subprocess.Popen(
        [str(binary), str(seconds), str(alpha), str(beta)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        if process.stdin:
            process.stdin.close()
        process.wait(timeout=30)


def _names(walker: CfiWalker, walk: Walk, pid: int) -> tuple[str, ...]:
    return tuple(walker.bpf.sym(pc, pid).decode() for pc in walk.pcs)


def test_fpless_call_paths_split_like_the_truth(walker: CfiWalker, fpless_binary: Path) -> None:
    # GIVEN a program built without frame pointers whose one worker thread burns CPU in one leaf reached
    # through two paths, 3:1, and measures the split itself
    with fpless_program(fpless_binary, 6, 3, 1) as process:
        assert process.stdout is not None
        walker.add_pid(process.pid)
        # WHEN its samples are walked until it has done its 6 s of CPU
        alpha_ns, beta_ns = (int(value) for value in process.stdout.readline().split())
        walks = [walk for walk in walker.walks() if walk.tgid == process.pid]
        stacks = Counter(_names(walker, walk, process.pid) + (str(walk.end),) for walk in walks)
    # THEN every stack is whole (leaf → path → worker → start_thread → clone3, the outermost by CFI) ...
    assert len(walks) >= 300, f"only {len(walks)} samples"
    whole = [walk for walk in walks if walk.end == END_CFI]
    assert len(whole) / len(walks) >= 0.98, stacks.most_common(5)
    alpha = sum(n for stack, n in stacks.items() if stack[:2] == ("leaf", "path_alpha") and "clone3" in stack)
    beta = sum(n for stack, n in stacks.items() if stack[:2] == ("leaf", "path_beta") and "clone3" in stack)
    assert alpha + beta >= 0.9 * len(walks), stacks.most_common(5)
    # ... and the two paths split as the thread's own CPU clock says
    truth = alpha_ns / (alpha_ns + beta_ns)
    assert_shares_match({"alpha": alpha, "beta": beta}, {"alpha": truth, "beta": 1 - truth}, 1)


GLIBC_FUTEX = ("__futex_abstimed_wait_common", "pthread_cond_signal", "pthread_cond_wait", "__lll_lock_wake")


def test_jvm_in_glibc_futex_reaches_its_thread_start(walker: CfiWalker, tmp_path: Path) -> None:
    # GIVEN a JVM (frame pointers in Java code, none in glibc) whose two threads hand a token back and
    # forth with park/unpark: their CPU is in glibc's futex paths and in the kernel below them
    from profiler.symbols.procsyms import ProcessSymbols
    from tests.fixtures.jvm import java_home, javac

    java = java_home() / "bin" / "java"
    javac(tmp_path, WORKLOADS / "FutexPingPong.java")
    process = subprocess.Popen(
        [str(java), "-XX:+PreserveFramePointer", "-cp", str(tmp_path), "com.example.FutexPingPong", "120"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "READY"
        walker.add_pid(process.pid)
        # WHEN 5 s of its samples are walked (user- and kernel-mode samples alike)
        walker.walks()
        time.sleep(5)
        walks = [walk for walk in walker.walks() if walk.tgid == process.pid]
        symbols = ProcessSymbols(process.pid)
        try:
            stacks = Counter(tuple(symbols.resolve(pc).name for pc in walk.pcs) + (str(walk.end),) for walk in walks)
        finally:
            symbols.close()
    finally:
        if process.stdin:
            process.stdin.close()
        process.wait(timeout=60)
    # THEN nearly every stack walks out of glibc, through libjvm and the Java frames, to clone3
    assert len(walks) >= 200, f"only {len(walks)} samples"
    whole = sum(n for stack, n in stacks.items() if stack[-2] == "clone3" and stack[-1] == str(END_CFI))
    in_futex = sum(n for stack, n in stacks.items() if any(f.startswith(GLIBC_FUTEX) for f in stack))
    assert in_futex >= 0.3 * len(walks), stacks.most_common(5)
    assert whole / len(walks) >= 0.98, stacks.most_common(8)


def test_sampler_splits_fpless_call_paths_like_the_truth(fpless_binary: Path) -> None:
    # GIVEN the FP-less program (3:1 over two paths) and the product's sampler with its own walker
    from profiler.sampling.sampler import StackSampler

    # The sampler is compiled first: the program burns its 6 s right after "ready", and a compile on a
    # loaded host can take longer than that.
    with StackSampler(frequency=499, stack_walk="bpf") as sampler:
        sampler.start()
        with fpless_program(fpless_binary, 6, 3, 1) as process:
            assert process.stdout is not None
            assert sampler.prepare_unwinding([process.pid], wait=60), sampler.warnings
            sampler.add_pid(process.pid)
            sampler.begin_window()
            # WHEN it samples until the program has done its 6 s of CPU
            alpha_ns, beta_ns = (int(value) for value in process.stdout.readline().split())
            sampler.stop()
            collected = sampler.collect()[process.pid]
    folded, stats = collected.folded, collected.stats
    # THEN the stacks are whole and no sample is cut at a native frame ...
    whole = {stack: n for stack, n in folded.items() if ";clone3;start_thread;worker;" in stack}
    assert stats.samples >= 300, f"only {stats.samples} samples"
    assert sum(whole.values()) / stats.samples >= 0.98, folded.most_common(5)
    assert sum(stats.stacks_cut.values()) <= 0.01 * stats.samples, stats.stacks_cut
    # ... and the paths split as the thread's own CPU clock says
    alpha = sum(n for stack, n in whole.items() if ";path_alpha;leaf" in stack)
    beta = sum(n for stack, n in whole.items() if ";path_beta;leaf" in stack)
    truth = alpha_ns / (alpha_ns + beta_ns)
    assert_shares_match({"alpha": alpha, "beta": beta}, {"alpha": truth, "beta": 1 - truth}, 1)


def test_sampler_loads_tables_of_a_process_found_mid_window(fpless_binary: Path) -> None:
    # GIVEN a sampling window already running; WHEN the FP-less program starts and is added only then
    # (the loader's worker builds its tables while it is sampled)
    from profiler.sampling.sampler import StackSampler

    with StackSampler(frequency=499, stack_walk="bpf") as sampler:
        sampler.start()
        sampler.begin_window()
        with fpless_program(fpless_binary, 5, 1, 1) as process:
            assert process.stdout is not None
            sampler.add_pid(process.pid)
            process.stdout.readline()
            sampler.stop()
            stats = sampler.collect()[process.pid].stats
    # THEN only the samples before its tables were in are cut (the libraries' tables are built within a second)
    assert stats.samples >= 200
    assert sum(stats.stacks_cut.values()) <= 0.2 * stats.samples, stats.stacks_cut
