"""install / rollback / bundles / bundle lock|fetch over a real loopback release server and the real CLI."""

from __future__ import annotations

import fcntl
import json
import os

T1 = "vllm0.1.0-rocm7.0.0-gfx1151"
T2 = "vllm0.2.0-rocm7.0.0-gfx1151"


def _json(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_install_verifies_activates_and_is_idempotent(install_lab):
    built = install_lab.bundle(T1, payload=200_000)
    install_lab.pin("gfx1151", built)
    first = install_lab.install("gfx1151", "--json")
    assert first.returncode == 0, first.stderr
    doc = _json(first)
    assert doc["changed"] is True and doc["current"] == T1 and doc["schema_version"] == 1
    assert doc["downloaded_bytes"] == sum(a.size for a in built.assets)
    assert install_lab.current() == f"bundles/{T1}"
    tree = install_lab.prefix / "current"
    assert (tree / "lib/python3.13/site-packages/marker.txt").read_text() == T1
    assert os.access(tree / "bin/vllm-server", os.X_OK)
    assert not any((install_lab.prefix / "bundles" / ".downloads").iterdir())  # parts removed after success

    install_lab.server.clear_log()
    second = install_lab.install("gfx1151", "--json")
    assert second.returncode == 0, second.stderr
    assert _json(second)["changed"] is False
    assert install_lab.server.log == []  # nothing downloaded, not even metadata


def test_rollback_switches_back_and_forth_and_bundles_lists_them(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(T1))
    assert install_lab.install("gfx1151").returncode == 0
    install_lab.bundle(T2)
    by_tag = install_lab.cli("install", "--tag", T2, "--prefix", str(install_lab.prefix), "--json")
    assert by_tag.returncode == 0, by_tag.stderr
    assert _json(by_tag)["previous"] == T1 and install_lab.current() == f"bundles/{T2}"

    back = _json(install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--json"))
    assert back["changed"] is True and back["current"] == T1 and back["previous"] == T2
    listing = _json(install_lab.cli("bundles", "--prefix", str(install_lab.prefix), "--json"))
    assert {b["tag"]: (b["current"], b["previous"]) for b in listing["bundles"]} == {
        T1: (True, False),
        T2: (False, True),
    }
    forth = _json(install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--json"))
    assert forth["current"] == T2
    again = _json(install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--to", T2, "--json"))
    assert again["changed"] is False


def test_rollback_without_previous_says_what_to_do(install_lab):
    missing = install_lab.cli("rollback", "--prefix", str(install_lab.prefix))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not install_lab.prefix.exists()  # a typo in --prefix creates nothing
    install_lab.prefix.mkdir()
    proc = install_lab.cli("rollback", "--prefix", str(install_lab.prefix))
    assert proc.returncode == 1
    assert "no previous bundle" in proc.stderr and "rocmdoctor bundles" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_installed_but_not_current_tag_is_switched_without_download(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(T1))
    assert install_lab.install("gfx1151").returncode == 0
    install_lab.bundle(T2)
    assert install_lab.cli("install", "--tag", T2, "--prefix", str(install_lab.prefix)).returncode == 0
    install_lab.server.clear_log()
    proc = install_lab.install("gfx1151", "--json")
    doc = _json(proc)
    assert doc["changed"] is True and doc["current"] == T1 and doc["downloaded_bytes"] == 0
    assert not [e for e in install_lab.server.log if e.path.endswith(".tar.gz")]


def test_force_reinstalls_the_current_tag(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(T1))
    assert install_lab.install("gfx1151").returncode == 0
    marker = install_lab.prefix / "current" / "stale-file"
    marker.write_text("from the old tree")
    doc = _json(install_lab.install("gfx1151", "--force", "--json"))
    assert doc["changed"] is True and doc["current"] == T1
    assert not marker.exists() and install_lab.leftovers() == []


def test_tag_without_api_digest_is_refused_unless_pinned(install_lab):
    built = install_lab.bundle(T2, digests=False)
    proc = install_lab.cli("install", "--tag", T2, "--prefix", str(install_lab.prefix))
    assert proc.returncode == 2
    assert "no digest" in proc.stderr and built.assets[0].name in proc.stderr
    assert install_lab.current() is None
    install_lab.pin("gfx1151", built)  # a reviewed lock pins the digest the API lacks
    pinned = install_lab.cli(
        "install",
        "--tag",
        T2,
        "--prefix",
        str(install_lab.prefix),
        "--bundles-dir",
        str(install_lab.pins),
        "--json",
    )
    assert pinned.returncode == 0, pinned.stderr
    assert _json(pinned)["current"] == T2


def test_tag_whose_api_digest_differs_from_the_lock_is_refused(install_lab):
    old = install_lab.bundle(T1, publish=False, payload=1000)
    install_lab.pin("gfx1151", old)
    install_lab.bundle(T1, payload=2000)  # "rebuilt under the same tag"
    proc = install_lab.cli(
        "install", "--tag", T1, "--prefix", str(install_lab.prefix), "--bundles-dir", str(install_lab.pins)
    )
    assert proc.returncode == 2 and "rebuilt under the same tag" in proc.stderr


def test_bundle_lock_pins_from_the_api_and_install_uses_it(install_lab):
    built = install_lab.bundle(T1)
    pins = install_lab.pins
    pins.mkdir()
    (pins / "manifest.toml").write_text(
        f'schema_version = 1\nrepo = "lemonade-sdk/vllm-rocm"\n'
        f'[families.gfx1151]\ntag = "{T1}"\nchannel = "stable"\n'
        f'[families.gfx110X]\ntag = "vllm0.1.0-rocm7.0.0-gfx110X"\nchannel = "nightly"\n'
    )
    (pins / "lock.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "repo": "lemonade-sdk/vllm-rocm",
                "families": {"gfx1151": {"tag": T1, "pinned": False, "assets": []}},
            }
        )
    )
    unpinned = install_lab.install("gfx1151", "--frozen")
    assert unpinned.returncode == 2 and "rocmdoctor bundle lock --family gfx1151" in unpinned.stderr

    locked = install_lab.cli("bundle", "lock", "--bundles-dir", str(pins), "--json")
    doc = _json(locked)
    assert locked.returncode == 1  # gfx110X has no release on the server
    assert [(f["family"], f["pinned"]) for f in doc["families"]] == [("gfx110X", False), ("gfx1151", True)]
    lock = json.loads((pins / "lock.json").read_text())
    assert [a["digest"] for a in lock["families"]["gfx1151"]["assets"]] == [a.digest for a in built.assets]
    assert install_lab.install("gfx1151").returncode == 0


def test_bundle_fetch_fills_a_mirror_that_install_uses_offline(install_lab, tmp_path):
    install_lab.pin("gfx1151", install_lab.bundle(T1, payload=100_000))
    mirror = tmp_path / "mirror"
    fetched = _json(
        install_lab.cli(
            "bundle", "fetch", "--to", str(mirror), "--bundles-dir", str(install_lab.pins), "--json"
        )
    )
    assert fetched["changed"] is True and len(fetched["fetched"]) == len(list(mirror.glob("*.tar.gz")))
    again = _json(
        install_lab.cli(
            "bundle", "fetch", "--to", str(mirror), "--bundles-dir", str(install_lab.pins), "--json"
        )
    )
    assert again["changed"] is False
    install_lab.server.stop()  # offline from here on
    proc = install_lab.install("gfx1151", "--mirror", str(mirror), "--json")
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["current"] == T1


def test_a_second_install_waits_for_nobody_and_says_so(install_lab):
    install_lab.pin("gfx1151", install_lab.bundle(T1))
    install_lab.prefix.mkdir()
    with open(install_lab.prefix / ".install.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = install_lab.install("gfx1151")
    assert proc.returncode == 1 and "another rocmdoctor install" in proc.stderr
    assert install_lab.current() is None


def test_progress_bars_on_a_terminal_only(install_lab):
    """Under a pseudo-terminal (script(1)) the bars show on stderr; with --json nothing but JSON."""
    import shlex
    import subprocess
    import sys

    install_lab.pin("gfx1151", install_lab.bundle(T1, payload=300_000))
    argv = [sys.executable, "-m", "rocmdoctor", *install_lab.install_args("gfx1151")]
    tty = subprocess.run(
        ["script", "-qec", shlex.join(argv), "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
        env=install_lab.env(),
        check=False,
    )
    assert tty.returncode == 0, tty.stdout
    assert "download" in tty.stdout and "extract" in tty.stdout and "\ninstalled vllm" in tty.stdout
    assert tty.stdout.rstrip().endswith("changed=true")
    quiet = subprocess.run(
        ["script", "-qec", shlex.join(argv + ["--force", "--json"]), "/dev/null"],
        capture_output=True,
        text=True,
        timeout=120,
        env=install_lab.env(),
        check=False,
    )
    assert quiet.returncode == 0
    assert json.loads(quiet.stdout)["changed"] is True  # the whole terminal output is the JSON, no bars


def test_replacing_the_live_tag_never_leaves_current_dangling(tmp_path, monkeypatch):
    """--force or a rebuilt release swaps the trees in one step: at every filesystem call on the
    way, `current` resolves to a complete bundle (the old one, then the new one)."""
    import os
    import shutil

    from rocmdoctor import host_files
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle import install as installer

    layout = installer.Layout(tmp_path, HostWriter("/").trees)
    for tree, text in ((layout.bundles / "t1", "old"), (layout.bundles / "t1.partial" / "root", "new")):
        (tree / "bin").mkdir(parents=True)
        (tree / "bin" / "vllm-server").write_text(text)
    installer._point(layout, layout.current, "bundles/t1")
    seen: list[str] = []

    def watched(real):
        def call(*args, **kwargs):
            seen.append((layout.current / "bin" / "vllm-server").read_text())  # raises if dangling
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(host_files.os, "replace", watched(os.replace))  # the seam makes the moves
    monkeypatch.setattr(host_files.shutil, "rmtree", watched(shutil.rmtree))
    installer._move_into_place(layout, layout.bundles / "t1.partial" / "root", "t1")
    assert (layout.current / "bin" / "vllm-server").read_text() == "new"
    assert seen and set(seen) == {"new"}  # the swap happened before any other step
    assert sorted(p.name for p in layout.bundles.iterdir()) == ["t1"]
