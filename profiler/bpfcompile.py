"""Compiling a bcc program without keeping LLVM's heap.

bcc compiles its C with LLVM inside our process: about 90 MB of heap per program, freed when the compile
ends but kept by glibc's allocator for reuse. A host profiler compiles up to four programs (the walker,
thread names, exec watch, network) one after the other; without giving that memory back after each
compile, the second compile stacks on the first one's leftovers and the unwind tables built next stack
on both. ``compile_program`` returns the heap to the kernel after every compile, so the peak is one
compile's, not their sum.
"""

from __future__ import annotations

import ctypes
from typing import Any


def release_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the kernel (``malloc_trim(0)``); a no-op
    where libc is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def compile_program(bpf_class: Any, text: str) -> Any:
    """``bpf_class(text=text)`` (bcc's BPF: compile and load), then LLVM's freed heap released."""
    try:
        return bpf_class(text=text.encode())
    finally:
        release_freed_memory()
