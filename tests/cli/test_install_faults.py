"""Network and disk faults during install, each over real loopback sockets: the previous bundle stays
active, nothing half-installed is left, and the message says what happened and what to do."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.release_server import Fault

OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
NEW = "vllm0.2.0-rocm7.0.0-gfx1151"
PAYLOAD = 300_000  # random bytes: a few 64 KiB parts


@pytest.fixture
def lab(install_lab):
    """OLD installed and current; NEW published and pinned, not yet installed."""
    install_lab.pin("gfx1151", install_lab.bundle(OLD))
    assert install_lab.install("gfx1151").returncode == 0
    install_lab.new = install_lab.bundle(NEW, payload=PAYLOAD)
    install_lab.pin("gfx1151", install_lab.new)
    install_lab.server.clear_log()
    return install_lab


def _failed_cleanly(lab, proc, *needles: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert "previous bundle is still active" in proc.stderr
    assert lab.current() == f"bundles/{OLD}"
    assert not (lab.prefix / "bundles" / NEW).exists()
    assert lab.leftovers() == []


def test_cut_connection_resumes_with_range_and_fetches_only_the_rest(lab):
    part = lab.new.assets[1]
    lab.server.inject(part.name, Fault("cut", after=40_000))
    proc = lab.install("gfx1151", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["current"] == NEW
    gets = lab.server.downloads(part.name)
    assert [g.range for g in gets] == [None, "bytes=40000-"]
    assert gets[1].if_range and gets[1].status == 206
    assert lab.server.body_bytes(part.name) == part.size  # nothing fetched twice
    for other in lab.new.assets:
        if other.name != part.name:
            assert lab.server.range_requests(other.name) == [None]


def test_server_ignoring_range_restarts_the_part_and_the_extraction(lab):
    """A 200 to a Range request restarts the part from byte 0; extraction that already read from it
    starts over from the finished files, and the result is complete."""
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("cut", after=40_000))
    lab.server.inject(part.name, Fault("norange"))
    proc = lab.install("gfx1151", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [(g.range, g.status) for g in lab.server.downloads(part.name)] == [
        (None, 200),
        ("bytes=40000-", 200),
    ]
    tree = lab.prefix / "current" / "lib/python3.13/site-packages"
    assert (tree / "marker.txt").read_text() == NEW
    assert (tree / "payload.bin").stat().st_size == PAYLOAD


def test_resume_after_a_killed_run_rehashes_the_bytes_on_disk(lab):
    """A staging file left by an earlier run is re-hashed, then only the rest is requested."""
    part = lab.new.assets[0]
    staging = lab.prefix / "bundles" / ".downloads" / NEW
    staging.mkdir(parents=True)
    (staging / f"{part.name}.partial").write_bytes(part.path.read_bytes()[:30_000])
    proc = lab.install("gfx1151")
    assert proc.returncode == 0, proc.stderr
    assert lab.server.range_requests(part.name) == ["bytes=30000-"]
    assert lab.current() == f"bundles/{NEW}"


def test_corrupted_byte_is_a_digest_error_naming_the_part_and_nothing_is_activated(lab):
    part = lab.new.assets[1]
    lab.server.inject(part.name, Fault("corrupt", offset=5_000))
    proc = lab.install("gfx1151")
    _failed_cleanly(lab, proc, part.name, "sha256 mismatch")
    # the bad bytes are not kept: a rerun downloads the part again and succeeds
    rerun = lab.install("gfx1151")
    assert rerun.returncode == 0, rerun.stderr
    assert lab.current() == f"bundles/{NEW}"


def test_404_names_the_part_and_the_next_step(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("status", status=404, times=None))
    _failed_cleanly(lab, lab.install("gfx1151"), part.name, "not found", "bundle fetch")
    assert len(lab.server.downloads(part.name)) == 1  # a 404 is not retried


def test_transient_500_is_retried(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("status", status=500, times=2))
    proc = lab.install("gfx1151")
    assert proc.returncode == 0, proc.stderr
    assert [g.status for g in lab.server.downloads(part.name)] == [500, 500, 200]


def test_persistent_500_gives_up_after_bounded_retries(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("status", status=500, times=None))
    _failed_cleanly(lab, lab.install("gfx1151"), part.name, "gave up after 3 attempts", "server error 500")
    assert len(lab.server.downloads(part.name)) == 3


def test_stalled_server_times_out_with_a_clear_error(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("stall", after=10_000, seconds=30, times=None))
    proc = lab.install("gfx1151", "--retries", "1")
    _failed_cleanly(lab, proc, part.name, "stalled", "rerun the same command to resume")


def test_part_shorter_than_declared(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("short", length=part.size - 100, times=None))
    _failed_cleanly(lab, lab.install("gfx1151"), part.name, "shorter than declared")


def test_failure_with_json_reports_failed_true(lab):
    part = lab.new.assets[0]
    lab.server.inject(part.name, Fault("status", status=404, times=None))
    proc = lab.install("gfx1151", "--json")
    doc = json.loads(proc.stdout)
    assert (
        proc.returncode == 1 and doc["failed"] is True and doc["changed"] is False and part.name in doc["msg"]
    )


@pytest.fixture
def small_disk(install_lab):
    """A 20 MiB tmpfs as the prefix (unmounted in teardown)."""
    install_lab.prefix.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "install-test-tmpfs", str(install_lab.prefix)], check=True
    )
    try:
        yield install_lab
    finally:
        subprocess.run(["umount", "-l", str(install_lab.prefix)], check=True)


def test_full_disk_leaves_the_previous_bundle_active(small_disk):
    lab = small_disk
    lab.pin("gfx1151", lab.bundle(OLD))
    assert lab.install("gfx1151").returncode == 0
    lab.pin("gfx1151", lab.bundle(NEW, payload=24 << 20, part_size=8 << 20))  # incompressible: > 20 MiB
    proc = lab.install("gfx1151")
    _failed_cleanly(lab, proc, "no space left")
    assert (lab.prefix / "current" / "bin" / "vllm-server").is_file()


def test_download_dir_keeps_finished_parts_for_the_rerun(lab, tmp_path):
    staging = tmp_path / "staging"
    first, last = lab.new.assets[0], lab.new.assets[-1]
    lab.server.inject(last.name, Fault("status", status=404, times=1))
    failed = lab.install("gfx1151", "--download-dir", str(staging))
    assert failed.returncode == 1 and last.name in failed.stderr
    assert (staging / NEW / first.name).stat().st_size == first.size  # verified, kept
    lab.server.clear_log()
    rerun = lab.install("gfx1151", "--download-dir", str(staging))
    assert rerun.returncode == 0, rerun.stderr
    assert lab.server.downloads(first.name) == []  # re-hashed on disk, not fetched again
    assert not (staging / NEW).exists() and lab.current() == f"bundles/{NEW}"
