"""Download directories others can write, planted links and files, stale parts, FIFOs where a lock
belongs, and `rollback --to` paths: refused with a clear message (exit 2) or repaired, and nothing
outside the prefix and the download directory is ever written."""

from __future__ import annotations

import json
import os
import time

import pytest

from harness.release_server import Fault

TAG = "vllm0.1.0-rocm7.0.0-gfx1151"
NOBODY = 65534


def _json(proc):
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _refused(proc, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


@pytest.fixture
def lab(install_lab):
    install_lab.built = install_lab.bundle(TAG, payload=200_000)
    install_lab.pin("gfx1151", install_lab.built)
    return install_lab


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_download_dir_others_can_write_is_refused(lab, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # world-writable, not sticky
    _refused(lab.install("gfx1151", "--download-dir", str(shared)), str(shared), "other users", "sticky")
    _refused(
        lab.cli("bundle", "fetch", "--to", str(shared), "--bundles-dir", str(lab.pins)),
        str(shared),
        "other users",
    )
    assert os.listdir(shared) == [] and lab.current() is None


def test_sticky_dir_works_but_a_subdirectory_planted_by_another_user_is_refused(lab, tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    planted = sticky / TAG
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    _refused(lab.install("gfx1151", "--download-dir", str(sticky)), f"belongs to uid {NOBODY}")
    planted.rmdir()
    os.symlink("/etc", planted)
    _refused(lab.install("gfx1151", "--download-dir", str(sticky)), "symbolic link")
    planted.unlink()
    ok = lab.install("gfx1151", "--download-dir", str(sticky), "--json")
    assert ok.returncode == 0, ok.stderr


def test_planted_partial_link_is_never_followed(lab, tmp_path, victim):
    staging = tmp_path / "dl" / TAG
    staging.mkdir(parents=True, mode=0o700)
    first = lab.built.assets[0]
    os.symlink(victim, staging / f"{first.name}.partial")
    proc = lab.install("gfx1151", "--download-dir", str(tmp_path / "dl"))
    assert proc.returncode == 1 and "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert victim.read_text() == "precious\n" and lab.current() is None


def test_planted_finished_part_link_and_foreign_file_in_a_mirror_dir(lab, tmp_path, victim):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    mirror.chmod(0o1777)
    first = lab.built.assets[0]
    os.symlink(victim, mirror / first.name)
    proc = lab.cli("bundle", "fetch", "--to", str(mirror), "--bundles-dir", str(lab.pins))
    assert proc.returncode == 1 and "symbolic link" in proc.stderr
    os.unlink(mirror / first.name)
    (mirror / first.name).write_bytes(b"x" * first.size)
    os.chown(mirror / first.name, NOBODY, NOBODY)
    proc = lab.cli("bundle", "fetch", "--to", str(mirror), "--bundles-dir", str(lab.pins))
    assert proc.returncode == 1 and f"owned by uid {NOBODY}" in proc.stderr
    assert victim.read_text() == "precious\n"


def test_finished_part_of_an_earlier_build_is_replaced_not_blocking(lab, tmp_path):
    staging = tmp_path / "dl" / TAG
    staging.mkdir(parents=True, mode=0o700)
    first = lab.built.assets[0]
    (staging / first.name).write_bytes(b"an earlier build of the same tag")  # wrong size
    second = lab.built.assets[1]
    (staging / second.name).write_bytes(b"\0" * second.size)  # right size, wrong digest
    proc = lab.install("gfx1151", "--download-dir", str(tmp_path / "dl"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert _json(proc)["current"] == TAG
    assert len(lab.server.downloads(first.name)) == 1 and len(lab.server.downloads(second.name)) == 1


def test_mirror_fetch_replaces_a_stale_part(lab, tmp_path):
    mirror = tmp_path / "mirror"
    first = lab.built.assets[0]
    mirror.mkdir(mode=0o755)
    (mirror / first.name).write_bytes(b"stale")
    doc = _json(lab.cli("bundle", "fetch", "--to", str(mirror), "--bundles-dir", str(lab.pins), "--json"))
    assert first.name in doc["fetched"] and (mirror / first.name).stat().st_size == first.size


def test_corrupt_part_is_always_reported_as_its_digest_mismatch(lab):
    """Two parts finishing together, one corrupt: the digest error wins over the reader's symptom."""
    for _ in range(3):
        lab.server.inject(lab.built.assets[-1].name, Fault("corrupt", offset=10))
        proc = lab.install("gfx1151")
        assert proc.returncode == 1, proc.stderr
        assert "sha256 mismatch" in proc.stderr and "No such file" not in proc.stderr, proc.stderr
        assert lab.current() is None and lab.leftovers() == []
        lab.server.clear_faults()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_lock_that_is_not_a_regular_file_is_refused_without_hanging(lab, tmp_path, kind):
    path = tmp_path / "lock.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        path.mkdir()
    started = time.monotonic()
    proc = lab.install("gfx1151", "--lock", str(path))
    assert time.monotonic() - started < 25
    _refused(proc, str(path), "is a directory" if kind == "directory" else "not a regular file")


def test_prefix_lock_fifo_does_not_hang_install(lab):
    lab.prefix.mkdir()
    os.mkfifo(lab.prefix / "lock.json")
    proc = lab.cli("install", "--family", "gfx1151", "--prefix", str(lab.prefix))
    _refused(proc, "lock.json", "not a regular file")


def test_rollback_to_accepts_only_names_inside_bundles(lab, tmp_path):
    assert lab.install("gfx1151").returncode == 0
    outside = tmp_path / "elsewhere" / TAG
    (outside / "bin").mkdir(parents=True)
    for bad in (str(outside), "../" + TAG, "/etc", ".hidden", f"{TAG}/../../x"):
        proc = lab.cli("rollback", "--prefix", str(lab.prefix), "--to", bad)
        _refused(proc, "--to")
        assert lab.current() == f"bundles/{TAG}"
    inside = lab.cli(
        "rollback", "--prefix", str(lab.prefix), "--to", str(lab.prefix / "bundles" / TAG), "--json"
    )
    assert inside.returncode == 0 and _json(inside)["changed"] is False


def test_rollback_check_changes_nothing(lab):
    assert lab.install("gfx1151").returncode == 0
    other = "vllm0.2.0-rocm7.0.0-gfx1151"
    lab.bundle(other)
    assert lab.cli("install", "--tag", other, "--prefix", str(lab.prefix)).returncode == 0
    doc = _json(lab.cli("rollback", "--prefix", str(lab.prefix), "--check", "--json"))
    assert doc["changed"] is True and doc["check"] is True and doc["diff"]["after"]["current"] == TAG
    assert lab.current() == f"bundles/{other}"


# -- deadlines -------------------------------------------------------------------------------------


def _timed(lab, *args, limit: float):
    started = time.monotonic()
    proc = lab.cli(*args)
    elapsed = time.monotonic() - started
    assert elapsed < limit, (elapsed, proc.stderr)
    return proc


@pytest.mark.parametrize(
    ("kind", "args", "needle"),
    [
        ("hang", ("--read-timeout", "1"), "no answer"),
        ("trickle", ("--api-deadline", "2"), "deadline"),
        ("huge", (), "MiB"),
    ],
)
def test_release_api_that_hangs_trickles_or_never_ends_fails_in_time(install_lab, kind, args, needle):
    install_lab.bundle(TAG)
    install_lab.server.api_fault = Fault(kind, seconds=60 if kind == "hang" else 0.5)
    proc = _timed(
        install_lab,
        "install",
        "--tag",
        TAG,
        "--prefix",
        str(install_lab.prefix),
        "--connect-timeout",
        "2",
        *args,
        limit=20,
    )
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not install_lab.prefix.joinpath("current").exists()


def test_trickling_download_fails_naming_url_and_rate(lab):
    part = lab.built.assets[0]
    lab.server.inject(part.name, Fault("trickle", after=1000, seconds=0.05, times=None))
    proc = _timed(
        lab,
        *lab.install_args("gfx1151", "--min-rate", "100000", "--rate-window", "1", "--retries", "1"),
        limit=30,
    )
    assert proc.returncode == 1, proc.stderr
    assert part.name in proc.stderr and "B/s" in proc.stderr and "below the minimum 100000" in proc.stderr
    assert "/mirror/" in proc.stderr  # the URL it came from


def test_slow_but_steady_download_still_works(lab):
    """A mirror at ~80 kB/s passes a 16 kB/s rule."""
    part = lab.built.assets[0]
    lab.server.inject(part.name, Fault("trickle", after=part.size - 400, seconds=0.005, times=1))
    proc = lab.install("gfx1151", "--min-rate", "16", "--rate-window", "0.5")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_bad_rates_and_deadlines_are_refused_naming_the_option(lab, value):
    for option in ("--min-rate", "--api-deadline", "--read-timeout"):
        proc = lab.install("gfx1151", option, value)
        _refused(proc, option)
