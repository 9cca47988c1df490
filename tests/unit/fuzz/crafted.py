"""Builders of crafted target bytes (ELF files, .eh_frame sections, hsperfdata files) for the bounds tests
and the fuzz tests: the shapes a hostile tenant can put in front of the root agent (issue 46)."""

from __future__ import annotations

import struct

_SHDR = struct.Struct("<IIQQQQIIQQ")


def elf_image(sections: list[tuple[str, int, bytes, int, int, int]], code: tuple[int, int] | None = None) -> bytes:
    """A minimal 64-bit little-endian x86_64 ELF: ``sections`` as (name, sh_type, bytes, sh_addr, sh_link,
    sh_entsize) after the null section (sh_link counts from 1 = the first of them), a .shstrtab last, and
    one executable PT_LOAD of (offset, size) when ``code`` is given."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name, *_ in sections) + b".shstrtab\0"
    phnum = 1 if code else 0
    body = bytearray(64 + 56 * phnum)
    placed = []
    for _name, _kind, content, *_rest in sections:
        placed.append(len(body))
        body += content
    names_at = len(body)
    body += names
    while len(body) % 8:
        body += b"\0"
    shoff = len(body)
    headers = bytearray(_SHDR.size)
    name_at = 1
    for (name, kind, content, addr, link, entsize), offset in zip(sections, placed, strict=True):
        headers += _SHDR.pack(name_at, kind, 0, addr, offset, len(content), link, 0, 8, entsize)
        name_at += len(name) + 1
    headers += _SHDR.pack(name_at, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)
    shnum = len(sections) + 2
    head = bytearray(b"\x7fELF\x02\x01\x01" + bytes(9))
    head += struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 64 if phnum else 0, shoff, 0, 64, 56, phnum, 64, shnum, shnum - 1
    )
    body[:64] = head
    if code:
        body[64:120] = struct.pack("<IIQQQQQQ", 1, 5, code[0], code[0], code[0], code[1], code[1], 0x1000)
    return bytes(body + headers)


def cie(instructions: bytes = b"\x0c\x07\x08\x90\x01", augmentation: bytes = b"zR", fde_encoding: int = 0x1B) -> bytes:
    """One CIE record: code alignment 1, data alignment -8, return address r16 (what GCC emits)."""
    body = b"\0\0\0\0\x01" + augmentation + b"\0" + b"\x01\x78\x10"
    if augmentation.startswith(b"z"):
        body += b"\x01" + bytes([fde_encoding])
    body += instructions
    return struct.pack("<I", len(body)) + body


def eh_frame_distinct_cies(fdes: int, cie_span: int) -> bytes:
    """The crafted ``.eh_frame`` of issue 46: every FDE points at a CIE offset of its own. A first record
    (a CIE the walker steps over in one go) holds ``fdes`` fake CIE headers 16 bytes apart, each claiming
    ``cie_span`` bytes of initial instructions (the bytes of the headers after it); ``fdes`` FDEs of 24
    bytes follow, FDE i pointing at header i. Before the bounds: ``fdes`` copies of ``cie_span`` bytes."""
    unit = struct.pack("<I", cie_span) + b"\0\0\0\0" + b"\x01\0\x01\x78\x10\0\0\0"  # len, id, v1, "", 1, -8, r16
    region = unit * fdes + bytes(cie_span)
    outer_body = b"\0\0\0\0\x01\0\x01\x78\x10" + region
    out = bytearray(struct.pack("<I", len(outer_body)) + outer_body)
    for index in range(fdes):
        fake_at = 4 + 9 + 16 * index
        body_at = len(out) + 4
        out += struct.pack("<IIQQ", 20, body_at - fake_at, 0x1000 + 16 * index, 16)
    return bytes(out + b"\0\0\0\0")


def elf_with_eh_frame(eh_frame: bytes, address: int = 0x200000) -> bytes:
    return elf_image([(".eh_frame", 1, eh_frame, address, 0, 0)], code=(0, 0x1000))


def elf_quadratic_strtab(symbols: int, string_bytes: int) -> bytes:
    """The crafted libjvm.so of issue 46: a .dynsym whose every symbol names a different offset of one
    string table of ``string_bytes`` letters with a single NUL at its end (reading each name to its NUL
    from its offset is quadratic)."""
    strings = b"A" * (string_bytes - 1) + b"\0"
    table = bytes(24) + b"".join(
        struct.pack("<IBBHQQ", (index * 7919) % (string_bytes - 1), 0x11, 0, 1, 0x1000, 8) for index in range(symbols)
    )
    return elf_image([(".dynsym", 11, table, 0, 2, 24), (".dynstr", 3, strings, 0, 0, 0)])


def elf_symbols_table(names: dict[str, int], symtab: bool = False) -> bytes:
    """An ELF whose .dynsym (or .symtab) defines ``names`` with their values."""
    strings = bytearray(b"\0")
    table = bytearray(24)
    for name, value in names.items():
        table += struct.pack("<IBBHQQ", len(strings), 0x11, 0, 1, value, 8)
        strings += name.encode() + b"\0"
    kind, strtab = (2, ".strtab") if symtab else (11, ".dynstr")
    return elf_image(
        [(".symtab" if symtab else ".dynsym", kind, bytes(table), 0, 2, 24), (strtab, 3, bytes(strings), 0, 0, 0)]
    )


PERF_MAGIC = 0xCAFEC0C0


def hsperfdata(counters: dict[str, int], entry_offset: int = 32) -> bytes:
    """A PerfData file (HotSpot perfMemory.hpp) holding long counters ``counters``."""
    entries = bytearray()
    for name, value in counters.items():
        raw_name = name.encode() + b"\0"
        name_offset = 20
        data_offset = (name_offset + len(raw_name) + 7) // 8 * 8
        length = data_offset + 8
        entry = struct.pack("<iiibbbbi", length, name_offset, 0, ord("J"), 0, 0, 0, data_offset)
        entry += raw_name + bytes(data_offset - name_offset - len(raw_name)) + struct.pack("<q", value)
        entries += entry
    prologue = (
        struct.pack(">I", PERF_MAGIC)
        + bytes([1, 2, 0, 0])
        + bytes(16)
        + struct.pack("<ii", entry_offset, len(counters))
    )
    return prologue + bytes(entry_offset - len(prologue)) + bytes(entries)


def hsperfdata_quadratic(size: int) -> bytes:
    """The crafted hsperfdata of issue 46: entries of 20 bytes over the first half of ``size`` bytes, each
    naming the second half, which holds no NUL (each name read to its NUL and copied: quadratic)."""
    entries = (size // 2 - 32) // 20
    names_at = 32 + 20 * entries
    prologue = struct.pack(">I", PERF_MAGIC) + bytes([1, 2, 0, 0]) + bytes(16) + struct.pack("<ii", 32, entries)
    table = b"".join(
        struct.pack("<iiibbbbi", 20, names_at - (32 + 20 * index), 0, ord("J"), 0, 0, 0, 0) for index in range(entries)
    )
    return prologue + table + b"j" * (size - names_at)
