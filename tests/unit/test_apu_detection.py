"""APU or dGPU, decided from definitive signals on every node of every host fixture, with the reason."""

from __future__ import annotations

import pytest

from harness.hosts import FIXTURE_IDS, fixture_root
from rocmdoctor.checks.facts import HEAP_FB_PRIVATE, HEAP_FB_PUBLIC, classify_apu, gpus, parse_properties
from rocmdoctor.host import Host
from rocmdoctor.registry import Context

NODES = "sys/class/kfd/kfd/topology/nodes"
# fixture -> (APU nodes, dGPU nodes); every GPU node of the fixture is in exactly one of them.
EXPECTED = {
    "strix-halo-nocwsr-dkms": ({1}, set()),
    "strix-halo-clean": ({1}, set()),
    "strix-halo-default-ttm": ({1}, set()),
    "strix-halo-carveout": ({1}, set()),
    "strix-point": ({1}, set()),
    "rx7900xtx-no-render": (set(), {1}),
    "r9700": (set(), {1}),
    "mi300x": (set(), {2}),
    "no-amd-gpu": (set(), set()),
    "mi308x-cpx": (set(), set(range(2, 34))),
    "mi300x-cpx": (set(), set(range(2, 65))),
    "rx7900xtx-beside-igpu": ({2}, {1}),
    "r9700-beside-780m": ({2}, {1}),
    "r9700-beside-780m-igpu-first": ({1}, {2}),
    "strix-halo-beside-r9700": ({1}, {2}),
    "strix-halo-unbound": (set(), set()),
    "r9700-docker-unmapped-gid": (set(), {1}),
    "r9700-x4-ipc-legacy": (set(), {1, 2, 3, 4}),
    "r9700-rocm10-kernel7": (set(), {1}),
    "r9700-beside-nvidia": (set(), {1}),
    "wsl": (set(), set()),
    "mi350x": (set(), {1}),
}


def test_every_fixture_has_an_expectation():
    assert set(EXPECTED) == set(FIXTURE_IDS)


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_every_node_of_every_fixture(fixture_id):
    apus, dgpus = EXPECTED[fixture_id]
    found = gpus(Context(Host(fixture_root(fixture_id))))
    assert {g.node for g in found if g.apu is True} == apus
    assert {g.node for g in found if g.apu is False} == dgpus
    assert all(g.apu is not None and g.apu_basis and "cannot tell" not in g.apu_basis for g in found)


def props_of(fixture_id: str, node: int) -> dict[str, int]:
    return parse_properties((fixture_root(fixture_id) / NODES / str(node) / "properties").read_text())


def test_instinct_partitions_are_dgpus_by_their_pci_id_although_their_bank_is_public():
    """A CPX partition's bank is heap type 1 (frame buffer, public) like an APU's: not a signal."""
    props = props_of("mi308x-cpx", 7)
    apu, why = classify_apu("gfx942", props, [HEAP_FB_PUBLIC])
    assert (apu, why) == (False, "PCI device id 0x74a2 is the Instinct MI308X, a dGPU")


def test_mi300a_is_an_apu_although_it_is_gfx942():
    # The GPU node of a real 4-socket MI300A: device_id 29856, num_xcc 6, cpu_cores_count 0.
    props = {"cpu_cores_count": 0, "simd_count": 912, "gfx_target_version": 90402, "device_id": 29856}
    assert classify_apu("gfx942", props, [HEAP_FB_PUBLIC]) == (
        True,
        "PCI device id 0x74a0 is the Instinct MI300A, an APU",
    )


def test_a_w7500_is_a_dgpu_whatever_its_bank_looks_like():
    """gfx1102 (Radeon Pro W7500, RX 7600) exists only as a discrete GPU; the old vote said APU."""
    apu, why = classify_apu("gfx1102", {"device_id": 0x7489, "unique_id": 0}, [HEAP_FB_PUBLIC])
    assert apu is False and "only as a discrete GPU" in why


def test_a_fused_cpu_and_gpu_node_is_an_apu():
    assert classify_apu("gfx801", {"cpu_cores_count": 4, "simd_count": 32}, [])[0] is True


def test_private_vram_decides_for_an_unknown_target():
    assert classify_apu("gfx1250", {"device_id": 0x1234}, [HEAP_FB_PRIVATE]) == (
        False,
        "its KFD memory bank has a private frame buffer (VRAM beyond the CPU's BAR): a dGPU",
    )


def test_the_vote_is_a_last_resort_and_says_so():
    apu, why = classify_apu("gfx1250", {}, [HEAP_FB_PUBLIC], {"small_vram_carveout": True})
    assert apu is True and why.startswith("no definitive signal; weak hints vote APU")


def test_nothing_decides_is_said_with_the_reason():
    apu, why = classify_apu("gfx942", {"device_id": 0x74FF}, [HEAP_FB_PUBLIC], {})
    assert apu is None
    assert why == (
        "cannot tell: gfx942 exists as both APU and dGPU and no definitive signal "
        "(device id, fused node, private VRAM)"
    )


def test_the_unsupported_igpu_beside_a_dgpu_is_reported_as_such():
    found = {g.node: g for g in gpus(Context(Host(fixture_root("rx7900xtx-beside-igpu"))))}
    assert (found[1].gfx, found[1].family, found[1].apu) == ("gfx1100", "gfx110X", False)
    assert (found[2].gfx, found[2].family, found[2].apu) == ("gfx1033", None, True)
    assert found[2].apu_basis == "gfx1033 exists only as an integrated GPU"
