"""The host's libraries as its dynamic loader finds them (archive/host_libs.py) in qualification's load
closure: real ELF files made by gcc (harness.elf_bundle) in a bundle tree, and a host root holding the
real libc and ld.so of this machine, its own /etc/ld.so.conf.d and, where a test needs one, an
/etc/ld.so.cache written by this machine's own `ldconfig` (the authority on its format)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from harness.elf_bundle import EXT, SP, TORCH_LIB, qualify_files, write_tree
from rocmdoctor.archive.elf_scan import scan_tree
from rocmdoctor.archive.host_libs import HostLibraries, parse_cache, system_library
from rocmdoctor.documents import DocumentError
from rocmdoctor.provision.bundle.qualify import _Resolver, launcher_library_path, qualify

TAG = "vllm0.1.0-rocm7.0.0-gfx1151"
MULTIARCH = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def elves(tmp_path_factory) -> dict[str, bytes]:
    from harness.elf_bundle import build_elves

    out = tmp_path_factory.mktemp("elves")
    built = build_elves(out)
    return {**built, "libghost.so.1": (out / "ghost/libghost.so.1").read_bytes()}


def _host_root(root: Path) -> Path:
    """A merged-/usr host as Debian lays it out (`lib` -> `usr/lib`, a link), carrying this machine's
    own libc and ld.so (what every gcc-built file needs) in the multiarch directory."""
    (root / MULTIARCH).mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    for name in ("libc.so.6", "ld-linux-x86-64.so.2"):
        found = system_library(name)
        assert found is not None, name
        shutil.copyfile(Path("/") / found.path, root / MULTIARCH / name)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    return root


def _libraries(result):
    return next(step for step in result.steps if step.id == "libraries")


def test_a_library_found_only_through_ld_so_conf_d_through_a_chain_of_links(elves, tmp_path):
    """/etc/ld.so.conf.d/ghost.conf names /opt/ghost/lib; /opt/ghost is an absolute link to /srv/ghost
    (inside the root, as the loader of that root would see it: realpath would leave the root) and
    libghost.so.1 a link to libghost.so.1.0.0. No ld.so.cache: the record says what answered."""
    host = _host_root(tmp_path / "host")
    (host / "etc/ld.so.conf.d/ghost.conf").write_text("# the ghost SDK\n/opt/ghost/lib\n")
    (host / "srv/ghost/lib").mkdir(parents=True)
    (host / "srv/ghost/lib/libghost.so.1.0.0").write_bytes(elves["libghost.so.1"])
    (host / "srv/ghost/lib/libghost.so.1").symlink_to("libghost.so.1.0.0")
    (host / "opt").mkdir()
    (host / "opt/ghost").symlink_to("/srv/ghost")
    result = qualify(
        write_tree(tmp_path / "b", qualify_files(elves, "ghost")), TAG, "sha256:x", "gfx1151", host_root=host
    )
    libraries = _libraries(result)
    assert libraries.status == "passed", libraries.detail
    assert (
        result.host_libraries["libghost.so.1"] == "/opt/ghost/lib/libghost.so.1 (ld.so.conf (/opt/ghost/lib))"
    )
    assert f"{EXT} takes libghost.so.1 from this host (/opt/ghost/lib/libghost.so.1, ld.so.conf" in (
        "\n".join(libraries.notes)
    )
    assert result.host_search.startswith("no /etc/ld.so.cache: the directories of /etc/ld.so.conf")
    assert next(s for s in result.steps if s.id == "symbols").status == "passed"  # ghost() is defined
    # the record carries it as the install writes it
    assert result.to_json()["host_libraries"]["libghost.so.1"].startswith("/opt/ghost/lib/")


def test_the_cache_ldconfig_writes_decides_and_a_stale_conf_does_not(elves, tmp_path):
    """With an /etc/ld.so.cache, the loader asks it and not ld.so.conf: a directory added to the conf
    after the last `ldconfig` is not searched (ld.so(8)). The cache is this machine's ldconfig's."""
    host = _host_root(tmp_path / "host")
    (host / "etc/ld.so.conf.d/ghost.conf").write_text("/opt/ghost\n")
    (host / "opt/ghost").mkdir(parents=True)
    (host / "opt/ghost/libghost.so.1").write_bytes(elves["libghost.so.1"])
    subprocess.run(
        ["ldconfig", "-r", str(host), "-X", "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"],
        check=True,
        capture_output=True,
    )
    bundle = write_tree(tmp_path / "b", qualify_files(elves, "ghost"))
    cached = qualify(bundle, TAG, "sha256:x", "gfx1151", host_root=host)
    assert _libraries(cached).status == "passed"
    assert cached.host_libraries["libghost.so.1"] == "/opt/ghost/libghost.so.1 (ld.so.cache)"
    assert cached.host_search.startswith("/etc/ld.so.cache (")
    # moved to a directory only the conf names, without a new ldconfig: the cache does not know it
    (host / "etc/ld.so.conf.d/ghost.conf").write_text("/opt/ghost2\n")
    (host / "opt/ghost").rename(host / "opt/ghost2")
    stale = qualify(bundle, TAG, "sha256:x", "gfx1151", host_root=host)
    (failure,) = _libraries(stale).failures
    assert failure.missing == "libghost.so.1" and failure.file == EXT


def test_a_library_only_on_the_launchers_library_path(elves, tmp_path):
    """bin/vllm-server puts the bundle's _rocm_sdk_core/lib/llvm/lib first on LD_LIBRARY_PATH
    (vllm_serve.bundle_environment, the one definition); a library there resolves through it before
    the RUNPATH, as ld.so(8) orders them."""
    files = qualify_files(elves, "ghost")
    llvm_lib = f"{SP}/_rocm_sdk_core/lib/llvm/lib"
    files[f"{llvm_lib}/libghost.so.1"] = (elves["libghost.so.1"], 0o755)
    bundle = write_tree(tmp_path / "b", files)
    path = launcher_library_path(bundle)
    assert path[0] == llvm_lib and f"{SP}/torch/lib" in path
    resolver = _Resolver(scan_tree(bundle, 1), HostLibraries(), path)
    how, found = resolver.find(resolver.scan.elfs[EXT], "libghost.so.1")
    assert (how, found.path if found else None) == ("LD_LIBRARY_PATH", f"{llvm_lib}/libghost.so.1")
    how, found = resolver.find(resolver.scan.elfs[EXT], "libprovide.so.1")  # torch/lib: on both paths
    assert (how, found.path if found else None) == ("LD_LIBRARY_PATH", f"{TORCH_LIB}/libprovide.so.1")
    # without the launcher's path the same library is only found by its soname (an earlier load)
    bare = _Resolver(scan_tree(bundle, 1), HostLibraries(), [])
    assert bare.find(bare.scan.elfs[EXT], "libghost.so.1")[0] == "soname"


def test_a_library_missing_everywhere_names_it_its_user_and_the_package(elves, tmp_path):
    host = _host_root(tmp_path / "host")
    files = qualify_files(elves, "good")
    files[f"{SP}/vllm/_numa.abi3.so"] = (elves["ext_ghost"], 0o755)  # a root: vllm/<ext>
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151", host_root=host)
    (failure,) = _libraries(result).failures
    assert failure.file == f"{SP}/vllm/_numa.abi3.so" and failure.missing == "libghost.so.1"
    assert "needs libghost.so.1, which is neither in the bundle" in failure.message
    assert "its loader searched /etc/ld.so.conf, /lib/x86_64-linux-gnu" in failure.message
    assert "; install " not in failure.message  # no package is known for it: none is named

    # a library the data knows: the package on each distribution is named (bundles/qualification.toml)
    from rocmdoctor.archive.host_libs import package_for

    assert (
        package_for("libnuma.so.1")
        == "; install libnuma1 (debian) / libnuma1 (ubuntu) / numactl-libs (fedora)"
    )


def test_the_real_cache_of_this_machine_agrees_with_ldconfig(tmp_path):
    """parse_cache against `ldconfig -p` (glibc's own reader) on this machine's /etc/ld.so.cache."""
    data = Path("/etc/ld.so.cache").read_bytes()
    parsed = parse_cache(data)
    listed = subprocess.run(["ldconfig", "-p"], check=True, capture_output=True, text=True).stdout
    theirs: dict[str, str] = {}
    for name, flags, path in re.findall(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", listed, re.M):
        if flags == "libc6,x86-64":
            theirs.setdefault(name, path)
    assert parsed == theirs and len(parsed) > 50


def _cache_with(data: bytes, **fields: int) -> bytes:
    """The real cache with header or first-entry fields overwritten (nlibs, key, value)."""
    out = bytearray(data)
    if "nlibs" in fields:
        struct.pack_into("<I", out, 20, fields["nlibs"])
    if "key" in fields:
        struct.pack_into("<I", out, 48 + 4, fields["key"])
    return bytes(out)


@pytest.mark.parametrize(
    ("mutate", "said"),
    [
        (lambda d: d[:40], "not a glibc-ld.so.cache1.1 file"),
        (lambda d: d[:100], "more than its 100 bytes hold"),
        (lambda d: _cache_with(d, nlibs=0xFFFFFFFF), "it claims 4294967295 entries"),
        (
            lambda d: _cache_with(d, key=0x7FFFFFF0),
            "entry 0 points at offset 2147483632, outside its strings",
        ),
        (lambda d: d[: len(d) - 200], "outside its strings"),
        (lambda d: b"ld.so-1.7.0" + d, "the old ld.so-1.7.0 cache format"),
    ],
    ids=[
        "truncated-header",
        "truncated-entries",
        "huge-count",
        "offset-past-end",
        "strings-cut",
        "old-format",
    ],
)
def test_a_hostile_cache_is_refused_naming_the_file(mutate, said):
    with pytest.raises(DocumentError) as caught:
        parse_cache(mutate(Path("/etc/ld.so.cache").read_bytes()))
    assert str(caught.value).startswith("/etc/ld.so.cache: ") and said in str(caught.value)


def test_a_cache_that_is_a_fifo_or_huge_is_refused(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    os.mkfifo(host / "etc/ld.so.cache")
    with pytest.raises(DocumentError, match="cannot be read .*not a regular file"):
        HostLibraries(host)
    (host / "etc/ld.so.cache").unlink()
    (host / "etc/ld.so.cache").symlink_to("/etc/ld.so.cache")  # absolute: inside the root, absent
    assert HostLibraries(host).source.startswith("no /etc/ld.so.cache")


def test_an_include_loop_in_ld_so_conf_is_refused(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/ld.so.conf").write_text("include /etc/ld.so.conf\n")
    with pytest.raises(DocumentError, match="includes nest more than 8 deep"):
        HostLibraries(host)


def _numa_ext(out: Path) -> bytes:
    """A real abi3 extension module that calls libnuma (this host's, as the vLLM CPU engine's _C does)."""
    from harness.elf_bundle import _shared

    numa = HostLibraries().find("libnuma.so.1")
    assert numa is not None, "the test host carries libnuma.so.1 (the real engine needs it too)"
    source = "int numa_available(void);\nint uses_numa(void) { return numa_available(); }\n"
    return _shared(out, source, "numa_ext.so", str(Path("/") / numa.facts.path)).read_bytes()


def test_on_this_host_the_loader_itself_agrees_and_the_record_says_it_decided(elves, tmp_path):
    """vllm/_numa.abi3.so needs libnuma.so.1, which the bundle does not carry: the static reading finds it
    in this host's ld.so.cache, and `ld.so --list` (the host's loader, trace mode) loads it too."""
    files = qualify_files(elves, "good")
    files[f"{SP}/vllm/_numa.abi3.so"] = (_numa_ext(tmp_path), 0o755)
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert result.qualified, result.first_failure()
    assert result.library_authority.startswith("this host's loader (/lib64/ld-linux-x86-64.so.2 --list")
    assert "on 2 root file(s)" in result.library_authority  # vllm/_C.abi3.so and vllm/_numa.abi3.so
    assert result.host_libraries["libnuma.so.1"].endswith("(ld.so.cache)")
    notes = "\n".join(_libraries(result).notes)
    assert f"{SP}/vllm/_numa.abi3.so takes libnuma.so.1 from this host (" in notes
    assert "the loader maps" not in notes  # the loader opened the path the cache names


def test_a_library_found_only_by_soname_is_left_to_the_import_which_refuses(elves, tmp_path):
    """libghost.so.1 sits in the bundle outside every RUNPATH and the launcher's path: the static reading
    takes it by soname (an earlier import might load it), the loader alone does not find it, and the
    import step, which really loads vllm._C, is what refuses the bundle."""
    files = qualify_files(elves, "ghost")
    files[f"{SP}/other/libghost.so.1"] = (elves["libghost.so.1"], 0o755)
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    libraries = _libraries(result)
    assert libraries.status == "passed"
    assert f"{EXT}: the loader alone does not find libghost.so.1" in "\n".join(libraries.notes)
    step = next(s for s in result.steps if s.id == "import")
    assert step.status == "failed" and "libghost.so.1" in step.detail and not result.qualified


def test_a_replayed_host_root_is_judged_statically_and_says_so(elves, tmp_path):
    host = _host_root(tmp_path / "host")
    result = qualify(
        write_tree(tmp_path / "b", qualify_files(elves, "good")), TAG, "sha256:x", "gfx1151", host_root=host
    )
    assert result.library_authority.startswith("the static reading only: the host is a replayed root")
