"""The boot configuration files as their tools read them: every GRUB edit is checked by the real `/bin/sh`
(grub-mkconfig sources /etc/default/grub and grub.d with it), kmod's modprobe.d rules, BLS entries."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmdoctor.facts import boot_files as bf

VARS = bf.GRUB_VARS


def sh_values(tmp: Path, files: list[tuple[str, str]]) -> dict[str, str]:
    """What /bin/sh makes of the files sourced in order (as grub-mkconfig does)."""
    script = []
    for n, (_path, text) in enumerate(files):
        f = tmp / f"f{n}"
        f.write_bytes(bf.encode(text))
        script.append(f". {f}")
    script += [f'printf "%s\\0" "${v}"' for v in VARS]
    out = subprocess.run(["/bin/sh", "-c", "\n".join(script)], capture_output=True, check=True).stdout
    return dict(zip(VARS, bf.decode(out).split("\0"), strict=False))


def words(values: dict[str, str]) -> list[str]:
    return bf.cmdline_words(" ".join(values[v] for v in VARS))


# Each form a user's file takes (from public /etc/default/grub files; the list).
FORMS = {
    "double": 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash amdgpu.gttsize=131072"\nGRUB_CMDLINE_LINUX=""\n',
    "single": "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash amdgpu.gttsize=131072'\n",
    "unquoted": "GRUB_CMDLINE_LINUX_DEFAULT=quiet\n",
    "exported": 'export GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n',
    "indented": '  \tGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"  # ours\n',
    "escaped": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet acpi_osi=\\"Windows 2020\\" splash"\n',
    "two": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n# later\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash amdgpu.gttsize=4096"\n',
    "self-reference": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT splash"\n',
    "multiline": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet\n  splash"\n',
    "in-linux": 'GRUB_CMDLINE_LINUX="rd.luks amdgpu.gttsize=2048"\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
    "distributor": (
        "GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Ubuntu} ) 2>/dev/null || echo Ubuntu`\n"
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
    ),
    "latin1": '# r\xe9seau: caf\udce9\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
    "none": "GRUB_TIMEOUT=5\n",
    "no-newline": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_grub_edit_keeps_the_users_words_and_adds_ours_as_sh_reads_it(form: str, tmp_path: Path) -> None:
    files = [("/etc/default/grub", FORMS[form])]
    before = sh_values(tmp_path, files)
    # The reader agrees with sh on the file as it is.
    assert {v: bf.evaluate(files, VARS)[v][0] for v in VARS} == before
    changed, error = bf.grub_edit(files, ("iommu=pt",), ("amdgpu.gttsize",))
    assert error == ""
    after = sh_values(tmp_path, [(p, changed.get(p, t)) for p, t in files])
    expected = [w for w in words(before) if not w.startswith("amdgpu.gttsize=")] + ["iommu=pt"]
    assert words(after) == expected
    # Every line outside the edited value is kept byte for byte (the latin-1 comment included).
    old, new = bf.encode(FORMS[form]), bf.encode(changed["/etc/default/grub"])

    def others(text: bytes) -> list[bytes]:
        return [ln for ln in text.split(b"\n") if b"GRUB_CMDLINE" not in ln and b"splash" not in ln and ln]

    assert others(old) == others(new)
    # A second run changes nothing.
    assert bf.grub_edit([(p, changed.get(p, t)) for p, t in files], ("iommu=pt",), ("amdgpu.gttsize",)) == (
        {},
        "",
    )


def test_grub_d_override_is_where_the_edit_lands(tmp_path: Path) -> None:
    """Ubuntu's cloud images override the command line in /etc/default/grub.d/50-cloudimg-settings.cfg:
    editing /etc/default/grub would change nothing GRUB reads."""
    files = [
        ("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'),
        (
            "/etc/default/grub.d/50-cloudimg-settings.cfg",
            'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n',
        ),
    ]
    changed, error = bf.grub_edit(files, ("iommu=pt",), ())
    assert error == "" and list(changed) == ["/etc/default/grub.d/50-cloudimg-settings.cfg"]
    after = sh_values(tmp_path, [(p, changed.get(p, t)) for p, t in files])
    assert words(after) == ["console=tty1", "console=ttyS0", "iommu=pt"]


def test_a_file_sh_would_refuse_is_not_edited() -> None:
    changed, error = bf.grub_edit(
        [("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet\n')], ("iommu=pt",), ()
    )
    assert changed == {} and "not valid shell" in error


def test_a_value_from_a_command_is_refused_not_guessed() -> None:
    files = [("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="$(cat /etc/cmdline) quiet"\n')]
    changed, error = bf.grub_edit(files, ("iommu=pt",), ())
    assert changed == {} and "edit it by hand" in error


SAFE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-=,:", min_size=1, max_size=12)


def render(style: str, value: str) -> str:
    if style == "single":
        return f"'{value}'"
    if style == "double":
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'
    return value.replace(" ", "\\ ")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    user=st.lists(SAFE, max_size=5),
    style=st.sampled_from(["single", "double", "unquoted"]),
    prefix=st.sampled_from(["", "export ", "  ", "\t"]),
    comment=st.binary(max_size=8),
    twice=st.booleans(),
)
def test_grub_edit_over_the_class(
    tmp_path: Path, user: list[str], style: str, prefix: str, comment: bytes, twice: bool
) -> None:
    value = " ".join(user)
    text = "# " + bf.decode(comment.replace(b"\n", b" ")) + "\n"
    if twice:
        text += f"GRUB_CMDLINE_LINUX_DEFAULT={render(style, 'old words')}\n"
    text += f"{prefix}GRUB_CMDLINE_LINUX_DEFAULT={render(style, value)}\nGRUB_TIMEOUT=5\n"
    files = [("/etc/default/grub", text)]
    before = sh_values(tmp_path, files)
    changed, error = bf.grub_edit(files, ("iommu=pt",), ())
    assert error == ""
    new = changed.get("/etc/default/grub", text)
    after = sh_values(tmp_path, [("/etc/default/grub", new)])
    old_words = words(before)
    assert words(after) == (old_words if "iommu=pt" in old_words else [*old_words, "iommu=pt"])
    # The comment (any bytes) and the lines around the value are byte for byte the same.
    assert bf.encode(new).startswith(bf.encode(text.split("\n", 1)[0]))
    assert bf.encode(new).endswith(b"\nGRUB_TIMEOUT=5\n")


def test_modprobe_d_options_continuations_and_module_name_spelling() -> None:
    text = "# x\noptions amd-ttm foo=1\noptions ttm pages_limit=1 \\\n   page_pool_size=2\noptions ttm pages_limit=3 # c\n"
    assert bf.modprobe_options(text, "ttm") == ["pages_limit=1", "page_pool_size=2", "pages_limit=3"]
    assert bf.modprobe_options(text, "amd_ttm") == ["foo=1"]


def test_bls_entry_edit_keeps_other_lines_and_replaces_an_old_value() -> None:
    entry = (
        "title Fedora\nversion 6.14\nlinux /vmlinuz\noptions root=UUID=1 ro ttm.pages_limit=1\ninitrd /i\n"
    )
    new = bf.bls_edit(entry, ("ttm.pages_limit=2",), ("amdgpu.gttsize",))
    assert (
        new
        == "title Fedora\nversion 6.14\nlinux /vmlinuz\noptions root=UUID=1 ro ttm.pages_limit=2\ninitrd /i\n"
    )
    assert bf.bls_edit(new, ("ttm.pages_limit=2",), ("amdgpu.gttsize",)) == new


def test_kernel_command_line_words_and_last_value_wins() -> None:
    words_ = bf.cmdline_words(
        'BOOT_IMAGE=/vmlinuz quiet acpi_osi="Windows 2020" ttm.pages_limit=1 ttm.pages-limit=2'
    )
    assert words_[2] == 'acpi_osi="Windows 2020"'
    assert bf.param_value(words_, "ttm.pages_limit") == "2"


# VERBATIM: /etc/default/grub.d/amd_cwsr.cfg from ROCm/ROCm#5590 (../shared/reference/sysfs/
# grub-d-amd_cwsr-cfg-cwsr_enable-0-strix-halo.txt): it appends with ${VAR:+...}.
AMD_CWSR_CFG = (
    "# /etc/default/grub.d/amd_cwsr.cfg\n"
    'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX:+$GRUB_CMDLINE_LINUX }amdgpu.cwsr_enable=0"\n'
)


@pytest.mark.parametrize("linux", ['GRUB_CMDLINE_LINUX=""\n', 'GRUB_CMDLINE_LINUX="ro rd.luks"\n', ""])
def test_a_grub_d_file_that_appends_with_parameter_expansion(linux: str, tmp_path: Path) -> None:
    files = [
        ("/etc/default/grub", f'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n{linux}'),
        ("/etc/default/grub.d/amd_cwsr.cfg", AMD_CWSR_CFG),
    ]
    before = sh_values(tmp_path, files)
    assert {v: bf.evaluate(files, VARS)[v][0] for v in VARS} == before
    changed, error = bf.grub_edit(files, ("iommu=pt",), ("amdgpu.cwsr_enable",))
    assert error == ""
    after = sh_values(tmp_path, [(p, changed.get(p, t)) for p, t in files])
    assert words(after) == [w for w in words(before) if w != "amdgpu.cwsr_enable=0"] + ["iommu=pt"]
