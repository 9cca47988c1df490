"""A frame and the rules that name it: one spelling for Java methods whichever way the perf map was
written, the thread-start frames a correctly walked stack ends in, a folded stack's line, and the memo of
the frames a process's addresses were named as.

Java frames come out as ``com.example.CpuSplit::burnAlpha`` whichever way the map was written
(``jcmd Compiler.perfmap`` spells ``long com.example.CpuSplit.burnAlpha(long, long)``, our JVMTI agent
``Lcom/example/CpuSplit;::burnAlpha``); stubs and the interpreter keep the JVM's names (``Interpreter``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..capture.folded import FRAME_SEPARATOR, KERNEL_SUFFIX, sanitize_frame
from .perfmap import PerfMapLike

UNKNOWN = "[unknown]"
INTERPRETER = "Interpreter"  # HotSpot's template interpreter: one symbol for every interpreted frame
LOST_USER = "[lost user stack]"
LOST_KERNEL = "[lost kernel stack]"
MEMO_LIMIT = 100_000  # native addresses a process's memo takes during the window (~15 MB at most)

# Frames a correctly walked thread stack ends in (outermost first in the walk's order).
THREAD_ROOTS = frozenset(
    {
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "__clone3",
        "__clone_internal",
        "_start",
        "__libc_start_main",
        "__libc_start_call_main",
        "thread_native_entry",  # HotSpot (JDK 9+)
        "java_start",  # HotSpot (JDK 8)
        "JavaMain",  # the launcher's main Java thread
        "ThreadJavaMain",
    }
)


ROOT_WINDOW = 3
_PERF_MAP_AGENT = re.compile(r"^L([^;]+);::([^(]+)(\(.*)?$")
_QUALIFIED = re.compile(r"^([\w$./+-]+)\.([\w$<>-]+)$")


@dataclass(frozen=True)
class Frame:
    name: str
    kind: str  # "native", "jit" (perf map), "anon" (no file mapping, no perf-map entry), "unknown"
    module: str = ""  # a native frame's file name (libjvm.so); empty when unknown or not native

    @property
    def in_jit_code(self) -> bool:
        return self.kind in ("jit", "anon")


def java_frame_name(raw: str) -> str:
    """One spelling for Java methods from both perf-map writers; anything else is returned unchanged."""
    match = _PERF_MAP_AGENT.match(raw)
    if match:
        return f"{match.group(1).replace('/', '.')}::{match.group(2)}"
    head, paren, _ = raw.partition("(")
    if paren and raw.endswith(")"):
        qualified = head.rsplit(" ", 1)[-1]
        match = _QUALIFIED.match(qualified)
        if match:
            return f"{match.group(1)}::{match.group(2)}"
    return raw


def java_frame_kinds(frames: Sequence[Frame]) -> tuple[int, int, int, int]:
    """(Java frames, unresolved, interpreted, compiled methods) of one stack.

    Java frames are those in JIT memory; unresolved ones no perf map named; interpreted ones are the
    interpreter's single symbol; compiled methods are named ``pkg.Class::method``.
    """
    java = unresolved = interpreted = compiled = 0
    for frame in frames:
        if not frame.in_jit_code:
            continue
        java += 1
        if frame.kind == "anon":
            unresolved += 1
        elif frame.name == INTERPRETER:
            interpreted += 1
        elif "::" in frame.name:
            compiled += 1
    return java, unresolved, interpreted, compiled


def frame_base_name(name: str) -> str:
    """``JavaThread::run()`` -> ``JavaThread::run``; plain C names pass through."""
    return name.split("(", 1)[0].strip()


def reaches_thread_start(user_frames_leaf_first: Sequence[Frame]) -> bool:
    """One of the stack's ROOT_WINDOW outermost frames is a thread or process start frame."""
    return any(frame_base_name(frame.name) in THREAD_ROOTS for frame in user_frames_leaf_first[-ROOT_WINDOW:])


def fold_stack(comm: str, user_leaf_first: Sequence[str] | None, kernel_leaf_first: Sequence[str] | None) -> str:
    """Root first: thread name, user frames, kernel frames (``_[k]``). None marks a lost stack."""
    frames = [sanitize_frame(comm) or "[unnamed]"]
    if user_leaf_first is None:
        frames.append(LOST_USER)
    else:
        frames.extend(sanitize_frame(name) for name in reversed(user_leaf_first))
    if kernel_leaf_first is None:
        frames.append(LOST_KERNEL)
    else:
        frames.extend(sanitize_frame(name) + KERNEL_SUFFIX for name in reversed(kernel_leaf_first))
    return FRAME_SEPARATOR.join(frames)


class FrameMemo:
    """The frames of the addresses named so far, for a symbolizer's ``_resolve``; the JIT names are
    forgotten when the perf-map version changes (native names stay)."""

    perf_map: PerfMapLike | None = None
    _memo: dict[int, Frame]

    def set_perf_map(self, perf_map: PerfMapLike | None) -> None:
        """Name JIT code with this map from now on (native names stay cached)."""
        self.perf_map = perf_map
        self._memo = {addr: frame for addr, frame in self._memo.items() if frame.kind == "native"}

    def resolve(self, addr: int) -> Frame:
        frame = self._memo.get(addr)
        if frame is None:
            frame = self._memo[addr] = self._resolve(addr)
        return frame

    def resolve_native(self, addr: int) -> None:
        """Name ``addr`` now if it is native code (profiler/symbols/batches.py: during the window); other
        kinds are named later, with the perf map of their epoch. Stops adding at MEMO_LIMIT addresses."""
        if addr in self._memo or len(self._memo) >= MEMO_LIMIT:
            return
        frame = self._resolve(addr)
        if frame.kind == "native" and frame.module:  # a symbol found in a file: no perf map can rename it
            self._memo[addr] = frame

    def adopt_native(self, other: FrameMemo) -> None:
        """Take the native names ``other`` found (its cache was opened while the process ran)."""
        for addr, frame in other._memo.items():
            if frame.kind == "native" and frame.module:
                self._memo.setdefault(addr, frame)

    def _resolve(self, addr: int) -> Frame:
        raise NotImplementedError
