"""The .eh_frame parser against binutils' own interpretation (readelf --debug-dump=frames-interp)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profiler.unwind import ehframe
from profiler.unwind.ehframe import CFA_END, CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, GAP, Rule

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")
LIBJVM = Path("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so")

_FDE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)$")
_CIE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE ")


def _readelf_rule(cfa: str, rbp: str, ra: str) -> Rule:
    """One row of readelf's table in our terms (``exp`` CFA compares equal to our PLT rule)."""
    if ra == "u":
        return ehframe.END
    if ra != "c-8" or rbp not in ("u", "s") and not re.fullmatch(r"c-?\d+", rbp):
        return ehframe.UNSUPPORTED
    rbp_offset = int(rbp[1:]) if rbp.startswith("c") else 0
    match = re.fullmatch(r"(rsp|rbp)\+(\d+)", cfa)
    if match:
        return Rule(CFA_RSP if match[1] == "rsp" else CFA_RBP, int(match[2]), rbp_offset)
    return Rule(CFA_PLT, -1, rbp_offset) if cfa == "exp" else ehframe.UNSUPPORTED


def _readelf_fdes(path: Path) -> dict[tuple[int, int], list[tuple[int, Rule]]]:
    """(start, end) → rows as readelf interprets them; an FDE without rows has its CIE's initial row."""
    text = subprocess.run(
        ["readelf", "--debug-dump=frames-interp", str(path)], capture_output=True, text=True, check=False
    ).stdout  # exits 1 over warnings about other sections
    fdes: dict[tuple[int, int], list[tuple[int, Rule]]] = {}
    cie_rows: dict[int, list[tuple[int, Rule]]] = {}
    rows: list[tuple[int, Rule]] | None = None
    columns: list[str] = []
    for line in text.splitlines():
        fde, cie = _FDE.match(line), _CIE.match(line)
        if fde or cie:
            rows = []
            if fde:
                start, end = int(fde[2], 16), int(fde[3], 16)
                fdes[(start, end)] = rows
                rows.extend((start, rule) for _loc, rule in cie_rows.get(int(fde[1], 16), [])[:1])
            else:
                cie_rows[int(cie[1], 16)] = rows
        elif line.strip().startswith("LOC") and rows is not None:
            columns = line.split()
            rows.clear()  # the table replaces the CIE's initial row
        elif rows is not None and re.match(r"^[0-9a-f]{16} ", line):
            cells = dict(zip(columns, re.findall(r"r\d+ \([a-z0-9]+\)|\S+", line), strict=False))  # "r10 (r10)"
            rows.append((int(cells["LOC"], 16), _readelf_rule(cells["CFA"], cells.get("rbp", "u"), cells["ra"])))
    return fdes


def _collapse(rows: list[tuple[int, Rule]] | tuple[tuple[int, Rule], ...]) -> list[tuple[int, Rule]]:
    out: list[tuple[int, Rule]] = []
    for address, rule in rows:
        if rule.kind == CFA_PLT:
            rule = Rule(CFA_PLT, -1, rule.rbp_offset)
        if out and out[-1][0] == address:
            out[-1] = (address, rule)
        elif not out or out[-1][1] != rule:
            out.append((address, rule))
    return out


@pytest.mark.parametrize("path", [LIBC, LIBJVM], ids=["libc", "libjvm"])
def test_every_fde_matches_readelf(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"{path} not on this machine: scripts/setup.sh installs glibc and JDK 17")
    if shutil.which("readelf") is None:  # a broken set-up, not a missing capability
        pytest.fail("binutils' readelf is missing: scripts/setup.sh installs it (build-essential)")
    expected = _readelf_fdes(path)
    ours = {(fde.start, fde.end): fde.rows for fde in ehframe.iter_fdes(ehframe.read_elf_info(path.read_bytes()))}
    assert set(ours) == set(expected)
    mismatched = [key for key in expected if _collapse(expected[key]) != _collapse(ours[key])]
    assert mismatched == [], f"{len(mismatched)} FDEs differ, first {mismatched[0]}: " + (
        f"readelf {_collapse(expected[mismatched[0]])} ours {_collapse(ours[mismatched[0]])}" if mismatched else ""
    )


def test_libc_has_the_expected_kinds() -> None:
    addresses, rules = ehframe.table_for_elf(LIBC.read_bytes())
    kinds = {rule.kind for rule in rules}
    assert {CFA_RSP, CFA_RBP, CFA_PLT, CFA_END}.issubset(kinds)
    assert list(addresses) == sorted(set(addresses))
    assert all(a != b for a, b in zip(rules, rules[1:], strict=False))  # equal neighbours merged
    assert CFA_UNSUPPORTED in kinds  # signal trampoline (__restore_rt) is an expression


def test_table_merges_fdes_and_marks_gaps() -> None:
    rsp8, rsp16 = Rule(CFA_RSP, 8), Rule(CFA_RSP, 16)
    fdes = [
        ehframe.Fde(0x200, 0x240, ((0x200, rsp8), (0x201, rsp16))),
        ehframe.Fde(0x100, 0x180, ((0x100, rsp8), (0x104, rsp16), (0x170, rsp8))),
        ehframe.Fde(0x240, 0x250, ((0x240, rsp8),)),
    ]
    addresses, rules = ehframe.build_table(fdes)
    assert list(zip(addresses, rules, strict=True)) == [
        (0x100, rsp8), (0x104, rsp16), (0x170, rsp8), (0x180, GAP),
        (0x200, rsp8), (0x201, rsp16), (0x240, rsp8), (0x250, GAP),
    ]  # fmt: skip
    assert ehframe.lookup(addresses, rules, 0x0FF) == GAP
    assert ehframe.lookup(addresses, rules, 0x17F) == rsp8
    assert ehframe.lookup(addresses, rules, 0x1FF) == GAP
    assert ehframe.lookup(addresses, rules, 0x23F) == rsp16


def test_not_an_elf_is_refused() -> None:
    with pytest.raises(ehframe.EhFrameError):
        ehframe.read_elf_info(b"#!/bin/sh\n" + b"\0" * 64)
