"""A cache of bcc's compiled output, so a warm start loads BPF programs without running LLVM.

bcc compiles a program's C at every start (seconds of CPU each). What it produces for one kernel is
fixed by the program text, the kernel (release and BTF), the bcc version and the CPUs the maps are
sized for: the eBPF instructions of each function and the definition of each map. This module holds
the pure part: the cache key, the entry's format (JSON, instructions base64, map references as map
indices instead of this process's map fds) with its validation, and the rewrite of ``ld_imm64``
map-fd immediates. ``cached.py`` turns an entry into a loaded program.

The cache is root's own directory (``/var/cache/spe-taskprof/bpf``, 0700); an entry is still input
read back by root, so it is opened without following links, checked (regular, root's, bounded) and
validated field by field; anything wrong makes the caller compile as before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import privatecache

FORMAT_VERSION = 1
CACHE_DIR = Path("/var/cache/spe-taskprof/bpf")
CACHE_ENV = "SPE_TASKPROF_BPF_CACHE"  # another directory, or "off"
MAX_ENTRY_BYTES = 32 << 20
MAX_BTF_BYTES = 256 << 20
MAX_MAPS = 256
MAX_FUNCTIONS = 256
MAX_INSNS = 1_000_000  # the kernel's own limit on a program's instructions
MAX_NAME = 128
MAX_DESC = 1 << 16
BTF_PATH = "/sys/kernel/btf/vmlinux"
POSSIBLE_CPUS_PATH = "/sys/devices/system/cpu/possible"

INSN_SIZE = 8
LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instruction slots
PSEUDO_MAP_FD = 1
MAX_MAP_TYPE = 64
MAX_PROG_TYPE = 64


class CacheError(Exception):
    """An entry that cannot be used (absent, damaged, for another key, refused by the kernel):
    the caller compiles instead."""


@dataclass(frozen=True)
class MapDef:
    """One of bcc's tables as the kernel created it, with bcc's key and leaf type descriptions
    (the JSON text bcc turns into ctypes types)."""

    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass(frozen=True)
class FunctionDef:
    """One function's instructions with map references as map indices; ``prog_type`` once a run
    loaded it (None: compiled but never loaded)."""

    name: str
    insns: bytes
    prog_type: int | None


@dataclass(frozen=True)
class ProgramImage:
    """Everything needed to load a compiled bcc module again without compiling it."""

    license: str
    kern_version: int
    maps: tuple[MapDef, ...]
    functions: tuple[FunctionDef, ...]


def _read_bounded(path: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        content = handle.read(limit + 1)
    if len(content) > limit:
        raise CacheError(f"{path}: larger than {limit} bytes")
    return content


def host_fields(bcc_version: str, library_path: str) -> dict[str, str]:
    """What ties compiled output to this host: kernel release, the kernel's BTF, the CPUs maps are
    sized for, bcc's version and its library file (a package upgrade changes it)."""
    try:
        btf = hashlib.sha256(_read_bounded(BTF_PATH, MAX_BTF_BYTES)).hexdigest()
    except OSError:
        btf = "none"
    try:
        cpus = _read_bounded(POSSIBLE_CPUS_PATH, 4096).decode("ascii", "replace").strip()
    except OSError:
        cpus = "unknown"
    try:
        info = os.stat(library_path)
        library = f"{library_path}:{info.st_size}:{info.st_mtime_ns}"
    except OSError:
        library = library_path
    return {
        "format": str(FORMAT_VERSION),
        "kernel": os.uname().release,
        "btf_sha256": btf,
        "possible_cpus": cpus,
        "bcc": bcc_version,
        "libbcc": library,
    }


def entry_key(text: bytes, cflags: list[str], host: dict[str, str]) -> dict[str, str]:
    """The full key of one program's entry: the host's fields and the program's text and cflags."""
    return {
        **host,
        "text_sha256": hashlib.sha256(text).hexdigest(),
        "cflags_sha256": hashlib.sha256("\0".join(cflags).encode()).hexdigest(),
    }


def entry_name(key: dict[str, str]) -> str:
    """The entry's file name: a digest of its key (the key itself is stored and compared too)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest() + ".json"


def _insn_fields(insns: bytes, index: int) -> tuple[int, int, int]:
    code, regs, _off, imm = struct.unpack_from("<BBhi", insns, index * INSN_SIZE)
    return code, regs >> 4, imm


def _set_imm(out: bytearray, index: int, imm: int) -> None:
    struct.pack_into("<i", out, index * INSN_SIZE + 4, imm)


def _rewrite_map_refs(insns: bytes, replace: dict[int, int], what: str) -> bytes:
    if len(insns) % INSN_SIZE or not insns:
        raise CacheError(f"{len(insns)} bytes of instructions: not a whole number of instructions")
    out = bytearray(insns)
    count = len(insns) // INSN_SIZE
    index = 0
    while index < count:
        code, src_reg, imm = _insn_fields(insns, index)
        if code == LD_IMM64:
            if index + 1 >= count:
                raise CacheError("ld_imm64 without its second slot")
            if src_reg == PSEUDO_MAP_FD:
                if imm not in replace:
                    raise CacheError(f"ld_imm64 refers to {what} {imm}, not one of the module's maps")
                _set_imm(out, index, replace[imm])
            elif src_reg != 0:
                raise CacheError(f"ld_imm64 with source {src_reg} (only map fds are cached)")
            index += 2
            continue
        index += 1
    return bytes(out)


def fds_to_indices(insns: bytes, fd_index: dict[int, int]) -> bytes:
    """Instructions as bcc left them (map fds of this process in ``ld_imm64``) with map indices
    instead, so they can be stored; CacheError for any other kind of ``ld_imm64`` reference."""
    return _rewrite_map_refs(insns, fd_index, "fd")


def indices_to_fds(insns: bytes, fds: list[int]) -> bytes:
    """Stored instructions with the map indices replaced by the fds of the maps just created."""
    return _rewrite_map_refs(insns, dict(enumerate(fds)), "map index")


def encode(key: dict[str, str], image: ProgramImage) -> bytes:
    """The entry's bytes (JSON)."""
    payload = {
        "key": key,
        "license": image.license,
        "kern_version": image.kern_version,
        "maps": [vars(definition) for definition in image.maps],
        "functions": [
            {"name": fn.name, "prog_type": fn.prog_type, "insns": base64.b64encode(fn.insns).decode("ascii")}
            for fn in image.functions
        ],
    }
    return json.dumps(payload, sort_keys=True).encode()


def _string(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str) or len(value) > limit or "\0" in value:
        raise CacheError(f"{what}: not a string of at most {limit} characters")
    return value


def _integer(value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CacheError(f"{what}: not an integer in [{low}, {high}]")
    return value


def _map_def(raw: Any) -> MapDef:
    if not isinstance(raw, dict):
        raise CacheError("a map is not an object")
    return MapDef(
        name=_string(raw.get("name"), MAX_NAME, "map name"),
        map_type=_integer(raw.get("map_type"), 1, MAX_MAP_TYPE, "map type"),
        key_size=_integer(raw.get("key_size"), 0, 1 << 16, "key size"),
        value_size=_integer(raw.get("value_size"), 0, 1 << 26, "value size"),
        max_entries=_integer(raw.get("max_entries"), 0, 1 << 31, "max entries"),
        flags=_integer(raw.get("flags"), 0, (1 << 32) - 1, "map flags"),
        key_desc=_string(raw.get("key_desc"), MAX_DESC, "key description"),
        leaf_desc=_string(raw.get("leaf_desc"), MAX_DESC, "leaf description"),
    )


def _function_def(raw: Any, map_count: int) -> FunctionDef:
    if not isinstance(raw, dict):
        raise CacheError("a function is not an object")
    encoded = _string(raw.get("insns"), (MAX_INSNS * INSN_SIZE * 4) // 3 + 4, "instructions")
    try:
        insns = base64.b64decode(encoded, validate=True)
    except ValueError:
        raise CacheError("instructions: not base64") from None
    indices_to_fds(insns, list(range(map_count)))  # every map reference is a known index
    prog_type = raw.get("prog_type")
    return FunctionDef(
        name=_string(raw.get("name"), MAX_NAME, "function name"),
        insns=insns,
        prog_type=None if prog_type is None else _integer(prog_type, 0, MAX_PROG_TYPE, "program type"),
    )


def decode(content: bytes, key: dict[str, str]) -> ProgramImage:
    """The entry's image, or CacheError when it is damaged or for another key."""
    try:
        payload = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        raise CacheError("not JSON") from None
    if not isinstance(payload, dict):
        raise CacheError("not a JSON object")
    if payload.get("key") != key:
        raise CacheError("written for another kernel, bcc or program text")
    maps, functions = payload.get("maps"), payload.get("functions")
    if not isinstance(maps, list) or not isinstance(functions, list):
        raise CacheError("maps or functions missing")
    if len(maps) > MAX_MAPS or not 0 < len(functions) <= MAX_FUNCTIONS:
        raise CacheError(f"{len(maps)} maps, {len(functions)} functions: out of bounds")
    map_defs = tuple(_map_def(raw) for raw in maps)
    function_defs = tuple(_function_def(raw, len(map_defs)) for raw in functions)
    if len({m.name for m in map_defs}) != len(map_defs) or len({f.name for f in function_defs}) != len(function_defs):
        raise CacheError("a map or function name appears twice")
    return ProgramImage(
        license=_string(payload.get("license"), MAX_NAME, "license"),
        kern_version=_integer(payload.get("kern_version"), 0, (1 << 32) - 1, "kernel version"),
        maps=map_defs,
        functions=function_defs,
    )


def cache_dir() -> Path | None:
    """The cache's directory, or None when the cache is off (``SPE_TASKPROF_BPF_CACHE=off``)."""
    return privatecache.configured_dir(CACHE_ENV, CACHE_DIR)


def read_entry(directory: Path, key: dict[str, str]) -> ProgramImage:
    """The validated entry for ``key``; CacheError when absent or unusable."""
    path = directory / entry_name(key)
    try:
        content = privatecache.read_entry_bytes(path, MAX_ENTRY_BYTES)
    except privatecache.PrivateCacheError as exc:
        raise CacheError(str(exc)) from None
    try:
        return decode(content, key)
    except CacheError as exc:
        raise CacheError(f"{path}: {exc}") from None


def write_entry(directory: Path, key: dict[str, str], image: ProgramImage) -> None:
    """Store the entry atomically (a reader sees the old or the new one) in the private directory,
    created 0700 when absent."""
    try:
        privatecache.write_entry_bytes(directory, entry_name(key), encode(key, image))
    except privatecache.PrivateCacheError as exc:
        raise CacheError(str(exc)) from None
    except OSError as exc:
        raise CacheError(f"{directory}: {exc.strerror or exc}") from None


def remove_entry(directory: Path, key: dict[str, str]) -> None:
    """Forget an entry the kernel refused (the next start compiles and writes it again)."""
    try:
        os.unlink(directory / entry_name(key))
    except OSError:
        pass
