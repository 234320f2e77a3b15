"""Step-time statistics, throughput, data-wait share, speedup and efficiency computed from recorded timings."""

from __future__ import annotations

import numpy as np
import pytest

from accelkit.bench.stats import NOISY_SPREAD, TooFewSteps, percentile, scaling, summarize


def rank(seconds: list[float], waits: list[float], samples: int = 8, tokens: int = 0, memory: int = 100) -> dict:
    return {"steps": [{"step": i + 1, "seconds": s, "data_wait_s": w, "samples": samples, "tokens": tokens}
                      for i, (s, w) in enumerate(zip(seconds, waits, strict=True))],
            "peak_memory_bytes": memory}


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], list(np.linspace(0, 1, 17))])
@pytest.mark.parametrize("q", [0, 50, 90, 100])
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_summary_takes_the_slowest_rank_per_step_after_warmup() -> None:
    # warmup step 1 (slow, excluded); rank 1 is slower on steps 2 and 4, rank 0 on step 3.
    r0 = rank([9.0, 0.10, 0.30, 0.10, 0.10], [0, 0.01, 0.01, 0.01, 0.01], memory=300)
    r1 = rank([9.0, 0.20, 0.10, 0.40, 0.10], [0, 0.10, 0.05, 0.20, 0.05], memory=500)
    s = summarize([r0, r1], warmup=1)
    assert s.steps == 4
    assert s.step_times_s == [0.20, 0.30, 0.40, 0.10]
    assert s.step_median_s == pytest.approx(0.25)
    assert s.step_p90_s == pytest.approx(float(np.percentile([0.2, 0.3, 0.4, 0.1], 90)))
    # Throughput from the one statistic: 8 samples x 2 ranks per step over the median step (0.25 s), not the
    # 64 samples over the slowest rank's wall time (0.8 s) that a mean would give.
    assert s.measured_s == pytest.approx(0.8)
    assert s.samples == 64 and s.samples_per_s == pytest.approx(16 / 0.25)
    assert s.tokens_per_s is None
    # Data-wait share on the most data-bound rank: 0.40 / 0.80.
    assert s.data_wait_share_per_rank == pytest.approx([0.04 / 0.6, 0.5])
    assert s.data_wait_share == pytest.approx(0.5)
    assert s.peak_memory_bytes == 500 and s.peak_memory_per_rank == [300, 500]


def test_summary_uses_steps_every_rank_completed_and_counts_tokens() -> None:
    s = summarize([rank([1, 1, 1], [0, 0, 0], tokens=128), rank([1, 1], [0, 0], tokens=128)], warmup=0)
    assert s.steps == 2 and s.tokens == 4 * 128 and s.tokens_per_s == pytest.approx(512 / 2)


def test_summary_refuses_a_run_with_no_step_after_warmup() -> None:
    with pytest.raises(TooFewSteps, match="completed 2 optimizer step"):
        summarize([rank([1, 1], [0, 0])], warmup=2)
    with pytest.raises(TooFewSteps):
        summarize([], warmup=0)


def summary(step: float, samples_per_s: float | None):
    s = summarize([rank([step] * 3, [0] * 3)], warmup=0)
    s.samples_per_s = samples_per_s
    return s


def test_weak_scaling_speedup_is_the_throughput_ratio() -> None:
    one, four = summary(0.10, 100.0), summary(0.125, 320.0)
    result = scaling(4, four, 1, one, "weak")
    assert result.speedup == pytest.approx(3.2) and result.efficiency == pytest.approx(0.8)
    assert scaling(1, one, 1, one, "weak").speedup == 1.0


def test_without_samples_weak_and_strong_scaling_use_step_times() -> None:
    one, two = summary(0.10, None), summary(0.08, None)
    weak = scaling(2, two, 1, one, "weak")  # twice the work per step in 0.08 s: 2 x 0.10 / 0.08
    assert weak.speedup == pytest.approx(2.5) and weak.efficiency == pytest.approx(1.25)
    strong = scaling(2, two, 1, one, "strong")  # same work: T1 / (N x TN) = 0.10 / (2 x 0.08)
    assert strong.speedup == pytest.approx(1.25) and strong.efficiency == pytest.approx(0.625)


def test_a_baseline_above_one_process() -> None:
    two, eight = summary(0.1, 200.0), summary(0.1, 600.0)
    result = scaling(8, eight, 2, two, "weak")
    assert result.baseline_num_processes == 2
    assert result.speedup == pytest.approx(3.0) and result.efficiency == pytest.approx(0.75)
    own = scaling(2, two, 2, two, "weak")  # a run compared with itself above one process says nothing
    assert own.speedup is None and own.efficiency is None


# -- one statistic, its spread, and the noise flag (issue 22, item 5) ---------------------------------------------
def steps_run(seconds: list[float], samples: int = 32) -> dict:
    return rank(seconds, [0.0] * len(seconds), samples=samples, tokens=samples * 10)


def test_every_rate_derives_from_the_median_step_time() -> None:
    # One slow step (a GC pause) in 20: the mean moves, the median does not, and no figure follows the mean.
    one = summarize([steps_run([0.002] * 19 + [0.040])], warmup=0)
    assert one.step_median_s == pytest.approx(0.002) and one.step_mean_s == pytest.approx(0.0039)
    assert one.samples_per_s == pytest.approx(32 / 0.002) and one.tokens_per_s == pytest.approx(320 / 0.002)
    two = summarize([steps_run([0.0025] * 20), steps_run([0.0024] * 20)], warmup=0)
    result = scaling(2, two, 1, one, "weak")
    # speedup = (64 / 0.0025) / (32 / 0.002): the same statistic on both sides.
    assert result.speedup == pytest.approx((64 / 0.0025) / (32 / 0.002)) and result.efficiency == pytest.approx(0.8)
    assert result.noise == ()


def test_the_issues_example_superlinear_is_flagged_as_noise() -> None:
    """The issue's report: 20 steps of ~2 ms, a one-process p90 4x its median: 116% efficiency from mean
    throughputs. From medians it is below 100%, and the baseline's spread flags it as noise."""
    noisy_one = [0.002, 0.0021, 0.0019, 0.008, 0.002, 0.0082, 0.0020, 0.0079, 0.0021, 0.0080] * 2
    one = summarize([steps_run(noisy_one)], warmup=0)
    assert one.step_p90_s > 3.5 * one.step_median_s and one.spread > 0.2
    two = summarize([steps_run([0.0023] * 20), steps_run([0.0024] * 20)], warmup=0)
    mean_speedup = (64 / two.step_mean_s) / (32 / one.step_mean_s)
    assert mean_speedup / 2 > 1.0  # what the old arithmetic (mean throughputs) reported: superlinear
    result = scaling(2, two, 1, one, "weak")
    assert result.efficiency < 1.0 and result.noise == ("high variance",)


def test_a_superlinear_efficiency_is_flagged_even_when_quiet() -> None:
    one = summarize([steps_run([0.010] * 20)], warmup=0)
    two = summarize([steps_run([0.009] * 20), steps_run([0.009] * 20)], warmup=0)
    result = scaling(2, two, 1, one, "weak")
    assert result.efficiency == pytest.approx(10 / 9) and result.noise == ("superlinear",)
    # 100.4% shows as 100%: not superlinear
    almost = summarize([steps_run([0.010] * 20), steps_run([0.010] * 20)], warmup=0)
    almost.samples_per_s = 2 * one.samples_per_s * 1.004
    assert scaling(2, almost, 1, one, "weak").noise == ()


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    values = [0.0130, 0.0132, 0.0134, 0.0136, 0.0138, 0.0140, 0.0142, 0.0144, 0.0146]
    s = summarize([steps_run(values)], warmup=0)
    q25, q50, q75 = (float(np.percentile(values, q)) for q in (25, 50, 75))
    assert s.spread == pytest.approx((q75 - q25) / q50)
    assert s.spread < NOISY_SPREAD and scaling(1, s, 1, s, "weak").noise == ()
    wide = summarize([steps_run([0.01, 0.02] * 10)], warmup=0)
    assert wide.spread > NOISY_SPREAD and scaling(1, wide, 1, wide, "weak").noise == ("high variance",)


def test_a_batch_shared_by_a_tensor_parallel_group_is_counted_once() -> None:
    four = [steps_run([0.01] * 5, samples=8) for _ in range(4)]
    assert summarize(four, warmup=0).samples_per_s == pytest.approx(32 / 0.01)
    tp2 = summarize(four, warmup=0, batch_replicas=2)  # dp 2 x tp 2: two distinct batches per step
    assert tp2.samples == 5 * 16 and tp2.samples_per_s == pytest.approx(16 / 0.01)
