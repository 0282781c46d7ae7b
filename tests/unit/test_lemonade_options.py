"""The vllm_args merge and the options body rocmdoctor sends to Lemonade (provision.lemonade), pure."""

from __future__ import annotations

import pytest

from rocmdoctor.model import Status
from rocmdoctor.provision.server.lemonade import (
    ModelTarget,
    diagnose_launch,
    diagnose_orphans,
    diagnose_telemetry,
    diagnose_timeout,
    options_body,
)
from rocmdoctor.provision.server.lemonade_args import (
    PROTECTED_FLAGS,
    ProtectedFlagError,
    merge_vllm_args,
    refuse_protected,
)
from rocmdoctor.vllm.flags import FLAGS

WANTED = {"--gpu-memory-utilization": "0.78", "--max-num-seqs": "10"}


@pytest.mark.parametrize(
    "current, expected",
    [
        ("", "--gpu-memory-utilization 0.78 --max-num-seqs 10"),
        # unrelated flags stay, in order; the same flag in other spellings is replaced
        (
            "--enable-auto-tool-choice --max_num_seqs=256 --tool-call-parser qwen3_coder",
            "--enable-auto-tool-choice --tool-call-parser qwen3_coder --gpu-memory-utilization 0.78 --max-num-seqs 10",
        ),
        # one memory budget in Lemonade's resolver: --kv-cache-memory-bytes is replaced by the utilization
        (
            "--kv-cache-memory-bytes 4G --enforce-eager",
            "--enforce-eager --gpu-memory-utilization 0.78 --max-num-seqs 10",
        ),
        # a protected flag saved by hand is dropped, not resent
        (
            "--max-model-len 8192 --gpu-memory-utilization 0.92",
            "--gpu-memory-utilization 0.78 --max-num-seqs 10",
        ),
    ],
)
def test_merge_sets_the_flags_and_keeps_the_rest(current, expected):
    merged, _notes = merge_vllm_args(current, WANTED)
    assert merged == expected
    assert merge_vllm_args(merged, WANTED)[0] == merged  # idempotent


def test_merge_leaves_text_that_already_says_the_same_untouched():
    current = "--max-num-seqs 10 --enforce-eager --gpu-memory-utilization=0.78"
    assert merge_vllm_args(current, WANTED) == (current, [])


def test_options_body_holds_only_what_changes():
    target = ModelTarget("m", 40960, dict(WANTED))
    saved = {
        "ctx_size": 40960,
        "vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 10",
        "pinned": True,
    }
    assert options_body(saved, target) == ({}, [])
    body, _ = options_body({"ctx_size": 8192, "pinned": True}, target)
    assert body == {"ctx_size": 40960, "vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 10"}


@pytest.mark.parametrize(
    "args", ["--port 9000", "--served_model_name=x", "--max-model-len=4096 --enforce-eager"]
)
def test_a_protected_flag_never_leaves(args):
    with pytest.raises(ProtectedFlagError, match="refusing to send"):
        refuse_protected({"vllm_args": args})


@pytest.mark.parametrize(
    "timeout, checkpoint, status",
    [
        (0, "Qwen/Qwen3-8B", Status.FAIL),
        (600, "Qwen/Qwen3-4B-FP8", Status.FAIL),
        (300, "Qwen/Qwen3-8B", Status.WARN),
        (600, "Qwen/Qwen3-8B", Status.PASS),
        (1200, "Qwen/Qwen3-4B-FP8", Status.PASS),
    ],
)
def test_timeout_against_the_cold_load(timeout, checkpoint, status):
    assert diagnose_timeout({"global_timeout": timeout}, [checkpoint]).status is status


def test_an_engine_core_outside_every_loaded_backend_is_an_orphan():
    procs = [
        {"pid": 100, "ppid": 1, "vllm": True},  # vllm-server of a loaded model
        {"pid": 101, "ppid": 100, "vllm": True},  # its EngineCore
        {"pid": 200, "ppid": 1, "vllm": True},  # an EngineCore left by a timed-out load
        {"pid": 300, "ppid": 1, "vllm": False},
    ]
    result = diagnose_orphans(procs, [100])
    assert result.status is Status.FAIL and [p["pid"] for p in result.details["orphans"]] == [200]
    assert diagnose_orphans(procs[:2], [100]).status is Status.PASS


def test_a_model_loaded_before_the_save_is_said_to_run_old_options():
    saved = {"ctx_size": 40960, "vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 10"}
    old = ["vllm-server", "--max-model-len", "8192", "--kv-cache-memory-bytes", "4G"]
    new = [
        "vllm-server",
        "--max-model-len",
        "40960",
        "--gpu-memory-utilization",
        "0.78",
        "--max-num-seqs",
        "10",
    ]
    stale = diagnose_launch(old, saved)
    assert stale.status is Status.WARN and "--gpu-memory-utilization (none) (saved: 0.78)" in stale.summary
    assert diagnose_launch(new, saved).status is Status.PASS


def test_the_kv_cache_gauge_lemonade_reads_is_not_what_vllm_exports():
    assert diagnose_telemetry({"vllm:kv_cache_usage_perc", "vllm:num_requests_running"}).status is Status.WARN
    assert diagnose_telemetry({"vllm:gpu_cache_usage_factor"}).status is Status.PASS


def _accepted_spellings(flag: str) -> list[str]:
    """Every word vLLM 0.32's parser reads as `flag` (vllm/flags.py, generated from it with allow_abbrev
    on; tests/cli/test_security_args.py proves the table is the installed parser's): each prefix that
    names no other action, in dash and underscore spelling, bare and with =value."""
    action = FLAGS[flag][0]
    words = [flag, "--" + flag[2:].replace("-", "_"), flag + "=1"]  # an exact name wins over prefixes
    for end in range(3, len(flag)):
        prefix = flag[:end]
        if {FLAGS[o][0] for o in FLAGS if o.startswith(prefix)} == {action}:
            words += [prefix, "--" + prefix[2:].replace("-", "_"), prefix + "=1"]
    return words


@pytest.mark.parametrize("flag", sorted(PROTECTED_FLAGS))
def test_every_spelling_vllm_accepts_of_a_protected_flag_is_refused(flag):
    spellings = _accepted_spellings(flag)
    if flag != "--model":  # every prefix of --model is also one of --model-impl
        assert len(spellings) > 3  # --por, --max-model, --served-model among them
    for word in spellings:
        args = f"--enforce-eager {word} 1" if "=" not in word else f"--enforce-eager {word}"
        with pytest.raises(ProtectedFlagError, match="refusing to send"):
            refuse_protected({"vllm_args": args})
        merged, notes = merge_vllm_args(args, WANTED)
        assert word not in merged.split() and notes and merged.startswith("--enforce-eager ")


@pytest.mark.parametrize("word", ["--por", "--max-model", "--served-model", "--no-enable-prefix-caching"])
def test_the_reported_abbreviations_are_refused(word):
    with pytest.raises(ProtectedFlagError, match=word):
        refuse_protected({"vllm_args": f"{word} 8"})


def test_flags_that_only_share_a_prefix_with_a_protected_one_pass():
    refuse_protected({"vllm_args": "--max-num-seqs 8 --model-impl vllm --port-range 1 --hf-overrides {}"})


SPEC = '--speculative-config {"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'


@pytest.mark.parametrize(
    "current",
    [
        SPEC,
        f"--enforce-eager {SPEC} --max-num-seqs 256",
        # quoted as a shell user would: every byte stays, quotes and the space in the value included
        '--speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\' --max-num-seqs 4',
        '--override-generation-config {"temperature":0.6} --por 8001',
    ],
)
def test_the_users_other_vllm_args_are_kept_byte_for_byte(current):
    merged, _ = merge_vllm_args(current, WANTED)
    kept = [w for w in current.split() if w not in ("--max-num-seqs", "256", "4", "--por", "8001")]
    assert merged == " ".join([*kept, "--gpu-memory-utilization", "0.78", "--max-num-seqs", "10"])
    assert merge_vllm_args(merged, WANTED) == (merged, [])  # a rerun changes nothing
