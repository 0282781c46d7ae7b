"""ansible-playbook site.yml over real SSH against three fake hosts, each a different host fixture.

- halo   (strix-halo-clean): passes, gets its bundle, serves the REAL vLLM CPU engine (through the
         test bundle) with `rocmdoctor serve` started detached (no systemd in a namespaced host),
         and passes `rocmdoctor smoke`.
- point  (strix-point, gfx1150): passes with warnings and gets its own family's bundle; by design it
         stops after the bundle phase (rocmdoctor_serve: false), so one engine runs on 2 cores.
- nocwsr (strix-halo-nocwsr-dkms): fails preflight, is reported with the remedies and left alone
         while the others finish.
Then a second run changes nothing, `--check --diff` changes nothing, and the upstream's access log
shows every bundle part read once for the whole fleet. `--check --diff` with other server settings
reports the unit it would rewrite, with the diff, and writes nothing; on a host never converged
(fresh) it reports what it would do and leaves the host untouched; once that host has the tool but no
bundle, it reports the bundle install it would do (`current` before and after) and installs nothing.
"""

from __future__ import annotations

import pytest

from harness.fleet import SshFleet, host_root, run_playbook
from harness.served_bundle import ENGINE_ARGS, ENGINE_ENV
from plugins.fleet import FLEET_BUNDLES

pytestmark = [pytest.mark.ssh, pytest.mark.engine, pytest.mark.timeout(1800)]

HOSTS = {"halo": "strix-halo-clean", "point": "strix-point", "nocwsr": "strix-halo-nocwsr-dkms"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet")
    with SshFleet("fleet-t", workdir) as ssh_fleet:
        yield ssh_fleet


@pytest.fixture(scope="module")
def runs(fleet, fleet_upstream, tiny_model):
    """The fleet converged once, then again, then in check mode: the three runs' results."""
    tiny_model.chmod(0o755)
    for name, fixture_id in {**HOSTS, "fresh": "strix-halo-clean"}.items():
        host = fleet.add(name, rocmdoctor_serve=name not in ("point", "fresh"))
        host_root(fixture_id, host.opt / "host-root")
        host.hostvars["rocmdoctor_root"] = "/opt/host-root"  # as the host sees its private /opt
    inventory = fleet.write_inventory(
        fleet.workdir / "inventory.yml",
        group_vars={
            "rocmdoctor_controller_cache": str(fleet.workdir / "controller-cache"),
            "rocmdoctor_bundles_dir": str(fleet_upstream.pins),
            "rocmdoctor_model": str(tiny_model),
            "rocmdoctor_server_args": [
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "512",
                "--max-num-seqs",
                "4",
            ],
            "rocmdoctor_vllm_extra_args": list(ENGINE_ARGS),
            "rocmdoctor_detached_server": True,
            "rocmdoctor_detached_environment": ENGINE_ENV,
            "rocmdoctor_ready_timeout_s": 600,
        },
    )
    converge = ("--limit", ",".join(HOSTS))  # "fresh" stays unconverged for the check-mode test
    first = run_playbook(fleet, inventory, *converge)
    (fleet.workdir / "first.log").write_text(first.stdout + first.stderr)
    second = run_playbook(fleet, inventory, *converge)
    (fleet.workdir / "second.log").write_text(second.stdout + second.stderr)
    unit = fleet.hosts[0].opt / "host-root/etc/systemd/system/vllm.service"
    before = {p: p.stat().st_mtime_ns for p in (unit, fleet.hosts[0].opt / "rocmdoctor/current")}
    check = run_playbook(fleet, inventory, "--check", "--diff", "--limit", ",".join(HOSTS))
    unit_text = unit.read_text()
    # Other server settings: the would-be unit is shown as a diff, nothing is written, nothing restarts.
    other = run_playbook(
        fleet,
        inventory,
        "--check",
        "--diff",
        "--limit",
        "halo",
        "--tags",
        "preflight,service",
        "-e",
        '{"rocmdoctor_server_args": ["--served-model-name", "tiny", "--max-model-len", '
        '"512", "--max-num-seqs", "3"]}',
    )
    fresh = run_playbook(fleet, inventory, "--check", "--diff", "--limit", "fresh")
    fresh_host = next(h for h in fleet.hosts if h.name == "fresh")
    fresh_untouched = not (fresh_host.opt / "rocmdoctor").exists()
    # The tool on it (a real preflight run), no bundle yet: the dry run reaches the install.
    tooled = run_playbook(fleet, inventory, "--tags", "preflight", "--limit", "fresh")
    fresh_tooled = run_playbook(fleet, inventory, "--check", "--diff", "--limit", "fresh")
    after = {p: p.stat().st_mtime_ns for p in before}
    for run in (first, second, check, other, fresh, tooled, fresh_tooled):
        print(f"run: rc={run.rc} {run.seconds:.1f} s {run.recap()}")
    return {
        "first": first,
        "second": second,
        "check": check,
        "other": other,
        "fresh": fresh,
        "fresh_untouched": fresh_untouched,
        "tooled": tooled,
        "fresh_tooled": fresh_tooled,
        "untouched": before == after and unit.read_text() == unit_text,
    }


def test_first_run_serves_passing_hosts_and_skips_the_failing_one(fleet, runs):
    first = runs["first"]
    recap = first.recap()
    assert set(recap) == set(HOSTS), first.stdout[-3000:]
    assert recap["halo"]["failed"] == 0 and recap["point"]["failed"] == 0, first.stdout[-6000:]
    assert recap["halo"]["changed"] > 0 and recap["point"]["changed"] > 0
    assert recap["nocwsr"]["failed"] == 1
    assert first.rc == 2  # ansible-playbook's "a host failed"
    # The failing host is reported with each failed check and its remedy, and left alone.
    assert "rocmdoctor check failed on nocwsr" in first.stdout
    for check_id in ("kernel.cwsr", "driver.dkms"):
        assert check_id + " -- " in first.stdout
    nocwsr = fleet.hosts[2]
    assert not (nocwsr.opt / "rocmdoctor" / "current").exists()
    assert not (nocwsr.opt / "rocmdoctor" / "mirror").exists()
    # The passing hosts carry their own family's bundle, activated.
    halo, point = fleet.hosts[0], fleet.hosts[1]
    assert (halo.opt / "rocmdoctor/current/bin/vllm-server").is_file()
    assert "gfx1151" in (halo.opt / "rocmdoctor/current").resolve().name
    assert "gfx1150" in (point.opt / "rocmdoctor/current").resolve().name
    assert "rocmdoctor smoke passed on halo" in first.stdout


def test_the_served_host_answers_a_completion(fleet, runs):
    halo, point = fleet.hosts[0], fleet.hosts[1]
    probe = (
        "curl -sf -H 'Content-Type: application/json' http://127.0.0.1:8000/v1/completions "
        '-d \'{"model": "tiny", "prompt": "Hello", "max_tokens": 3}\''
    )
    answer = fleet.ssh(halo, probe)
    assert answer.returncode == 0 and '"choices"' in answer.stdout, answer.stderr
    # point stops after the bundle phase: nothing listens there.
    assert fleet.ssh(point, "curl -s -o /dev/null http://127.0.0.1:8000/health").returncode != 0


def test_second_run_changes_nothing(runs):
    recap = runs["second"].recap()
    assert {host: r["changed"] for host, r in recap.items()} == {host: 0 for host in HOSTS}, runs[
        "second"
    ].stdout[-4000:]
    assert recap["halo"]["failed"] == recap["point"]["failed"] == 0


def test_check_mode_changes_nothing(runs):
    check = runs["check"]
    recap = check.recap()
    assert {host: r["changed"] for host, r in recap.items()} == {host: 0 for host in HOSTS}, check.stdout[
        -4000:
    ]
    assert recap["halo"]["failed"] == recap["point"]["failed"] == 0
    assert runs["untouched"]


def test_each_bundle_part_is_read_from_upstream_once_for_the_fleet(runs, fleet_upstream):
    for part in fleet_upstream.parts:
        reads = [e for e in fleet_upstream.server.downloads(part) if e.status in (200, 206)]
        assert len(reads) == 1, f"{part}: {reads}"


def test_check_diff_shows_the_unit_it_would_write_and_writes_nothing(runs):
    other = runs["other"]
    recap = other.recap()
    assert recap["halo"]["failed"] == 0 and recap["halo"]["changed"] >= 1, other.stdout[-6000:]
    # the unit's ExecStart line, old and new, as a unified diff under --diff
    assert "--max-num-seqs 4" in other.stdout and "--max-num-seqs 3" in other.stdout, other.stdout[-6000:]
    assert any(line.startswith("-") and "--max-num-seqs 4" in line for line in other.stdout.splitlines())
    assert any(line.startswith("+") and "--max-num-seqs 3" in line for line in other.stdout.splitlines())
    assert runs["untouched"]


def test_check_mode_on_a_fresh_host_reports_changes_and_touches_nothing(fleet, runs):
    fresh = runs["fresh"]
    recap = fresh.recap()
    assert recap["fresh"]["failed"] == 0 and recap["fresh"]["changed"] >= 1, fresh.stdout[-6000:]
    assert runs["fresh_untouched"]


def test_check_mode_reports_the_bundle_install_it_would_do_and_installs_nothing(fleet, runs):
    assert runs["tooled"].rc == 0, runs["tooled"].stdout[-4000:]
    dry = runs["fresh_tooled"]
    recap = dry.recap()
    assert recap["fresh"]["failed"] == 0 and recap["fresh"]["changed"] >= 1, dry.stdout[-6000:]
    # `install --check` through rocmdoctor_command: `current` before and after, as Ansible's diff
    lines = dry.stdout.splitlines()
    assert "-current: null" in lines, dry.stdout[-6000:]
    assert f'+current: "{FLEET_BUNDLES["gfx1151"]}"' in lines
    host = next(h for h in fleet.hosts if h.name == "fresh")
    assert (host.opt / "rocmdoctor/venv/bin/rocmdoctor").exists()  # the real preflight run's
    for never in ("current", "bundles", "mirror", "pins"):
        assert not (host.opt / "rocmdoctor" / never).exists(), never
