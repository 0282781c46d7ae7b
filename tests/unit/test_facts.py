"""The facts other helpers import (rocmdoctor.checks.facts) and the pure kernel rules, against the
values in host-facts.md and the real captures in the fixtures."""

from __future__ import annotations

import pytest

from harness.hosts import fixture_root
from rocmdoctor.checks.facts import (
    GpuNode,
    gfx_name,
    gpus,
    meminfo,
    parse_properties,
    pci_slot_from_location,
    usable_memory,
)
from rocmdoctor.checks.kernel_rules import carries_cwsr_export, expected_cwsr, parse_release, vgpr_bytes
from rocmdoctor.facts.manifest import ManifestError, parse_manifest, shipped_manifest
from rocmdoctor.host import Host
from rocmdoctor.registry import Context

NODES = "sys/class/kfd/kfd/topology/nodes"


def ctx_for(fixture_id: str) -> Context:
    return Context(Host(fixture_root(fixture_id)))


@pytest.mark.parametrize(
    "value, name",
    [
        (110501, "gfx1151"),
        (110500, "gfx1150"),
        (110502, "gfx1152"),
        (110000, "gfx1100"),
        (110003, "gfx1103"),
        (120000, "gfx1200"),
        (120001, "gfx1201"),
        (120500, "gfx1250"),
        (100300, "gfx1030"),
        (100303, "gfx1033"),
        (90010, "gfx90a"),
        (90012, "gfx90c"),
        (90008, "gfx908"),
        (90402, "gfx942"),
        (90500, "gfx950"),
        (0, None),
    ],
)
def test_gfx_names_use_one_hex_digit_for_minor_and_stepping(value, name):
    assert gfx_name(value) == name


@pytest.mark.parametrize(
    "gfx, family",
    [
        ("gfx1151", "gfx1151"),
        ("gfx1150", "gfx1150"),
        ("gfx1100", "gfx110X"),
        ("gfx1103", "gfx110X"),
        ("gfx1200", "gfx120X"),
        ("gfx1201", "gfx120X"),
        ("gfx942", "gfx942"),
        ("gfx950", "gfx950"),
        ("gfx1030", None),
        ("gfx90a", None),
        ("gfx1152", None),
    ],
)
def test_bundle_family(gfx, family):
    assert shipped_manifest().family_for_gfx(gfx) == family


MANIFEST_HEAD = 'schema_version = 1\nrepo = "o/r"\n'


def test_a_family_named_after_one_gfx_runs_on_it_without_targets():
    manifest = parse_manifest(MANIFEST_HEAD + '[families.gfx1151]\nchannel = "stable"\n')
    assert manifest.family_for_gfx("gfx1151") == "gfx1151" and manifest.family_for_gfx("gfx1150") is None


def test_a_target_in_two_families_is_refused_naming_both():
    text = MANIFEST_HEAD + (
        '[families.gfx115X]\nchannel = "stable"\ntargets = ["gfx1150", "gfx1151"]\n'
        '[families.gfx1151]\nchannel = "stable"\n'
    )
    with pytest.raises(
        ManifestError,
        match="families.gfx1151: field 'targets': gfx1151 is already a target of family gfx115X",
    ):
        parse_manifest(text)


@pytest.mark.parametrize("targets", ['"gfx1151"', '["gfx1151", 7]', '["../etc"]', '[""]'])
def test_targets_must_be_a_list_of_gfx_names(targets):
    with pytest.raises(ManifestError, match="field 'targets' must be a list of gfx names"):
        parse_manifest(MANIFEST_HEAD + f'[families.gfx115X]\nchannel = "stable"\ntargets = {targets}\n')


@pytest.mark.parametrize(
    "location, domain, slot",
    [
        (49408, 0, "0000:c1:00.0"),
        (25600, 0, "0000:64:00.0"),
        (49664, 0, "0000:c2:00.0"),
        (1280, 0, "0000:05:00.0"),
        (-1, 0, None),
    ],
)
def test_kfd_location_to_pci_slot(location, domain, slot):
    assert pci_slot_from_location(location, domain) == slot


def test_properties_parse_by_name_not_position():
    props = parse_properties(
        "simd_count 80\ngarbage\ngfx_target_version 110501\nhive_id 18446744073709551615\n"
    )
    assert props == {"simd_count": 80, "gfx_target_version": 110501, "hive_id": 18446744073709551615}


@pytest.mark.parametrize(
    "fixture_id, node, expected",
    [
        ("strix-halo-clean", 1, (19185664, 16384)),  # matches ROCm#6157's exported value
        ("r9700", 1, (30699520, 28672)),  # matches the R9700 capture's exported values
        ("rx7900xtx-no-render", 1, (46047232, 40960)),
        ("strix-point", 1, (4186112, 8192)),
        ("mi300x", 2, (23203840, 12288)),  # per XCC
    ],
)
def test_cwsr_formula_reproduces_the_table(fixture_id, node, expected):
    props = parse_properties((fixture_root(fixture_id) / NODES / str(node) / "properties").read_text())
    assert expected_cwsr(props) == expected
    if "cwsr_size" in props:
        assert (props["cwsr_size"], props["ctl_stack_size"]) == expected


def test_gfx1151_without_the_vgpr_bump_is_what_the_check_catches():
    props = parse_properties((fixture_root("strix-halo-clean") / NODES / "1" / "properties").read_text())
    ctl, cu = 16384, 40
    assert ctl + cu * (0x40000 + 0x15000) == 13942784 != expected_cwsr(props)[0]
    assert vgpr_bytes(110501) == 0x60000 and vgpr_bytes(110500) == 0x40000


@pytest.mark.parametrize(
    "release, distro, carries",
    [
        ("6.18.4", "fedora", True),
        ("6.18.3-100.fc43.x86_64", "fedora", False),
        ("6.19.11-1-cachyos", "arch", True),
        ("6.12.64", "debian", True),
        ("6.12.48+deb13-amd64", "debian", False),
        ("6.17.0-19-generic", "ubuntu", True),
        ("6.17.0-7-generic", "ubuntu", False),
        ("6.14.0-1018-oem", "ubuntu", True),
        ("6.14.0-1014-oem", "ubuntu", False),
        ("7.1.0", "nixos", True),
    ],
)
def test_minimum_kernels(release, distro, carries):
    assert carries_cwsr_export(parse_release(release), distro) is carries


def test_gpus_read_through_the_render_minor_and_decide_apu():
    (halo,) = gpus(ctx_for("strix-halo-clean"))
    assert isinstance(halo, GpuNode)
    assert (halo.node, halo.gfx, halo.apu, halo.render_minor, halo.pci_slot) == (
        1,
        "gfx1151",
        True,
        128,
        "0000:65:00.0",
    )
    (point,) = gpus(ctx_for("strix-point"))
    assert (point.apu, point.pci_slot, point.gtt_used, point.device_id) == (
        True,
        "0000:c1:00.0",
        3946811392,
        5390,
    )
    (xtx,) = gpus(ctx_for("rx7900xtx-no-render"))
    assert xtx.apu is False and xtx.pci_slot == "0000:03:00.0"  # the DRM device's own address
    (r9700,) = gpus(ctx_for("r9700"))
    assert (r9700.apu, r9700.vram_total) == (False, 34208743424)  # from the KFD frame-buffer bank
    (mi300x,) = gpus(ctx_for("mi300x"))
    assert (mi300x.node, mi300x.family, mi300x.apu) == (2, "gfx942", False)
    assert gpus(ctx_for("no-amd-gpu")) == []


def test_usable_memory_is_gtt_bounded_by_memavailable_on_an_apu():
    ctx = ctx_for("strix-point")
    (gpu,) = gpus(ctx)
    total, free = usable_memory(ctx, gpu)
    gtt_free = gpu.gtt_total - gpu.gtt_used
    assert total == gpu.gtt_total and free == min(gtt_free, meminfo(ctx)["MemAvailable"])


def test_gpus_are_memoized_per_run():
    ctx = ctx_for("strix-halo-clean")
    assert gpus(ctx) is gpus(ctx)


def test_without_a_render_minor_the_pci_address_finds_card10(tmp_path):
    """Multi-GPU hosts have card10+; the KFD location_id picks the right one, enumerated numerically."""
    import shutil

    root = tmp_path / "host"
    shutil.copytree(fixture_root("strix-point"), root, symlinks=True)
    props = root / NODES / "1" / "properties"
    props.write_text(props.read_text().replace("drm_render_minor 128", "drm_render_minor -1"))
    drm = root / "sys/class/drm"
    (drm / "renderD128").rename(drm / "card10")
    (drm / "card1" / "device").unlink()
    (drm / "card1" / "device").mkdir()
    (drm / "card1" / "device" / "uevent").write_text("DRIVER=amdgpu\nPCI_SLOT_NAME=0000:03:00.0\n")
    (gpu,) = gpus(Context(Host(root)))
    assert (gpu.render_minor, gpu.pci_slot, gpu.gtt_total) == (None, "0000:c1:00.0", 16441004032)
