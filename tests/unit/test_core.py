"""The core seams: the rooted host, the registry's ordering and skip propagation, exit codes."""

from __future__ import annotations

import json
import os

import pytest

from rocmdoctor.host import Host, ReadState, RootError
from rocmdoctor.model import Result, Status, exit_code, failed, passed
from rocmdoctor.registry import Context, Registry, RegistryError, SelectionError


def test_host_refuses_a_root_that_is_not_a_directory(tmp_path):
    with pytest.raises(RootError):
        Host(tmp_path / "absent")


def test_read_states_are_distinct(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "value").write_text("42\n")
    (tmp_path / "sys" / "blank").write_text("\n")
    (tmp_path / "sys" / "secret").write_text("x")
    os.chmod(tmp_path / "sys" / "secret", 0)
    host = Host(tmp_path)
    assert host.read_int("/sys/value").value == 42
    assert host.read_text("/sys/absent").state is ReadState.MISSING
    assert host.read_text("/sys/blank").state is ReadState.EMPTY
    assert host.read_text("/sys").state is ReadState.UNREADABLE
    if os.getuid() != 0:  # root reads anything
        assert host.read_text("/sys/secret").state is ReadState.DENIED


def test_paths_never_escape_the_root(tmp_path):
    (tmp_path / "etc").mkdir()
    host = Host(tmp_path)
    assert host.read_text("/../../../etc/passwd").state is ReadState.MISSING


def test_device_nodes_come_from_stat_json(tmp_path):
    meta = tmp_path / ".rocmdoctor"
    meta.mkdir()
    (meta / "stat.json").write_text(
        json.dumps(
            {
                "/dev/kfd": {"type": "char", "mode": "0660", "uid": 0, "gid": 992, "rdev": "235:0"},
                "/dev/dri/renderD128": {
                    "type": "char",
                    "mode": "0660",
                    "uid": 0,
                    "gid": 992,
                    "rdev": "226:128",
                },
            }
        )
    )
    host = Host(tmp_path)
    st = host.stat("/dev/kfd")
    assert (st.type, st.mode, st.gid, st.rdev) == ("char", 0o660, 992, "235:0")
    assert host.exists("/dev/kfd")
    assert host.glob("/dev/dri/renderD*") == ["/dev/dri/renderD128"]
    with pytest.raises(PermissionError):
        host.read_text("/dev/kfd")


def test_glob_orders_numerically(tmp_path):
    for n in (0, 1, 2, 10):
        (tmp_path / "sys" / "class" / "drm" / f"card{n}").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "drm" / "card0-DP-1").mkdir()
    names = Host(tmp_path).glob("/sys/class/drm/card*")
    assert names[:5] == [
        "/sys/class/drm/card0",
        "/sys/class/drm/card0-DP-1",
        "/sys/class/drm/card1",
        "/sys/class/drm/card2",
        "/sys/class/drm/card10",
    ]


def test_run_kills_a_hung_command_and_never_raises():
    host = Host("/")
    result = host.run(["sleep", "30"], timeout=0.5)
    assert result.timed_out and result.returncode is None
    missing = host.run(["/nonexistent/binary"])
    assert missing.returncode is None and missing.spawn_error


def _registry() -> Registry:
    reg = Registry()
    reg.check("a.root", "root")(lambda ctx: failed("broken", "fix it"))
    reg.check("b.child", "child", depends=("a.root",))(lambda ctx: passed("fine"))
    reg.check("c.boom", "boom")(lambda ctx: 1 / 0)
    return reg


def test_dependents_of_a_failure_skip_naming_the_cause(tmp_path):
    reg = _registry()
    reg.validate()
    outcomes = {o.spec.id: o.result for o in reg.run(Context(Host(tmp_path)), reg.select())}
    assert outcomes["b.child"].status is Status.SKIP
    assert outcomes["b.child"].details["skipped_because_of"] == "a.root"
    assert outcomes["c.boom"].status is Status.ERROR and "ZeroDivisionError" in outcomes["c.boom"].summary


def test_only_pulls_in_prerequisites_and_rejects_typos():
    reg = _registry()
    assert [s.id for s in reg.select(only=["b.child"])] == ["a.root", "b.child"]
    with pytest.raises(SelectionError):
        reg.select(only=["b.chlid"])


def test_unknown_dependency_and_cycles_are_registry_errors():
    reg = Registry()
    reg.check("x.one", "one", depends=("x.two",))(lambda ctx: passed("ok"))
    with pytest.raises(RegistryError):
        reg.validate()
    reg.check("x.two", "two", depends=("x.one",))(lambda ctx: passed("ok"))
    with pytest.raises(RegistryError, match="cycle"):
        reg.validate()


def test_warn_and_fail_need_a_remedy():
    with pytest.raises(ValueError):
        Result(Status.FAIL, "bad")


@pytest.mark.parametrize(
    "statuses, code",
    [
        ([Status.PASS, Status.WARN], 0),
        ([Status.PASS, Status.FAIL, Status.ERROR], 1),
        ([Status.ERROR, Status.SKIP], 2),
        ([Status.PASS, Status.ERROR], 0),
        ([], 0),
    ],
)
def test_exit_code_contract(statuses, code):
    assert exit_code(statuses) == code


def test_damaged_metadata_and_os_release_never_raise(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_bytes(b'ID=debian\nVERSION_ID="12\nNAME=\xff\xfe Debian\n')
    meta = tmp_path / ".rocmdoctor"
    meta.mkdir()
    (meta / "stat.json").write_text(json.dumps({"/opt": {"type": "dir", "free_bytes": "lots"}}))
    (meta / "env.json").write_text(json.dumps(["PYTHONPATH=/x"]))
    host = Host(tmp_path)
    assert host.distro()["id"] == "debian"
    assert host.free_bytes("/opt/rocmdoctor") is None
    assert dict(host.env) == {}
    (meta / "stat.json").write_text("[1, 2]")
    fresh = Host(tmp_path)
    assert fresh.stat("/dev/kfd") is None and not fresh.exists("/dev/kfd")


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from rocmdoctor.atomic import atomic_file, write_atomic

    target = tmp_path / "vllm.env"
    write_atomic(target, "OLD=1\n", 0o600)
    assert target.read_text() == "OLD=1\n" and (target.stat().st_mode & 0o777) == 0o600
    with pytest.raises(RuntimeError), atomic_file(target, 0o600) as out:
        out.write(b"NEW=")
        raise RuntimeError("disk went away")
    assert target.read_text() == "OLD=1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["vllm.env"]
