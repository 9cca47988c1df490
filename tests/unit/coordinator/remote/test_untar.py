"""A host's capture stream taken in by coordinator.remote.untar: crafted tar streams (links, devices,
names leading out, sizes over the limits) are refused with one line, and nothing lands outside the host's
directory."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

import pytest

from coordinator.remote import untar
from coordinator.remote.untar import CaptureRefused, TarLimits


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields: object
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def _stream(members: Iterable[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.GNU_FORMAT) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    return buffer


def _header(name: bytes, kind: bytes, size: int) -> bytes:
    """A raw GNU header (for sizes tarfile would not write for us)."""
    block = bytearray(512)
    block[0 : len(name)] = name
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = b"\x80" + size.to_bytes(11, "big") if size >= 8**11 else f"{size:011o}\0".encode()
    block[136:148] = b"00000000000\0"
    block[156:157] = kind
    block[257:265] = b"ustar  \0"
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\0 ".encode()
    return bytes(block)


@pytest.fixture
def area(tmp_path: Path) -> tuple[Path, Path]:
    """(the host's directory RUN/hosts/node1, a file beside the run that must never change)."""
    dest = tmp_path / "run" / "hosts" / "node1"
    dest.mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    return dest, outside


def _everything(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_an_honest_capture_is_extracted_with_plain_modes(area: tuple[Path, Path]) -> None:
    dest, _ = area
    stream = _stream([
        _member("./", tarfile.DIRTYPE),
        _member("./meta.json", data=b"{}\n", mode=0o4777, uid=0, uname="root"),
        _member("./pids", tarfile.DIRTYPE, mode=0o7777),
        _member("./pids/42", tarfile.DIRTYPE),
        _member("./pids/42/stacks.bin", data=b"x" * 1000),
        _member("./" + "n" * 150, data=b"long name"),  # a GNU long-name header first
    ])  # fmt: skip
    assert untar.extract_capture(stream, dest) == 6
    assert (dest / "meta.json").read_bytes() == b"{}\n"
    assert (dest / "pids" / "42" / "stacks.bin").read_bytes() == b"x" * 1000
    assert (dest / ("n" * 150)).read_bytes() == b"long name"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((dest / "meta.json").stat().st_mode) == 0o644 & ~umask
    assert stat.S_IMODE((dest / "pids").stat().st_mode) == 0o755 & ~umask


def test_a_pax_path_is_honoured_and_checked(area: tuple[Path, Path]) -> None:
    dest, _ = area
    untar.extract_capture(_stream([_member("./é" + "p" * 120, data=b"pax")], tarfile.PAX_FORMAT), dest)
    assert (dest / ("é" + "p" * 120)).read_bytes() == b"pax"
    with pytest.raises(CaptureRefused, match=r"'\.\.'"):
        untar.extract_capture(_stream([_member("../" + "p" * 120, data=b"pax")], tarfile.PAX_FORMAT), dest)


def test_a_fetch_again_replaces_the_earlier_copy(area: tuple[Path, Path]) -> None:
    dest, _ = area
    untar.extract_capture(_stream([_member("meta.json", data=b"first")]), dest)
    untar.extract_capture(_stream([_member("meta.json", data=b"second")]), dest)
    assert (dest / "meta.json").read_bytes() == b"second"


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([_member("link", tarfile.SYMTYPE, linkname="../../../outside.txt")], "a symbolic link"),
        ([_member("hard", tarfile.LNKTYPE, linkname="../../../outside.txt")], "a hard link"),
        ([_member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3)], "a character device"),
        ([_member("blk", tarfile.BLKTYPE, devmajor=8, devminor=0)], "a block device"),
        ([_member("fifo", tarfile.FIFOTYPE)], "a FIFO"),
        ([_member("../../../outside.txt", data=b"forged\n")], r"'\.\.'"),
        ([_member("a/b/../../../../outside.txt", data=b"forged\n")], r"'\.\.'"),
        ([_member("/tmp/outside.txt", data=b"forged\n")], "an absolute name"),
    ],
    ids=["symlink", "hardlink", "chardev", "blockdev", "fifo", "dotdot", "dotdot-inside", "absolute"],
)
def test_members_that_are_not_plain_files_or_lead_out_are_refused(
    area: tuple[Path, Path], members: list[tuple[tarfile.TarInfo, bytes]], reason: str
) -> None:
    dest, outside = area
    before = _everything(dest.parents[2])
    with pytest.raises(CaptureRefused, match=reason) as refused:
        untar.extract_capture(_stream([_member("ok.txt", data=b"fine"), *members]), dest)
    assert "\n" not in str(refused.value) and "refused" in str(refused.value)
    assert outside.read_text() == "untouched\n"
    assert _everything(dest.parents[2]) - before <= {"run/hosts/node1/ok.txt"}


def test_a_symlink_then_a_file_through_it_writes_nothing_outside(area: tuple[Path, Path], tmp_path: Path) -> None:
    # GIVEN a stream whose first member is a link out of the host's directory, the second a file through it
    dest, outside = area
    stream = _stream([
        _member("escape", tarfile.SYMTYPE, linkname=str(tmp_path)),
        _member("escape/outside.txt", data=b"forged\n"),
    ])  # fmt: skip
    # WHEN it is extracted THEN the link is refused and the file never written
    with pytest.raises(CaptureRefused, match="a symbolic link"):
        untar.extract_capture(stream, dest)
    assert outside.read_text() == "untouched\n" and not (dest / "escape").exists()


def test_a_link_already_in_the_hosts_directory_is_never_followed(area: tuple[Path, Path], tmp_path: Path) -> None:
    # GIVEN a link left in the host's directory (by anything) to the directory above
    dest, outside = area
    (dest / "escape").symlink_to(tmp_path)
    (dest / "leaf").symlink_to(outside)
    # WHEN a stream writes through it, or onto it THEN it is refused, the file outside unchanged
    with pytest.raises(CaptureRefused, match="a link or a file here"):
        untar.extract_capture(_stream([_member("escape/outside.txt", data=b"forged\n")]), dest)
    with pytest.raises(CaptureRefused, match="not a file holds its name"):
        untar.extract_capture(_stream([_member("leaf", data=b"forged\n")]), dest)
    assert outside.read_text() == "untouched\n"


def test_the_hosts_directory_itself_as_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "node1").symlink_to(tmp_path / "real")
    with pytest.raises(CaptureRefused, match="not the host's directory"):
        untar.extract_capture(_stream([_member("meta.json", data=b"{}")]), tmp_path / "node1")
    assert not list((tmp_path / "real").iterdir())


def test_a_huge_member_is_refused_before_its_bytes_are_read(area: tuple[Path, Path]) -> None:
    # GIVEN a header claiming a terabyte, with no content behind it
    dest, _ = area
    stream = io.BytesIO(_header(b"stacks.bin", b"0", 1 << 40))
    with pytest.raises(CaptureRefused, match="over the limit"):
        untar.extract_capture(stream, dest)
    assert not (dest / "stacks.bin").exists()


def test_the_total_bytes_are_capped(area: tuple[Path, Path]) -> None:
    dest, _ = area
    limits = TarLimits(max_total_bytes=2500)
    members = [_member(f"f{i}", data=b"x" * 1000) for i in range(3)]
    with pytest.raises(CaptureRefused, match="passes 2500 bytes"):
        untar.extract_capture(_stream(members), dest, limits)
    assert sorted(p.name for p in dest.iterdir()) == ["f0", "f1"]


def test_too_many_members_are_refused(area: tuple[Path, Path]) -> None:
    dest, _ = area
    with pytest.raises(CaptureRefused, match="more than 50 members"):
        untar.extract_capture(_stream(_member(f"f{i}") for i in range(60)), dest, TarLimits(max_members=50))
    assert len(list(dest.iterdir())) == 50


def test_long_names_and_deep_paths_are_refused(area: tuple[Path, Path]) -> None:
    dest, _ = area
    with pytest.raises(CaptureRefused, match="extended header of"):
        untar.extract_capture(_stream([_member("x" * 2000)]), dest)  # GNU long name over 1024 bytes
    with pytest.raises(CaptureRefused, match="deeper than"):
        untar.extract_capture(_stream([_member("/".join("d" * 20))]), dest)


def test_a_huge_pax_header_is_refused_before_it_is_read(area: tuple[Path, Path]) -> None:
    dest, _ = area
    with pytest.raises(CaptureRefused, match="extended header of"):
        untar.extract_capture(io.BytesIO(_header(b"././@PaxHeader", b"x", 1 << 33)), dest)


def test_a_stream_cut_short_is_a_lost_connection(area: tuple[Path, Path]) -> None:
    dest, _ = area
    whole = _stream([_member("meta.json", data=b"y" * 5000)]).getvalue()
    with pytest.raises(EOFError):
        untar.extract_capture(io.BytesIO(whole[:2000]), dest)


def test_garbage_is_not_a_tar_stream(area: tuple[Path, Path]) -> None:
    dest, _ = area
    with pytest.raises(CaptureRefused, match="not a tar stream"):
        untar.extract_capture(io.BytesIO(b"<html>" + b"A" * 1000), dest)
