"""The stall decision on sampled ranks: what counts as progress, and when silence becomes a stall."""

from __future__ import annotations

import pytest

from accelkit.launch.watchdog import RankSample, StallDetector

TIMEOUT = 10.0


def ranks(*states: tuple[float, int, int]) -> list[RankSample]:
    """One sample per rank from (cpu seconds, io bytes, steps); rank r has pid 100 + r."""
    return [RankSample(rank=r, pid=100 + r, cpu_seconds=cpu, io_bytes=io, steps=steps)
            for r, (cpu, io, steps) in enumerate(states)]


def run(detector: StallDetector, timeline) -> list[tuple[float, object]]:
    """Feed (time, samples) pairs; return the stalls reported, with their time."""
    return [(now, stall) for now, samples in timeline if (stall := detector.observe(now, samples)) is not None]


def test_two_idle_ranks_stall_after_the_timeout_and_not_before():
    detector = StallDetector(TIMEOUT)
    found = run(detector, [(t, ranks((1.0, 500, 3), (1.0, 480, 3))) for t in range(0, 15)])
    assert found and found[0][0] == TIMEOUT  # the first moment the window spans the whole timeout
    stall = found[0][1]
    assert stall.idle_ranks == (0, 1) and stall.busy_ranks == () and stall.seconds == TIMEOUT


def test_a_slow_job_that_writes_now_and_then_never_stalls():
    # Idle for 8 s at a time (no CPU), then one collective (its socket writes) and a printed line.
    timeline, io = [], 0
    for t in range(0, 120):
        if t % 9 == 0:
            io += 1000
        timeline.append((t, ranks((0.1, io, 0), (0.1, io, 0))))
    assert run(StallDetector(TIMEOUT), timeline) == []


def test_optimizer_steps_alone_are_progress():
    timeline = [(t, ranks((0.0, 0, t // 5), (0.0, 0, t // 5))) for t in range(0, 60)]
    assert run(StallDetector(TIMEOUT), timeline) == []


def test_all_ranks_computing_without_output_is_progress():
    # e.g. every rank tokenizing its shard for minutes without printing
    timeline = [(t, ranks((0.9 * t, 0, 0), (0.8 * t, 0, 0))) for t in range(0, 60)]
    assert run(StallDetector(TIMEOUT), timeline) == []


def test_one_rank_spinning_while_the_other_waits_is_a_stall():
    # rank 1 in an infinite loop (100% CPU, nothing written), rank 0 waiting in a collective
    timeline = [(t, ranks((2.0 + 0.002 * t, 70, 1), (2.0 + 1.0 * t, 90, 1))) for t in range(0, 30)]
    found = run(StallDetector(TIMEOUT), timeline)
    assert found and found[0][1].idle_ranks == (0,) and found[0][1].busy_ranks == (1,)


def test_housekeeping_threads_do_not_count_as_work():
    # a waiting rank's background threads wake up now and then: well under 5% of a core
    timeline = [(t, ranks((0.03 * t, 10, 0), (0.01 * t, 10, 0))) for t in range(0, 20)]
    assert run(StallDetector(TIMEOUT), timeline)


def test_a_new_set_of_ranks_starts_the_window_over():
    detector = StallDetector(TIMEOUT)
    first = [(t, ranks((1.0, 5, 0), (1.0, 5, 0))) for t in range(0, 8)]
    # torchrun restarted the worker group: new pids, counters from zero
    restarted = [(t, [RankSample(rank=r, pid=200 + r, cpu_seconds=0.5, io_bytes=1, steps=0) for r in (0, 1)])
                 for t in range(8, 30)]
    found = run(detector, first + restarted)
    assert found[0][0] == 8 + TIMEOUT


def test_no_ranks_no_stall():
    detector = StallDetector(TIMEOUT)
    assert run(detector, [(t, []) for t in range(0, 60)]) == []


def test_timeout_must_be_positive():
    with pytest.raises(ValueError):
        StallDetector(0)
