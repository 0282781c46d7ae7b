"""`rocmdoctor instances --write` into a root directory: the template unit, the target and one env file
per instance, idempotent, diffs, stale instance files removed, nothing written under --check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.hosts import fixture_root, run_cli

UNIT_DIR = "etc/systemd/system"
ENV_DIR = "etc/rocmdoctor/vllm"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "etc/group").write_text("root:x:0:\n")
    return tmp_path


def write(root: Path, *args: str, check: bool = False) -> dict:
    argv = [
        "instances",
        "--devices-from",
        str(fixture_root("mi308x-cpx")),
        "--instances",
        "per-partition",
        "--model",
        "/srv/models/tiny model",
        "--served-model-name",
        "tiny",
        "--write",
        "--target",
        str(root),
        "--json",
        "--port",
        "18000",
        *args,
    ]
    if check:
        argv.append("--check")
    proc = run_cli(*argv, root=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_write_is_idempotent_and_removes_what_the_layout_dropped(root: Path):
    first = write(root, "--count", "3")
    assert first["changed"] is True and first["schema_version"] == 1
    assert "group render" in first["accounts_created"] and "user vllm" in first["accounts_created"]
    paths = {f["path"]: f for f in first["files"]}
    template = (root / UNIT_DIR / "vllm@.service").read_text()
    assert "PartOf=vllm.target" in template and "WantedBy=vllm.target" in template
    assert "EnvironmentFile=/etc/rocmdoctor/vllm/%i.env" in template
    assert "KillMode=control-group" in template and "ExecStartPost=" in template
    assert (
        '"/srv/models/tiny model"' in template
        and "--port ${ROCMDOCTOR_PORT} --gpu-memory-utilization ${ROCMDOCTOR_GPU_MEMORY_UTILIZATION} "
        "--tensor-parallel-size ${ROCMDOCTOR_TENSOR_PARALLEL_SIZE}"
        in template
    )
    assert "http://127.0.0.1:${ROCMDOCTOR_PORT} tiny" in template
    target = (root / UNIT_DIR / "vllm.target").read_text()
    assert "Wants=vllm@0.service vllm@1.service vllm@2.service\n" in target
    envs = sorted(os.listdir(root / ENV_DIR))
    assert envs == ["0.env", "1.env", "2.env"]
    env1 = (root / ENV_DIR / "1.env").read_text()
    assert "ROCR_VISIBLE_DEVICES=1\n" in env1 and "ROCMDOCTOR_TENSOR_PARALLEL_SIZE=1\n" in env1
    assert (root / ENV_DIR / "1.env").stat().st_mode & 0o777 == 0o600
    ports = [i["port"] for i in first["instances"]]
    assert f"ROCMDOCTOR_PORT={ports[1]}\n" in env1
    assert paths["/etc/systemd/system/vllm@.service"]["diff"].startswith("--- /dev/null")
    assert "not shown" in paths["/etc/rocmdoctor/vllm/0.env"]["diff"]
    assert first["daemon_reload"].startswith("skipped")  # not the live root

    again = write(root, "--count", "3")
    assert again["changed"] is False and again["accounts_created"] == []
    assert all(f["action"] == "unchanged" for f in again["files"])
    assert [i["port"] for i in again["instances"]] == ports

    # Two instances of two partitions each: instance 2's file goes, the others change.
    smaller = write(root, "--count", "2", "--tensor-parallel-size", "2", check=True)
    assert smaller["changed"] is True
    assert sorted(os.listdir(root / ENV_DIR)) == envs  # --check changed nothing
    done = write(root, "--count", "2", "--tensor-parallel-size", "2")
    actions = {f["path"]: f["action"] for f in done["files"]}
    assert actions["/etc/rocmdoctor/vllm/2.env"] == "removed"
    assert actions["/etc/systemd/system/vllm.target"] == "updated"
    assert actions["/etc/systemd/system/vllm@.service"] == "unchanged"
    assert done["restart_needed"] == ["0", "1"]
    target_diff = next(f["diff"] for f in done["files"] if f["path"].endswith("vllm.target"))
    assert "-Wants=vllm@0.service vllm@1.service vllm@2.service" in target_diff
    assert sorted(os.listdir(root / ENV_DIR)) == ["0.env", "1.env"]
    assert "ROCR_VISIBLE_DEVICES=2,3\n" in (root / ENV_DIR / "1.env").read_text()


def test_api_key_goes_into_the_env_files_only(root: Path, tmp_path: Path):
    key = tmp_path / "key"
    key.write_text("secret-key-0123456789\n")
    write(root, "--count", "2", "--api-key-file", str(key))
    assert "secret-key" not in (root / UNIT_DIR / "vllm@.service").read_text()
    for name in ("0.env", "1.env"):
        assert "VLLM_API_KEY=secret-key-0123456789\n" in (root / ENV_DIR / name).read_text()


def test_write_needs_a_model_and_refuses_computed_flags(root: Path):
    proc = run_cli(
        "instances",
        "--devices-from",
        str(fixture_root("mi308x-cpx")),
        "--instances",
        "per-partition",
        "--write",
        "--target",
        str(root),
        root=root,
    )
    assert proc.returncode == 2 and "--write needs --model" in proc.stderr
    proc = run_cli(
        "instances",
        "--devices-from",
        str(fixture_root("mi308x-cpx")),
        "--instances",
        "per-partition",
        "--model",
        "m",
        "--write",
        "--target",
        str(root),
        "--",
        "--port",
        "9",
        root=root,
    )
    assert proc.returncode == 2 and "--port is computed by rocmdoctor" in proc.stderr
    assert not (root / UNIT_DIR).exists()
    proc = run_cli("instances", "--devices-from", str(root / "missing"), root=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_listing_and_removing_never_follow_a_link_out_of_the_root(tmp_path: Path):
    from rocmdoctor.host_writes import HostWriter, WriteRefused

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "9.env").write_text("precious\n")
    root = tmp_path / "root"
    (root / "etc/rocmdoctor").mkdir(parents=True)
    (root / "etc/rocmdoctor/vllm").symlink_to(outside)
    writer = HostWriter(root)
    with pytest.raises(WriteRefused, match="link"):
        writer.listdir("/etc/rocmdoctor/vllm")
    with pytest.raises(WriteRefused, match="link"):
        writer.remove_file("/etc/rocmdoctor/vllm/9.env")
    assert (outside / "9.env").read_text() == "precious\n"
    # A link as the last component is removed itself, not what it points at.
    (root / "etc/rocmdoctor/link.env").symlink_to(outside / "9.env")
    assert writer.listdir("/etc/rocmdoctor") == ["link.env", "vllm"]
    assert writer.remove_file("/etc/rocmdoctor/link.env") is True
    assert writer.remove_file("/etc/rocmdoctor/link.env") is False
    assert (outside / "9.env").exists()
    assert writer.listdir("/etc/missing") == []


def test_unit_instances_is_the_same_layout(root: Path):
    base = ["--model", "/srv/models/tiny", "--served-model-name", "tiny", "--port", "18000", "--json"]
    via_unit = run_cli(
        "unit",
        "--instances",
        "per-partition",
        "--tensor-parallel-size",
        "4",
        *base,
        "--write",
        "--target",
        str(root),
        root=root,
        env={"ROCMDOCTOR_ROOT": ""},
    )
    # unit reads the topology from --root: this root has none, so it refuses clearly.
    assert via_unit.returncode == 2 and "no GPU here" in via_unit.stderr
    fixture = fixture_root("mi308x-cpx")
    preview = run_cli(
        "unit", "--instances", "per-partition", "--tensor-parallel-size", "4", *base, root=fixture
    )
    direct = run_cli(
        "instances",
        "--instances",
        "per-partition",
        "--tensor-parallel-size",
        "4",
        "--port",
        "18000",
        "--json",
        root=fixture,
    )
    assert preview.returncode == direct.returncode == 0, preview.stderr + direct.stderr
    assert json.loads(preview.stdout)["instances"] == json.loads(direct.stdout)["instances"]
    assert [i["visible_devices"] for i in json.loads(preview.stdout)["instances"]][:2] == [
        "0,1,2,3",
        "4,5,6,7",
    ]


def test_the_template_runs_each_instance_with_its_own_file(root: Path):
    from harness.unit_exec import UnitExecError, env_file_vars, instance_argv

    done = write(root, "--count", "2", "--", "--load-format", "dummy")
    template = (root / UNIT_DIR / "vllm@.service").read_text()
    for name, port in [(i["name"], str(i["port"])) for i in done["instances"]]:
        env = env_file_vars((root / ENV_DIR / f"{name}.env").read_text())
        argv = instance_argv(template, name, env)
        # The model path with a space is one argument again; the ${...} come from this file.
        assert argv[:3] == ["/opt/rocmdoctor/current/bin/vllm-server", "--model", "/srv/models/tiny model"]
        assert argv[argv.index("--port") + 1] == port == env["ROCMDOCTOR_PORT"]
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert argv[-2:] == ["--tensor-parallel-size", "1"]
    with pytest.raises(UnitExecError, match="ROCMDOCTOR_PORT"):
        instance_argv(template, "0", {})


def test_a_port_a_stale_env_file_claims_while_another_program_listens_is_not_reused(root: Path):
    """The env file of instance 0 names a port; the instance is not running and another program listens
    there: the port is probed like any other and skipped, never handed to the instance again."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as other:
        taken = other.getsockname()[1]
        (root / ENV_DIR).mkdir(parents=True)
        (root / ENV_DIR / "0.env").write_text(f"ROCMDOCTOR_PORT={taken}\n")
        doc = write(root, "--count", "2", "--port", str(taken))
    ports = [i["port"] for i in doc["instances"]]
    assert taken not in ports and ports[0] > taken, ports
    assert f"ROCMDOCTOR_PORT={ports[0]}\n" in (root / ENV_DIR / "0.env").read_text()
