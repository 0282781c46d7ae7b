"""bench's prompts: exact lengths, and no two prompts of one run alike from their first token on, so
vLLM's prefix cache (whole blocks matched from the start) finds no prefill to skip in any level."""

from __future__ import annotations

from rocmdoctor.provision.verify.bench import BenchOptions, prompt_bodies, unique_prompts

SEED = list(range(100, 125))  # 25 token ids, as the seed text gives


def test_a_whole_run_of_prompts_never_repeats_a_first_block():
    # Warm-up of 16, then three levels of 32: more prompts than the seed has rotations.
    prompts = unique_prompts(SEED, 128, 0, 16 + 3 * 32)
    assert all(len(p) == 128 for p in prompts)
    assert len({tuple(p[:16]) for p in prompts}) == len(prompts)  # vLLM's smallest GPU block: 16
    assert len({tuple(p[:3]) for p in prompts}) == len(prompts)  # even the first 3 tokens differ
    # Numbering continues across calls: a later level's prompts are not an earlier one's.
    later = unique_prompts(SEED, 128, 16 + 3 * 32, 32)
    assert not {tuple(p) for p in later} & {tuple(p) for p in prompts}


def test_bodies_carry_exact_lengths_as_ids_or_words():
    options = BenchOptions(url="", prompt_tokens=7, max_tokens=3)
    ids = prompt_bodies("tiny", SEED, options, 0, 4)
    assert [len(b["prompt"]) for b in ids] == [7] * 4 and ids[0]["max_tokens"] == 3
    words = prompt_bodies("tiny", None, options, 0, 30)
    assert all(len(b["prompt"].split()) == 7 for b in words)
    assert len({b["prompt"] for b in words}) == 30
