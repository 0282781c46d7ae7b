"""Which release `install` picks, and where its digests come from, against the loopback release server
speaking the GitHub API: trust on first use recorded in <prefix>/lock.json, --frozen, channels on a
release list of several families, products and channels (with '+' in tags and URL-encoded names)."""

from __future__ import annotations

import json

import pytest

STABLE_OLD = "vllm0.9.0-rocm7.12.0-gfx1151"  # a string sort would put 0.9.0 above 0.22.1
STABLE = "vllm0.22.1-rocm7.13.0-gfx1151"
STABLE_UNQUALIFIED = "vllm0.22.2-rocm7.13.0-gfx1151"  # a prerelease: qualification did not pass it
STABLE_LOW_BUT_LATEST = "vllm0.10.0-rocm7.12.0-gfx1151"  # published last, lower version
NIGHTLY = "vllm0.25.2.dev0+rocm7.15.0a20260724.g752a3a504.d20260724-rocm7.15.0-gfx1151"
NIGHTLY_OLD = "vllm0.25.1.dev3+rocm7.15.0a20260701.gabc1234.d20260701-rocm7.15.0-gfx1151"
OMNI = "vllm-omni0.30.0-rocm7.13.0-gfx1151"
OTHER_FAMILY = "vllm0.30.0-rocm7.13.0-gfx1150"
DRAFT = "vllm0.99.0-rocm7.13.0-gfx1151"


def _json(proc):
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def release_list(install_lab):
    """Published in this order (the list answers newest first)."""
    lab = install_lab
    lab.listed_only(STABLE_OLD)
    lab.bundle(STABLE)
    lab.listed_only(STABLE_UNQUALIFIED, prerelease=True)
    lab.listed_only(NIGHTLY_OLD)
    lab.bundle(NIGHTLY)
    lab.listed_only(OMNI)
    lab.listed_only(OTHER_FAMILY)
    lab.listed_only(DRAFT, draft=True)
    lab.listed_only(STABLE_LOW_BUT_LATEST)
    return lab


def test_tags_parse_with_packaging_and_never_split_on_plus():
    from rocmdoctor.facts.manifest import parse_release_tag

    nightly = parse_release_tag(NIGHTLY)
    assert nightly is not None and nightly.product == "vllm" and nightly.family == "gfx1151"
    assert str(nightly.version) == "0.25.2.dev0+rocm7.15.0a20260724.g752a3a504.d20260724"
    assert nightly.rocm == "rocm7.15.0" and nightly.channel == "nightly"
    assert parse_release_tag(STABLE).channel == "stable"
    omni = parse_release_tag(OMNI)
    assert omni.product == "vllm-omni" and str(omni.version) == "0.30.0"
    assert parse_release_tag("vllm0.22.1-gfx1151").rocm is None  # the feed's short form
    assert parse_release_tag("vllmnot-a-version-rocm7-gfx1151") is None
    assert parse_release_tag("qualification-data") is None
    assert parse_release_tag(NIGHTLY_OLD).version < nightly.version


def test_fresh_prefix_with_the_shipped_unpinned_lock_installs_first_try_and_records_the_pins(release_list):
    lab = release_list
    first = lab.shipped("--family", "gfx1151", "--json")
    assert first.returncode == 0, first.stderr
    doc = _json(first)
    assert doc["changed"] is True and doc["current"] == STABLE and doc["trusted_on_first_use"] is True
    assert doc["pins_recorded"] == str(lab.prefix / "lock.json")
    assert "trusted on first use" in doc["msg"] and "lock.json" in doc["msg"]
    lock = json.loads((lab.prefix / "lock.json").read_text())
    entry = lock["families"]["gfx1151"]
    published = {a["name"]: a["digest"] for a in _api_assets(lab, STABLE) if a["name"].endswith(".tar.gz")}
    assert entry["tag"] == STABLE and entry["pinned"] is True
    assert {a["name"]: a["digest"] for a in entry["assets"]} == published

    lab.server.clear_log()
    second = lab.shipped("--family", "gfx1151", "--json")
    doc2 = _json(second)
    assert second.returncode == 0 and doc2["changed"] is False and doc2["trusted_on_first_use"] is False
    assert lab.server.log == []  # the recorded pins answer: no API call, no download
    assert json.loads((lab.prefix / "lock.json").read_text()) == lock

    frozen = lab.shipped("--family", "gfx1151", "--frozen", "--json")
    assert frozen.returncode == 0 and _json(frozen)["changed"] is False  # pinned now: frozen is fine


def _api_assets(lab, tag):
    import requests

    return requests.get(
        f"{lab.server.api_url}/repos/lemonade-sdk/vllm-rocm/releases/tags/{tag}", timeout=10
    ).json()["assets"]


def test_check_reports_the_install_and_the_pins_and_writes_nothing(release_list):
    lab = release_list
    proc = lab.shipped("--family", "gfx1151", "--check", "--json")
    doc = _json(proc)
    assert proc.returncode == 0 and doc["check"] is True and doc["changed"] is True
    assert doc["diff"] == {"before": {"current": None}, "after": {"current": STABLE}}
    assert "would fetch" in doc["msg"] and "would record" in doc["msg"]
    assert not lab.prefix.exists()


def test_frozen_refuses_the_unpinned_family_naming_the_command_that_pins_it(release_list):
    lab = release_list
    proc = lab.shipped("--family", "gfx1151", "--frozen")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--frozen" in proc.stderr
    assert f"rocmdoctor bundle lock --family gfx1151 --prefix {lab.prefix}" in proc.stderr
    assert not (lab.prefix / "current").exists() and lab.server.log == []
    # the named command pins it; then --frozen installs exactly that
    locked = lab.cli("bundle", "lock", "--family", "gfx1151", "--prefix", str(lab.prefix), "--json")
    assert locked.returncode == 0, locked.stderr
    assert _json(locked)["families"][0]["tag"] == STABLE
    again = lab.shipped("--family", "gfx1151", "--frozen", "--json")
    assert again.returncode == 0, again.stderr
    assert _json(again)["current"] == STABLE and _json(again)["pins_recorded"] is None


def test_frozen_with_a_tag_the_lock_does_not_pin(release_list):
    proc = release_list.shipped("--tag", STABLE, "--frozen")
    assert proc.returncode == 2 and f"--tag {STABLE}" in proc.stderr and "bundle lock" in proc.stderr


def test_a_release_whose_asset_lost_its_digest_is_refused(install_lab):
    lab = install_lab
    built = lab.bundle(STABLE, digests=False)
    proc = lab.shipped("--family", "gfx1151")
    assert proc.returncode == 2 and "no digest" in proc.stderr and built.assets[0].name in proc.stderr
    assert not (lab.prefix / "current").exists() and not (lab.prefix / "lock.json").exists()
    assert not [e for e in lab.server.log if e.path.endswith(".tar.gz")]  # not a byte downloaded


def test_channel_selection_on_a_mixed_release_list(release_list):
    from rocmdoctor.provision.bundle.github_release import ApiOptions, list_releases
    from rocmdoctor.provision.bundle.selection import Request, choose

    listing = list_releases("lemonade-sdk/vllm-rocm", release_list.server.api_url, ApiOptions(2, 2, 10))
    assert DRAFT not in [r.tag for r in listing.releases]

    def pick(**kw):
        return choose(listing, Request("gfx1151", **kw), "r")

    assert pick(channel="stable")[0].tag == STABLE
    assert pick(channel="nightly")[0].tag == NIGHTLY
    assert pick(channel="stable", version="0.9")[0].tag == STABLE_OLD
    assert choose(listing, Request("gfx1150", channel="stable"), "r")[0].tag == OTHER_FAMILY
    only_unqualified = pick(channel="stable", version="0.22.2")
    assert only_unqualified[0].tag == STABLE_UNQUALIFIED and "no qualified" in only_unqualified[1][0]
    with pytest.raises(ValueError, match="releases exist on: stable"):
        choose(listing, Request("gfx1150", channel="nightly"), "r")


def test_nightly_install_with_plus_in_the_tag_uses_percent_encoded_urls(release_list):
    lab = release_list
    proc = lab.shipped("--family", "gfx1151", "--channel", "nightly", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["current"] == NIGHTLY and (lab.prefix / "bundles" / NIGHTLY / "bin" / "vllm-server").is_file()
    fetched = [e.raw_path for e in lab.server.log if e.path.endswith(".tar.gz")]
    assert fetched and all("%2B" in p and "+" not in p for p in fetched)
    assert json.loads((lab.prefix / "lock.json").read_text())["families"]["gfx1151"]["tag"] == NIGHTLY
    # the pin now in force is kept until another channel is asked for
    assert _json(lab.shipped("--family", "gfx1151", "--json"))["current"] == NIGHTLY
    back = _json(lab.shipped("--family", "gfx1151", "--channel", "stable", "--json"))
    assert back["current"] == STABLE and back["previous"] == NIGHTLY


def test_pinned_takes_the_manifests_reviewed_tag(install_lab):
    lab = install_lab
    shipped_tag = "vllm0.20.1-rocm7.12.0-gfx1151"  # bundles/manifest.toml
    lab.bundle(shipped_tag)
    lab.bundle(STABLE)
    doc = _json(lab.shipped("--family", "gfx1151", "--pinned", "--json"))
    assert doc["current"] == shipped_tag and doc["trusted_on_first_use"] is True


def test_unqualified_release_is_installed_only_when_nothing_qualified_exists_and_says_so(install_lab):
    lab = install_lab
    lab.bundle(STABLE_UNQUALIFIED, prerelease=True)
    proc = lab.shipped("--family", "gfx1151", "--json")
    doc = _json(proc)
    assert proc.returncode == 0 and doc["current"] == STABLE_UNQUALIFIED and doc["qualified"] is False
    assert any("qualification did not pass" in n for n in doc["notes"])


def test_bundles_available_lists_the_family_with_installed_and_current(release_list):
    lab = release_list
    assert lab.shipped("--family", "gfx1151").returncode == 0
    proc = lab.cli("bundles", "--available", "--family", "gfx1151", "--prefix", str(lab.prefix), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["tag"]: r for r in _json(proc)["available"]}
    assert list(rows) == [NIGHTLY, NIGHTLY_OLD, STABLE_UNQUALIFIED, STABLE, STABLE_LOW_BUT_LATEST, STABLE_OLD]
    assert rows[STABLE]["current"] and rows[STABLE]["installed"] and rows[STABLE]["pinned"]
    assert rows[STABLE_UNQUALIFIED]["qualified"] is False and rows[NIGHTLY]["channel"] == "nightly"
    text = lab.cli("bundles", "--available", "--family", "gfx1151", "--prefix", str(lab.prefix))
    assert text.returncode == 0 and f"* {STABLE}" in text.stdout and "not qualified" in text.stdout


def test_bundle_lock_check_writes_nothing(release_list):
    lab = release_list
    proc = lab.cli("bundle", "lock", "--family", "gfx1151", "--prefix", str(lab.prefix), "--check", "--json")
    doc = _json(proc)
    assert proc.returncode == 0 and doc["changed"] is True and doc["check"] is True
    assert not (lab.prefix / "lock.json").exists()
