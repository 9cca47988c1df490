"""Walks this very thread's CPython frames as the BPF walker does (profiler/unwind/python_step.h), through
/proc/self/mem with the layout cpython.py picks, and prints them as one JSON line: run by
tests/unit/unwind/test_cpython.py with each CPython installed (PYTHONPATH: the repository)."""

from __future__ import annotations

import json
import os
import threading

from profiler.capture.stackstore import PYTHON_TAG
from profiler.unwind import cpython


def walk_self() -> None:
    namer = cpython.open_namer(os.getpid())
    t, m, L = namer.target, namer.memory, namer.target.layout
    # os.pread releases the GIL: tstate_current is NULL while we read; the thread list, as the walker falls back
    ts = m.u64(m.u64(t.runtime + L.interp_head) + L.threads_head)
    while m.u64(ts + L.ts_native_tid) != threading.get_native_id():
        ts = m.u64(ts + L.ts_next)
    cframe = ts if L.ts_cframe == cpython.NO_CFRAME else m.u64(ts + L.ts_cframe)
    frame = m.u64(cframe + L.cframe_frame)
    walked = []
    for _ in range(64):
        if not frame:
            break
        raw = m.read(frame, 80)
        code = int.from_bytes(raw[L.fr_code : L.fr_code + 8], "little")
        prev = int.from_bytes(raw[L.fr_prev_instr : L.fr_prev_instr + 8], "little")
        entry = (raw[L.fr_is_entry] & L.entry_mask) == L.entry_value
        index = ((prev - code - L.code_units) >> 1) & 16383
        walked.append(index << 47 | code | (cpython.ENTRY_BIT if entry else 0))
        frame = int.from_bytes(raw[L.fr_previous : L.fr_previous + 8], "little")
    if L.entry_is_shim:
        walked = cpython.entries_from_shims(walked)
    names = [(namer.name(PYTHON_TAG | value & ~cpython.ENTRY_BIT), int(value >> 63)) for value in walked]
    print(json.dumps({"version": t.version, "frames": names}))
    namer.close()


def outer() -> None:
    return walk_self()


if __name__ == "__main__":
    outer()
