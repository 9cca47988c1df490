"""CPython's frames: the location table, the splice into native stacks, the mappings looked for, and the whole
reader on this very interpreter (its own memory, no privileges needed); the 3.11 table against the DWARF of a
libpython that has it."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from profiler.capture.stackstore import PYTHON_MASK, PYTHON_TAG
from profiler.unwind import cpython
from profiler.unwind.cpython import ENTRY_BIT, INDEX_SHIFT, LAYOUTS, line_of, module_of, python_mappings, splice
from profiler.unwind.vmstructs import ProcessMemory

# the venv's CPython (3.11, pinned by the set-up) and its shared library, with its DWARF
LIBPYTHON_311 = os.path.join(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME"))


def sample_function(x: int) -> int:
    y = 0
    for i in range(x):
        if i % 3 == 0:
            y += (i *
                  2)  # fmt: skip
        else:
            y -= 1
    try:
        y += len([a for a in range(3)])
    except ValueError:
        pass
    return y


@pytest.mark.parametrize("code", [sample_function.__code__, json.dumps.__code__, textwrap.wrap.__code__])
def test_line_of_every_instruction_as_cpython_says(code) -> None:
    positions = list(code.co_positions())  # one per code unit
    assert positions
    for index, position in enumerate(positions):
        assert line_of(code.co_linetable, code.co_firstlineno, index) == position[0], index
    assert line_of(code.co_linetable, code.co_firstlineno, len(positions) + 5) is None
    assert line_of(b"\xff\x00", 1, 0) is None and line_of(b"", 1, 0) is None  # crafted: no location, empty


def _u64s(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def test_splice_puts_each_eval_calls_frames_leafward_of_it() -> None:
    # GIVEN a native stack, leaf first: leaf C, eval (runs f2, f1 entry), C call, eval (runs f0 entry), main
    evals = [(0x1000, 0x2000)]
    user = _u64s(0x9000, 0x1010, 0x3000, 0x1020, 0x4000)
    python = [0xA1 | 5 << INDEX_SHIFT, 0xA2 | ENTRY_BIT, 0xA3 | ENTRY_BIT]
    values = struct.unpack("<8Q", splice(user, python, evals))
    tag = PYTHON_TAG
    assert values == (0x9000, tag | 0xA1 | 5 << INDEX_SHIFT, tag | 0xA2, 0x1010, 0x3000, tag | 0xA3, 0x1020, 0x4000)
    assert all(v & PYTHON_MASK == PYTHON_TAG for v in values[1:3])
    # a native walk cut before the outer eval: the frames left go to the root end; none: unchanged
    cut = struct.unpack("<5Q", splice(_u64s(0x9000, 0x1010), python, evals))
    assert cut == (0x9000, tag | 0xA1 | 5 << INDEX_SHIFT, tag | 0xA2, 0x1010, tag | 0xA3)
    assert splice(user, [], evals) == user


def test_313_shim_frames_become_311_entry_flags() -> None:
    # GIVEN 3.13 frames leaf first: f2, f1, the inner eval's shim, f0, the outer eval's shim
    walked = [0xA1, 0xA2 | 3 << INDEX_SHIFT, 0xF0 | ENTRY_BIT, 0xA3, 0xF1 | ENTRY_BIT]
    # THEN the shims go and the frame leafward of each is its call's entry frame, as 3.11's is_entry says
    assert cpython.entries_from_shims(walked) == [0xA1, 0xA2 | 3 << INDEX_SHIFT | ENTRY_BIT, 0xA3 | ENTRY_BIT]
    assert cpython.entries_from_shims([0xF0 | ENTRY_BIT]) == []  # a call that has not pushed its frame yet


# CPython 3.13.0's own _Py_DebugOffsets (pyenv's build, read from its _PyRuntime)
_DEBUG_313 = dict(
    zip(
        cpython.DEBUG_OFFSETS[(3, 13)],
        (
            0x30D00F0, 0, 283320, 608, 632, 194968, 7272, 8, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0, 7768, 7760,
            304, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120, 128, 136, 68, 52, 96, 104,
            200, 16, 8, 416, 24, 88, 168, 32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32, 64,
            32, 16, 40, 240, 200,
        ),
        strict=True,
    )
)  # fmt: skip


def _debug_offsets(**changed: int) -> bytes:
    values = {**_DEBUG_313, **changed}
    return cpython.DEBUG_COOKIE + struct.pack(f"<{len(values)}Q", *values.values())


def test_313_layout_from_its_debug_offsets_and_what_is_refused() -> None:
    fields = cpython.DEBUG_OFFSETS[(3, 13)]
    # GIVEN 3.13.0's offsets WHEN read THEN the walker's and the namer's fields come from them
    layout = cpython.layout_from_debug_offsets(_debug_offsets(), fields, 0x30D00F0)
    assert (layout.interp_head, layout.threads_head, layout.ts_native_tid, layout.cframe_frame) == (632, 7344, 160, 72)
    assert (layout.ts_cframe, layout.tstate_current, layout.fr_code, layout.fr_prev_instr) == (
        cpython.NO_CFRAME,
        0,
        0,
        56,
    )
    assert (layout.fr_is_entry, layout.entry_mask, layout.entry_value, layout.entry_is_shim) == (70, 0xFF, 3, True)
    assert (layout.code_units, layout.co_firstlineno, layout.co_qualname) == (200, 68, 128)
    assert (layout.str_ascii_data, layout.str_compact_data, layout.bytes_data) == (40, 56, 32)
    # AND a wrong cookie, another version, a free-threaded build, an offset out of its struct or beyond what
    # the walker reads of a frame are refused
    refused = {
        b"ydebugpy" + _debug_offsets()[8:]: "cookie",
        _debug_offsets(version=0x30D01F0): "version",
        _debug_offsets(free_threaded=1): "free-threaded",
        _debug_offsets(ts_native_thread_id=304): "ts_native_thread_id",
        _debug_offsets(co_size=0): "co_size",
        _debug_offsets(fr_size=1 << 40): "fr_size",
        _debug_offsets(fr_instr_ptr=64, fr_size=96): "frame fields",
        _debug_offsets()[:100]: "cookie",
    }
    for raw, reason in refused.items():
        with pytest.raises(cpython.PythonLayoutError, match=reason):
            cpython.layout_from_debug_offsets(raw, fields, 0x30D00F0)


def test_module_of_and_mappings() -> None:
    assert module_of("/app/jobs/py_split.py") == "py_split"
    assert module_of("/usr/lib/python3.11/json/__init__.py") == "json"
    assert module_of("<string>") == "<string>"
    lines = [
        "55d0-56d0 r--p 00000000 fe:00 12 /usr/bin/python3.11\n",
        "56d0-57d0 r-xp 00001000 fe:00 12 /usr/bin/python3.11\n",
        "7f00-7f10 r--p 00000000 fe:00 13 /opt/lib/libpython3.11.so.1.0\n",
        "7f20-7f30 r--p 00000000 fe:00 14 /usr/lib/libpythonista.so\n",
        "7f40-7f50 r--p 00000000 fe:00 15 /home/u/python3.11 (deleted)\n",
        "zz-7f60 r--p 00000000 fe:00 16 /usr/bin/python3\n",
    ]
    assert python_mappings(lines) == [
        ("/opt/lib/libpython3.11.so.1.0", 0x7F00, 0x7F10),
        ("/usr/bin/python3.11", 0x55D0, 0x56D0),
    ]


def test_reads_this_interpreter_and_names_a_live_code_object() -> None:
    # GIVEN this very process (its own memory: no privileges) WHEN its CPython is opened
    namer = cpython.open_namer(os.getpid())
    try:
        target = namer.target
        assert target.version == "{}.{}.{}".format(*sys.version_info[:3])
        assert any(low < high for low, high in target.eval_ranges)
        # THEN a code object's address and instruction index name its function, file and line
        code = sample_function.__code__
        index = 7
        expected_line = list(code.co_positions())[index][0]
        value = PYTHON_TAG | index << INDEX_SHIFT | id(code)
        assert namer.name(value) == f"test_cpython.sample_function (test_cpython.py:{expected_line})"
        # AND an address that holds no code object names nothing
        assert namer.name(PYTHON_TAG | id(object())) is None
        entry = type("Entry", (), {})()
        cpython.fill_python(entry, target)
        assert entry.runtime == target.runtime and entry.fr_code == target.layout.fr_code
    finally:
        namer.close()


def test_a_version_without_layout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpython, "LAYOUTS", {(3, 99): next(iter(LAYOUTS.values()))})
    monkeypatch.setattr(cpython, "DEBUG_OFFSETS", {})
    memory = ProcessMemory(os.getpid())
    try:
        with pytest.raises(cpython.PythonLayoutError, match=r"no frame layout for it \(named: 3.99\)"):
            cpython.open_target(os.getpid(), memory)
    finally:
        memory.close()


_GDB_FIELDS = {
    "fr_code": ("struct _PyInterpreterFrame", "f_code"),
    "fr_previous": ("struct _PyInterpreterFrame", "previous"),
    "fr_prev_instr": ("struct _PyInterpreterFrame", "prev_instr"),
    "fr_is_entry": ("struct _PyInterpreterFrame", "is_entry"),
    "cframe_frame": ("struct _PyCFrame", "current_frame"),
    "ts_next": ("struct _ts", "next"),
    "ts_interp": ("struct _ts", "interp"),
    "ts_native_tid": ("struct _ts", "native_thread_id"),
    "ts_cframe": ("struct _ts", "cframe"),
    "threads_head": ("struct _is", "threads.head"),
    "interp_head": ("struct pyruntimestate", "interpreters.head"),
    "tstate_current": ("struct pyruntimestate", "gilstate.tstate_current"),
    "code_units": ("PyCodeObject", "co_code_adaptive"),
    "co_firstlineno": ("PyCodeObject", "co_firstlineno"),
    "co_filename": ("PyCodeObject", "co_filename"),
    "co_qualname": ("PyCodeObject", "co_qualname"),
    "co_linetable": ("PyCodeObject", "co_linetable"),
}


def test_the_311_table_is_what_the_debug_info_says() -> None:
    commands = []
    for struct_name, field in _GDB_FIELDS.values():
        commands += ["-ex", f"print (long)&(({struct_name} *)0)->{field}"]
    result = subprocess.run(
        ["gdb", "-batch", "-nx", *commands, LIBPYTHON_311], capture_output=True, text=True, timeout=120, check=False
    )
    offsets = [int(value) for value in re.findall(r"^\$\d+ = (\d+)$", result.stdout, re.M)]
    assert len(offsets) == len(_GDB_FIELDS), result.stdout + result.stderr
    layout = LAYOUTS[(3, 11)]
    assert {name: getattr(layout, name) for name in _GDB_FIELDS} == dict(zip(_GDB_FIELDS, offsets, strict=True))


def _installed_cpythons() -> list[str]:
    found = [os.path.realpath(sys.executable)]
    # Debian's static 3.11 and pyenv's 3.13 (its layout read from its own _Py_DebugOffsets), where installed
    for path in ("/usr/bin/python3.11", os.path.expanduser("~/.pyenv/versions/3.13.0/bin/python3.13")):
        if os.path.exists(path) and os.path.realpath(path) not in found:
            found.append(os.path.realpath(path))
    return found


@pytest.mark.parametrize("python", _installed_cpythons())
def test_the_layout_walks_a_live_threads_frames_on_each_installed_cpython(python: str) -> None:
    # GIVEN a CPython that walks its own thread's frames as the BPF walker would (thread list, cframe,
    # previous, is_entry) through /proc/self/mem (shared and static builds: pyenv's and Debian's 3.11)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    script = os.path.join(root, "tests", "workloads", "py_selfwalk.py")
    result = subprocess.run(
        [python, script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": root},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    walked = json.loads(result.stdout)
    names = [name for name, _entry in walked["frames"]]
    # THEN the frames below the read in flight are the script's, innermost first, each at the line it runs
    with open(script) as handle:
        lines = handle.read().splitlines()
    read, call, main = "        raw = m.read(frame, 80)", "    return walk_self()", "    outer()"
    at = {text: lines.index(text) + 1 for text in (read, call, main)}
    assert names[-3:] == [
        f"py_selfwalk.walk_self (py_selfwalk.py:{at[read]})",
        f"py_selfwalk.outer (py_selfwalk.py:{at[call]})",
        f"py_selfwalk.<module> (py_selfwalk.py:{at[main]})",
    ], (walked, python)
    assert walked["frames"][-1][1] == 1  # the module's frame is its eval call's entry frame
