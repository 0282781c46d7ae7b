"""Accounts in a target tree and the litter of killed runs, over generated inputs.

- whatever SYS_UID/GID_MIN/MAX a tree's login.defs says (0, 65534, 2^32, 5,000 digits, '²'), the service
  account never gets id 0, an overflow id or one above 2^31-1, and a refusal is WriteRefused, said clearly;
- a run killed after any prefix of its group, gshadow, passwd and shadow writes is completed by the rerun,
  each line written exactly once;
- temp files and replay trees carry their owner's pid: the sweep removes exactly those whose owner is gone,
  and a link among them is removed, never followed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmdoctor import atomic, litter
from rocmdoctor.host_files import remove_tree
from rocmdoctor.host_writes import FORBIDDEN_IDS, MAX_ID, HostWriter, WriteRefused, add_group, add_system_user
from rocmdoctor.provision.server.unit import ensure_accounts

HC = [HealthCheck.function_scoped_fixture]


def _tree(base: Path, login_defs: str, passwd: str = "") -> Path:
    root = base / "root"
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" + passwd)
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc/gshadow").write_text("root:*::\n")
    (root / "etc/login.defs").write_text(login_defs)
    return root


id_text = st.one_of(
    st.integers(0, 2**33).map(str),
    st.sampled_from(["0", "65534", "65535", "4294967295", "2147483648", "²", "-5", "1" * 5000]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=HC)
@given(low=id_text, high=id_text, taken=st.lists(st.integers(0, 70000), max_size=5))
def test_system_ids_stay_sane_whatever_login_defs_says(tmp_path_factory, low, high, taken):
    base = tmp_path_factory.mktemp("t")
    defs = f"SYS_UID_MIN {low}\nSYS_UID_MAX {high}\nSYS_GID_MIN {low}\nSYS_GID_MAX {high}\n"
    passwd = "".join(f"u{i}:x:{uid}:{uid}::/:/bin/false\n" for i, uid in enumerate(taken))
    root = _tree(base, defs, passwd)
    try:
        add_system_user(root, "vllm", "/var/lib/vllm", "/usr/sbin/nologin", "vLLM server")
    except WriteRefused as exc:
        assert "login.defs" in str(exc) and len(str(exc)) < 400
        return
    writer = HostWriter(root)
    uid = writer.uid_of("vllm")
    group = next(x for x in (root / "etc/group").read_text().splitlines() if x.startswith("vllm:"))
    gid = int(group.split(":")[2])
    for value in (uid, gid):
        assert value is not None and 0 < value <= MAX_ID and value not in FORBIDDEN_IDS
    assert uid not in taken


WRITES = ["group", "gshadow", "passwd", "shadow"]


@settings(max_examples=20, deadline=None, suppress_health_check=HC)
@given(done=st.integers(0, 4), groups_first=st.booleans())
def test_a_killed_account_creation_is_completed_by_the_rerun(tmp_path_factory, done, groups_first):
    """A kill after the first `done` of the account's four writes, simulated by writing them as the
    killed run would have, then ensure_accounts (what `unit --write` runs) again."""
    base = tmp_path_factory.mktemp("k")
    root = _tree(base, "SYS_UID_MIN 100\nSYS_UID_MAX 999\nSYS_GID_MIN 100\nSYS_GID_MAX 999\n")
    for group in ("render", "video") if groups_first else ():
        add_group(root, group)
    lines = {
        "group": "vllm:x:990:",
        "gshadow": "vllm:!::",
        "passwd": "vllm:x:990:990:vLLM server:/var/lib/vllm:/usr/sbin/nologin",
        "shadow": "vllm:!:20000::::::",
    }
    for db in WRITES[:done]:
        with open(root / "etc" / db, "a") as fh:
            fh.write(lines[db] + "\n")
    ensure_accounts(HostWriter(root), "vllm")
    ensure_accounts(HostWriter(root), "vllm")  # and once more: nothing left to do, nothing duplicated
    for db in WRITES:
        names = [x.split(":", 1)[0] for x in (root / "etc" / db).read_text().splitlines()]
        assert names.count("vllm") == 1, (db, done)
    assert HostWriter(root).account_complete("vllm")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@settings(max_examples=30, deadline=None, suppress_health_check=HC)
@given(
    owners=st.lists(st.sampled_from(["dead", "alive", "me"]), min_size=1, max_size=6), as_link=st.booleans()
)
def test_the_sweep_removes_exactly_the_litter_of_gone_owners(tmp_path_factory, owners, as_link):
    base = tmp_path_factory.mktemp("s")
    outside = base / "outside"
    outside.write_text("keep me\n")
    pids = {"dead": _dead_pid(), "alive": os.getppid(), "me": os.getpid()}
    made = []
    for i, owner in enumerate(owners):
        name = f".lock.json.tmp-{pids[owner]}-{i:04x}ab"
        if as_link:
            (base / name).symlink_to(outside)
        else:
            (base / name).write_text("half")
        made.append((name, owner))
    removed = atomic.sweep(base, ".lock.json.tmp-")
    assert sorted(removed) == sorted(n for n, o in made if o == "dead")
    assert outside.read_text() == "keep me\n"
    for name, owner in made:
        assert os.path.lexists(base / name) == (owner != "dead")


def test_a_killed_replay_tree_is_removed_by_the_next_unpack(tmp_path, monkeypatch):
    from rocmdoctor.snapshot import SnapshotError, unpack

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    stale = tmp_path / f"{litter.REPLAY_PREFIX}{_dead_pid()}-abc123"
    (stale / "sys").mkdir(parents=True)
    live = tmp_path / f"{litter.REPLAY_PREFIX}{os.getppid()}-abc123"
    live.mkdir()
    archive = tmp_path / "not-a-snapshot.tar.gz"
    archive.write_bytes(b"garbage")
    with pytest.raises(SnapshotError):
        unpack(archive)
    assert not stale.exists() and live.exists()


def test_removing_a_linked_tree_removes_the_link_not_its_target(tmp_path):
    target = tmp_path / "elsewhere"
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "vllm-server").write_text("x")
    link = tmp_path / "bundle"
    link.symlink_to(target)
    remove_tree(link)
    assert not os.path.lexists(link) and (target / "bin" / "vllm-server").exists()
