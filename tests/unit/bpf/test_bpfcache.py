"""The BPF compile cache's pure part (key, entry format, map-fd rewrite, validation) and
compile_program's fallback on a damaged entry; tests/integration/test_bpfcompile.py loads a real entry."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from profiler.bpf import cache
from profiler.bpf.cache import CacheError, FunctionDef, MapDef, ProgramImage


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def ld_map_fd(dst: int, fd: int) -> bytes:
    return insn(cache.LD_IMM64, dst, cache.PSEUDO_MAP_FD, 0, fd) + insn(0, 0, 0, 0, 0)


def imm_of(insns: bytes, index: int) -> int:
    return struct.unpack_from("<i", insns, index * 8 + 4)[0]


EXIT = insn(0x95)
MOV_R0_7 = insn(0xB7, 0, 0, 0, 7)
HOST = {
    "format": "1", "kernel": "6.18.0", "btf_sha256": "ab" * 32, "possible_cpus": "0-1", "bcc": "0.26.0", "libbcc": "x",
}


def image(insns: bytes, prog_type: int | None = 7) -> ProgramImage:
    maps = (
        MapDef("targets", 1, 4, 1, 64, 0, '"unsigned int"', '"unsigned char"'),
        MapDef("events", 27, 0, 0, 65536, 0, '"int"', '"int"'),
    )
    return ProgramImage("GPL", 0, maps, (FunctionDef("probe", insns, prog_type),))


def test_map_fds_become_indices_and_back_to_new_fds_only_in_map_loads() -> None:
    # GIVEN instructions bcc left with fds 11 and 12 in two map loads, and a plain 64-bit constant 11
    plain = insn(cache.LD_IMM64, 1, 0, 0, 11) + insn(0, 0, 0, 0, 0)
    compiled = ld_map_fd(1, 12) + plain + ld_map_fd(2, 11) + MOV_R0_7 + EXIT
    stored = cache.fds_to_indices(compiled, {11: 0, 12: 1})
    # THEN the map loads hold map indices, the constant is untouched, other instructions unchanged
    assert [imm_of(stored, i) for i in (0, 2, 4)] == [1, 11, 0]
    assert stored[48:] == compiled[48:]
    # WHEN loaded again with new maps 40 and 41
    loaded = cache.indices_to_fds(stored, [40, 41])
    assert [imm_of(loaded, i) for i in (0, 2, 4)] == [41, 11, 40]
    assert imm_of(loaded, 1) == 0  # the second slot of a map load stays as it was


def test_unknown_map_references_and_other_pseudo_loads_are_refused() -> None:
    with pytest.raises(CacheError, match="not one of the module's maps"):
        cache.fds_to_indices(ld_map_fd(1, 99) + EXIT, {11: 0})
    with pytest.raises(CacheError, match="not one of the module's maps"):
        cache.indices_to_fds(ld_map_fd(1, 2) + EXIT, [40, 41])  # index past the maps
    map_value = insn(cache.LD_IMM64, 1, 2, 0, 11) + insn(0)
    with pytest.raises(CacheError, match="source 2"):
        cache.fds_to_indices(map_value + EXIT, {11: 0})
    with pytest.raises(CacheError, match="second slot"):
        cache.fds_to_indices(EXIT + insn(cache.LD_IMM64, 1, 1, 0, 11), {11: 0})
    with pytest.raises(CacheError, match="whole number"):
        cache.fds_to_indices(EXIT + b"\x00", {})


def test_the_key_changes_with_text_cflags_and_every_host_field() -> None:
    base = cache.entry_key(b"int f() {}", [], HOST)
    assert cache.entry_name(base) == cache.entry_name(cache.entry_key(b"int f() {}", [], dict(HOST)))
    names = {cache.entry_name(base), cache.entry_name(cache.entry_key(b"int g() {}", [], HOST))}
    names.add(cache.entry_name(cache.entry_key(b"int f() {}", ["-DX=1"], HOST)))
    for field in HOST:
        names.add(cache.entry_name(cache.entry_key(b"int f() {}", [], {**HOST, field: "other"})))
    assert len(names) == 3 + len(HOST)


def test_host_fields_name_this_kernel() -> None:
    fields = cache.host_fields("0.26.0", "/nonexistent/libbcc.so.0")
    assert fields["kernel"] == os.uname().release
    assert fields["format"] == str(cache.FORMAT_VERSION)
    assert fields["bcc"] == "0.26.0"


def test_an_entry_round_trips_and_is_refused_for_another_key() -> None:
    key = cache.entry_key(b"text", [], HOST)
    original = image(ld_map_fd(1, 1) + ld_map_fd(2, 0) + EXIT)
    assert cache.decode(cache.encode(key, original), key) == original
    with pytest.raises(CacheError, match="another kernel"):
        cache.decode(cache.encode(key, original), {**key, "kernel": "6.19.0"})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.replace(b'"max_entries": 64', b'"max_entries": -1'), "max entries"),
        (lambda p: p.replace(b'"map_type": 1', b'"map_type": true'), "map type"),
        (lambda p: p.replace(b'"prog_type": 7', b'"prog_type": 1000'), "program type"),
        (lambda p: p.replace(b'"name": "probe"', b'"name": 5'), "function name"),
        (lambda p: p.replace(b'"functions": [', b'"functions": [7, '), "not an object"),
        (lambda p: p[: len(p) // 2], "not JSON"),
        (lambda p: b"[]", "not a JSON object"),
        (lambda p: p.replace(b'"license"', b'"licence"'), "license"),
    ],
)
def test_damaged_entries_are_refused(edit, message) -> None:
    key = cache.entry_key(b"text", [], HOST)
    content = cache.encode(key, image(ld_map_fd(1, 1) + EXIT))
    with pytest.raises(CacheError, match=message):
        cache.decode(edit(content), key)


def test_an_entry_whose_instructions_name_a_missing_map_is_refused() -> None:
    key = cache.entry_key(b"text", [], HOST)
    content = cache.encode(key, image(ld_map_fd(1, 5) + EXIT))  # only 2 maps
    with pytest.raises(CacheError, match="not one of the module's maps"):
        cache.decode(content, key)


def test_entries_are_written_private_and_read_back(tmp_path: Path) -> None:
    directory = tmp_path / "bpf"
    key = cache.entry_key(b"text", [], HOST)
    cache.write_entry(directory, key, image(EXIT))
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / cache.entry_name(key)).stat().st_mode & 0o777 == 0o600
    assert cache.read_entry(directory, key) == image(EXIT)
    cache.remove_entry(directory, key)
    with pytest.raises(CacheError, match="no entry"):
        cache.read_entry(directory, key)


def test_a_link_an_open_directory_or_an_oversized_entry_is_not_read(tmp_path: Path, monkeypatch) -> None:
    directory = tmp_path / "bpf"
    key = cache.entry_key(b"text", [], HOST)
    cache.write_entry(directory, key, image(EXIT))
    entry = directory / cache.entry_name(key)
    # an entry that is a link to another file
    entry.rename(directory / "elsewhere")
    entry.symlink_to(directory / "elsewhere")
    with pytest.raises(CacheError, match="bpf/"):
        cache.read_entry(directory, key)
    entry.unlink()
    (directory / "elsewhere").rename(entry)
    # a directory others may write to
    directory.chmod(0o755)
    with pytest.raises(CacheError, match="private"):
        cache.read_entry(directory, key)
    directory.chmod(0o700)
    monkeypatch.setattr(cache, "MAX_ENTRY_BYTES", 10)
    with pytest.raises(CacheError, match="under 10 bytes"):
        cache.read_entry(directory, key)


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    assert cache.cache_dir() == cache.CACHE_DIR
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    assert cache.cache_dir() is None
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.cache_dir() == tmp_path


def test_a_damaged_entry_is_reported_once_and_the_program_compiled(monkeypatch, tmp_path: Path) -> None:
    # GIVEN a damaged entry where compile_program looks for the program's entry
    from profiler.bpf import compiler
    from profiler.files import safeio

    class Store:
        directory = tmp_path
        key = cache.entry_key(b"text", [], HOST)
        image = None
        problem = None

    tmp_path.chmod(0o700)
    (tmp_path / cache.entry_name(Store.key)).write_bytes(b'{"key": ')
    safeio.take_warnings()
    # WHEN the cached load is tried
    assert compiler._load_cached(object, Store()) is None
    # THEN one line names the entry and says the program was compiled; no entry: no line
    warnings = safeio.take_warnings()
    assert len(warnings) == 1 and "unusable (" in warnings[0] and "compiled instead" in warnings[0]
    (tmp_path / cache.entry_name(Store.key)).unlink()
    assert compiler._load_cached(object, Store()) is None
    assert safeio.take_warnings() == []
