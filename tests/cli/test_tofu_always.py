"""Trust on first use, always: whatever supplies the pins (a --bundles-dir, ROCMDOCTOR_BUNDLES, --lock, the
shipped lock with the release API), the digests <prefix>/lock.json recorded for a tag are consulted, a
release rebuilt under the same tag is refused with exit 2 naming both digests, and --retrust-tag is the one
way to accept it. Pins are recorded before `current` moves."""

from __future__ import annotations

import errno
import json
import os
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocmdoctor.host_writes import HostWriter
from rocmdoctor.provision.bundle import install as install_mod
from rocmdoctor.provision.bundle.install import DigestChanged, InstallError, InstallPlan, Layout, Source
from rocmdoctor.provision.bundle.manifest import Asset, Lock, LockEntry, parse_lock, with_entry

TAG = "vllm0.22.1-rocm7.13.0-gfx1151"


def _digests(proc_text: str) -> list[str]:
    return [w.strip(".,") for w in proc_text.split() if w.startswith("sha256:")]


def _supplier_args(lab, how: str) -> tuple[list[str], dict[str, str]]:
    if how == "bundles-dir":
        return ["--bundles-dir", str(lab.pins)], {}
    if how == "env":
        return [], {"ROCMDOCTOR_BUNDLES": str(lab.pins)}
    return ["--lock", str(lab.pins / "lock.json"), "--manifest", str(lab.pins / "manifest.toml")], {}


@pytest.mark.parametrize("how", ["bundles-dir", "env", "lock"])
def test_a_rebuilt_release_under_a_recorded_tag_is_refused_whatever_supplies_the_pins(install_lab, how):
    lab = install_lab
    first = lab.bundle(TAG, payload=4096)
    first_digests = [a.digest for a in first.assets]  # read now: a rebuild replaces the files
    lab.pin("gfx1151", first)
    args, env = _supplier_args(lab, how)
    base = ["install", "--family", "gfx1151", "--prefix", str(lab.prefix), "--connect-timeout", "2"]
    os.environ.update(env)
    try:
        done = lab.cli(*base, *args, "--json")
        assert done.returncode == 0, done.stderr
        recorded = json.loads((lab.prefix / "lock.json").read_text())
        assert [a["digest"] for a in recorded["trusted"][TAG]] == first_digests

        rebuilt = lab.bundle(TAG, payload=4096)  # same tag, other bytes: other digests
        assert rebuilt.assets[0].digest != first_digests[0]
        lab.pin("gfx1151", rebuilt)
        refused = lab.cli(*base, *args, "--force")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        said = _digests(refused.stderr)
        assert rebuilt.assets[0].digest in said and first_digests[0] in said
        assert "--retrust-tag" in refused.stderr
        assert json.loads((lab.prefix / "lock.json").read_text()) == recorded  # not overwritten

        retrusted = lab.cli(*base, *args, "--force", "--retrust-tag", TAG)
        assert retrusted.returncode == 0, retrusted.stderr
        now = json.loads((lab.prefix / "lock.json").read_text())
        assert [a["digest"] for a in now["trusted"][TAG]] == [a.digest for a in rebuilt.assets]
    finally:
        for name in env:
            os.environ.pop(name, None)


def test_retrust_names_only_the_chosen_tag(install_lab):
    lab = install_lab
    lab.pin("gfx1151", lab.bundle(TAG))
    done = lab.install("gfx1151", "--retrust-tag", TAG + "\n")
    assert done.returncode == 2 and "is not the release chosen" in done.stderr


def _plan(prefix: Path, parts: list[tuple[str, str]], retrust: bool = False) -> InstallPlan:
    sources = [Source(Asset(name, 10, digest)) for name, digest in parts]
    return InstallPlan(prefix, "gfx1151", TAG, "lemonade-sdk/vllm-rocm", sources, retrust=retrust)


_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(lambda h: "sha256:" + h)


@settings(max_examples=60, deadline=None)
@given(
    recorded=_hex,
    offered=_hex,
    other_name=st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=8),
    rename=st.booleans(),
)
def test_check_recorded_refuses_every_change_and_accepts_only_the_same_parts(
    tmp_path_factory, recorded, offered, other_name, rename
):
    prefix = tmp_path_factory.mktemp("prefix")
    name = f"{TAG}-x64.tar.gz"
    lock = Lock("lemonade-sdk/vllm-rocm", {}, "", {TAG: (Asset(name, 10, recorded),)})
    (prefix / "lock.json").write_text(json.dumps(lock.to_json()))
    assert parse_lock((prefix / "lock.json").read_text()).recorded(TAG)[0].digest == recorded
    offered_name = f"{TAG}-{other_name}-x64.tar.gz" if rename else name
    plan = _plan(prefix, [(offered_name, offered)])
    if offered_name == name and offered == recorded:
        install_mod._check_recorded(Layout(prefix), plan)
    else:
        with pytest.raises(DigestChanged) as refused:
            install_mod._check_recorded(Layout(prefix), plan)
        if not rename:
            assert recorded in str(refused.value) and offered in str(refused.value)
    install_mod._check_recorded(Layout(prefix), _plan(prefix, [(offered_name, offered)], retrust=True))


def test_pins_are_recorded_before_current_moves(install_lab, monkeypatch):
    """A failed lock.json write (disk full) leaves `current` where it was: the message is then true."""
    lab = install_lab
    old = lab.bundle("vllm0.21.0-rocm7.13.0-gfx1151")
    lab.pin("gfx1151", old)
    assert lab.install("gfx1151").returncode == 0
    new = lab.bundle(TAG)
    sources = [Source(Asset(a.name, a.size, a.digest), local=a.path) for a in new.assets]
    plan = InstallPlan(lab.prefix, "gfx1151", TAG, "lemonade-sdk/vllm-rocm", sources)

    def disk_full(layout, path, doc):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(install_mod, "write_json_atomic", disk_full)
    with pytest.raises(InstallError, match="the previous bundle is still active"):
        install_mod.install(plan, HostWriter("/"))
    assert os.readlink(lab.prefix / "current").endswith("vllm0.21.0-rocm7.13.0-gfx1151")


def test_lock_entries_keep_the_record_of_a_tag_when_the_family_moves_on():
    a = (Asset(f"{TAG}-x64.tar.gz", 1, "sha256:" + "a" * 64),)
    lock = Lock("o/r", {"gfx1151": LockEntry("gfx1151", TAG, True, a)})
    other = "vllm0.23.0-rocm7.13.0-gfx1151"
    moved = with_entry(
        lock, LockEntry("gfx1151", other, True, (Asset(f"{other}-x64.tar.gz", 1, "sha256:" + "b" * 64),))
    )
    assert moved.recorded(TAG) == a and moved.recorded(other)[0].digest == "sha256:" + "b" * 64


def test_prune_of_a_linked_bundle_directory_removes_the_link_never_its_target(install_lab, tmp_path):
    lab = install_lab
    tags = [f"vllm0.2{n}.0-rocm7.13.0-gfx1151" for n in (0, 1, 2)]
    for tag in tags:
        lab.pin("gfx1151", lab.bundle(tag))
        assert lab.install("gfx1151").returncode == 0
    oldest = lab.prefix / "bundles" / tags[0]
    elsewhere = tmp_path / "kept-elsewhere"
    oldest.rename(elsewhere)
    oldest.symlink_to(elsewhere)
    done = lab.cli("bundle", "prune", "--prefix", str(lab.prefix), "--json")
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(oldest) and (elsewhere / "bin" / "vllm-server").is_file()
    assert [p.name for p in (lab.prefix / "bundles").iterdir() if p.name.startswith(".")] in (
        [],
        [".downloads"],
    )


def test_two_installs_sharing_a_download_dir_say_it_is_in_use(install_lab, tmp_path):
    import fcntl

    lab = install_lab
    lab.pin("gfx1151", lab.bundle(TAG))
    shared = tmp_path / "shared-downloads"
    shared.mkdir(mode=0o700)
    with open(shared / ".rocmdoctor-install.lock", "w") as held:  # the other install, mid-download
        fcntl.flock(held, fcntl.LOCK_EX)
        done = lab.install("gfx1151", "--download-dir", str(shared))
    assert done.returncode == 1 and "is in use by another rocmdoctor install" in done.stderr
    assert lab.current() is None
    assert lab.install("gfx1151", "--download-dir", str(shared)).returncode == 0


def test_a_part_offered_without_a_digest_is_verified_against_the_recorded_one(tmp_path):
    name, digest = f"{TAG}-x64.tar.gz", "sha256:" + "d" * 64
    lock = Lock("lemonade-sdk/vllm-rocm", {}, "", {TAG: (Asset(name, 10, digest),)})
    (tmp_path / "lock.json").write_text(json.dumps(lock.to_json()))
    plan = _plan(tmp_path, [(name, None)])  # type: ignore[list-item]
    install_mod._check_recorded(Layout(tmp_path), plan)
    assert [s.asset.digest for s in plan.sources] == [digest]
