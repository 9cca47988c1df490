"""Compiling bcc programs without keeping LLVM's memory.

bcc compiles its C with LLVM inside our process: about 90 MB of heap per program, freed when the compile
ends but kept by glibc's allocator for reuse. A host profiler compiles up to four programs (the walker,
thread names, exec watch, network) one after the other; without giving that memory back after each
compile, the second compile stacks on the first one's leftovers and the unwind tables built next stack
on both. ``compile_program`` returns the heap to the kernel after every compile, so the peak is one
compile's, not their sum. Loading libbcc already makes LLVM's and clang's static initialisers touch
about 55 MB of their pages that no compile runs again, so ``compile_program`` also drops the compilers'
clean pages before each compile: the compile faults back only the code it runs (the walker's compile, the
agent's start-up peak: 196 -> 163 MB VmHWM). Once every program is compiled, ``release_compiler_pages``
drops LLVM's and clang's code pages from the process: file-backed and clean, about 85 MB of RSS the
window never uses.

Most starts compile nothing: ``compile_program`` first looks for the program in the compile cache
(``cache.py``, ``cached.py``: bcc's output from an earlier start on this kernel with this bcc) and loads it
without LLVM; it compiles, and fills the cache, only when there is no usable entry.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .cache import CacheError, cache_dir, entry_key, entry_name, read_entry, remove_entry
from .pidns import with_own_ids, write_own_namespace


def bcc_error(exc: BaseException) -> str:
    """One line for a failed compile or attach: bcc raises a bare Exception for both, the compiler's or
    the kernel's output first and the cause last; an exception with no text, its repr."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else repr(exc)


def release_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the kernel (``malloc_trim(0)``); a no-op
    where libc is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def compile_program(bpf_class: Any, text: str) -> Any:
    """``bpf_class(text=text)`` (bcc's BPF: compile and load), or the same program loaded from the
    compile cache without LLVM (``cached.py``) when an earlier start compiled it on this kernel with
    this bcc. A cold compile runs with the compilers' clean pages dropped before (the compile faults
    back what it runs) and LLVM's freed heap released after, and fills the cache. Either way the program
    is told the agent's PID namespace (``pidns.py``) before it is returned."""
    program = _compile(bpf_class, with_own_ids(text).encode())
    write_own_namespace(program)
    return program


def _compile(bpf_class: Any, source: bytes) -> Any:
    store = _cache_store(bpf_class, source)
    if store is not None:
        program = _load_cached(bpf_class, store)
        if program is not None:
            return program
    release_compiler_pages()
    try:
        if store is None:
            return bpf_class(text=source)
        from .cached import recording_class

        program = recording_class(bpf_class)(source, store)
        if store.problem is not None:
            _note(store, f"not stored ({store.problem})")
        return program
    finally:
        release_freed_memory()


def _cache_store(bpf_class: Any, source: bytes) -> Any:
    """The cache entry for ``source`` when ``bpf_class`` is bcc's BPF and the cache is on; None
    otherwise (a test's stand-in class compiles as it always did)."""
    try:
        import bcc
    except ImportError:
        return None
    directory = cache_dir()
    if directory is None or not isinstance(bpf_class, type) or not issubclass(bpf_class, bcc.BPF):
        return None
    from .cached import Store, host_fields

    return Store(directory, entry_key(source, [], host_fields()))


def _load_cached(bpf_class: Any, store: Any) -> Any:
    """The program built from its cache entry, or None (no entry yet; or an unusable one, which is
    said in one line and removed so this start's compile writes it again)."""
    from .cached import cached_class

    try:
        image = read_entry(store.directory, store.key)
    except CacheError as exc:
        if str(exc) != "no entry":
            _note(store, f"unusable ({exc}); compiled instead")
        return None
    store.image = image
    try:
        return cached_class(bpf_class)(image, store)
    except (CacheError, OSError) as exc:
        remove_entry(store.directory, store.key)
        _note(store, f"refused ({exc}); compiled instead")
        return None


def _note(store: Any, message: str) -> None:
    """One health line among the run's warnings."""
    from ..files import safeio

    line = f"BPF compile cache {store.directory / entry_name(store.key)}: {message}"
    safeio.warn(0, f"bpf-cache:{entry_name(store.key)}", line)


MADV_DONTNEED = 4
_COMPILER_LIBRARIES = ("libLLVM", "libclang")


def compiler_mappings(smaps_text: str) -> list[tuple[int, int]]:
    """Address ranges of the LLVM and clang libraries' mappings in ``/proc/self/smaps`` text that hold
    only clean file pages: not writable, and no anonymous (copied-on-write) page in them. Dropping
    such a range loses nothing: the next touch reads the file again. Relocated read-only data (RELRO)
    has anonymous pages and is never listed."""
    ranges: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps_text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            current = None
            name = head[5].rsplit("/", 1)[-1] if len(head) == 6 else ""
            if "w" not in head[1] and name.startswith(_COMPILER_LIBRARIES):
                low, high = head[0].split("-")
                current = (int(low, 16), int(high, 16))
        elif current is not None and line.startswith("Anonymous:"):
            if line.split()[1] == "0":
                ranges.append(current)
            current = None
    return ranges


def release_compiler_pages() -> int:
    """Once every program is compiled: drop this process's hold on the code and read-only data of LLVM
    and clang (about 85 MB of RSS, clean file pages that no BPF map operation uses). Their page cache
    stays the kernel's to keep or reclaim; a later compile faults them back in. Returns the bytes
    released; 0 where the maps cannot be read or no compiler library is mapped."""
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as handle:
            ranges = compiler_mappings(handle.read())
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return 0
    released = 0
    for low, high in ranges:
        if libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) == 0:
            released += high - low
    return released
