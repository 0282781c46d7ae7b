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
