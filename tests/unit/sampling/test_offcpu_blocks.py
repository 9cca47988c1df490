"""The off-CPU tracer's pure steps: blocks still open at the window's end, stack naming (the tracing
frames dropped, lost stacks marked) and the BPF text's kernel checks."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from profiler.errors import CapabilityError
from profiler.sampling.offcpu import (
    BPF_SOURCE,
    DEFAULT_KERNEL_HZ,
    RawBlock,
    SwitchLayout,
    build_bpf_text,
    kernel_hz_of_config,
    label_threads,
    name_blocks,
    open_blocks,
    read_kernel_hz,
    without_tracing_frames,
)
from profiler.scope.threadnames import NameHistory


def test_open_blocks_count_up_to_the_end_and_respect_the_minimum() -> None:
    pending = [RawBlock(7, 1, 2, 1, "t", 1_000, 0), RawBlock(7, 1, 2, 1, "t", 9_500, 0)]
    assert open_blocks(pending, end_ns=10_000, min_block_ns=1_000) == [RawBlock(7, 1, 2, 1, "t", 9_000, 1)]


def test_tracing_frames_at_the_kernel_leaf_are_dropped_and_nothing_else() -> None:
    frames = ["bpf_prog_6a_raw_tracepoint__sched_switch", "bpf_trace_run4", "__schedule", "schedule", "bpf_prog_x"]
    assert without_tracing_frames(frames) == ["__schedule", "schedule", "bpf_prog_x"]


def test_blocks_are_named_classified_and_merged() -> None:
    stacks = {1: (0x10, 0x20), 2: (0x900, 0x901, 0x902)}
    user = {0x10: "Parker::park", 0x20: "main"}
    kernel = {0x900: "bpf_prog_1_sched_switch", 0x901: "futex_wait", 0x902: "do_syscall_64"}
    blocks = [
        RawBlock(7, 1, 2, 1, "worker", 4_000_000, 2),
        RawBlock(7, 1, 2, 1, "worker", 1_000_000, 1),  # the same stack closed at stop()
        RawBlock(7, -14, 2, 0, "worker", 3_000_000, 1),  # no user stack (EFAULT): lost, preempted
    ]
    entries = name_blocks(blocks, stacks.get, user.__getitem__, kernel.__getitem__)
    assert [(e.cause, e.stack, e.blocked_ns, e.switches) for e in entries] == [
        ("lock", "worker;main;Parker::park;do_syscall_64_[k];futex_wait_[k]", 5_000_000, 3),
        ("preempted", "worker;[lost user stack];do_syscall_64_[k];futex_wait_[k]", 3_000_000, 1),
    ]


def test_a_java_threads_last_java_frame_goes_below_the_walked_frames_and_names_the_cause() -> None:
    stacks = {1: (0x10,), 2: (0x901,)}
    user = {0x10: "__futex_abstimed_wait_common"}
    kernel = {0x901: "futex_wait"}
    java = {0x5000: "jdk.internal.misc.Unsafe::park", 0x6000: None}
    blocks = [
        RawBlock(7, 1, 2, 1, "pool-1", 4_000_000, 2, java_state=1, java_frame=0x5000),
        RawBlock(7, 1, 2, 1, "pool-1", 1_000_000, 1, java_state=1, java_frame=0x6000),  # unnamed: kernel's cause
        RawBlock(7, 1, 2, 1, "locker", 2_000_000, 1, java_state=2, java_frame=0x6000),  # a contended monitor
    ]
    entries = name_blocks(blocks, stacks.get, user.__getitem__, kernel.__getitem__, java.__getitem__)
    assert [(e.cause, e.stack, e.blocked_ns) for e in entries] == [
        ("park", "pool-1;jdk.internal.misc.Unsafe::park;__futex_abstimed_wait_common;futex_wait_[k]", 4_000_000),
        ("monitor", "locker;__futex_abstimed_wait_common;futex_wait_[k]", 2_000_000),
        ("lock", "pool-1;__futex_abstimed_wait_common;futex_wait_[k]", 1_000_000),
    ]


def test_a_whole_walk_keeps_its_own_frames_and_gets_no_last_java_frame_at_its_root() -> None:
    stacks = {1: (0x10, 0x20, 0x30), 2: (0x901,)}
    user = {0x10: "epoll_wait", 0x20: "sun.nio.ch.EPoll::wait", 0x30: "start_thread"}
    blocks = [RawBlock(7, 1, 2, 1, "poller", 4_000_000, 2, java_state=1, java_frame=0x5000)]
    entries = name_blocks(blocks, stacks.get, user.__getitem__, {0x901: "ep_poll"}.__getitem__,
                          {0x5000: "sun.nio.ch.EPoll::wait"}.__getitem__)
    assert [(e.cause, e.stack) for e in entries] == [
        ("net", "poller;start_thread;sun.nio.ch.EPoll::wait;epoll_wait;ep_poll_[k]")
    ]


def test_bpf_text_needs_the_four_argument_tracepoint_and_carries_the_offsets() -> None:
    source = BPF_SOURCE.read_text()
    text = build_bpf_text(source, SwitchLayout(task_pid_offset=1264, switch_args=4), 2_000_000)
    assert "#define NEXT_PID_OFF 1264" in text and "#define MIN_BLOCK_NS 2000000" in text
    assert "#define SAMPLE_EVERY 1\n" in text and "#define EXACT_PER_EPOCH 10\n" in text
    assert "#define SAMPLE_EVERY 10\n" in build_bpf_text(source, SwitchLayout(1264, 4), 1, sample_every=10)
    assert "#define WALK_BUDGET_PER_EPOCH 10\n" in text and "#define EPOCH_JIFFIES 25\n" in text
    assert "#define EPOCH_JIFFIES 100\n" in build_bpf_text(source, SwitchLayout(1264, 4), 1, hz=1000)
    for layout in (None, SwitchLayout(1264, 3), SwitchLayout(1264, None)):
        with pytest.raises(CapabilityError, match="kernel >= 5.18 with BTF; run without --off-cpu"):
            build_bpf_text(source, layout, 1)


def test_a_sampled_open_block_counts_its_weight() -> None:
    # a switch-out remembered with weight 10 (one in 10 of a busy thread's) still open at the end
    pending = [RawBlock(7, 1, 2, 1, "t", 1_000, 10)]
    assert open_blocks(pending, end_ns=4_000, min_block_ns=1_000) == [RawBlock(7, 1, 2, 1, "t", 30_000, 10)]


def test_blocks_of_threads_with_full_names_take_the_samples_kind_and_context() -> None:
    # GIVEN two task threads of one kind (Spark renames its pool thread per task), one thread without a
    # full name, and the sampler's namer (the same history the on-CPU samples are named from)
    history = NameHistory()
    history.renamed(7, 11, 100, "Executor task launch worker for task 1.0 in stage 3.0 (TID 8)")
    history.renamed(7, 12, 100, "Executor task launch worker for task 2.0 in stage 4.0 (TID 9)")
    history.renamed(7, 13, 100, "Flink Netty Server (6121) Thread 0")
    stacks = {1: (0x10,), 2: (0x901,)}
    user = {0x10: "Parker::park"}
    kernel = {0x901: "futex_wait"}
    blocks = [
        RawBlock(7, 1, 2, 1, "Executor task l", 4_000_000, 2, tid=11),
        RawBlock(7, 1, 2, 1, "Executor task l", 1_000_000, 1, tid=12),
        RawBlock(7, 1, 2, 1, "Flink Netty Ser", 3_000_000, 1, tid=13),
        RawBlock(7, 1, 2, 1, "VM Thread", 2_000_000, 1, tid=14),  # no full name: its comm, no context
    ]
    labels = label_threads([(b.tgid, b.tid, b.comm) for b in blocks], 200, history.label)
    # WHEN the blocks are named with those labels
    entries = name_blocks(blocks, stacks.get, user.__getitem__, kernel.__getitem__,
                          thread_of=lambda b: labels[(b.tgid, b.tid, b.comm)])
    # THEN the task threads share one stack (the kind) and keep their tasks apart as contexts
    assert [(e.stack, e.blocked_ns, e.context) for e in entries] == [
        ("Executor task launch worker;Parker::park;futex_wait_[k]", 4_000_000,
         "Executor task launch worker for task 1.0 in stage 3.0 (TID 8)"),
        ("Flink Netty Server (6121) Thread 0;Parker::park;futex_wait_[k]", 3_000_000, None),
        ("VM Thread;Parker::park;futex_wait_[k]", 2_000_000, None),
        ("Executor task launch worker;Parker::park;futex_wait_[k]", 1_000_000,
         "Executor task launch worker for task 2.0 in stage 4.0 (TID 9)"),
    ]


def test_without_thread_names_or_a_thread_id_blocks_keep_their_comm() -> None:
    def never(_tgid: int, _tid: int, _time: int, _comm: bytes) -> None:
        raise AssertionError("no thread id: not asked")

    assert label_threads([(7, 0, "worker")], 5, never) == {(7, 0, "worker"): ("worker", None)}
    assert label_threads([(7, 3, "worker")], 5, None) == {(7, 3, "worker"): ("worker", None)}
def test_the_kernels_hz_comes_from_its_configuration_else_the_default(tmp_path: Path) -> None:
    assert kernel_hz_of_config("# CONFIG_HZ_100 is not set\nCONFIG_HZ_1000=y\nCONFIG_HZ=1000\n") == 1000
    assert kernel_hz_of_config("CONFIG_HZ=fast\n") is None and kernel_hz_of_config("CONFIG_HZ=0\n") is None
    assert kernel_hz_of_config("") is None
    plain, packed, broken = tmp_path / "config-6.1", tmp_path / "config.gz", tmp_path / "broken.gz"
    plain.write_text("CONFIG_HZ=300\n")
    packed.write_bytes(gzip.compress(b"CONFIG_HZ=100\n"))
    broken.write_bytes(b"not gzip")
    assert read_kernel_hz([broken, tmp_path / "missing", packed, plain]) == 100
    assert read_kernel_hz([plain]) == 300
    assert read_kernel_hz([broken, tmp_path / "missing"]) == DEFAULT_KERNEL_HZ


def test_a_refused_program_is_one_line_naming_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a kernel (a fake bcc) that refuses the program
    import profiler.sampling.offcpu as offcpu

    monkeypatch.setattr(offcpu, "read_switch_layout", lambda: SwitchLayout(1264, 4))
    loaded: list[str] = []

    def accepts(text: bytes) -> str:
        loaded.append(text.decode())
        return "loaded"

    def refuses_all(text: bytes) -> str:
        raise Exception("bpf: Failed to load program: Permission denied\nno sched_switch")

    tracer = offcpu.OffCpuTracer(sample_every=10)
    # THEN a kernel that accepts it gets the program with this tracer's defines, the rates in an array
    assert tracer._load(accepts) == "loaded" and len(loaded) == 1
    assert "#define SAMPLE_EVERY 10" in loaded[0] and "BPF_ARRAY(switch_rates" in loaded[0]
    assert "TASK_STORAGE" not in loaded[0]
    # AND where it is refused, one line names the failure and the way out
    with pytest.raises(CapabilityError, match=r"cannot attach to the sched_switch raw tracepoint \(no sched_switch\); "
                                              "run without --off-cpu"):
        tracer._load(refuses_all)


def test_named_blocks_keep_the_set_of_their_threads() -> None:
    # GIVEN threads 11 and 12 blocked under one stack, 11 twice, and a block whose thread is not known
    stacks = {1: (0x20,), 2: (0x901,)}
    blocks = [
        RawBlock(7, 1, 2, 1, "worker", 4_000_000, 2, tid=11),
        RawBlock(7, 1, 2, 1, "worker", 1_000_000, 1, tid=11),
        RawBlock(7, 1, 2, 1, "worker", 2_000_000, 1, tid=12),
        RawBlock(7, 1, 2, 0, "worker", 3_000_000, 1),
    ]
    entries = name_blocks(blocks, stacks.get, {0x20: "main"}.__getitem__, {0x901: "futex_wait"}.__getitem__)
    # THEN the merged entry holds both threads once; the unknown thread stays unknown, not an empty set
    assert [(e.cause, e.threads) for e in entries] == [("lock", frozenset({11, 12})), ("preempted", None)]


def test_off_cpu_is_refused_inside_a_pid_namespace_of_its_own(monkeypatch) -> None:
    """sched_switch names the next thread by its initial-namespace id, which the agent's namespace ids of the
    switched-out thread never meet: one error line, not silently empty sums (profiler/bpf/pidns.py)."""
    from profiler.bpf.pidns import PidNamespace
    from profiler.sampling import offcpu

    monkeypatch.setattr(offcpu.os, "geteuid", lambda: 0)
    monkeypatch.setattr(offcpu, "own_pid_namespace", lambda: PidNamespace(dev=4, ino=4026532555))
    with pytest.raises(CapabilityError, match="PID namespace of its own.*run without --off-cpu"):
        offcpu.OffCpuTracer().start()
