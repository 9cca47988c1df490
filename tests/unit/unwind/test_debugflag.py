"""profiler.unwind.debugflag: the JVM's flag table read from (fake) memory, the checks before the one-byte
write, and the write itself on this process's own memory."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest

from profiler.errors import VMStructsError
from profiler.unwind import debugflag
from tests.fixtures.memory import FakeMemory

STRIDE, NAME_AT, ADDR_AT, TYPE_AT = 48, 8, 16, 0
TABLE, COUNT_AT, FLAGS_AT, STRINGS = 0x10000, 0x9000, 0x9008, 0x20000


def jvm_memory(flags: list[tuple[str, int, int]], count: int | None = None) -> FakeMemory:
    """A flag table of (name, type, value address) entries and its empty last entry."""
    memory = FakeMemory()
    at = STRINGS
    for index, (name, kind, value_address) in enumerate(flags):
        entry = TABLE + index * STRIDE
        memory.write(at, name.encode() + b"\0")
        memory.write(entry + NAME_AT, struct.pack("<Q", at))
        memory.write(entry + ADDR_AT, struct.pack("<Q", value_address))
        memory.write(entry + TYPE_AT, struct.pack("<i", kind))
        at += len(name) + 1
    memory.write(TABLE + len(flags) * STRIDE + NAME_AT, struct.pack("<Q", 0))
    memory.write(FLAGS_AT, struct.pack("<Q", TABLE))
    memory.write(COUNT_AT, struct.pack("<Q", len(flags) + 1 if count is None else count))
    return memory


FIELDS = {
    ("JVMFlag", "flags"): FLAGS_AT,
    ("JVMFlag", "numFlags"): COUNT_AT,
    ("JVMFlag", "_name"): NAME_AT,
    ("JVMFlag", "_addr"): ADDR_AT,
    ("JVMFlag", "_type"): TYPE_AT,
}


def test_the_bool_flag_is_found_by_its_exact_name():
    memory = jvm_memory(
        [("DebugNonSafepointsX", 0, 0x500), ("UseSerialGC", 0, 0x600), ("DebugNonSafepoints", 0, 0x700)]
    )
    table = debugflag.flag_table(FIELDS, {"JVMFlag": STRIDE}, memory)
    assert debugflag.find_flag(table, memory) == 0x700


def test_a_flag_of_another_type_or_none_at_all_is_refused():
    memory = jvm_memory([("DebugNonSafepoints", 5, 0x700)])
    table = debugflag.flag_table(FIELDS, {"JVMFlag": STRIDE}, memory)
    with pytest.raises(VMStructsError, match="not bool"):
        debugflag.find_flag(table, memory)
    memory = jvm_memory([("UseSerialGC", 0, 0x600)])
    with pytest.raises(VMStructsError, match="no flag"):
        debugflag.find_flag(debugflag.flag_table(FIELDS, {"JVMFlag": STRIDE}, memory), memory)


@pytest.mark.parametrize(
    ("fields", "sizes", "count", "message"),
    [
        ({k: v for k, v in FIELDS.items() if k[1] != "_addr"}, {"JVMFlag": STRIDE}, None, "JVMFlag::_addr"),
        (FIELDS, {}, None, "sizeof"),
        (FIELDS, {"JVMFlag": STRIDE}, 10**9, "absurd"),
        (FIELDS, {"JVMFlag": 4}, None, "absurd"),  # offsets beyond the entry
    ],
)
def test_a_table_vmstructs_do_not_describe_or_describe_absurdly_is_refused(fields, sizes, count, message):
    memory = jvm_memory([("DebugNonSafepoints", 0, 0x700)], count=count)
    with pytest.raises(VMStructsError, match=message):
        debugflag.flag_table(fields, sizes, memory)


def test_a_table_without_its_empty_last_entry_stops_at_its_count():
    memory = jvm_memory([("UseSerialGC", 0, 0x600)], count=1)
    table = debugflag.flag_table(FIELDS, {"JVMFlag": STRIDE}, memory)
    with pytest.raises(VMStructsError, match="no flag"):
        debugflag.find_flag(table, memory)


LIBJVM = "/usr/lib/jvm/x/lib/server/libjvm.so"
MAPS = [
    f"7f0000000000-7f0000100000 r--p 00000000 fe:00 1 {LIBJVM}",
    f"7f0000100000-7f0000200000 r-xp 00100000 fe:00 1 {LIBJVM}",
    f"7f0000200000-7f0000210000 rw-p 00200000 fe:00 1 {LIBJVM}",
    "7f0000210000-7f0000220000 rw-p 00000000 00:00 0",
    "7f0000300000-7f0000400000 rw-p 00000000 00:00 0",
    "7f0000400000-7f0000410000 rw-p 00000000 fe:00 2 /usr/lib/libother.so",
]


def test_the_value_must_lie_in_libjvms_data_or_its_bss():
    ranges = debugflag.libjvm_data_ranges(MAPS, LIBJVM)
    assert ranges == [(0x7F0000200000, 0x7F0000210000), (0x7F0000210000, 0x7F0000220000)]
    debugflag.check_flag_address(0x7F0000200010, ranges, b"\0")
    debugflag.check_flag_address(0x7F000021FFFF, ranges, b"\1")
    for outside in (0x7F0000100010, 0x7F0000300000, 0x7F0000400000):  # code, a later heap, another library
        with pytest.raises(VMStructsError, match="outside"):
            debugflag.check_flag_address(outside, ranges, b"\0")
    with pytest.raises(VMStructsError, match="not a bool"):
        debugflag.check_flag_address(0x7F0000200010, ranges, b"\x07")


def test_the_write_changes_one_byte_only_when_it_holds_what_was_expected_and_is_undone():
    # GIVEN a byte in this process's memory (written through /proc/self/mem as the agent writes the JVM's)
    buffer = ctypes.create_string_buffer(b"\0\0\0", 3)
    address = ctypes.addressof(buffer) + 1
    # WHEN the flag is written there
    assert debugflag._write_byte(os.getpid(), address, 0, 1) == 0
    assert buffer.raw == b"\0\1\0"
    write = debugflag.FlagWrite(os.getpid(), address, before=0, after=1)
    # THEN restore puts 0 back, and a value someone else set since is left alone
    assert debugflag.restore(write) and buffer.raw == b"\0\0\0"
    ctypes.memmove(address, b"\1", 1)
    assert debugflag._write_byte(os.getpid(), address, 0, 1) == 1  # already set: nothing written
    buffer[1] = b"\x05"
    assert not debugflag.restore(write) and buffer.raw[1] == 5
    assert not debugflag.restore(debugflag.FlagWrite(os.getpid(), address, before=1, after=1))


def test_a_process_without_libjvm_gets_a_warning_naming_the_option_and_nothing_is_written():
    exact = debugflag.ExactInlining()
    warning = exact.apply(os.getpid())  # python: no libjvm.so mapped
    assert warning is not None and "no libjvm.so" in warning and "--exact-inlining not applied" in warning
    assert exact.writes == {} and exact.restore_all() == []


def test_after_restore_all_a_late_preparation_writes_nothing_and_the_flag_written_before_is_back(monkeypatch):
    # GIVEN a byte standing for a JVM's flag, and enable() pointed at it (the real write, on our own memory)
    buffer = ctypes.create_string_buffer(b"\0", 1)
    address = ctypes.addressof(buffer)
    monkeypatch.setattr(
        debugflag, "enable", lambda pid: debugflag.FlagWrite(pid, address, debugflag._write_byte(pid, address, 0, 1), 1)
    )
    exact = debugflag.ExactInlining()
    # WHEN one JVM is written during the window, the window ends, and a late worker applies another
    assert exact.apply(os.getpid()) is None and buffer.raw == b"\1"
    assert exact.restore_all() == [os.getpid()] and buffer.raw == b"\0"
    assert exact.apply(os.getpid()) is None
    # THEN nothing was written after the window's end, and a second restore is harmless
    assert buffer.raw == b"\0" and exact.writes == {} and exact.restore_all() == []
