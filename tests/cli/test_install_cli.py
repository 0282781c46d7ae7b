"""Bad input to install: a message naming the field or what to do, exit 2, never a traceback."""

from __future__ import annotations

import json

import pytest

TAG = "vllm0.1.0-rocm7.0.0-gfx1151"
PART = f"{TAG}-x64.part01-of-01.tar.gz"
DIGEST = "sha256:" + "ab" * 32
MANIFEST = (
    f'schema_version = 1\nrepo = "lemonade-sdk/vllm-rocm"\n'
    f'[families.gfx1151]\ntag = "{TAG}"\nchannel = "stable"\n'
)


def _lock(**entry) -> dict:
    base = {"tag": TAG, "pinned": True, "assets": [{"name": PART, "size": 10, "digest": DIGEST}]}
    return {"schema_version": 1, "repo": "lemonade-sdk/vllm-rocm", "families": {"gfx1151": {**base, **entry}}}


BAD_MANIFESTS = {
    "schema_version": MANIFEST.replace("schema_version = 1", "schema_version = 7"),
    "repo": MANIFEST.replace('"lemonade-sdk/vllm-rocm"', '"not a repo"'),
    "channel": MANIFEST.replace('"stable"', '"beta"'),
    "'tag'": MANIFEST.replace(TAG, "vllm0.1.0-rocm7.0.0-gfx1100"),
    "'parts'": MANIFEST + 'parts = ["other-x64.part01-of-01.tar.gz"]\n',
    "'families'": 'schema_version = 1\nrepo = "a/b"\n',
    "not valid TOML": MANIFEST + "[families.gfx1151\n",
}

BAD_LOCKS = {
    "'digest'": _lock(assets=[{"name": PART, "size": 10, "digest": "md5:abc"}]),
    "'size'": _lock(assets=[{"name": PART, "size": -1, "digest": DIGEST}]),
    "'name'": _lock(assets=[{"size": 10, "digest": DIGEST}]),
    "'assets'": _lock(assets=[]),
    "'pinned'": _lock(pinned="yes"),
    "part01..part02": _lock(
        assets=[
            {"name": f"{TAG}-x64.part02-of-02.tar.gz", "size": 10, "digest": DIGEST},
            {"name": f"{TAG}-x64.part02-of-02.tar.gz", "size": 10, "digest": DIGEST},
        ]
    ),
    "not a part of": _lock(assets=[{"name": "evil.tar.gz", "size": 10, "digest": DIGEST}]),
}


def _refused(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("rocmdoctor: ")
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.mark.parametrize("field", sorted(BAD_MANIFESTS))
def test_bad_manifest_names_the_field(install_lab, field):
    install_lab.pins.mkdir()
    (install_lab.pins / "manifest.toml").write_text(BAD_MANIFESTS[field])
    (install_lab.pins / "lock.json").write_text(json.dumps(_lock()))
    _refused(install_lab.install("gfx1151"), "manifest.toml", field)


@pytest.mark.parametrize("field", sorted(BAD_LOCKS))
def test_bad_lock_names_the_field(install_lab, field):
    install_lab.pins.mkdir()
    (install_lab.pins / "manifest.toml").write_text(MANIFEST)
    (install_lab.pins / "lock.json").write_text(json.dumps(BAD_LOCKS[field]))
    _refused(install_lab.install("gfx1151"), "lock.json", "families.gfx1151", field)


def test_lock_that_is_not_json(install_lab):
    install_lab.pins.mkdir()
    (install_lab.pins / "manifest.toml").write_text(MANIFEST)
    (install_lab.pins / "lock.json").write_text("{")
    _refused(install_lab.install("gfx1151"), "lock.json: not valid JSON")


def test_missing_pin_files(install_lab, tmp_path):
    _refused(
        install_lab.install("gfx1151", "--manifest", str(tmp_path / "nope.toml")), "nope.toml: no such file"
    )


def test_unknown_family_lists_the_known_ones(install_lab):
    _refused(
        install_lab.cli("install", "--family", "gfx906", "--prefix", str(install_lab.prefix)),
        "unknown GPU family 'gfx906'",
        "gfx1151",
        "gfx942",
    )


def test_shipped_pins_are_valid_and_unpinned_install_says_run_bundle_lock(install_lab):
    from rocmdoctor.provision.bundle.manifest import PinSources

    manifest, lock = PinSources().load()
    assert set(manifest.families) == {"gfx1151", "gfx1150", "gfx110X", "gfx120X", "gfx942", "gfx950"}
    assert manifest.families["gfx942"].tag == "vllm0.19.1-rocm7.13.0-gfx942"
    assert all(not entry.pinned and not entry.assets for entry in lock.families.values())
    _refused(
        install_lab.cli("install", "--family", "gfx1151", "--prefix", str(install_lab.prefix), "--frozen"),
        "no pinned digests",
        f"rocmdoctor bundle lock --family gfx1151 --prefix {install_lab.prefix}",
    )
    _refused(  # not frozen: the newest stable release, of which this server has none
        install_lab.cli("install", "--family", "gfx1151", "--prefix", str(install_lab.prefix)),
        "no stable release for gfx1151",
        "bundles --available",
    )
    _refused(
        install_lab.cli("install", "--family", "gfx950", "--prefix", str(install_lab.prefix), "--pinned"),
        "no release of gfx950 is pinned",
        "--tag",
    )
    assert not install_lab.prefix.joinpath("current").exists()


def test_version_the_pins_do_not_have(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    _refused(install_lab.install("gfx1151", "--version", "0.9.0"), "not vLLM 0.9.0", "--tag")


def test_mirror_that_is_neither_dir_nor_url(install_lab, tmp_path):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    _refused(
        install_lab.install("gfx1151", "--mirror", str(tmp_path / "absent")), "not a directory or http(s) URL"
    )


def test_mirror_dir_missing_a_part_says_bundle_fetch(install_lab, tmp_path):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    (tmp_path / "mirror").mkdir()
    _refused(install_lab.install("gfx1151", "--mirror", str(tmp_path / "mirror")), "lacks", "bundle fetch")


def test_tag_for_another_family_and_unknown_tag(install_lab):
    _refused(
        install_lab.cli("install", "--tag", TAG, "--family", "gfx942", "--prefix", str(install_lab.prefix)),
        "is for gfx1151",
    )
    proc = install_lab.cli(
        "install", "--tag", "vllm9.9.9-rocm7.0.0-gfx1151", "--prefix", str(install_lab.prefix)
    )
    assert proc.returncode == 1 and "not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("tag", ["../../etc/x-gfx1151", ".hidden-gfx1151", "vllm1 x-gfx1151"])
def test_tag_that_is_not_a_plain_name_is_refused(install_lab, tag):
    _refused(
        install_lab.cli("install", "--tag", tag, "--prefix", str(install_lab.prefix)), "--tag", "field 'tag'"
    )
    assert install_lab.server.log == []


def test_asset_name_from_the_api_that_is_not_a_plain_file_name_is_refused(install_lab):
    evil = f"{TAG}-x64./../../escape.tar.gz"
    install_lab.server.add_release("lemonade-sdk/vllm-rocm", TAG, [(evil, b"x" * 10)])
    proc = install_lab.cli("install", "--tag", TAG, "--prefix", str(install_lab.prefix))
    assert proc.returncode == 1 and "is not a plain file name" in proc.stderr
    assert not (install_lab.root / "escape.tar.gz").exists()


def test_bundles_on_an_empty_prefix(install_lab):
    proc = install_lab.cli("bundles", "--prefix", str(install_lab.prefix), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["bundles"] == []
