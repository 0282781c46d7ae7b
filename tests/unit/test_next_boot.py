"""facts/next_boot.py: the next boot's values from every source with kmod's, GRUB's and kernel-install's
precedence (docs/fix.md has the rules and their sources)."""

from __future__ import annotations

from pathlib import Path

from rocmdoctor.facts import next_boot
from rocmdoctor.host import Host


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def test_modprobe_d_same_name_in_etc_hides_the_packaged_one_and_later_names_win(tmp_path):
    put(tmp_path, "/usr/lib/modprobe.d/ttm.conf", "options ttm pages_limit=1\n")
    put(tmp_path, "/etc/modprobe.d/ttm.conf", "options ttm pages_limit=2\n")
    put(tmp_path, "/lib/modprobe.d/zz-amd.conf", "options ttm pages_limit=3\n")
    put(tmp_path, "/etc/modprobe.d/aa.conf", "options ttm pages_limit=4\n")
    host = Host(tmp_path)
    assert next_boot.modprobe_files(host) == [
        "/etc/modprobe.d/aa.conf",
        "/etc/modprobe.d/ttm.conf",
        "/lib/modprobe.d/zz-amd.conf",
    ]
    param = next_boot.module_param(host, next_boot.boot_config(host), "ttm", "pages_limit")
    assert (param.value, param.source) == ("3", "/lib/modprobe.d/zz-amd.conf")
    assert not param.overridden_by_cmdline


def test_the_next_boots_command_line_wins_over_modprobe_d(tmp_path):
    put(tmp_path, "/etc/modprobe.d/ttm.conf", "options ttm pages_limit=2\n")
    put(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ttm.pages_limit=9\n")
    put(tmp_path, "/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet ttm.pages_limit=7"\n')
    put(
        tmp_path,
        "/etc/default/grub.d/50-local.cfg",
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT ttm.pages-limit=8"\n',
    )
    host = Host(tmp_path)
    boot = next_boot.boot_config(host)
    assert boot.loader == "grub" and "BOOT_IMAGE" in boot.evidence
    param = next_boot.module_param(host, boot, "ttm", "pages_limit")
    # the next boot's line (the grub.d file's last word), not the running one (9) nor the file (2)
    assert (
        param.value == "8"
        and param.overridden_by_cmdline
        and "/etc/default/grub.d/50-local.cfg" in param.source
    )


def test_a_running_parameter_grub_will_not_pass_again_does_not_count(tmp_path):
    """Typed at the boot menu once: the next boot from GRUB's files does not have it; modprobe.d counts."""
    put(tmp_path, "/etc/modprobe.d/ttm.conf", "options ttm pages_limit=2\n")
    put(tmp_path, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz ttm.pages_limit=9\n")
    put(tmp_path, "/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    host = Host(tmp_path)
    param = next_boot.module_param(host, next_boot.boot_config(host), "ttm", "pages_limit")
    assert (param.value, param.source) == ("2", "/etc/modprobe.d/ttm.conf")


def test_systemd_boot_reads_kernel_install_and_the_entries(tmp_path):
    put(tmp_path, next_boot.LOADER_INFO, "x")
    put(tmp_path, "/proc/cmdline", "initrd=\\i root=UUID=1 rw\n")
    put(tmp_path, "/etc/kernel/cmdline", "# comment\nroot=UUID=1 rw ttm.pages_limit=5\n")
    put(tmp_path, "/boot/loader/entries/a.conf", "title A\noptions root=UUID=1 rw ttm.pages_limit=5\n")
    boot = next_boot.boot_config(Host(tmp_path))
    assert boot.loader == "systemd-boot"
    assert [s.path for s in boot.sources] == ["/etc/kernel/cmdline", "/boot/loader/entries/a.conf"]
    assert boot.next_value("ttm.pages_limit") == "5"
    # sources that disagree leave the next value unknown, never one of them picked
    put(tmp_path, "/boot/loader/entries/a.conf", "title A\noptions root=UUID=1 rw ttm.pages_limit=6\n")
    assert next_boot.boot_config(Host(tmp_path)).next_value("ttm.pages_limit") is None


def test_the_initramfs_image_is_found_by_name(tmp_path):
    put(tmp_path, "/boot/initrd.img-6.8.0-49-generic", "")
    put(tmp_path, "/boot/initramfs-linux-fallback.img", "")
    host = Host(tmp_path)
    assert next_boot.initramfs_image(host, "6.8.0-49-generic") == "/boot/initrd.img-6.8.0-49-generic"
    assert next_boot.initramfs_image(host, "6.9.0") is None
