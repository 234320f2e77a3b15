"""The pipeline activation probe of benchmarks/plan_accuracy.py (tests/data/nd/pp_activations_probe.py): its running
count of saved-for-backward bytes peaks at what is in flight, falls back to zero once every backward ran, and leaves
the gradients as they are without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from accelkit.plan.activations import count

PROBE = Path(__file__).resolve().parents[2] / "data" / "nd" / "pp_activations_probe.py"


def _probe():
    spec = importlib.util.spec_from_file_location("pp_activations_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _microbatch_losses(model, inputs):
    return [torch.nn.functional.gelu(model(x)).square().sum() for x in inputs]


def test_peak_is_the_micro_batches_in_flight_and_all_is_released_after_their_backward():
    probe = _probe()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    inputs = [torch.randn(4, 8) for _ in range(3)]

    one = probe._Live(count)
    with torch.autograd.graph.saved_tensors_hooks(one.pack, probe._unpack):
        _microbatch_losses(model, inputs[:1])[0].backward()
    assert one.peak > 0 and one.live == 0

    model.zero_grad()
    live = probe._Live(count)
    with torch.autograd.graph.saved_tensors_hooks(live.pack, probe._unpack):
        first, second = _microbatch_losses(model, inputs[:2])  # two forwards in flight, as 1F1B's warm-up
        first.backward()
        assert live.live == one.peak  # the first micro-batch's saved tensors went with its backward
        (third,) = _microbatch_losses(model, inputs[2:])
        second.backward()
        third.backward()
    assert live.peak == 2 * one.peak  # inputs differ, so no storage is shared between micro-batches
    assert live.live == 0 and not live.refs
    probed = [p.grad.clone() for p in model.parameters()]

    # a forward no backward follows (pipelining's shape inference), dropped: its bytes go with it, Tanh's saved
    # output included (held with its grad_fn it would keep its own node alive in a cycle)
    dropped = probe._Live(count)
    with torch.autograd.graph.saved_tensors_hooks(dropped.pack, probe._unpack):
        _microbatch_losses(model, inputs[:1])
    assert dropped.peak == one.peak and dropped.live == 0

    model.zero_grad()
    for loss in _microbatch_losses(model, inputs):
        loss.backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(probed, model.parameters(), strict=True))


def test_a_cached_stage_output_counts_until_its_backward_once_per_storage_and_apart_from_saved():
    """What torch's stage keeps in fwd_cache (its output) counts in `peak` while the wrapper lives, not in
    `peak_saved`; a storage both saved and cached counts once."""
    probe = _probe()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    alone = probe._Live(count)
    with torch.autograd.graph.saved_tensors_hooks(alone.pack, probe._unpack):
        model(x).sum().backward()

    live = probe._Live(count)
    with torch.autograd.graph.saved_tensors_hooks(live.pack, probe._unpack):
        out = model(x)
        cached = [live.cache(out)]  # the output no op saved: 4 x 8 fp32
        tanh_out = model[1](model[0](y))  # Tanh saves its output: cache that very tensor too
        also = live.cache(tanh_out)
        assert live.live == 2 * alone.peak + out.numel() * 4  # the tanh output both saved and cached: once
        out.sum().backward()
        del also
        tanh_out.sum().backward()
        assert live.live_saved == 0 and live.live == out.numel() * 4
        cached.clear()  # the micro-batch's backward returned: fwd_cache's entry is gone
    assert live.live == 0 and not live.refs
    assert live.peak_saved == 2 * alone.peak and live.peak == 2 * alone.peak + out.numel() * 4
