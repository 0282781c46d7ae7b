"""The flags rocmdoctor saves into Lemonade are judged for the vLLM Lemonade runs (provision/server/
lemonade.lemonade_vllm): the version its vllm:rocm backend reports in GET /api/v1/system-info (the
stand-in, tests/harness/lemonade_server.py, reports the release tag vllm0.20.1-rocm7.12.0-gfx1151 over
real HTTP on loopback), read with that version's shipped table, and the output says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.lemonade_server import Registered, State, lemonade_server
from rocmdoctor.host_writes import HostWriter
from rocmdoctor.provision.server.args import ArgumentError
from rocmdoctor.provision.server.lemonade import ModelTarget, apply_options, judged, lemonade_vllm
from rocmdoctor.provision.server.lemonade_api import Lemonade
from rocmdoctor.vllm.surface import shipped

MODEL = "user.Qwen3-8B-vLLM"
TAG = "vllm0.20.1-rocm7.12.0-gfx1151"


def _state(tmp_path: Path) -> State:
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    return State(state_dir, {MODEL: Registered("Qwen/Qwen3-8B")})


def test_a_flag_the_backends_vllm_lacks_is_refused_naming_the_version_and_nothing_is_sent(tmp_path):
    state = _state(tmp_path)
    with lemonade_server(state) as server:
        client = Lemonade(server.url)
        vllm = lemonade_vllm(client)
        assert vllm.version == "0.20.1" and f"the version Lemonade's vllm:rocm backend reports ({TAG})" in (
            vllm.described()
        )
        target = ModelTarget(MODEL, None, {"--max-num-seqs": "8", "--max-num-scheduled-tokens": "64"})
        with pytest.raises(ArgumentError) as caught:
            apply_options(HostWriter(check_mode=False), client, target)
        assert server.posted_bodies() == []
    message = str(caught.value)
    assert message.startswith(
        f"{MODEL}: --max-num-scheduled-tokens needs vLLM 0.32.0 or newer; the bundle has vLLM 0.20.1"
    )
    assert TAG in message and message.endswith("(nothing was sent to Lemonade)")


def test_flags_it_knows_are_saved_and_a_saved_flag_it_lacks_is_noted(tmp_path):
    state = _state(tmp_path)
    state.write_saved({MODEL: {"vllm_args": "--max-num-scheduled-tokens 64 --enforce-eager"}})
    with lemonade_server(state) as server:
        change = apply_options(
            HostWriter(check_mode=False),
            Lemonade(server.url),
            ModelTarget(MODEL, None, {"--max-num-seqs": "8"}),
        )
    assert change.changed and change.data["vllm"].startswith("vLLM 0.20.1 (rocmdoctor's table of vLLM 0.20.1")
    assert (
        f"the saved vllm_args of {MODEL} carry --max-num-scheduled-tokens: --max-num-scheduled-tokens needs "
        "vLLM 0.32.0 or newer" in "\n".join(change.data["notes"])
    )
    assert (
        state.saved()[MODEL]["vllm_args"] == "--max-num-scheduled-tokens 64 --enforce-eager --max-num-seqs 8"
    )


def test_a_deprecated_flag_is_noted_for_the_version_that_deprecates_it():
    target = judged(ModelTarget(MODEL, None, {"--disable-cascade-attn": ""}), shipped("0.32.0"))
    assert target.flags == {"--disable-cascade-attn": ""}
    (note,) = target.notes
    assert note.startswith("--disable-cascade-attn is deprecated in vLLM 0.32.0")
