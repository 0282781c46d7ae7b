"""The header vetting in front of GNU tar: long names (pax, GNU 'L'/'K') cannot smuggle a member past it."""

from __future__ import annotations

import io
import tarfile

import pytest

from rocmdoctor.archive.extract import ArchiveError, UnsafeArchive
from rocmdoctor.archive.tar_pipe import HeaderVetter

LONG = "lib/" + "d" * 120


def _tar(members: list[tarfile.TarInfo], fmt: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size
    return info


def _vet(data: bytes, chunk: int = 700) -> HeaderVetter:
    vetter = HeaderVetter()
    for pos in range(0, len(data), chunk):  # odd chunk size: headers straddle reads
        vetter.feed(memoryview(data)[pos : pos + chunk])
    return vetter


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_are_vetted(fmt):
    ok = _vet(
        _tar([_member(LONG + "/file", size=3000), _member(LONG + "/link", tarfile.SYMTYPE, "file")], fmt)
    )
    assert ok.ended and ok.members == 2
    with pytest.raises(UnsafeArchive, match=r"contains '\.\.'"):
        _vet(_tar([_member(LONG + "/../../../escaped", size=10)], fmt))
    with pytest.raises(UnsafeArchive, match="symlink leaving"):
        _vet(_tar([_member("lib/x", tarfile.SYMTYPE, "../" * 3 + "d" * 120)], fmt))


def test_a_corrupt_header_is_refused_not_passed_through():
    data = bytearray(_tar([_member("bin/a", size=10)], tarfile.PAX_FORMAT))
    data[0] ^= 0x01  # name changed, checksum not
    with pytest.raises(ArchiveError, match="bad checksum"):
        _vet(bytes(data))


def test_archive_without_end_marker_is_not_ended():
    data = _tar([_member("bin/a", size=10)], tarfile.PAX_FORMAT)
    assert not _vet(data[:1024]).ended
