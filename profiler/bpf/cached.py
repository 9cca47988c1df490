"""bcc's BPF object from the compile cache: the same surface the agent's programs use (tables by
name, ring buffers, load_func, attach_*/detach_*, funcs, cleanup) without running LLVM.

A cold start compiles with bcc as before through ``recording_class``: a subclass of bcc's BPF that,
once compiled, stores each function's instructions and each table's definition, and the program type
of every function a run loads (bcc's own autoloaded probes included). A warm start builds a
``cached_class`` object instead: it creates the maps (``bcc_create_map``), puts their fds into the
instructions' ``ld_imm64`` immediates, and loads the recorded functions with ``bcc_prog_load`` at once,
so a verifier refusal surfaces here, where the caller can still compile instead.
"""

from __future__ import annotations

import atexit
import ctypes as ct
import functools
import json
import os
from pathlib import Path
from typing import Any

from . import cache
from .cache import CacheError, FunctionDef, MapDef, ProgramImage

# bcc.table classes by map type (linux/bpf.h numbers) that a table can be rebuilt as without bcc's module
_TABLE_CLASSES = {
    1: "HashTable",
    2: "Array",
    3: "ProgArray",
    5: "PerCpuHash",
    6: "PerCpuArray",
    7: "StackTrace",
    9: "LruHash",
    10: "LruPerCpuHash",
    11: "LpmTrie",
    27: "RingBuf",
}
_WITH_REDUCER = {5, 6, 10}


class _MapInfo(ct.Structure):
    """The head of the kernel's ``struct bpf_map_info`` (the kernel fills only what we ask for)."""

    _fields_ = [
        ("type", ct.c_uint32),
        ("id", ct.c_uint32),
        ("key_size", ct.c_uint32),
        ("value_size", ct.c_uint32),
        ("max_entries", ct.c_uint32),
        ("map_flags", ct.c_uint32),
        ("name", ct.c_char * 16),
    ]


@functools.cache
def _libbcc() -> Any:
    """Our own handle on the libbcc bcc loaded, with prototypes for the calls bcc's Python does not
    declare (declaring them on bcc's handle would change bcc's)."""
    from bcc.libbcc import lib

    own = ct.CDLL(lib._name, use_errno=True)
    module, name, size = ct.c_void_p, ct.c_char_p, ct.c_size_t
    prototypes: dict[str, tuple[Any, list[Any]]] = {
        "bpf_num_tables": (size, [module]),
        "bpf_table_name": (name, [module, size]),
        "bpf_table_fd_id": (ct.c_int, [module, size]),
        "bpf_table_key_desc_id": (name, [module, size]),
        "bpf_table_leaf_desc_id": (name, [module, size]),
        "bpf_num_functions": (size, [module]),
        "bpf_function_name": (name, [module, size]),
        "bpf_function_start": (ct.c_void_p, [module, name]),
        "bpf_function_size": (size, [module, name]),
        "bpf_module_license": (name, [module]),
        "bpf_module_kern_version": (ct.c_uint, [module]),
        "bpf_obj_get_info": (ct.c_int, [ct.c_int, ct.c_void_p, ct.POINTER(ct.c_uint32)]),
        "bcc_create_map": (ct.c_int, [ct.c_int, name, ct.c_int, ct.c_int, ct.c_int, ct.c_int]),
        "bcc_prog_load": (
            ct.c_int,
            [ct.c_int, name, ct.c_void_p, ct.c_int, name, ct.c_uint, ct.c_int, ct.c_char_p, ct.c_uint],
        ),
    }
    for function, (restype, argtypes) in prototypes.items():
        getattr(own, function).restype = restype
        getattr(own, function).argtypes = argtypes
    return own


def _library_path() -> str:
    """The libbcc file this process mapped (part of the cache key: an upgrade compiles again)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if "/libbcc.so" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return "libbcc.so.0"


@functools.cache
def host_fields() -> dict[str, str]:
    """The host's part of every entry's key, computed once per process."""
    import bcc

    return cache.host_fields(getattr(bcc, "__version__", "unknown"), _library_path())


def _map_def(module: int, index: int) -> tuple[MapDef, int]:
    own = _libbcc()
    name = own.bpf_table_name(module, index)
    fd = own.bpf_table_fd_id(module, index)
    info = _MapInfo()
    length = ct.c_uint32(ct.sizeof(info))
    if name is None or fd < 0 or own.bpf_obj_get_info(fd, ct.byref(info), ct.byref(length)) != 0:
        raise CacheError(f"table {index}: no map to describe")
    if info.type not in _TABLE_CLASSES:
        raise CacheError(f"table {name.decode(errors='replace')}: map type {info.type} is not cached")
    key_desc = own.bpf_table_key_desc_id(module, index) or b""
    leaf_desc = own.bpf_table_leaf_desc_id(module, index) or b""
    definition = MapDef(
        name=name.decode(),
        map_type=info.type,
        key_size=info.key_size,
        value_size=info.value_size,
        max_entries=info.max_entries,
        flags=info.map_flags,
        key_desc=key_desc.decode(),
        leaf_desc=leaf_desc.decode(),
    )
    return definition, fd


def capture(module: int, prog_types: dict[str, int]) -> ProgramImage:
    """What bcc compiled into ``module``: tables as the kernel created them, and each function's
    instructions with map fds turned into map indices (CacheError for what cannot be reloaded)."""
    own = _libbcc()
    maps: list[MapDef] = []
    fd_index: dict[int, int] = {}
    for index in range(own.bpf_num_tables(module)):
        definition, fd = _map_def(module, index)
        fd_index[fd] = len(maps)
        maps.append(definition)
    functions = []
    for index in range(own.bpf_num_functions(module)):
        name = own.bpf_function_name(module, index)
        start, size = own.bpf_function_start(module, name), own.bpf_function_size(module, name)
        if not start or not size:
            raise CacheError(f"function {name!r}: no instructions")
        insns = cache.fds_to_indices(ct.string_at(start, size), fd_index)
        functions.append(FunctionDef(name.decode(), insns, prog_types.get(name.decode())))
    license_text = own.bpf_module_license(module) or b"GPL"
    return ProgramImage(license_text.decode(), int(own.bpf_module_kern_version(module)), tuple(maps), tuple(functions))


class Store:
    """One program's entry: where it lives, its key, and the last image written (rewritten when a run
    loads a function with a type not yet recorded)."""

    def __init__(self, directory: Path, key: dict[str, str]) -> None:
        self.directory = directory
        self.key = key
        self.image: ProgramImage | None = None
        self.problem: str | None = None  # why the entry could not be written (reported once)

    def record(self, image: ProgramImage) -> None:
        self.image = image
        try:
            cache.write_entry(self.directory, self.key, image)
        except CacheError as exc:
            self.problem = str(exc)

    def record_type(self, name: str, prog_type: int) -> None:
        """Note that ``name`` was loaded as ``prog_type``; rewrite the entry when that is new."""
        if self.image is None or self.problem is not None:
            return
        functions = tuple(
            FunctionDef(fn.name, fn.insns, prog_type) if fn.name == name and fn.prog_type != prog_type else fn
            for fn in self.image.functions
        )
        if functions != self.image.functions:
            self.record(ProgramImage(self.image.license, self.image.kern_version, self.image.maps, functions))


@functools.cache
def recording_class(bpf_class: Any) -> Any:
    """A subclass of ``bpf_class`` (bcc's BPF) that compiles as bcc does and records the result."""

    class RecordingBPF(bpf_class):  # type: ignore[misc, valid-type]
        def __init__(self, text: bytes, store: Store) -> None:
            self._store = store
            self._prog_types: dict[str, int] = {}
            super().__init__(text=text)
            try:
                store.record(capture(self.module, self._prog_types))
            except CacheError as exc:
                store.problem = str(exc)

        def load_func(self, func_name: Any, prog_type: int, device: Any = None, attach_type: int = -1) -> Any:
            function = super().load_func(func_name, prog_type, device, attach_type)
            name = function.name.decode()
            if device is None and attach_type == -1 and self._prog_types.get(name) != prog_type:
                self._prog_types[name] = prog_type
                self._store.record_type(name, prog_type)
            return function

    return RecordingBPF


def _make_table(owner: Any, index: int, fd: int, definition: MapDef, types: tuple[Any, Any], reducer: Any) -> Any:
    from bcc import table as bcc_table

    table_class = getattr(bcc_table, _TABLE_CLASSES[definition.map_type])
    extra: dict[str, Any] = {"reducer": reducer} if definition.map_type in _WITH_REDUCER else {}
    if definition.map_type == 27:
        extra["name"] = definition.name.encode()
    table = table_class(owner, index, fd, types[0], types[1], **extra)
    # bcc asked its module for these; a cached program has none, so they come from the definition
    table.ttype, table.flags, table.max_entries = definition.map_type, definition.flags, definition.max_entries
    return table


class _FromCache:
    """The parts of bcc's BPF that read its compiled module, over a cache entry instead (``cached_class``
    puts this before bcc's class, so attach/detach, tables, ring buffers and cleanup stay bcc's own)."""

    # bcc's, reached through the subclass cached_class builds
    Function: Any
    KPROBE: int
    TRACEPOINT: int
    RAW_TRACEPOINT: int
    attach_kprobe: Any
    attach_kretprobe: Any
    attach_tracepoint: Any
    attach_raw_tracepoint: Any
    fix_syscall_fnname: Any
    cleanup: Any
    _decode_table_type: Any

    def __init__(self, image: ProgramImage, store: Store) -> None:
        # the state bcc's BPF.__init__ sets up, without its compile
        self.kprobe_fds: dict[Any, Any] = {}
        self.uprobe_fds: dict[Any, Any] = {}
        self.tracepoint_fds: dict[Any, Any] = {}
        self.raw_tracepoint_fds: dict[Any, Any] = {}
        self.kfunc_entry_fds: dict[Any, Any] = {}
        self.kfunc_exit_fds: dict[Any, Any] = {}
        self.lsm_fds: dict[Any, Any] = {}
        self.perf_buffers: dict[Any, Any] = {}
        self.open_perf_events: dict[Any, Any] = {}
        self._ringbuf_manager = None
        self.tracefile = None
        self.debug = 0
        self.funcs: dict[bytes, Any] = {}
        self.tables: dict[Any, Any] = {}
        self.module = None
        self._image = image
        self._store = store
        self._map_fds: list[int] = []
        atexit.register(self.cleanup)
        try:
            self._load(image)
        except BaseException:
            self.cleanup()
            raise

    def _load(self, image: ProgramImage) -> None:
        own = _libbcc()
        for definition in image.maps:
            fd = own.bcc_create_map(
                definition.map_type, definition.name.encode()[:15], definition.key_size,
                definition.value_size, definition.max_entries, definition.flags,
            )
            if fd < 0:
                raise CacheError(f"map {definition.name}: {os.strerror(ct.get_errno())}")
            self._map_fds.append(fd)
        self._map_index = {definition.name.encode(): index for index, definition in enumerate(image.maps)}
        self._insns = {fn.name.encode(): cache.indices_to_fds(fn.insns, self._map_fds) for fn in image.functions}
        for fn in image.functions:
            if fn.prog_type is not None:
                try:
                    self.load_func(fn.name.encode(), fn.prog_type)
                except Exception as exc:  # noqa: BLE001 - bcc's surface raises bare Exception
                    raise CacheError(str(exc)) from None
        self._trace_autoload()

    def load_func(self, func_name: Any, prog_type: int, device: Any = None, attach_type: int = -1) -> Any:
        name = func_name.encode() if isinstance(func_name, str) else bytes(func_name)
        if name in self.funcs:
            return self.funcs[name]
        insns = self._insns.get(name)
        if insns is None or device is not None or attach_type != -1:
            raise Exception(f"Unknown program {name!r}")  # bcc's own error for a name it lacks
        buffer = ct.create_string_buffer(insns, len(insns))
        fd = _libbcc().bcc_prog_load(
            prog_type, name, buffer, len(insns), self._image.license.encode(),
            self._image.kern_version, 0, None, 0,
        )
        if fd < 0:
            raise Exception(f"Failed to load BPF program {name!r}: {os.strerror(ct.get_errno())}")
        function = self.Function(self, name, fd)
        self.funcs[name] = function
        self._store.record_type(name.decode(), prog_type)
        return function

    def dump_func(self, func_name: Any) -> bytes:
        name = func_name.encode() if isinstance(func_name, str) else bytes(func_name)
        if name not in self._insns:
            raise Exception(f"Unknown program {name!r}")
        return self._insns[name]

    def get_table(self, name: Any, keytype: Any = None, leaftype: Any = None, reducer: Any = None) -> Any:
        name = name.encode() if isinstance(name, str) else bytes(name)
        if name not in self._map_index:
            raise KeyError(name)
        index = self._map_index[name]
        definition = self._image.maps[index]
        if keytype is None:
            keytype = self._decode_table_type(json.loads(definition.key_desc))
        if leaftype is None:
            leaftype = self._decode_table_type(json.loads(definition.leaf_desc))
        return _make_table(self, index, self._map_fds[index], definition, (keytype, leaftype), reducer)

    def _trace_autoload(self) -> None:
        # bcc's autoload, over the cached function names (bcc reads them from its module)
        for fn in self._image.functions:
            name = fn.name.encode()
            if name.startswith(b"kprobe__"):
                self.load_func(name, self.KPROBE)
                self.attach_kprobe(event=self.fix_syscall_fnname(name[8:]), fn_name=name)
            elif name.startswith(b"kretprobe__"):
                self.load_func(name, self.KPROBE)
                self.attach_kretprobe(event=self.fix_syscall_fnname(name[11:]), fn_name=name)
            elif name.startswith(b"tracepoint__"):
                self.load_func(name, self.TRACEPOINT)
                self.attach_tracepoint(tp=name[len(b"tracepoint__"):].replace(b"__", b":"), fn_name=name)
            elif name.startswith(b"raw_tracepoint__"):
                self.load_func(name, self.RAW_TRACEPOINT)
                self.attach_raw_tracepoint(tp=name[len(b"raw_tracepoint__"):], fn_name=name)
            elif name.startswith((b"kfunc__", b"kretfunc__", b"lsm__")):
                raise CacheError(f"function {fn.name}: kfunc and lsm programs are not cached")

    def close(self) -> None:
        super().close()  # type: ignore[misc]  # bcc's, after this class in the subclass's order
        map_fds, self._map_fds = self._map_fds, []
        for fd in map_fds:
            os.close(fd)


@functools.cache
def cached_class(bpf_class: Any) -> Any:
    """A subclass of ``bpf_class`` (bcc's BPF) built from a cache entry instead of a compile."""
    return type("CachedBPF", (_FromCache, bpf_class), {})
