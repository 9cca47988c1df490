"""Full thread names on the real kernel: the uprobe on HotSpot's thread naming, jcmd's seed, and each
sample named by the name its thread had at the sample's time (a Spark-like pool renaming per task)."""

from __future__ import annotations

import re
import time
from collections import Counter

from profiler.sampling.sampler import StackSampler
from profiler.scope.threadnames import split_name
from tests.fixtures.renamer import BACKGROUND_THREAD, STAGE_METHODS, wait_ready

TASK_NAME = re.compile(r"^Executor task launch worker for task \d+\.0 in stage (\d\.0) \(TID (\d+)\)$")


def _stage_method(stack: str) -> str | None:
    return next((stage for stage, method in STAGE_METHODS.items() if f"::{method}" in stack), None)


def test_each_sample_is_named_by_the_task_its_thread_ran_then(task_renamer_jvm):
    # GIVEN a JVM whose two pool threads rename themselves every 40 ms (stage 1 and 2 alternate every
    # 8 tasks, each in its own method) and whose background thread was named before we looked
    sampler = StackSampler()
    try:
        sampler.start()
        sampler.begin_window()
        sampler.add_pid(task_renamer_jvm.pid)
        sampler.prepare_symbols(task_renamer_jvm.pid)
        # 8 s give ~2000 samples on an idle 2-core machine; on a loaded one keep going (up to 40 s)
        began = time.monotonic()
        time.sleep(8)
        while sampler.sample_count(task_renamer_jvm.pid) < 800 and time.monotonic() - began < 40:
            time.sleep(1)
        sampler.stop()
        # WHEN the window is collected
        result = sampler.collect()[task_renamer_jvm.pid]
        mode = sampler.thread_names
    finally:
        sampler.close()
    assert mode == "uprobe"
    roots = Counter()
    for stack, count in result.folded.items():
        roots[stack.split(";", 1)[0]] += count
    # THEN the stacks' roots are whole names: the pool's kind and the seeded background thread
    assert roots["Executor task launch worker"] > 300, roots.most_common(8)
    assert roots[BACKGROUND_THREAD] > 100, roots.most_common(8)
    # a sample taken while jcmd was still reading the names waited for them; only a pool thread renamed
    # between the uprobe's attach and jcmd's reading has no known name before that rename (kernel name)
    assert roots["Long-lived back"] == 0, roots.most_common(8)
    assert roots["Executor task l"] <= 0.05 * roots["Executor task launch worker"], roots.most_common(8)
    # AND every task sample carries its task's full name, and that name's stage is the stage the stack runs
    assert result.contexts
    tids, right, wrong = set(), 0, 0
    for (context, stack), count in result.contexts.items():
        match = TASK_NAME.match(context)
        assert match, context
        assert split_name(context) == ("Executor task launch worker", context)
        tids.add(int(match.group(2)))
        stage = _stage_method(stack)
        if stage is not None:
            right += count if stage == match.group(1) else 0
            wrong += count if stage != match.group(1) else 0
    assert len(tids) > 50  # 8 s or more of 40 ms tasks on two threads
    assert right > 300 and wrong <= 0.01 * (right + wrong), (right, wrong)
    assert sum(result.contexts.values()) == roots["Executor task launch worker"]
    assert result.stats.thread_names_kernel < 0.05 * result.stats.samples


def test_a_jvm_that_starts_during_the_window_is_named_from_its_first_threads(start_task_renamer):
    # GIVEN a sampler already running when the JVM is exec'd, and the JVM added at once (as the exec
    # watcher does), before it has even mapped libjvm.so
    sampler = StackSampler()
    try:
        sampler.start()
        sampler.begin_window()
        jvm = start_task_renamer()
        sampler.add_pid(jvm.pid)
        sampler.prepare_symbols(jvm.pid)
        wait_ready(jvm)
        time.sleep(6)
        sampler.stop()
        result = sampler.collect()[jvm.pid]
    finally:
        sampler.close()
    # THEN its threads carry full names: the uprobe saw them start, nothing needed jcmd
    roots = Counter()
    for stack, count in result.folded.items():
        roots[stack.split(";", 1)[0]] += count
    assert roots["Executor task launch worker"] > 0 and roots[BACKGROUND_THREAD] > 0, roots.most_common(8)
    assert result.contexts
    assert result.stats.thread_names_kernel < 0.05 * result.stats.samples, (result.stats, roots.most_common(8))
