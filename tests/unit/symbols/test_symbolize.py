"""Pure parts of symbolization: Java frame spelling, perf-map lookup, folding, the unwalkable heuristic."""

from __future__ import annotations

import pytest

from profiler.errors import ConfigError
from profiler.sampling.sampler import StackSampler
from profiler.symbols.frames import LOST_KERNEL, LOST_USER, Frame, fold_stack, java_frame_name
from profiler.symbols.perfmap import parse_perf_map
from profiler.symbols.symbolize import is_java_unwalkable


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # jcmd Compiler.perfmap (JDK 17+)
        ("long com.example.CpuSplit.burnAlpha(long, long)", "com.example.CpuSplit::burnAlpha"),
        ("void java.lang.Thread.run()", "java.lang.Thread::run"),
        ("void com.example.CpuSplit.<init>()", "com.example.CpuSplit::<init>"),
        ("void com.example.CpuSplit.lambda$main$0(int[], long)", "com.example.CpuSplit::lambda$main$0"),
        ("java.lang.Object[] java.util.ArrayList.toArray()", "java.util.ArrayList::toArray"),
        (
            "void com.example.CpuSplit$$Lambda$14/0x0000000800c03000.run()",
            "com.example.CpuSplit$$Lambda$14/0x0000000800c03000::run",
        ),
        ("int Main.work(int)", "Main::work"),
        # our agent / perf-map-agent
        ("Lcom/example/CpuSplit;::burnAlpha", "com.example.CpuSplit::burnAlpha"),
        ("Lcom/example/CpuSplit;::burnAlpha(JJ)J", "com.example.CpuSplit::burnAlpha"),
        ("Ljava/lang/Thread;::<init>", "java.lang.Thread::<init>"),
        # stubs and blobs keep their names
        ("Interpreter", "Interpreter"),
        ("StubRoutines (1)", "StubRoutines (1)"),
        ("I2C/C2I adapters(0xbc)", "I2C/C2I adapters(0xbc)"),
        ("StubRoutines::call_stub", "StubRoutines::call_stub"),
    ],
)
def test_java_frame_name_gives_one_spelling(raw: str, expected: str) -> None:
    assert java_frame_name(raw) == expected


def test_perf_map_lookup_later_lines_win_and_bounds_hold() -> None:
    perf_map = parse_perf_map(
        [
            "0x1000 0x100 old\n",
            "1000 80 new\n",  # same code cache space reused later: newer wins where they overlap
            "2000 10 other\n",
            "garbage line\n",
            "zz 10 bad-hex\n",
            "3000 0 empty\n",
        ]
    )
    assert len(perf_map) == 3
    assert perf_map.lookup(0x1000) == "new"
    assert perf_map.lookup(0x107F) == "new"
    assert perf_map.lookup(0x1080) == "old"
    assert perf_map.lookup(0x10FF) == "old"
    assert perf_map.lookup(0x1100) is None
    assert perf_map.lookup(0x2005) == "other"
    assert perf_map.lookup(0x0FFF) is None
    assert perf_map.lookup(0x3000) is None


def test_fold_stack_root_first_with_kernel_suffix_and_sanitized_frames() -> None:
    folded = fold_stack("burner-0", ["leaf;x", "mid", "start_thread"], ["do_syscall_64", "entry_SYSCALL_64"])
    assert folded == "burner-0;start_thread;mid;leaf:x;entry_SYSCALL_64_[k];do_syscall_64_[k]"
    assert fold_stack("t", None, None) == f"t;{LOST_USER};{LOST_KERNEL}"
    assert fold_stack("", [], []) == "[unnamed]"


def _frames(*spec: tuple[str, str]) -> list[Frame]:
    return [Frame(name, kind) for name, kind in spec]


def test_unwalkable_needs_java_code_and_a_missing_thread_start() -> None:
    walked = _frames(
        ("com.example.CpuSplit::burnAlpha", "jit"),
        ("Interpreter", "jit"),
        ("JavaCalls::call_helper(JavaValue*)", "native"),
        ("thread_native_entry(Thread*)", "native"),
        ("start_thread", "native"),
        ("[unknown]", "anon"),  # a garbage frame after glibc's start_thread
    )
    assert not is_java_unwalkable(walked, truncated=False)
    broken = _frames(("com.example.CpuSplit::burnAlpha", "jit"), ("[unknown]", "anon"))
    assert is_java_unwalkable(broken, truncated=False)
    assert not is_java_unwalkable(broken, truncated=True)  # counted as truncated instead
    assert not is_java_unwalkable(broken, truncated=False, java_process=False)
    native_only = _frames(("GCTaskThread::run", "native"), ("[libjvm.so]", "native"))
    assert not is_java_unwalkable(native_only, truncated=False)
    assert not is_java_unwalkable([], truncated=False)


def test_bpf_text_carries_the_limits_and_config_is_validated() -> None:
    sampler = StackSampler(frequency=49, max_stack_depth=300, stack_storage_size=1024)
    text = sampler.bpf_text("stackmap")
    assert "#define MAX_STACK_DEPTH 300" in text
    assert "#define STACK_STORAGE_SIZE 1024" in text
    assert "BPF_F_USER_STACK" in text and "targets.lookup" in text
    ring = sampler.bpf_text("ringbuf")
    assert "#define MAX_STACK_DEPTH 300" in ring and "#define KERNEL_STACK_DEPTH 127" in ring
    assert f"#define RINGBUF_PAGES {sampler.program.ringbuf_pages()}" in ring and "ringbuf_reserve" in ring
    assert sampler.program.record_size == 48 + 8 * (300 + 127)  # the walker's header (the default walk)
    assert StackSampler(max_stack_depth=300, stack_walk="kernel").program.record_size == 40 + 8 * (300 + 127)
    walker = sampler.bpf_text("walker")
    assert sampler.program.walk_slots == (236, 64)
    assert "#define LEAF_SLOTS 236" in walker and "#define ROOT_SLOTS 64" in walker
    assert "static __always_inline int cfi_step(struct unwind_regs *regs, u32 tgid)" in walker  # the header inlined
    assert '#include "cfi_step.h"' not in walker
    assert StackSampler().max_stack_depth == 1024 and StackSampler(stack_walk="kernel").max_stack_depth == 127
    for bad in (
        {"frequency": 0},
        {"max_stack_depth": 0},
        {"stack_storage_size": -1},
        {"perf_map_mode": "x"},
        {"collection": "x"},
        {"interval": 0},
        {"perf_map_refresh": -1},
        {"stack_walk": "x"},
        {"stack_walk": "bpf", "collection": "stackmap"},
    ):
        with pytest.raises(ConfigError):
            StackSampler(**bad)  # type: ignore[arg-type]


def test_depth_limit_raises_the_sysctl_and_restores_only_its_own_value(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from profiler.sampling import program as sampler_module

    sysctl = {"value": 127}
    busy = {"writes": 0}

    def read_int(path: str) -> int:
        return sysctl["value"]

    def write_int(path: str, value: int, attempts: int = 30) -> None:
        if busy["writes"]:
            busy["writes"] -= 1
            raise OSError(errno.EBUSY, "busy")
        sysctl["value"] = value

    monkeypatch.setattr(sampler_module, "_read_int", read_int)
    monkeypatch.setattr(sampler_module, "_write_int", write_int)
    warnings: list[str] = []
    limit = sampler_module.StackDepthLimit(400)
    assert limit.apply(warnings) == 400 and sysctl["value"] == 400
    limit.restore(warnings)
    assert sysctl["value"] == 127 and warnings == []
    busy["writes"] = 1  # another perf user holds the callchain buffers
    assert sampler_module.StackDepthLimit(400).apply(warnings) == 127 and sysctl["value"] == 127
    assert "lower --max-stack-depth" in warnings[0]
    assert sampler_module.StackDepthLimit(100).apply([]) == 100 and sysctl["value"] == 127


def test_walker_that_cannot_load_falls_back_to_bpf_get_stack_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.sampling import program as sampler_module

    class FakeBPF:
        PERF_EVENT = 7

        def __init__(self, text: bytes) -> None:
            if b"stack_walk.c" in text or b"walk_more" in text:
                raise Exception("verifier says no")
            self.text = text

    monkeypatch.setattr(sampler_module, "_read_int", lambda path: 127)
    written: list[tuple[str, int]] = []
    monkeypatch.setattr(sampler_module, "_write_int", lambda path, value: written.append((path, value)))
    sampler = StackSampler()
    loaded = sampler.program.load(FakeBPF)
    assert b"ringbuf_reserve" in loaded.text
    assert sampler.stack_walk == "kernel" and sampler.collection == "ringbuf" and sampler.max_stack_depth == 127
    assert written == []  # the fallback's depth fits the sysctl: nothing raised
    assert "own stack walker unavailable (verifier says no)" in sampler.warnings[0]
    # asked for by name, the walker's failure is the error
    with pytest.raises(Exception, match="verifier"):
        StackSampler(stack_walk="bpf").program.load(FakeBPF)
