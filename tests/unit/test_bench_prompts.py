"""bench's prompts: exact lengths, and no two prompts of one run, nor of two runs, alike from their
first tokens on, so vLLM's prefix cache (whole blocks matched from the start) finds no prefill to skip
in any level or rerun; and the prefix-cache figure the server's counters give."""

from __future__ import annotations

from rocmdoctor.provision.verify.bench import (
    PREFIX_HITS,
    PREFIX_QUERIES,
    BenchOptions,
    prefix_cache,
    prompt_bodies,
    unique_prompts,
)

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


def test_two_runs_never_share_a_first_block():
    # A rerun of the same prompts is all prefix-cache hits (the CPU engine served 96% of a second
    # run's 400-token prompts from its cache): each run's number sets its prompts apart.
    first = unique_prompts(SEED, 128, 0, 48, run_id=7)
    second = unique_prompts(SEED, 128, 0, 48, run_id=8)
    assert all(len(p) == 128 for p in first + second)
    assert not {tuple(p[:16]) for p in first} & {tuple(p[:16]) for p in second}
    # within a run, prompts still differ from their first token (j comes before the run's number)
    assert len({p[0] for p in first[:25]}) == 25
    # the run's number is written whole: numbers that differ only in their highest digit differ too
    top = len(SEED) ** 6
    assert unique_prompts(SEED, 16, 0, 1, run_id=top)[0] != unique_prompts(SEED, 16, 0, 1, run_id=0)[0]


def test_bodies_of_a_run_carry_its_number():
    options = BenchOptions(url="", prompt_tokens=20, max_tokens=3)
    ids_a = prompt_bodies("tiny", SEED, options, 0, 3, run_id=1)
    ids_b = prompt_bodies("tiny", SEED, options, 0, 3, run_id=2)
    assert [len(b["prompt"]) for b in ids_a] == [20] * 3
    assert all(a["prompt"] != b["prompt"] for a, b in zip(ids_a, ids_b, strict=True))
    words = prompt_bodies("tiny", None, options, 0, 3, run_id=1)
    assert all(len(b["prompt"].split()) == 20 for b in words)
    assert words != prompt_bodies("tiny", None, options, 0, 3, run_id=2)


def test_prefix_cache_is_the_growth_of_the_servers_counters():
    before = {PREFIX_HITS: 640.0, PREFIX_QUERIES: 20432.0}
    assert prefix_cache(before, {PREFIX_HITS: 640.0, PREFIX_QUERIES: 22432.0}) == {
        "hits": 0,
        "queries": 2000,
        "detail": "",
    }
    served = prefix_cache(before, {PREFIX_HITS: 2560.0, PREFIX_QUERIES: 22432.0})
    assert served is not None and served["hits"] == 1920 and "another client" in served["detail"]
    # a server without the counters (an older vLLM, a proxy): unknown, not zero
    assert prefix_cache({}, {}) is None
    assert prefix_cache(before, {PREFIX_HITS: 700.0}) is None
