"""provision/fix.py's plan on an image tree: each remedy against the tree's current state."""

from __future__ import annotations

from rocmdoctor.host_processes import HeldProcess
from rocmdoctor.host_writes import HostWriter
from rocmdoctor.process_identity import ProcessFacts
from rocmdoctor.provision.fix import UDEV_RULE_PATH, Wanted, apply, plan


def tree(tmp_path):
    (tmp_path / "etc/modprobe.d").mkdir(parents=True)
    (tmp_path / "etc/passwd").write_text("vllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n")
    (tmp_path / "etc/group").write_text("render:x:992:\nvideo:x:44:vllm\n")
    return HostWriter(tmp_path)


def test_ttm_file_keeps_other_options_and_replaces_its_own(tmp_path):
    writer = tree(tmp_path)
    (tmp_path / "etc/modprobe.d/ttm.conf").write_text(
        "# local\noptions ttm pages_limit=1\noptions ttm page_pool_size=2\n"
    )
    (item,) = plan(writer, Wanted(user="vllm", family="ubuntu", ttm_pages=262144 * 60), ("ttm",))
    assert "-options ttm pages_limit=1" in item.diff() and "+options ttm pages_limit=15728640" in item.diff()
    apply(writer, [item])
    text = (tmp_path / "etc/modprobe.d/ttm.conf").read_text()
    assert text == "# local\noptions ttm page_pool_size=2\noptions ttm pages_limit=15728640\n"
    assert "update-initramfs -u" in item.before_check
    (again,) = plan(writer, Wanted(user="vllm", family="ubuntu", ttm_pages=262144 * 60), ("ttm",))
    assert not again.changes


def test_groups_only_those_missing(tmp_path):
    writer = tree(tmp_path)
    (item,) = plan(writer, Wanted(user="vllm", family="debian", groups=("render", "video")), ("groups",))
    assert item.groups == ["render"] and item.before_check.startswith("a new login")
    apply(writer, [item])
    assert (tmp_path / "etc/group").read_text() == "render:x:992:vllm\nvideo:x:44:vllm\n"


def test_udev_rule_is_written_and_its_reload_left_to_the_booted_machine(tmp_path):
    writer = tree(tmp_path)
    (item,) = plan(writer, Wanted(user="vllm", family="debian", udev=True), ("udev",))
    assert item.run == [] and not item.refused  # a tree: the file only
    apply(writer, [item])
    assert 'KERNEL=="kfd", GROUP="render", MODE="0660"' in (tmp_path / UDEV_RULE_PATH.lstrip("/")).read_text()


def test_kernelstub_and_orphans_need_the_booted_machine(tmp_path):
    writer = tree(tmp_path)
    wanted = Wanted(
        user="vllm",
        family="ubuntu",
        cmdline_add=("iommu=pt",),
        tools=("kernelstub",),
        orphans=(
            HeldProcess(ProcessFacts(7, "/usr/bin/python3", ("python3",), 1, 0, 1, (), "python3"), "x", -1),
        ),
    )
    items = {i.id: i for i in plan(writer, wanted)}
    assert "kernelstub -a iommu=pt" in items["cmdline"].refused
    assert "image tree" in items["orphans"].refused and items["orphans"].cannot_undo


def test_bytes_that_are_not_utf8_are_kept_and_never_crash(tmp_path):
    """Latin-1 names and comments in /etc/group, /etc/passwd and ttm.conf: the plan and the write keep every
    byte it does not change (issue 35)."""
    writer = tree(tmp_path)
    (tmp_path / "etc/passwd").write_bytes(b"vllm:x:998:998:J\xfcrgen:/var/lib/vllm:/usr/sbin/nologin\n")
    (tmp_path / "etc/group").write_bytes(b"caf\xe9:x:1001:vllm\nrender:x:992:\nvideo:x:44:\n")
    (tmp_path / "etc/gshadow").write_bytes(b"caf\xe9:!::vllm\nrender:!::\nvideo:!::\n")
    (tmp_path / "etc/modprobe.d/ttm.conf").write_bytes(b"# r\xe9seau \xff\noptions ttm pages_limit=1\n")
    wanted = Wanted(user="vllm", family="debian", groups=("render", "video"), ttm_pages=262144 * 60)
    items = plan(writer, wanted)
    apply(writer, items)
    assert (
        tmp_path / "etc/group"
    ).read_bytes() == b"caf\xe9:x:1001:vllm\nrender:x:992:vllm\nvideo:x:44:vllm\n"
    assert (tmp_path / "etc/gshadow").read_bytes() == b"caf\xe9:!::vllm\nrender:!::vllm\nvideo:!::vllm\n"
    assert (
        tmp_path / "etc/modprobe.d/ttm.conf"
    ).read_bytes() == b"# r\xe9seau \xff\noptions ttm pages_limit=15728640\n"
    assert (tmp_path / "etc/passwd").read_bytes().startswith(b"vllm:x:998:998:J\xfc")
    assert all(not i.changes for i in plan(writer, wanted))


def test_a_group_with_gid_0_is_never_joined(tmp_path):
    writer = tree(tmp_path)
    (tmp_path / "etc/group").write_text("render:x:0:\nvideo:x:44:\n")  # a container whose render is gid 0
    (item,) = plan(writer, Wanted(user="vllm", family="debian", groups=("render", "video")), ("groups",))
    assert item.groups == ["video"] and "gid 0" in item.why


def test_an_unreadable_group_file_is_refused_not_read_as_empty(tmp_path):
    import os

    writer = tree(tmp_path)
    os.chmod(tmp_path / "etc/group", 0)
    try:
        if os.access(tmp_path / "etc/group", os.R_OK):  # root reads it anyway: make it unreadable as a FIFO
            (tmp_path / "etc/group").unlink()
            os.mkfifo(tmp_path / "etc/group")
        (item,) = plan(writer, Wanted(user="vllm", family="debian", groups=("render",)), ("groups",))
        assert "cannot be read" in item.refused and not item.changes
    finally:
        os.chmod(tmp_path / "etc/group", 0o644)


LOADER_INFO = "sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


def systemd_boot(tmp_path, kernel_cmdline: str | None):
    writer = tree(tmp_path)
    (tmp_path / LOADER_INFO).parent.mkdir(parents=True)
    (tmp_path / LOADER_INFO).write_bytes(b"\x06\x00\x00\x00s\x00y\x00s\x00")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text("initrd=\\initrd.img root=UUID=1 rw quiet ttm.pages_limit=1\n")
    entries = tmp_path / "boot/loader/entries"
    entries.mkdir(parents=True)
    (entries / "a.conf").write_text(
        "title A\nlinux /vmlinuz\noptions root=UUID=1 rw quiet\noptions ttm.pages_limit=1\n"
    )
    if kernel_cmdline is not None:
        (tmp_path / "etc/kernel").mkdir(parents=True)
        (tmp_path / "etc/kernel/cmdline").write_text(kernel_cmdline)
    return writer


def test_systemd_boot_edits_the_entries_and_kernel_installs_cmdline(tmp_path):
    """kernel-install(8) writes the next kernel's entry from /etc/kernel/cmdline: an edit of today's entries
    alone is lost at the next kernel update. A limit on the command line is changed there, not in modprobe.d."""
    writer = systemd_boot(tmp_path, "root=UUID=1 rw quiet ttm.pages_limit=1\n")
    (item,) = plan(writer, Wanted(user="vllm", family="arch", ttm_pages=262144 * 60), ("ttm",))
    assert sorted(p for p, *_ in item.files) == ["/boot/loader/entries/a.conf", "/etc/kernel/cmdline"]
    apply(writer, [item])
    assert (tmp_path / "etc/kernel/cmdline").read_text() == "root=UUID=1 rw quiet ttm.pages_limit=15728640\n"
    assert (tmp_path / "boot/loader/entries/a.conf").read_text() == (
        "title A\nlinux /vmlinuz\noptions root=UUID=1 rw quiet\noptions ttm.pages_limit=15728640\n"
    )
    assert not (tmp_path / "etc/modprobe.d/ttm.conf").exists()
    (again,) = plan(writer, Wanted(user="vllm", family="arch", ttm_pages=262144 * 60), ("ttm",))
    assert not again.changes


def test_systemd_boot_without_kernel_cmdline_gets_one_from_the_running_line(tmp_path):
    writer = systemd_boot(tmp_path, None)
    (item,) = plan(writer, Wanted(user="vllm", family="arch", cmdline_add=("iommu=pt",)), ("cmdline",))
    files = {p: new for p, _old, new, _mode in item.files}
    # kernel-install's fallback is the running line without the loader's own initrd=
    assert files["/etc/kernel/cmdline"] == b"root=UUID=1 rw quiet ttm.pages_limit=1 iommu=pt\n"
    assert b"options ttm.pages_limit=1 iommu=pt\n" in files["/boot/loader/entries/a.conf"]


def test_host_side_change_names_each_runtime():
    from rocmdoctor.checks.container import host_side_change

    devices = {"devices": {"/dev/kfd": {"rdev": "511:0"}}}
    assert "--group-add keep-groups" in host_side_change(
        "podman", {**devices, "user_namespace": {"uid_map": "x"}}
    )
    assert "--group-add <the host's render gid>" in host_side_change("docker", devices)
    assert "amd.com/gpu" in host_side_change("kubernetes", devices)
    lxc = host_side_change("lxc", devices)
    assert "pct set" in lxc and "lxc.cgroup2.devices.allow = c 511:* rwm" in lxc and "lxc.idmap" in lxc


def test_access_never_names_a_gid_0_group_even_when_it_is_called_render(tmp_path):
    import re
    import shutil

    from harness.hosts import fixture_root, run_check

    root = tmp_path / "root"
    shutil.copytree(fixture_root("r9700"), root, symlinks=True)
    (root / "etc/passwd").write_text((root / "etc/passwd").read_text() + "vllm:x:998:998::/:/sbin/nologin\n")
    (root / "etc/group").write_text("root:x:0:\nrender:x:0:\nvideo:x:39:\nvllm:x:998:\n")
    result = run_check(root, "access.devices", user="vllm")
    joined = {g for m in re.findall(r"usermod -aG (\S+)", result.remedy) for g in m.split(",")}
    assert result.status.value == "fail" and "render" not in joined and "root" not in joined
