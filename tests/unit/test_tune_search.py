"""`rocmdoctor tune`'s search and objective on shaped throughput curves (no server)."""

from __future__ import annotations

import pytest

from rocmdoctor.provision.tune.search import (
    Measurement,
    Search,
    Setting,
    SloError,
    choose,
    exhaustive,
    parse_slo,
    run_search,
    seqs_candidates,
)


@pytest.mark.parametrize(
    ("text", "metric", "pct", "limit_ms"),
    [
        ("ttft:p95<=2s", "ttft", 95, 2000.0),
        ("itl:p99<=50ms", "itl", 99, 50.0),
        ("E2EL:P50 <= 1.5s", "e2el", 50, 1500.0),
        ("tpot:p99<20ms", "tpot", 99, 20.0),
    ],
)
def test_slo_forms(text, metric, pct, limit_ms):
    slo = parse_slo(text)
    assert (slo.metric, slo.percentile, slo.limit_ms) == (metric, pct, limit_ms)


@pytest.mark.parametrize("text", ["", "ttft", "ttft:p90<=2s", "latency:p95<=2s", "ttft:p95>=2s", "ttft:p95<=0s",
                                  "ttft:p95<=2 min", "ttft:p95<=-1ms"])  # fmt: skip
def test_bad_slo_says_the_form(text):
    with pytest.raises(SloError, match="METRIC:pPCT<=LIMIT"):
        parse_slo(text)


def curve(throughput, latency_ms=lambda seqs: 10.0 * seqs, batched_gain=None):
    """A measure function from a shaped curve: throughput(seqs), e2el/ttft p95 = latency_ms(seqs)."""

    def measure(setting: Setting) -> Measurement:
        gain = (batched_gain or {}).get(setting.max_num_batched_tokens, 1.0)
        lat = latency_ms(setting.max_num_seqs)
        return Measurement(
            setting,
            throughput(setting.max_num_seqs) * gain,
            16,
            0,
            {"ttft": {"p50": lat / 2, "p95": lat, "p99": lat}, "e2el": {"p50": lat, "p95": lat, "p99": lat}},
        )

    return measure


SHAPES = {
    "saturating": lambda s: 1000 * s / (s + 6),
    "peak then falls": lambda s: 100 * min(s, 10) - 8 * max(0, s - 12),
    "linear to a wall": lambda s: 50.0 * min(s, 20),
}


def best_of_grid(measure, seqs, batched, slo):
    return choose([measure(s) for s in exhaustive(seqs, batched)], slo)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("slo_text", [None, "ttft:p95<=150ms", "e2el:p95<=1s"])
def test_search_reaches_95_percent_of_the_grid_best_in_a_third_of_its_points(shape, slo_text):
    slo = parse_slo(slo_text) if slo_text else None
    measure = curve(SHAPES[shape])
    seqs = seqs_candidates(1, 64)
    points = run_search(Search(seqs, [None], slo), measure)
    chosen = choose(points, slo).winner
    grid = best_of_grid(measure, seqs, [None], slo).winner
    assert chosen is not None and grid is not None
    if slo is None:  # the knee: the smallest max-num-seqs within 95% of the best throughput
        assert chosen.output_tokens_per_s >= 0.95 * max(p.output_tokens_per_s for p in points)
        assert chosen.setting.max_num_seqs <= grid.setting.max_num_seqs * 1.25
    else:
        assert slo.met(chosen)
        assert chosen.output_tokens_per_s >= 0.95 * grid.output_tokens_per_s
    assert len(points) <= len(seqs) / 3
    assert len({p.setting for p in points}) == len(points)  # never the same point twice


def test_no_setting_meets_the_limit_gives_no_winner_and_the_best_seen():
    slo = parse_slo("ttft:p95<=1ms")
    points = run_search(Search(seqs_candidates(1, 32), [None], slo), curve(SHAPES["saturating"]))
    # The smallest setting already breaks the limit: larger batches only queue more, so it stops there.
    assert [p.setting.max_num_seqs for p in points] == [1]
    choice = choose(points, slo)
    assert choice.winner is None and choice.best_seen is points[0]
    assert "no setting met ttft p95 <= 1 ms" in choice.reason


def test_the_limit_stops_the_doubling_and_bisection_finds_its_edge():
    slo = parse_slo("e2el:p95<=200ms")  # latency 10 ms per sequence: 20 is the last that meets it
    points = run_search(Search(seqs_candidates(1, 64), [None], slo), curve(lambda s: 10.0 * s))
    assert [p.setting.max_num_seqs for p in points][:6] == [1, 2, 4, 8, 16, 32]
    assert choose(points, slo).winner.setting.max_num_seqs >= 19


def test_failed_points_are_never_chosen():
    def measure(setting: Setting) -> Measurement:
        if setting.max_num_seqs >= 8:
            return Measurement(setting, 0.0, error="the server exited with status 1 while loading")
        return curve(lambda s: 100.0 * s)(setting)

    points = run_search(Search(seqs_candidates(1, 16), [None], None), measure)
    assert choose(points, None).winner.setting.max_num_seqs < 8


def test_batched_tokens_are_hill_climbed_at_the_chosen_seqs():
    measure = curve(SHAPES["saturating"], batched_gain={512: 1.0, 1024: 1.2, 2048: 1.25, 4096: 1.0})
    slo = parse_slo("e2el:p95<=10s")
    points = run_search(Search(seqs_candidates(1, 32), [512, 1024, 2048, 4096], slo), measure)
    winner = choose(points, slo).winner
    assert winner.setting.max_num_batched_tokens == 2048
    tried = [p.setting.max_num_batched_tokens for p in points if p.setting.max_num_batched_tokens != 512]
    assert tried == [1024, 2048, 4096]  # climbed while it paid, stopped at the first that did not
