"""Step-time statistics, throughput, data-wait share, speedup and efficiency computed from recorded timings."""

from __future__ import annotations

import numpy as np
import pytest

from accelkit.bench.stats import TooFewSteps, percentile, scaling, summarize


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
    # Throughput: 8 samples x 4 steps x 2 ranks over the slowest rank's measured wall time (0.8 s).
    assert s.measured_s == pytest.approx(0.8)
    assert s.samples == 64 and s.samples_per_s == pytest.approx(64 / 0.8)
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
