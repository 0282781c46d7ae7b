"""SIGKILL at random points of an install, then a rerun: `current` never points at a partial tree and
the rerun always ends with a complete bundle."""

from __future__ import annotations

import json
import random
import time

T1 = "vllm0.1.0-rocm7.0.0-gfx1151"
T2 = "vllm0.2.0-rocm7.0.0-gfx1151"


def _many_files(tag: str) -> dict:
    # enough members that extraction takes a while, so kills land in every phase
    return {
        f"lib/python3.13/site-packages/pkg{i // 100}/mod{i}.py": f"# {tag} {i}\n".encode() * 20
        for i in range(3000)
    }


def _assert_current_is_complete(lab) -> None:
    target = lab.current()
    if target is None:
        return
    assert not target.endswith(".partial")
    tree = lab.prefix / target
    meta = json.loads((tree / ".rocmdoctor-bundle.json").read_text())
    assert meta["tag"] == tree.name
    assert (tree / "bin" / "vllm-server").is_file() and (tree / "bin" / "python3").is_file()
    assert (tree / "lib/python3.13/site-packages/marker.txt").read_text() == tree.name
    assert len(list((tree / "lib/python3.13/site-packages").glob("pkg*/mod*.py"))) == 3000


def test_sigkill_at_random_points_then_rerun_always_completes(install_lab):
    bundles = {
        tag: install_lab.bundle(tag, extra=_many_files(tag), payload=2 << 20, part_size=512 << 10)
        for tag in (T1, T2)
    }
    started = time.monotonic()
    install_lab.pin("gfx1151", bundles[T1])
    assert install_lab.install("gfx1151").returncode == 0
    duration = time.monotonic() - started
    rng = random.Random(20261121)
    for iteration in range(8):
        tag = (T2, T1)[iteration % 2]
        install_lab.pin("gfx1151", bundles[tag])
        proc = install_lab.spawn_install("gfx1151")
        time.sleep(rng.uniform(0.0, duration * 1.1))
        proc.kill()
        proc.wait()
        _assert_current_is_complete(install_lab)
        rerun = install_lab.install("gfx1151", "--json")
        assert rerun.returncode == 0, rerun.stderr
        assert json.loads(rerun.stdout)["current"] == tag
        _assert_current_is_complete(install_lab)
        assert install_lab.leftovers() == []
