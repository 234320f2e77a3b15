"""The probe's bookkeeping in one process: batch sizes, the outermost loader timed once, steps closed with the
training loader's samples only, time blocked on data separated from the rest."""

from __future__ import annotations

import time
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelkit.bench.loaders import BatchSize, LoaderHooks, batch_size
from accelkit.bench.probe import StepRecorder
from accelkit.bench.sync_wait import SyncWaitClock
from accelkit.ranks.probes.steps import StepEvent


def test_batch_sizes() -> None:
    assert batch_size(torch.zeros(5, 3)) == BatchSize(5, 0)
    assert batch_size((torch.zeros(4, 2), torch.zeros(4))) == BatchSize(4, 0)
    assert batch_size({"input_ids": torch.zeros(3, 16), "labels": torch.zeros(3, 16)}) == BatchSize(3, 48)
    assert batch_size({"pixel_values": torch.zeros(6, 3, 8, 8), "labels": torch.zeros(6)}) == BatchSize(6, 0)
    assert batch_size([{"x": torch.zeros(2, 2)}]) == BatchSize(2, 0)
    assert batch_size(["a", "b", "c"]) == BatchSize(3, 0)  # text not yet tokenised: one sample per item
    pair = namedtuple("pair", "x y")
    assert batch_size(pair(torch.zeros(7, 1), torch.zeros(7))) == BatchSize(7, 0)


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch):
    fetched: list[tuple[int, float, float, BatchSize]] = []
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)  # undone after the test
    installed = LoaderHooks(lambda *event: fetched.append(event))
    installed.install()
    return installed, fetched


class Slow(TensorDataset):
    def __getitem__(self, index):
        time.sleep(0.01)
        return super().__getitem__(index)


def test_the_outermost_loader_is_timed_once_per_batch(hooks) -> None:
    _, fetched = hooks
    loader = DataLoader(Slow(torch.zeros(10, 2)), batch_size=4)
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert [event[3].samples for event in fetched] == [4, 4, 2]
    assert {event[0] for event in fetched} == {id(loader)}
    waits = [finished - started for _, started, finished, _ in fetched]
    assert waits[0] >= 0.04 and waits[2] >= 0.02  # the sleeping __getitem__ is inside the timed next()

    class Outer:  # a wrapper loader iterating a DataLoader inside its own iteration, like Accelerate's
        def __iter__(self):
            yield from DataLoader(TensorDataset(torch.zeros(6, 1)), batch_size=3)

    fetched.clear()
    hooks[0]._wrap(Outer)
    assert len(list(Outer())) == 2
    assert [event[3].samples for event in fetched] == [3, 3]  # counted once, not once per layer


def step(number: int, started: float, finished: float) -> StepEvent:
    return StepEvent(clock_steps=number, is_clock=True, started=started, finished=finished, source="torch",
                     optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(3, 4))], lr=0.1))


def test_steps_take_samples_from_the_training_loader_only() -> None:
    recorder = StepRecorder()
    train, evaluation = 1, 2
    recorder.on_fetch(train, 10.0, 10.5, BatchSize(8, 128))  # first fetch starts step 1
    recorder.on_fetch(train, 11.0, 11.2, BatchSize(8, 128))  # accumulation: two micro-batches per step
    recorder.on_step(step(1, 11.5, 12.0))
    recorder.on_fetch(evaluation, 12.1, 12.4, BatchSize(4, 64))  # evaluation between steps
    recorder.on_fetch(train, 12.5, 12.6, BatchSize(8, 128))
    recorder.on_step(step(2, 12.8, 13.0))
    recorder.on_step(StepEvent(2, False, 13.0, 13.1, "torch", None))  # another optimizer's step: not the clock
    one, two = recorder.steps
    assert one == {"step": 1, "seconds": pytest.approx(2.0), "data_wait_s": pytest.approx(0.7),
                   "optimizer_s": pytest.approx(0.5), "sync_wait_s": None, "samples": 16, "tokens": 256}
    assert two == {"step": 2, "seconds": pytest.approx(1.0), "data_wait_s": pytest.approx(0.4),
                   "optimizer_s": pytest.approx(0.2), "sync_wait_s": None, "samples": 8, "tokens": 128}
    assert recorder.other_samples == 4
    assert recorder.gradient_bytes == 3 * 4 * 4  # the optimizer's fp32 parameters


def test_steps_without_a_loader_start_at_the_step_call() -> None:
    recorder = StepRecorder()
    recorder.on_step(step(1, 5.0, 5.25))
    assert recorder.steps[0]["seconds"] == pytest.approx(0.25) and recorder.steps[0]["samples"] == 0
    result = recorder.result("step limit", loader_seconds=0.0)
    assert result["reason"] == "step limit" and result["peak_memory_bytes"] > 0 and result["memory_kind"]


def test_starting_a_loaders_workers_counts_as_data_wait(hooks) -> None:
    _, fetched = hooks

    class SlowStart(DataLoader):
        def __iter__(self):
            time.sleep(0.05)  # like spawning worker processes
            return super().__iter__()

    hooks[0]._wrap(SlowStart)
    assert len(list(SlowStart(TensorDataset(torch.zeros(4, 1)), batch_size=2))) == 2
    (first_id, started, finished, _), second = fetched
    assert finished - started >= 0.05 and second[2] - second[1] < 0.05


class SlowBackward(torch.autograd.Function):
    """The rank's own backward work: sleeps before the parameter's gradient is complete."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.1)
        return grad


def test_the_sync_wait_is_the_backward_after_the_last_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP waits for the other ranks in a callback queued on autograd's engine (its finalize_backward) after the
    rank's last gradient: the same shape here, with a sleep standing in for the wait."""
    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)  # undone after the test
    clock = SyncWaitClock()
    clock._hook_backward()
    weight = torch.nn.Parameter(torch.ones(4))

    def queue_the_wait(_param) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: time.sleep(0.05))

    weight.register_post_accumulate_grad_hook(queue_the_wait)
    SlowBackward.apply(weight * 2).sum().backward()
    assert clock.close_step() is None  # gradients not watched yet: nothing measured (the first, warmup step)
    recorder = StepRecorder(sync_wait=clock)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    recorder.on_step(StepEvent(1, True, 1.0, 1.1, "torch", optimizer))  # the first step hooks its parameters
    SlowBackward.apply(weight * 2).sum().backward()
    SlowBackward.apply(weight * 2).sum().backward()  # accumulation: two backward passes in one step
    started = time.perf_counter()
    recorder.on_step(StepEvent(2, True, started, started + 0.001, "torch", optimizer))
    wait = recorder.steps[1]["sync_wait_s"]
    assert 2 * 0.05 <= wait < 2 * 0.05 + 0.1  # the queued waits, not the 2 x 0.1 s of the rank's own backward
    assert recorder.steps[1]["optimizer_s"] == pytest.approx(0.001)
