"""Hostile archives: every escape is refused by name, nothing lands outside the prefix, nothing is activated.

The archives carry valid digests (the publisher itself is hostile or compromised), so only the
extraction checks stand between them and the filesystem."""

from __future__ import annotations

import tarfile

import pytest

OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
EVIL = "vllm0.6.6-rocm7.0.0-gfx1151"


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info


def _cases(outside: str) -> dict[str, tuple[dict, str]]:
    """name -> (extra tar members, what the error must say)."""
    return {
        "dotdot": ({"../escaped.txt": (_member("../escaped.txt"), b"x")}, "contains '..'"),
        "absolute": ({f"{outside}/abs.txt": (_member(f"{outside}/abs.txt"), b"x")}, "absolute path"),
        "symlink-absolute": ({"lib/out": _member("lib/out", tarfile.SYMTYPE, outside)}, "symlink"),
        "symlink-relative": (
            {"lib/out": _member("lib/out", tarfile.SYMTYPE, "../../../../../../../../" + outside)},
            "symlink leaving the bundle",
        ),
        # `here -> .` is harmless alone; `here/up -> ../x` then resolves outside the tree.
        "symlink-chain": (
            {
                "here": _member("here", tarfile.SYMTYPE, "."),
                "here/up": _member("here/up", tarfile.SYMTYPE, "../escaped"),
            },
            "through a symlink",
        ),
        "symlink-dotdot-through-link": (
            {"here": _member("here", tarfile.SYMTYPE, "."), "up": _member("up", tarfile.SYMTYPE, "here/..")},
            "symlink leaving the bundle",
        ),
        "hardlink": ({"lib/hard": _member("lib/hard", tarfile.LNKTYPE, "../../etc/hostname")}, "hard link"),
        "device": ({"dev/null": _member("dev/null", tarfile.CHRTYPE)}, "device node"),
        "fifo": ({"lib/pipe": _member("lib/pipe", tarfile.FIFOTYPE)}, "device node, FIFO"),
        "setuid": ({"bin/su": (_member("bin/su", mode=0o4755), b"#!/bin/sh\n")}, "setuid"),
    }


@pytest.mark.parametrize("extractor", ["tar", "python"])
@pytest.mark.parametrize("case", sorted(_cases("/x")))
def test_hostile_member_is_refused(install_lab, tmp_path, case, extractor):
    outside = tmp_path / "outside"
    outside.mkdir()
    extra, message = _cases(str(outside))[case]
    install_lab.pin("gfx1151", install_lab.bundle(OLD))
    assert install_lab.install("gfx1151").returncode == 0
    install_lab.pin("gfx1151", install_lab.bundle(EVIL, extra=extra))
    proc = install_lab.install("gfx1151", "--extractor", extractor)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)  # bad input from the publisher (README: exit 2)
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert "previous bundle is still active" in proc.stderr
    assert list(outside.iterdir()) == []
    assert not (install_lab.prefix / "bundles" / "escaped.txt").exists()
    assert not (install_lab.root / "escaped.txt").exists()
    assert install_lab.current() == f"bundles/{OLD}"
    assert not (install_lab.prefix / "bundles" / EVIL).exists() and install_lab.leftovers() == []


@pytest.mark.parametrize("extractor", ["tar", "python"])
def test_internal_links_are_kept(install_lab, extractor):
    """A symlink and a hard link inside the tree are legitimate (the real bundle has them)."""
    extra = {
        "lib/libfoo.so.1": b"ELF",
        "lib/libfoo.so": _member("lib/libfoo.so", tarfile.SYMTYPE, "libfoo.so.1"),
        "lib/libfoo.copy": _member("lib/libfoo.copy", tarfile.LNKTYPE, "lib/libfoo.so.1"),
    }
    install_lab.pin("gfx1151", install_lab.bundle(OLD, extra=extra))
    proc = install_lab.install("gfx1151", "--extractor", extractor)
    assert proc.returncode == 0, proc.stderr
    lib = install_lab.prefix / "current" / "lib"
    assert (lib / "libfoo.so").read_bytes() == b"ELF" and (lib / "libfoo.copy").read_bytes() == b"ELF"


def test_exec_bit_of_bundled_clang_is_restored(install_lab):
    clang = "lib/python3.13/site-packages/_rocm_sdk_core/lib/llvm/bin/clang"
    install_lab.pin("gfx1151", install_lab.bundle(OLD, extra={clang: (b"#!/bin/sh\n", 0o644)}))
    assert install_lab.install("gfx1151").returncode == 0
    assert (install_lab.prefix / "current" / clang).stat().st_mode & 0o111 == 0o111


def test_tree_without_the_shim_is_not_activated(install_lab):
    built = install_lab.bundle(OLD)
    files_without_shim = {"lib/python3.13/site-packages/x.py": b""}
    from harness.bundles import build_bundle

    broken = build_bundle(
        install_lab.root / "broken", "vllm0.9.9-rocm7.0.0-gfx1151", files_without_shim, 4096
    )
    install_lab.server.add_release("lemonade-sdk/vllm-rocm", broken.tag, broken.release_assets())
    install_lab.pin("gfx1151", built)
    assert install_lab.install("gfx1151").returncode == 0
    install_lab.pin("gfx1151", broken)
    proc = install_lab.install("gfx1151")
    assert proc.returncode == 1 and "lacks bin/vllm-server, bin/python3" in proc.stderr
    assert install_lab.current() == f"bundles/{OLD}" and install_lab.leftovers() == []


def test_interpreter_that_does_not_run_is_not_activated(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(OLD))
    assert install_lab.install("gfx1151").returncode == 0
    broken = {"bin/python3": (b"#!/bin/sh\necho 'libpython3.13.so: cannot open' >&2\nexit 127\n", 0o755)}
    install_lab.pin("gfx1151", install_lab.bundle("vllm0.9.9-rocm7.0.0-gfx1151", extra=broken))
    proc = install_lab.install("gfx1151")
    assert proc.returncode == 1 and "exit 127" in proc.stderr and "libpython3.13.so" in proc.stderr
    assert install_lab.current() == f"bundles/{OLD}" and install_lab.leftovers() == []


@pytest.mark.parametrize("case", sorted(_cases("/x")))
def test_the_shared_rule_refuses_without_touching_a_disk(tmp_path, case):
    """The scanner alone (no tarfile, no realpath, nothing on disk) refuses every case."""
    import io

    from rocmdoctor.archive.tar_pipe import HeaderVetter
    from rocmdoctor.archive.tar_rule import UnsafeArchive

    extra, message = _cases(str(tmp_path / "outside"))[case]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for spec in extra.values():
            info, data = spec if isinstance(spec, tuple) else (spec, b"")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    with pytest.raises(UnsafeArchive, match=message.replace("(", r"\(").replace(")", r"\)")):
        HeaderVetter().feed(memoryview(out.getvalue()))
