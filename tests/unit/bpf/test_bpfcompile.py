"""Which mappings may be dropped after the BPF compiles (pure), and the one line a failed compile is told by;
tests/integration/test_bpfcompile.py drops them in a real process."""

from __future__ import annotations

from profiler.bpf.compiler import bcc_error, compiler_mappings

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fe:01 1001 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:               1024 kB
Rss:                 512 kB
Anonymous:             0 kB
7f0000100000-7f0002000000 r-xp 00100000 fe:01 1001 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:              31744 kB
Anonymous:             0 kB
7f0002000000-7f0002400000 r--p 02000000 fe:01 1001 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:               4096 kB
Anonymous:          4096 kB
7f0002400000-7f0002500000 rw-p 02400000 fe:01 1001 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Anonymous:             0 kB
7f0003000000-7f0004000000 r-xp 00000000 fe:01 1002 /usr/lib/llvm-14/lib/libclang-cpp.so.14
Anonymous:             0 kB
7f0005000000-7f0005100000 r-xp 00000000 fe:01 1003 /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
Anonymous:             0 kB
7f0006000000-7f0006100000 rw-p 00000000 00:00 0
Anonymous:          1024 kB
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
"""


def test_only_clean_read_only_mappings_of_llvm_and_clang_are_listed() -> None:
    assert compiler_mappings(SMAPS) == [
        (0x7F0000000000, 0x7F0000100000),  # read-only, no copied page
        (0x7F0000100000, 0x7F0002000000),  # code
        # not the relocated read-only data (anonymous pages), not the writable data
        (0x7F0003000000, 0x7F0004000000),  # clang's code
        # not libbcc (its code serves the maps and symbols during the window), not anonymous memory
    ]


def test_nothing_listed_in_garbage() -> None:
    assert compiler_mappings("") == []
    assert compiler_mappings("not smaps\nAnonymous: 0 kB\n7f-7e r-xp\n") == []


def test_compile_program_drops_compiler_pages_before_and_heap_after(monkeypatch) -> None:
    from profiler.bpf import compiler

    calls: list[str] = []
    monkeypatch.setattr(compiler, "release_compiler_pages", lambda: calls.append("pages") or 0)
    monkeypatch.setattr(compiler, "release_freed_memory", lambda: calls.append("heap"))

    def fake_bpf(text: bytes) -> str:
        calls.append(f"compile {text.decode()}")
        return "loaded"

    monkeypatch.setattr(compiler, "with_own_ids", lambda text: f"/* ids */ {text}")
    assert compiler.compile_program(fake_bpf, "int x;") == "loaded"
    assert calls == ["pages", "compile /* ids */ int x;", "heap"]


def test_a_bcc_failure_is_told_by_its_last_line_or_its_repr() -> None:
    # bcc's compile errors carry the compiler's output first and the cause last
    failure = Exception("/virtual/main.c:12:3: error: use of undeclared identifier 'x'\n1 error generated.\n"
                        "Failed to compile BPF module <text>\n")
    assert bcc_error(failure) == "Failed to compile BPF module <text>"
    assert bcc_error(Exception("  ")) == "Exception('  ')" and bcc_error(OSError()) == "OSError()"
