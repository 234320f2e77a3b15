"""The measured window (issue 22, item 5): at least --steps steps AND at least --min-time seconds, decided at
checkpoints every rank reaches together; the probe stops every rank after the same step."""

from __future__ import annotations

import pytest

from accelkit.bench.probe import StepRecorder
from accelkit.bench.window import MAX_GROWTH, next_checkpoint
from accelkit.ranks.probes.steps import StepEvent


def test_done_only_when_both_the_steps_and_the_time_are_reached() -> None:
    assert next_checkpoint(20, 2.5, 2.0, 20) is None
    assert next_checkpoint(20, 2.0, 2.0, 20) is None
    assert next_checkpoint(10, 5.0, 2.0, 20) == 20  # long enough, too few steps
    assert next_checkpoint(0, 0.0, 2.0, 20) == 20


def test_the_minimal_templates_2_ms_steps_measure_over_the_window() -> None:
    # 20 steps of 2 ms = 40 ms: project to 2 s (with a little overshoot), growth capped per checkpoint.
    first = next_checkpoint(20, 0.040, 2.0, 20)
    assert first == 20 * MAX_GROWTH  # 1050 wanted, at most 16x the steps seen so far
    second = next_checkpoint(first, first * 0.002, 2.0, 20)
    assert second == pytest.approx(2.0 * 1.05 / 0.002, abs=1) and second * 0.002 >= 2.0
    assert next_checkpoint(second, second * 0.002, 2.0, 20) is None


def test_slow_steps_keep_the_minimum_steps_only() -> None:
    assert next_checkpoint(20, 20 * 3.0, 2.0, 20) is None  # 3 s steps: 20 of them already exceed the window


def test_min_time_zero_measures_exactly_the_steps() -> None:
    assert next_checkpoint(20, 0.001, 0.0, 20) is None


def test_a_projection_always_moves_forward() -> None:
    assert next_checkpoint(20, 1.99, 2.0, 20) == 22  # 2.0 x 1.05 / 0.0995 = 21.1 -> 22
    assert next_checkpoint(20, 0.0, 2.0, 20) == 20 * MAX_GROWTH  # a clock that did not move


def clock_step(n: int, t: float) -> StepEvent:
    return StepEvent(clock_steps=n, is_clock=True, started=t, finished=t, source="torch", optimizer=object())


def test_the_recorder_moves_the_step_limit_at_checkpoints_until_the_window_is_full(monkeypatch) -> None:
    """One process (no process group needed): 2 warmup steps, at least 4 measured steps and 0.1 s, 10 ms steps."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    limits: list[int] = []
    recorder = StepRecorder(warmup=2, min_steps=4, min_time=0.1, set_limit=limits.append)
    recorder.gradient_bytes = 0  # skip the model inspection
    times = iter(i * 0.01 for i in range(1, 1000))
    monkeypatch.setattr("accelkit.bench.probe.time.perf_counter", lambda: next(times))
    for n in range(1, 2 + 64 + 1):
        if recorder.checkpoint is None and limits and n > limits[-1]:
            break
        if recorder.checkpoint is None and not limits and n > 6:
            break
        recorder.on_step(clock_step(n, n * 0.01))
    measured = recorder.steps[2:]
    assert limits and limits[-1] == len(recorder.steps)  # the last limit is where the run stopped
    assert sum(step["seconds"] for step in measured) >= 0.1 and len(measured) >= 4
    assert recorder.window == "time" and recorder.checkpoint is None


def test_a_script_that_ends_before_the_window_is_full_is_told_how_many_steps_it_needs() -> None:
    from pathlib import Path

    from accelkit.bench.spec import BenchSpec
    from accelkit.bench.stats import summarize
    from accelkit.bench.sweep import short_window_note

    spec = BenchSpec(script="train.py", script_args=(), module=False, world_sizes=(1,), backends=("ddp",), steps=20,
                     warmup=5, min_time=2.0, output=Path("out"))
    ranks = [{"steps": [{"step": i, "seconds": 0.01, "data_wait_s": 0.0, "samples": 4, "tokens": 0}
                        for i in range(1, 101)], "window": "time"}]
    summary = summarize(ranks, warmup=5)  # 95 steps of 10 ms: 0.95 s of the 2 s asked
    note = short_window_note(summary, spec, ranks)
    assert note.startswith("the script ended after 100 steps: 95 measured over 0.95 s, less than the 20 steps / 2 s")
    assert note.endswith("about 225 steps in all)")  # 5 + 2 s x 1.1 / 10 ms
    full = summarize([{**ranks[0], "steps": ranks[0]["steps"] * 3}], warmup=5)
    assert short_window_note(full, spec, ranks) is None
    fixed = [{**ranks[0], "window": "steps (the ranks had no process group to agree on a time window)"}]
    assert short_window_note(full, spec, fixed) == ("measured --steps alone: the ranks had no process group to agree "
                                                    "on a time window")
