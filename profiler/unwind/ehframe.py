"""Call-frame information of an x86_64 ELF (``.eh_frame``) turned into a compact unwind table.

Pure functions over bytes: ``parse_eh_frame`` evaluates every FDE's CFA program into rows (address →
how to find the caller), ``build_table`` merges the rows of all FDEs into one sorted table that the BPF
unwinder (profiler/unwind/cfi_step.h) searches. Only the subset x86_64 compilers emit is understood; a
rule outside it becomes an ``UNSUPPORTED`` row (the BPF step then fails and says so, never guesses).
docs/unwinding.md explains the table and its limits.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ..errors import CapabilityError
from ..files.safeio import BoundedReader

EH_FRAME_MAX_BYTES = 32 << 20  # libjvm.so's is 1.4 MB, the largest libraries' a few MB
# The work per ELF is linear in its .eh_frame and bounded (issue 46: a crafted section of 7 MiB whose
# every FDE named a CIE of its own cost 1.5 GiB): past one of these the table is refused, named.
MAX_CIES = 256  # distinct CIEs per ELF (libjvm.so has 1, libc 3)
MAX_CIE_INSTRUCTIONS = 256  # bytes of a CIE's initial instructions (compilers emit under 16)
MAX_AUGMENTATION = 16  # bytes of a CIE's augmentation string ("zR", "zPLR", "zRS"...)
MAX_FDES = 1 << 18  # FDEs per ELF, ~250 bytes each while the table is built (libjvm.so: 44 k)
MAX_TABLE_ROWS = 1 << 20  # rows of one ELF's table (libjvm.so: ~190 k; cfi.DEFAULT_MAX_ROWS in all)
MAX_REMEMBERED = 64  # DW_CFA_remember_state depth (compilers nest 1 or 2)
_MAX_RULES = 4096  # distinct rules shared across ELFs (libjvm.so uses 8); more are not interned

# DWARF register numbers on x86_64
REG_RBP, REG_RSP, REG_RA = 6, 7, 16

# How the CFA (the caller's rsp) is found at an address: the ``kind`` of a Rule.
CFA_GAP = 0  # no FDE covers the address
CFA_RSP = 1  # CFA = rsp + offset
CFA_RBP = 2  # CFA = rbp + offset
CFA_PLT = 3  # PLT stub: CFA = rsp + 8 + (((pc & 15) >= offset) ? 8 : 0)
CFA_END = 4  # outermost frame (return address undefined: _start, clone3): the stack is whole here
CFA_UNSUPPORTED = 5  # a rule this unwinder does not evaluate (expression, other base register)

KIND_NAMES = {
    CFA_GAP: "gap",
    CFA_RSP: "rsp",
    CFA_RBP: "rbp",
    CFA_PLT: "plt",
    CFA_END: "end",
    CFA_UNSUPPORTED: "unsupported",
}

# The expression GCC and binutils emit for PLT entries (16-byte slots whose push happens at +11 or +10):
#   DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_litK; DW_OP_ge;
#   DW_OP_lit3; DW_OP_shl; DW_OP_plus
_PLT_EXPR_HEAD = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A])
_PLT_EXPR_TAIL = bytes([0x2A, 0x33, 0x24, 0x22])


@dataclass(frozen=True)
class Rule:
    """How to step from a frame to its caller: CFA from ``kind``/``cfa_offset``; the return address
    is at CFA-8 (x86_64 call); rbp was saved at CFA+``rbp_offset``, or is unchanged when 0."""

    kind: int
    cfa_offset: int = 0
    rbp_offset: int = 0


GAP = Rule(CFA_GAP)
UNSUPPORTED = Rule(CFA_UNSUPPORTED)
END = Rule(CFA_END)


@dataclass(frozen=True)
class Fde:
    """One FDE evaluated: ``rows`` are (first address, rule) in address order, covering [start, end)."""

    start: int
    end: int
    rows: tuple[tuple[int, Rule], ...]


@dataclass(frozen=True, slots=True)
class FdeRef:
    """One FDE not evaluated yet: its range, and where its CFA program lies in the ELF's ``.eh_frame``.
    A whole ELF's FDEs are held as refs and evaluated one at a time in address order (``build_table``),
    so the rows of every FDE never exist at once (libjvm.so: 44 k FDEs, 150 k rows)."""

    start: int
    end: int
    info: ElfInfo
    program: int  # offset of the FDE's instructions in info.eh_frame
    program_end: int
    cie: _Cie

    @property
    def rows(self) -> tuple[tuple[int, Rule], ...]:
        """(first address, rule) in address order: the FDE's CFA program run now."""
        instructions = self.info.eh_frame[self.program : self.program_end]
        return _CfaMachine(self.cie, self.info.eh_frame_addr).run(instructions, self.start)


@dataclass(frozen=True)
class ElfInfo:
    """What the unwinder needs from an ELF header: its ``.eh_frame`` and its executable segments."""

    eh_frame: bytes
    eh_frame_addr: int  # the section's virtual address (pc-relative pointers count from it)
    exec_segments: tuple[tuple[int, int, int], ...]  # (p_offset, p_vaddr, p_filesz) of PT_LOAD with X


class EhFrameError(CapabilityError):
    """The ELF or its ``.eh_frame`` is malformed or not x86_64."""


class EhFrameBudgetError(EhFrameError):
    """The ``.eh_frame`` is over one of the bounds above (MAX_CIES, MAX_FDES...): its table is refused."""


# ---------------------------------------------------------------- ELF headers


def read_elf_info(image: bytes) -> ElfInfo:
    """The ``.eh_frame`` section and executable PT_LOAD segments of a 64-bit little-endian x86_64 ELF."""
    return _elf_info(lambda offset, size: image[offset : offset + size])


def read_elf_file(handle: BinaryIO) -> ElfInfo:
    """read_elf_info of an open file, reading only the headers and ``.eh_frame`` (libjvm.so: 1.4 of 24 MB),
    every read inside the file and bounded (a crafted header raises ValueError, never allocates its size)."""
    return _elf_info(BoundedReader.of(handle.fileno()).read_at)


def _elf_info(read_at: Callable[[int, int], bytes]) -> ElfInfo:
    header = read_at(0, 64)
    if header[:4] != b"\x7fELF" or len(header) < 64:
        raise EhFrameError("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise EhFrameError("not a 64-bit little-endian ELF")
    (machine,) = struct.unpack_from("<H", header, 18)
    if machine != 62:  # EM_X86_64
        raise EhFrameError(f"ELF machine {machine} is not x86_64")
    phoff, shoff = struct.unpack_from("<QQ", header, 32)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", header, 54)
    program_headers = read_at(phoff, phnum * phentsize)
    segments = []
    for index in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", program_headers, index * phentsize
        )
        if p_type == 1 and p_flags & 1:  # PT_LOAD, PF_X
            segments.append((p_offset, p_vaddr, p_filesz))
    eh_frame, eh_addr = b"", 0
    if shoff and shnum and shstrndx < shnum:
        sections = read_at(shoff, shnum * shentsize)
        names_offset, names_size = struct.unpack_from("<QQ", sections, shstrndx * shentsize + 24)
        names = read_at(names_offset, names_size)
        for index in range(shnum):
            name, _type, _flags, addr, offset, size = struct.unpack_from("<IIQQQQ", sections, index * shentsize)
            if names[name : names.find(b"\0", name)] == b".eh_frame":
                if size > EH_FRAME_MAX_BYTES:  # a target's crafted ELF must not cost minutes of parsing
                    raise EhFrameError(f".eh_frame of {size} bytes, over the limit of {EH_FRAME_MAX_BYTES}")
                eh_frame, eh_addr = read_at(offset, size), addr
    return ElfInfo(eh_frame, eh_addr, tuple(segments))


# ---------------------------------------------------------------- byte reading


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def u8(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def unpack(self, fmt: str, size: int) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(value)

    def uleb(self) -> int:
        result = shift = 0
        data = self.data
        while True:
            byte = data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return result

    def sleb(self) -> int:
        """The unsigned reading, sign-extended from its last byte's bit 6 (7 bits per byte read)."""
        start = self.pos
        result = self.uleb()
        if self.data[self.pos - 1] & 0x40:
            result -= 1 << (7 * (self.pos - start))
        return result

    def pointer(self, encoding: int, section_addr: int) -> int:
        """A DW_EH_PE-encoded pointer; pc-relative ones relative to the field's virtual address."""
        field_addr = section_addr + self.pos
        fmt = encoding & 0x0F
        if fmt == 0x00 or fmt == 0x04:
            value = self.unpack("<Q", 8)
        elif fmt == 0x0C:
            value = self.unpack("<q", 8)
        elif fmt == 0x03:
            value = self.unpack("<I", 4)
        elif fmt == 0x0B:
            value = self.unpack("<i", 4)
        elif fmt == 0x02:
            value = self.unpack("<H", 2)
        elif fmt == 0x0A:
            value = self.unpack("<h", 2)
        elif fmt == 0x01:
            value = self.uleb()
        elif fmt == 0x09:
            value = self.sleb()
        else:
            raise EhFrameError(f"pointer encoding {encoding:#x} not supported")
        application = encoding & 0x70
        if application == 0x10:  # DW_EH_PE_pcrel
            value += field_addr
        elif application not in (0x00,):
            raise EhFrameError(f"pointer application {application:#x} not supported")
        return value & 0xFFFFFFFFFFFFFFFF


# ---------------------------------------------------------------- CIE / FDE records


@dataclass(frozen=True)
class _Cie:
    code_align: int
    data_align: int
    ra_register: int
    fde_encoding: int
    has_augmentation_data: bool
    signal_frame: bool
    instructions: bytes
    # the CIE's initial instructions run once (every FDE starts from them): state, remembered states,
    # and the location they leave (absolute after a set_loc, else a delta from the FDE's start)
    initial: tuple[_State, tuple[_State, ...], int, bool] | None = field(default=None, compare=False)


def _parse_cie(data: bytes, start: int, end: int, section_addr: int) -> _Cie:
    reader = _Reader(data, start)
    version = reader.u8()
    if version not in (1, 3):
        raise EhFrameError(f"CIE at {start:#x}: version {version} not supported")
    aug_end = data.find(b"\0", reader.pos, min(end, reader.pos + MAX_AUGMENTATION))
    if aug_end < 0:
        raise EhFrameError(f"CIE at {start:#x}: no augmentation string within {MAX_AUGMENTATION} bytes")
    augmentation = data[reader.pos : aug_end].decode("ascii", "replace")
    reader.pos = aug_end + 1
    if "eh" in augmentation:
        reader.pos += 8
    code_align, data_align = reader.uleb(), reader.sleb()
    ra_register = reader.u8() if version == 1 else reader.uleb()
    fde_encoding = 0
    if augmentation.startswith("z"):
        length = reader.uleb()
        after = reader.pos + length
        for letter in augmentation[1:]:
            if letter == "R":
                fde_encoding = reader.u8()
            elif letter == "L":
                reader.u8()
            elif letter == "P":
                reader.pointer(reader.u8() & 0x7F, section_addr)  # the indirect bit changes nothing here
        reader.pos = after
    if end - reader.pos > MAX_CIE_INSTRUCTIONS:
        raise EhFrameBudgetError(
            f"CIE at {start:#x}: {end - reader.pos} bytes of initial instructions, over the limit of "
            f"{MAX_CIE_INSTRUCTIONS}"
        )
    cie = _Cie(
        code_align,
        data_align,
        ra_register,
        fde_encoding,
        augmentation.startswith("z"),
        "S" in augmentation,
        data[reader.pos : end],
    )
    object.__setattr__(cie, "initial", _CfaMachine(cie, section_addr).initial_state())
    return cie


def iter_fdes(info: ElfInfo) -> Iterator[Fde]:
    """Every FDE of the ``.eh_frame`` evaluated into rows, in section order."""
    for ref in iter_fde_refs(info):
        yield Fde(ref.start, ref.end, ref.rows)


def iter_fde_refs(info: ElfInfo) -> Iterator[FdeRef]:
    """Every FDE of the ``.eh_frame`` in section order, its rows evaluated only when asked for."""
    data, section_addr = info.eh_frame, info.eh_frame_addr
    cies: dict[int, _Cie] = {}
    pos = fdes = 0
    while pos + 4 <= len(data):
        length = struct.unpack_from("<I", data, pos)[0]
        if length == 0:  # terminator
            break
        header = 4
        if length == 0xFFFFFFFF:
            length = struct.unpack_from("<Q", data, pos + 4)[0]
            header = 12
        body, end = pos + header, pos + header + length
        if end > len(data):
            raise EhFrameError(f".eh_frame record at {pos:#x} runs past the section")
        cie_pointer = struct.unpack_from("<I", data, body)[0]
        if cie_pointer == 0:
            _count_cie(cies)
            cies[pos] = _parse_cie(data, body + 4, end, section_addr)
        else:
            # the pointer counts back from here: its CIE is a record walked already, never bytes elsewhere
            # read as one (each FDE naming an offset of its own cost 1.5 GiB for 7 MiB before)
            cie = cies.get(body - cie_pointer)
            if cie is None:
                raise EhFrameError(f"FDE at {pos:#x}: its CIE pointer names {body - cie_pointer:#x}, no CIE record")
            fdes += 1
            if fdes > MAX_FDES:
                raise EhFrameBudgetError(f"more than {MAX_FDES} FDEs in .eh_frame")
            yield _fde_ref(info, body + 4, end, cie)
        pos = end


def _count_cie(cies: dict[int, _Cie]) -> None:
    if len(cies) >= MAX_CIES:
        raise EhFrameBudgetError(f"more than {MAX_CIES} CIEs in .eh_frame")


def _fde_ref(info: ElfInfo, start: int, end: int, cie: _Cie) -> FdeRef:
    reader = _Reader(info.eh_frame, start)
    pc_begin = reader.pointer(cie.fde_encoding, info.eh_frame_addr)
    pc_range = reader.pointer(cie.fde_encoding & 0x0F, info.eh_frame_addr)
    if cie.has_augmentation_data:
        length = reader.uleb()
        reader.pos += length
    # the range ends inside the address space (a crafted one past 2**64 does not fit the table's array)
    return FdeRef(pc_begin, min(pc_begin + pc_range, _ADDRESS_END), info, reader.pos, end, cie)


_ADDRESS_END = (1 << 64) - 1


# ---------------------------------------------------------------- the CFA program


_RULES: dict[Rule, Rule] = {}


class _State:
    """The register rules that matter to the unwinder (CFA, rbp, return address)."""

    __slots__ = ("cfa_reg", "cfa_offset", "cfa_expr", "rbp", "ra")

    def __init__(self) -> None:
        self.cfa_reg = REG_RSP
        self.cfa_offset = 8
        self.cfa_expr: bytes | None = None
        self.rbp: int | str | None = None  # None: unchanged; int: saved at CFA+n; str: another rule
        self.ra: int | str | None = None

    def copy(self) -> _State:
        state = _State()
        state.cfa_reg, state.cfa_offset, state.cfa_expr = self.cfa_reg, self.cfa_offset, self.cfa_expr
        state.rbp, state.ra = self.rbp, self.ra
        return state

    def rule(self) -> Rule:
        """The state as a Rule, one shared object per distinct rule (libjvm.so: 8 for 191 k rows); the
        shared ones are bounded (a crafted section can make every row's offsets differ)."""
        rule = self._rule()
        shared = _RULES.get(rule)
        if shared is not None:
            return shared
        if len(_RULES) < _MAX_RULES:
            _RULES[rule] = rule
        return rule

    def _rule(self) -> Rule:
        if self.ra == "undefined":
            return END
        if self.ra != -8 or self.rbp is not None and not isinstance(self.rbp, int):
            return UNSUPPORTED
        rbp = self.rbp or 0
        if not -0x8000 <= rbp < 0x8000:
            return UNSUPPORTED
        if self.cfa_expr is not None:
            expr = self.cfa_expr
            if len(expr) == 11 and expr.startswith(_PLT_EXPR_HEAD) and expr.endswith(_PLT_EXPR_TAIL):
                return Rule(CFA_PLT, expr[6] - 0x30, rbp)
            return UNSUPPORTED
        if self.cfa_reg == REG_RSP:
            return Rule(CFA_RSP, self.cfa_offset, rbp)
        if self.cfa_reg == REG_RBP:
            return Rule(CFA_RBP, self.cfa_offset, rbp)
        return UNSUPPORTED


class _CfaMachine:
    """Evaluates CIE initial instructions then an FDE's instructions into (address, Rule) rows."""

    def __init__(self, cie: _Cie, section_addr: int) -> None:
        self.cie = cie
        self.section_addr = section_addr
        self.state = _State()
        self.state.ra = None
        self.initial = self.state
        self.stack: list[_State] = []
        self.loc, self._absolute = 0, False

    def initial_state(self) -> tuple[_State, tuple[_State, ...], int, bool]:
        """The CIE's initial instructions run from location 0: (state, remembered states, location,
        whether the location is absolute (a set_loc) or a delta from the FDE's start), what ``run``
        starts every FDE from."""
        self.loc, self._absolute = 0, False
        self._execute(self.cie.instructions, None)
        return self.state.copy(), tuple(self.stack), self.loc, self._absolute

    def run(self, instructions: bytes, pc_begin: int) -> tuple[tuple[int, Rule], ...]:
        initial = self.cie.initial
        if initial is None:  # a _Cie made without _parse_cie
            initial = self.initial_state()
        state, stack, delta, absolute = initial
        self.state, self.stack = state.copy(), [remembered.copy() for remembered in stack]
        self.loc = delta if absolute else pc_begin + delta
        self.initial = self.state.copy()
        rows: list[tuple[int, Rule]] = []
        self._execute(instructions, rows)
        self._emit(rows)
        return tuple(rows)

    def _emit(self, rows: list[tuple[int, Rule]]) -> None:
        rule = self.state.rule()
        if rows and rows[-1][0] == self.loc:
            rows[-1] = (self.loc, rule)
        elif not rows or rows[-1][1] != rule:
            rows.append((self.loc, rule))

    def _advance(self, delta: int, rows: list[tuple[int, Rule]] | None) -> None:
        if rows is not None:
            self._emit(rows)
        self.loc += delta * self.cie.code_align

    def _set_register(self, register: int, value: int | str | None) -> None:
        if register == REG_RBP:
            self.state.rbp = value
        elif register == self.cie.ra_register:
            self.state.ra = value

    def _restore(self, register: int) -> None:
        if register == REG_RBP:
            self.state.rbp = self.initial.rbp
        elif register == self.cie.ra_register:
            self.state.ra = self.initial.ra

    def _execute(self, code: bytes, rows: list[tuple[int, Rule]] | None) -> None:
        """One pass over CFA instructions (the DWARF 4 set GCC and clang emit on x86_64)."""
        reader = _Reader(code)
        data_align = self.cie.data_align
        while reader.pos < len(code):
            opcode = reader.u8()
            high, low = opcode & 0xC0, opcode & 0x3F
            if high == 0x40:  # DW_CFA_advance_loc
                self._advance(low, rows)
            elif high == 0x80:  # DW_CFA_offset
                self._set_register(low, reader.uleb() * data_align)
            elif high == 0xC0:  # DW_CFA_restore
                self._restore(low)
            else:
                self._extended(opcode, reader, rows, data_align)

    def _extended(self, opcode: int, reader: _Reader, rows: list[tuple[int, Rule]] | None, data_align: int) -> None:
        state = self.state
        if opcode == 0x00:  # nop
            return
        if opcode == 0x01:  # set_loc
            address = reader.pointer(self.cie.fde_encoding, self.section_addr)
            self._advance(0, rows)
            self.loc, self._absolute = address, True
        elif opcode in (0x02, 0x03, 0x04):  # advance_loc1/2/4
            size = 1 << (opcode - 2)
            self._advance(reader.unpack({1: "<B", 2: "<H", 4: "<I"}[size], size), rows)
        elif opcode in (0x05, 0x11):  # offset_extended(_sf)
            register = reader.uleb()
            self._set_register(register, (reader.uleb() if opcode == 0x05 else reader.sleb()) * data_align)
        elif opcode == 0x06:  # restore_extended
            self._restore(reader.uleb())
        elif opcode == 0x07:  # undefined
            self._set_register(reader.uleb(), "undefined")
        elif opcode == 0x08:  # same_value
            self._set_register(reader.uleb(), None)
        elif opcode == 0x09:  # register
            register = reader.uleb()
            self._set_register(register, f"r{reader.uleb()}")
        elif opcode == 0x0A:  # remember_state
            if len(self.stack) >= MAX_REMEMBERED:
                raise EhFrameBudgetError(f"DW_CFA_remember_state nested deeper than {MAX_REMEMBERED}")
            self.stack.append(state.copy())
        elif opcode == 0x0B:  # restore_state
            loc = self.loc
            if self.stack:
                self.state = self.stack.pop()
            self.loc = loc
        elif opcode in (0x0C, 0x12):  # def_cfa(_sf)
            state.cfa_reg = reader.uleb()
            state.cfa_offset = reader.uleb() if opcode == 0x0C else reader.sleb() * data_align
            state.cfa_expr = None
        elif opcode == 0x0D:  # def_cfa_register
            state.cfa_reg, state.cfa_expr = reader.uleb(), None
        elif opcode in (0x0E, 0x13):  # def_cfa_offset(_sf)
            state.cfa_offset = reader.uleb() if opcode == 0x0E else reader.sleb() * data_align
        elif opcode == 0x0F:  # def_cfa_expression
            length = reader.uleb()
            state.cfa_expr = reader.data[reader.pos : reader.pos + length]
            reader.pos += length
        elif opcode in (0x10, 0x16):  # expression, val_expression
            register = reader.uleb()
            length = reader.uleb()  # not `pos += uleb()`: that adds to the position before the length
            reader.pos += length
            self._set_register(register, "expression")
        elif opcode in (0x14, 0x15):  # val_offset(_sf)
            register = reader.uleb()
            reader.uleb() if opcode == 0x14 else reader.sleb()
            self._set_register(register, "val_offset")
        elif opcode == 0x2E:  # GNU_args_size
            reader.uleb()
        elif opcode == 0x2F:  # GNU_negative_offset_extended
            register = reader.uleb()
            self._set_register(register, -reader.uleb() * data_align)
        else:
            raise EhFrameError(f"DW_CFA opcode {opcode:#x} not supported")


# ---------------------------------------------------------------- the table


def build_table(fdes: Iterable[Fde | FdeRef]) -> tuple[array[int], list[Rule]]:
    """One sorted table for a whole ELF: ``addresses[i]`` is the first address of ``rules[i]``, which
    holds up to ``addresses[i+1]``; addresses no FDE covers are GAP rows, and equal neighbours merge.

    Overlapping FDEs (rare; zero-length ones exist) resolve to the one starting later. Each FDE's rows
    are asked for once, in address order: with FdeRefs only one FDE's rows exist at a time, and the
    table itself is an unsigned 64-bit array and a list of shared Rule objects.
    """
    ordered = sorted((fde for fde in fdes if fde.end > fde.start), key=lambda fde: fde.start)
    addresses: array[int] = array("Q")
    rules: list[Rule] = []

    def add(address: int, rule: Rule) -> None:
        if len(addresses) >= MAX_TABLE_ROWS:
            raise EhFrameBudgetError(f"unwind table of more than {MAX_TABLE_ROWS} rows")
        if addresses and addresses[-1] == address:
            rules[-1] = rule
            if len(rules) > 1 and rules[-2] == rule:
                addresses.pop()
                rules.pop()
        elif not rules or rules[-1] != rule:
            addresses.append(address)
            rules.append(rule)

    for index, fde in enumerate(ordered):
        following = ordered[index + 1].start if index + 1 < len(ordered) else None
        stop = fde.end if following is None else min(fde.end, following)
        if addresses and fde.start < addresses[-1]:
            continue  # nested inside the previous FDE's rows already written: keep the earlier rows
        for address, rule in fde.rows:
            if address >= stop:
                break
            add(max(address, fde.start), rule)
        if following is None or following > stop:
            add(stop, GAP)
    return addresses, rules


def table_for_elf(image: bytes) -> tuple[array[int], list[Rule]]:
    """The unwind table of an ELF image (empty when it has no ``.eh_frame``)."""
    return build_table(iter_fde_refs(read_elf_info(image)))


def lookup(addresses: Sequence[int], rules: list[Rule], address: int) -> Rule:
    """The rule covering ``address`` (GAP outside the table): what the BPF binary search returns."""
    index = bisect.bisect_right(addresses, address) - 1
    return GAP if index < 0 else rules[index]
