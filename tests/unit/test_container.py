"""Inside a container the remedies are the host's `docker run` options, not chgrp or usermod inside."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.checks.container import detect
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, Options


@pytest.fixture
def docker(tmp_path):
    root = tmp_path / "c"
    shutil.copytree(fixture_root("r9700-docker-unmapped-gid"), root, symlinks=True)
    return root


def test_unmapped_render_gid_gets_group_add_not_chgrp(docker):
    result = run_check(docker, "access.devices")
    assert result.status is Status.FAIL
    assert "--group-add 105" in result.remedy and "--device /dev/kfd --device /dev/dri" in result.remedy
    assert "seccomp=unconfined" in result.remedy  # this process runs under a seccomp filter
    assert "chgrp render" not in result.remedy and "gid=" not in result.remedy
    assert result.details["container"] == {"kind": "docker", "evidence": "/.dockerenv exists"}


def test_without_a_seccomp_filter_no_seccomp_option(docker):
    (docker / "proc/self/status").write_text("Name:\trocmdoctor\nSeccomp:\t0\n")
    assert "seccomp" not in run_check(docker, "access.devices").remedy


def test_container_started_without_the_nodes_names_the_device_options(docker):
    stat = docker / ".rocmdoctor/stat.json"
    nodes = json.loads(stat.read_text())
    nodes.pop("/dev/kfd")
    stat.write_text(json.dumps(nodes))
    result = run_check(docker, "driver.loaded")
    assert result.status is Status.FAIL and "docker container" in result.summary
    assert "--device /dev/kfd --device /dev/dri" in result.remedy and "modprobe" not in result.remedy


@pytest.mark.parametrize(
    ("path", "content", "kind"),
    [
        ("run/.containerenv", "", "podman"),
        ("run/systemd/container", "systemd-nspawn\n", "systemd-nspawn"),
        ("proc/1/cgroup", "0::/kubepods/besteffort/pod1/abc\n", "kubernetes"),
    ],
)
def test_each_runtime_signal(tmp_path, path, content, kind):
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(content)
    found = detect(Context(Host(tmp_path), Options()))
    assert found is not None and found.kind == kind


def test_an_nspawn_machine_keeps_the_host_remedy(docker):
    # systemd-nspawn is a full OS container: usermod inside works, so the host-style remedy stays.
    (docker / ".dockerenv").unlink()
    (docker / "run/systemd").mkdir(parents=True)
    (docker / "run/systemd/container").write_text("systemd-nspawn\n")
    result = run_check(docker, "access.devices")
    assert "--group-add" not in result.remedy and "chgrp" in result.remedy


def test_no_signal_is_no_container():
    assert detect(Context(Host(fixture_root("r9700")), Options())) is None
