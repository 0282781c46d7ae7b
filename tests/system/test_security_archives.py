"""Hostile bundle archives (tests/harness/hostile_tar.py) against both extractors: each is refused with a
message naming the problem, nothing lands outside the destination, and nothing unvetted (a device node,
a set-id file, a link out) is ever on disk, not even in the tree a failed extraction leaves behind.

The archives carry valid digests where they go through `install`: the publisher itself is hostile or
compromised, so only the extraction rule stands between them and the filesystem."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import REPO
from harness.bundles import BuiltBundle
from harness.hostile_tar import archive, corpus, gzip_bytes, inspect_tree
from rocmdoctor.archive.extract import ArchiveError, NoSpaceLeft, UnsafeArchive, extract_stream
from rocmdoctor.archive.tar_pipe import Counting, Gunzip, HeaderVetter, decompressor, relay_extract

CASES = {case.name: case for case in corpus("/outside", "../outside")}
OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
EVIL = "vllm0.6.6-rocm7.0.0-gfx1151"
# `install` refuses a hostile bundle with exit 1 (an install that did not happen; usage errors are 2).
INSTALL_REFUSED = 2  # bad input from a stranger (README: exit 2)


def _box(tmp_path: Path) -> tuple[Path, Path, Path]:
    outside = tmp_path / "outside"
    box = tmp_path / "box"
    dest = box / "dest"
    outside.mkdir()
    dest.mkdir(parents=True)
    return outside, box, dest


@pytest.mark.parametrize("extractor", ["tar", "python"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_archive_is_refused_and_nothing_unvetted_is_on_disk(tmp_path, name, extractor):
    outside, box, dest = _box(tmp_path)
    case = {c.name: c for c in corpus(str(outside), "../../outside")}[name]
    with pytest.raises((UnsafeArchive, ArchiveError)) as caught:
        extract_stream(io.BytesIO(gzip_bytes(archive(case))), dest, extractor=extractor)
    assert case.expect in str(caught.value), str(caught.value)
    # extract_stream leaves the tree to its caller: what it holds is what was created before the refusal
    assert inspect_tree(dest, box) == []
    assert list(outside.iterdir()) == []


def _package_tree(tmp_path: Path) -> Path:
    """`rocmdoctor` importable from source by any interpreter: src/rocmdoctor plus provision/."""
    pkg = tmp_path / "pkg" / "rocmdoctor"
    pkg.mkdir(parents=True)
    for entry in (REPO / "src" / "rocmdoctor").iterdir():
        (pkg / entry.name).symlink_to(entry)
    (pkg / "provision").symlink_to(REPO / "provision")
    return pkg.parent


def test_the_corpus_is_refused_under_the_system_python(tmp_path):
    """Debian 12's /usr/bin/python3 (3.11.2) predates the 2025 tarfile fixes; users run it there."""
    assert Path("/usr/bin/python3").exists(), "tests/setup/10-system-packages.sh installs python3"
    env = {
        **os.environ,
        "PYTHONPATH": f"{_package_tree(tmp_path)}:{REPO / 'tests'}",
        "PYTHONNOUSERSITE": "1",
    }
    proc = subprocess.run(
        ["/usr/bin/python3", "-s", str(REPO / "tests/harness/hostile_tar.py"), "drive",
         str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    print(lines[0])
    assert lines[0]["executable"] == "/usr/bin/python3"
    rows = lines[1:]
    assert len(rows) == 2 * len(CASES)
    failures = [r for r in rows if not r["refused"] or r["problems"]]
    assert failures == []


def test_the_python_extractor_uses_neither_realpath_nor_tarfile(tmp_path, monkeypatch):
    """A legitimate tree extracts with both unavailable: safety does not rest on them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the extractor called realpath or tarfile")

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name, data in {"bin/x": b"#!/bin/sh\n", "lib/" + "n" * 150 + "/f": b"long"}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("lib/l")
        link.type, link.linkname = tarfile.SYMTYPE, "../bin/x"
        tar.addfile(link)
        hard = tarfile.TarInfo("bin/y")
        hard.type, hard.linkname = tarfile.LNKTYPE, "bin/x"
        tar.addfile(hard)
    monkeypatch.setattr(os.path, "realpath", forbidden)
    monkeypatch.setattr(tarfile, "open", forbidden)
    monkeypatch.setattr(tarfile.TarFile, "extractall", forbidden)
    dest = tmp_path / "dest"
    dest.mkdir()
    extract_stream(io.BytesIO(out.getvalue()), dest, extractor="python")
    monkeypatch.undo()
    assert (dest / "bin/x").read_bytes() == b"#!/bin/sh\n" and (
        dest / "bin/x"
    ).stat().st_mode & 0o777 == 0o755
    assert (dest / "bin/x").stat().st_mtime == 1_700_000_000
    assert os.readlink(dest / "lib/l") == "../bin/x" and (dest / "bin/y").stat().st_nlink == 2
    assert (dest / "lib" / ("n" * 150) / "f").read_bytes() == b"long"


def _gnu_tree(tmp_path: Path) -> Path:
    """A tree with what real bundles hold: long names, symlinks, hard links, exec bits, empty files."""
    src = tmp_path / "src" / "vllm-rocm"
    deep = src / "lib" / "python3.13" / "site-packages" / ("pkg" * 40) / "sub"
    deep.mkdir(parents=True)
    (deep / "mod.py").write_text("x = 1\n")
    (deep / "empty.py").write_text("")
    (src / "bin").mkdir()
    (src / "bin" / "python3.13").write_text("#!/bin/sh\n")
    (src / "bin" / "python3.13").chmod(0o755)
    (src / "bin" / "python3").symlink_to("python3.13")
    os.link(deep / "mod.py", src / "lib" / "mod-hardlink.py")
    (src / "lib" / "up").symlink_to("../bin/python3")
    return src


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
@pytest.mark.parametrize("extractor", ["tar", "python"])
def test_archives_made_by_gnu_tar_extract_like_gnu_tar(tmp_path, fmt, extractor):
    """The canonical form is what GNU tar writes: its archives pass, and the tree is GNU tar's own."""
    src = _gnu_tree(tmp_path)
    names = (
        ["vllm-rocm"]
        if fmt != "ustar"
        else ["vllm-rocm/bin", "vllm-rocm/lib/up", "vllm-rocm/lib/mod-hardlink.py"]
    )
    data = subprocess.run(
        ["tar", "-c", f"--format={fmt}", "-z", "-C", str(src.parent), *names], capture_output=True, check=True
    ).stdout
    ours, reference = tmp_path / "ours", tmp_path / "reference"
    ours.mkdir()
    reference.mkdir()
    extract_stream(io.BytesIO(data), ours, extractor=extractor)
    subprocess.run(["tar", "-xzf", "-", "-C", str(reference)], input=data, check=True)

    def listing(root: Path) -> list[tuple]:
        out = []
        for path in sorted(root.rglob("*")):
            st = path.lstat()
            link = os.readlink(path) if path.is_symlink() else ""
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            mtime = int(st.st_mtime) if path.is_file() and not path.is_symlink() else 0
            out.append(
                (
                    str(path.relative_to(root)),
                    oct(st.st_mode),
                    link,
                    content,
                    mtime,
                    st.st_nlink if not path.is_dir() else 0,
                )
            )
        return out

    assert listing(ours) == listing(reference)


def test_the_bytes_tar_receives_are_the_bytes_vetted(tmp_path):
    """The relay writes each chunk it vetted, from the same buffer, splices large members' data for
    exactly their declared length, and sends nothing after the end marker."""
    fake_tar = tmp_path / "fake-tar"
    fake_tar.write_text('#!/bin/sh\nwhile [ "$1" != "-C" ]; do shift; done\ncat > "$2/../received.tar"\n')
    fake_tar.chmod(0o755)
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(50):  # small members go through the buffer, large ones pipe to pipe (splice)
            data = os.urandom(i * 997 if i % 10 else (1 << 20) + i)
            info = tarfile.TarInfo(f"lib/f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = plain.getvalue()
    dest = tmp_path / "dest"
    dest.mkdir()
    vetter = relay_extract(
        Gunzip(decompressor(), Counting(io.BytesIO(gzip_bytes(raw)), None)), dest, str(fake_tar)
    )
    received = (tmp_path / "received.tar").read_bytes()
    assert received == raw[: vetter.offset - vetter.trailer] and vetter.members == 50
    assert received.endswith(bytes(1024)) and raw[len(received) :].count(0) == len(raw) - len(received)


@pytest.mark.parametrize("chunk", [1, 511, 513, 4096])
def test_headers_straddling_reads_are_vetted_the_same(chunk):
    raw = archive(CASES["pax-size-underscore"])
    vetter = HeaderVetter()
    with pytest.raises(UnsafeArchive, match="pax size"):
        for pos in range(0, len(raw), chunk):
            vetter.feed(memoryview(raw)[pos : pos + chunk])


# -- disk full ---------------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, check=False
    )
    assert done.returncode == 0, (
        f"cannot mount a tmpfs (the suite runs as root): {done.stderr.decode().strip()}"
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class _Parts(io.RawIOBase):
    """A stream that knows its compressed size, as the install's PartStream does."""

    def __init__(self, data: bytes) -> None:
        self._raw = io.BytesIO(data)
        self.parts = [type("P", (), {"asset": type("A", (), {"size": len(data)})()})()]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        return self._raw.readinto(buffer)


@pytest.mark.parametrize("extractor", ["tar", "python"])
def test_disk_full_says_no_space_with_sizes(small_tmpfs, extractor):
    files = {f"lib/blob{i}": os.urandom(512 * 1024) for i in range(24)}  # 12 MiB into 2 MiB
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dest = small_tmpfs / "bundles" / "x.partial"
    dest.mkdir(parents=True)
    with pytest.raises(NoSpaceLeft) as caught:
        extract_stream(_Parts(out.getvalue()), dest, extractor=extractor)
    message = str(caught.value)
    assert message.startswith(f"no space left on tmpfs at {small_tmpfs}") and str(dest) in message
    needed = re.search(r"needed ~([0-9.]+) MiB, free ([0-9.]+ [KMiB]+) after ([0-9.]+) MiB written", message)
    assert needed, message
    # the estimate scales what was vetted by the compressed bytes still to come (pipes run ahead a little)
    assert 9.0 <= float(needed.group(1)) <= 15.0 and 1.0 <= float(needed.group(3)) <= 2.0, message
    assert "publisher" not in message


def _publish_raw(lab, tag: str, raw_tar: bytes) -> BuiltBundle:
    """A crafted archive as a release: gzip'd, one part, with its true digest."""
    out_dir = lab.root / "assets" / tag
    out_dir.mkdir(parents=True)
    base = f"{tag}-x64"
    part = out_dir / f"{base}.part01-of-01.tar.gz"
    part.write_bytes(gzip_bytes(raw_tar))
    built = BuiltBundle(
        tag=tag, base=base, out_dir=out_dir, parts=[part], partcount=out_dir / f"{base}.partcount"
    )
    built.partcount.write_text("1\n")
    lab.server.add_release("lemonade-sdk/vllm-rocm", tag, built.release_assets())
    return built


CLI_CASES = [  # one per class; the whole corpus runs against extract_stream above
    "pax-size-underscore", "size-base256-stray-bits", "type-char-device", "cve-2025-4517",
    "hardlink-to-symlink", "duplicate-replaces-shim",
]  # fmt: skip


@pytest.mark.parametrize("extractor", ["tar", "python"])
def test_install_refuses_the_corpus_and_keeps_the_previous_bundle(install_lab, tmp_path, extractor):
    """Through the CLI with valid digests: refused, the old bundle current, nothing left or outside."""
    install_lab.pin("gfx1151", install_lab.bundle(OLD))
    assert install_lab.install("gfx1151").returncode == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    partial = install_lab.prefix / "bundles" / f"{EVIL}.partial"
    cases = {c.name: c for c in corpus(str(outside), os.path.relpath(outside, partial))}
    for index, name in enumerate(CLI_CASES):
        tag = f"vllm0.6.{index}-rocm7.0.0-gfx1151"
        install_lab.pin("gfx1151", _publish_raw(install_lab, tag, archive(cases[name])))
        proc = install_lab.install("gfx1151", "--extractor", extractor)
        assert proc.returncode == INSTALL_REFUSED, (name, proc.stdout, proc.stderr)
        assert cases[name].expect in proc.stderr and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert "previous bundle is still active" in proc.stderr
        assert install_lab.current() == f"bundles/{OLD}"
        assert install_lab.leftovers() == [] and not (install_lab.prefix / "bundles" / tag).exists()
        assert list(outside.iterdir()) == [], name
        assert not any(p.name.startswith("smuggled") for p in install_lab.root.rglob("smuggled*"))


def test_install_on_a_full_disk_says_no_space_not_bad_bundle(install_lab, small_tmpfs):
    install_lab.pin("gfx1151", install_lab.bundle(OLD, payload=4 << 20, part_size=1 << 20))
    downloads = install_lab.root / "downloads"
    proc = subprocess.run(  # the prefix on the small tmpfs, the downloads beside it on disk
        [sys.executable, "-m", "rocmdoctor", "install", "--family", "gfx1151",
         "--prefix", str(small_tmpfs / "rd"),
         "--bundles-dir", str(install_lab.pins), "--download-dir", str(downloads), "--extractor", "tar"],
        capture_output=True, text=True, timeout=120, env=install_lab.env(), check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "no space left" in proc.stderr and "publisher" not in proc.stderr, proc.stderr
    assert not any(p.name.endswith(".partial") for p in (small_tmpfs / "rd" / "bundles").iterdir())
    shutil.rmtree(downloads, ignore_errors=True)
