"""A pp layout's figures from recorded rank results: the measured bubble per pipeline rank (busy vs schedule time),
the plan's bubble, and the counted point-to-point sends against the plan's figure for the same boundary tensor."""

from __future__ import annotations

import pytest

from accelkit.bench.pipeline_stats import pipeline_figures, plan_schedule, rank_bubble, sent_bytes
from accelkit.plan.pipeline import Pipeline

BOUNDARY = {"rows": 2, "tokens": 32, "hidden": 64, "element_bytes": 4}  # one micro-batch's hidden state: 16 KiB


def rank(stages: list[int], busy: list[float], sent: int, schedule: str = "Schedule1F1B") -> dict:
    steps = [{"seconds": 0.05, "pipeline": {"busy_s": b, "schedule_s": 0.04}} for b in busy]
    comm = {"send@2/2": {"calls": 4, "bytes": sent}, "recv@2/2": {"calls": 4, "bytes": sent},
            "all_reduce@2/2": {"calls": 2, "bytes": 8}}
    return {"steps": steps, "comm_per_step": comm,
            "pipeline": {"stages": stages, "num_stages": 2, "microbatches": 4, "schedule": schedule,
                         "boundary": BOUNDARY if stages[0] == 0 else None}}


def test_bubble_and_bytes_per_pipeline_rank() -> None:
    """dp_shard 2 x pp 2: ranks 0, 1 hold stage 0 and ranks 2, 3 stage 1; the warmup step is left out."""
    ranks = [rank([0], [0.0, 0.03, 0.03], 65536), rank([0], [0.0, 0.02, 0.02], 65536),
             rank([1], [0.0, 0.01, 0.01], 65536), rank([1], [0.0, 0.01, 0.01], 65536)]
    figures = pipeline_figures(ranks, warmup=1, pp=2)
    assert figures is not None and figures.schedule == "1F1B" and figures.microbatches == 4
    assert figures.planned_bubble == pytest.approx(1 / 5)  # (p-1)/(m+p-1)
    first, second = figures.stages
    assert (first.pp_rank, first.stages, second.pp_rank) == (0, (0,), 1)
    assert first.bubble == pytest.approx(1 - (0.75 + 0.5) / 2) and second.bubble == pytest.approx(0.75)
    # 4 micro-batches x 16 KiB: each stage of a 2-stage pipeline sends one boundary tensor per micro-batch
    assert first.p2p_computed == second.p2p_computed == 4 * 16384 == first.p2p_bytes
    assert figures.p2p_bytes == figures.p2p_computed == 65536
    assert figures.to_json()["stages"][1]["bubble"] == pytest.approx(0.75)


def test_no_pipeline_no_figures_and_a_schedule_the_plan_does_not_model() -> None:
    assert pipeline_figures([{"steps": [], "pipeline": None}], 0, 2) is None
    figures = pipeline_figures([rank([0], [0.01], 10, "ScheduleLoopedBFS")], 0, 2)  # torch's, not accelkit's
    assert figures is not None and figures.planned_bubble is None and figures.stages[0].p2p_computed is None
    assert plan_schedule("ScheduleInterleaved1F1B") == "Interleaved1F1B" and plan_schedule(None) is None
    # every schedule config offers is one the plan models (accelkit.pipeline_schedules: one vocabulary)
    assert plan_schedule("ScheduleInterleavedZeroBubble") == "InterleavedZeroBubble"
    assert rank_bubble([{"seconds": 1.0}]) is None and sent_bytes(None) is None


def test_the_plan_counts_each_ranks_sends() -> None:
    """Per micro-batch a stage sends its output on (all but the last) and its input's gradient back (all but the
    first): p = 2 sends m each; a middle rank 2m; interleaved (v = 2) ranks 0 and p-1 send 3m of 4m."""
    assert [Pipeline(2, "1F1B", 4).p2p_sends_of_rank(r) for r in range(2)] == [4, 4]
    assert [Pipeline(4, "1F1B", 8).p2p_sends_of_rank(r) for r in range(4)] == [8, 16, 16, 8]
    assert [Pipeline(2, "Interleaved1F1B", 4).p2p_sends_of_rank(r) for r in range(2)] == [12, 12]
    assert Pipeline(4, "1F1B", 8).p2p_sends() == 16 and Pipeline(1).p2p_sends() == 0
