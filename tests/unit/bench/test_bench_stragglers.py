"""Naming a straggler from the ranks' own clocks: the phases of each rank, the thresholds, the line and the JSON."""

from __future__ import annotations

import pytest

from accelkit.bench.stragglers import (
    GPU_NOTE,
    STRAGGLER_RATIO,
    STRAGGLER_SHARE,
    WAITED_SHARE,
    RankPhases,
    find_straggler,
    rank_phases,
    straggler_of,
)


def step(seconds: float, data: float, optimizer: float = 0.0, wait: float | None = None) -> dict:
    return {"step": 0, "seconds": seconds, "data_wait_s": data, "optimizer_s": optimizer, "sync_wait_s": wait,
            "samples": 4, "tokens": 0}


def phases(rank: int, data: float, compute: float, optimizer: float = 0.01, wait: float | None = None) -> RankPhases:
    return RankPhases(rank, data + compute + optimizer + (wait or 0.0), data, compute, optimizer, wait)


def test_phases_are_means_over_the_measured_steps_and_add_up_to_the_step() -> None:
    ranks = [{"rank": 0, "steps": [step(9.0, 9.0), step(0.10, 0.01, 0.02, 0.05), step(0.12, 0.01, 0.02, 0.07)]},
             {"rank": 1, "steps": [step(9.0, 9.0), step(0.10, 0.08, 0.01, 0.0), step(0.12, 0.09, 0.01, 0.01),
                                   step(0.5, 0.4)]}]  # a step rank 0 did not complete: not measured
    zero, one = rank_phases(ranks, warmup=1)
    assert zero == RankPhases(0, pytest.approx(0.11), pytest.approx(0.01), pytest.approx(0.02),
                              pytest.approx(0.02), pytest.approx(0.06))
    assert one.rank == 1 and one.data_s == pytest.approx(0.085) and one.sync_wait_s == pytest.approx(0.005)
    for p in (zero, one):
        assert p.data_s + p.compute_s + p.optimizer_s + p.sync_wait_s == pytest.approx(p.step_s)
    # records from before the sync wait was measured: the phase is unknown, the compute holds the step's rest
    (old,) = rank_phases([{"rank": 0, "steps": [{"seconds": 0.2, "data_wait_s": 0.05}]}], warmup=0)
    assert old.sync_wait_s is None and old.optimizer_s == 0.0 and old.compute_s == pytest.approx(0.15)
    assert rank_phases([{"rank": 0, "steps": [step(1, 0)]}], warmup=1) == []


def test_the_slow_loader_rank_is_named_not_the_ranks_that_wait_for_it() -> None:
    found = find_straggler([phases(0, 0.03, 0.05, wait=0.18), phases(1, 0.21, 0.05, wait=0.0)])
    assert (found.rank, found.phase) == (1, "data") and found.ratio == pytest.approx(7.0)
    assert found.line() == ("straggler: rank 1 spends 0.21 s per step loading data, 7.0x the other ranks' median "
                            "(30.0 ms); the other ranks wait 0.18 s per step for it in the gradient sync")
    assert found.to_json() == {"rank": 1, "phase": "data", "seconds_per_step": 0.21, "others_median_s": 0.03,
                               "ratio": pytest.approx(7.0), "others_sync_wait_s": 0.18,
                               "threshold": {"ratio": STRAGGLER_RATIO, "share_of_step": STRAGGLER_SHARE,
                                             "others_waited_share": WAITED_SHARE}}


def test_a_slow_compute_rank_among_four_against_the_others_median() -> None:
    ranks = [phases(0, 0.01, 0.050, wait=0.30), phases(1, 0.01, 0.055, wait=0.29),
             phases(2, 0.01, 0.350, wait=0.0), phases(3, 0.01, 0.060, wait=0.29)]
    found = find_straggler(ranks)
    assert (found.rank, found.phase) == (2, "compute") and found.others_median_s == pytest.approx(0.055)
    assert found.others_wait_s == pytest.approx(0.29)
    assert "rank 2 spends 0.35 s per step in forward+backward, 6.4x" in found.line()
    slow_step = find_straggler([phases(0, 0.01, 0.05, optimizer=0.30), phases(1, 0.01, 0.05, optimizer=0.02)])
    assert (slow_step.rank, slow_step.phase) == (0, "optimizer") and "in the optimizer step" in slow_step.line()


def test_below_either_threshold_no_straggler_is_named() -> None:
    # 1.4x the other rank's compute, a large share of the step: ordinary jitter between ranks
    assert find_straggler([phases(0, 0.01, 0.14), phases(1, 0.01, 0.10)]) is None
    # 10x the other rank's data time, but 9 ms of a 0.2 s step: too little to matter
    assert find_straggler([phases(0, 0.010, 0.19), phases(1, 0.001, 0.19)]) is None
    # just past each: 1.55x the other's compute; 24 ms more data time in a 0.226 s step (10.6%)
    assert find_straggler([phases(0, 0.0, 0.31, optimizer=0.0), phases(1, 0.0, 0.20, optimizer=0.0)]).rank == 0
    assert find_straggler([phases(0, 0.025, 0.19), phases(1, 0.001, 0.19)]).phase == "data"
    assert find_straggler([phases(0, 0.5, 0.1)]) is None  # one rank: nothing to compare with


def test_a_rank_the_others_did_not_wait_for_is_no_straggler() -> None:
    """Measured on a loaded machine (FSDP, 3 steps): rank 1's compute 1.8x rank 0's while rank 0 waited 0.3 ms in
    the gradient sync: noise between the ranks' windows, not a rank holding the other back."""
    noisy = [phases(0, 0.001, 0.108, optimizer=0.024, wait=0.0003), phases(1, 0.001, 0.192, 0.011, wait=0.0003)]
    assert find_straggler(noisy) is None
    waited = [phases(0, 0.001, 0.108, optimizer=0.024, wait=0.05), phases(1, 0.001, 0.192, 0.011, wait=0.0003)]
    assert find_straggler(waited).rank == 1  # 50 ms of the 84 ms excess waited for: past half


def test_the_line_without_a_measured_wait_or_a_zero_median() -> None:
    found = find_straggler([phases(0, 0.0, 0.05, wait=None), phases(1, 0.2, 0.05, wait=None)])
    assert found.line() == ("straggler: rank 1 spends 0.20 s per step loading data, against 0 s on the other "
                            "ranks' median (0.0 ms)")
    assert found.ratio is None


def test_gpu_runs_keep_their_phases_but_name_no_straggler() -> None:
    ranks = [{"rank": 0, "steps": [step(0.1, 0.01, 0.01, 0.05)]}, {"rank": 1, "steps": [step(0.1, 0.08, 0.01, 0.0)]}]
    phased = rank_phases(ranks, warmup=0)
    found, note = straggler_of(ranks, phased)
    assert found.rank == 1 and note is None
    gpu = [{**rank, "gpu_async": True} for rank in ranks]
    assert straggler_of(gpu, rank_phases(gpu, warmup=0)) == (None, GPU_NOTE)
    assert straggler_of(gpu[:1], rank_phases(gpu[:1], warmup=0)) == (None, None)  # one rank: nothing to say
