"""The plan against what ranks really hold: DDP, FSDP2 full-shard and grad-op, ZeRO-1/2/3 on 2 and 4 CPU ranks,
a tiny Llama and a tiny BERT, one optimizer step each, measured by the plan's own probe inside every rank.

Each launch trains both models and, where the backend allows it, several settings (ZeRO stages, FSDP reshard
modes) one after the other (tests/data/plan/two_models.py), so five launches cover 2 x 14 measured cases.
Goals from the issue: model states within 2% (they are exact), activations within 15% of the plan.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.plan.activations.trace import trace
from accelkit.plan.buffers import ZERO_REDUCE_BUCKET
from accelkit.plan.catalog import BY_NAME
from accelkit.plan.measure.compare import shape_of, state_figures
from accelkit.plan.models import hf_inputs, hf_step
from accelkit.plan.planner import compute_for

PLAN_DATA = DATA / "plan"
sys.path.insert(0, str(PLAN_DATA))
import tiny_models  # noqa: E402
from rehearse import case, rehearse  # noqa: E402

# name: (backend, ranks, ZeRO stage of the config, script arguments, the (backend detail) cases measured)
LAUNCHES = {
    "ddp-2": ("ddp", 2, "-", (), {"ddp"}),
    "fsdp-2": ("fsdp", 2, "-", ("--fsdp-modes", "full,grad-op"), {"fsdp-full", "fsdp-grad-op"}),
    "zero-2": ("deepspeed", 2, "1", ("--zero-stages", "1,2,3"), {"zero1", "zero2", "zero3"}),
    "fsdp-4": ("fsdp", 4, "-", (), {"fsdp-full"}),
    "zero-4": ("deepspeed", 4, "2", ("--zero-stages", "2,3"), {"zero2", "zero3"}),
}
PRECISION = "bf16-mixed"


@cache
def _records(name: str, folder: str) -> tuple[dict, ...]:
    backend, ranks, stage, args, _ = LAUNCHES[name]
    return tuple(rehearse(backend, ranks, stage, args, Path(folder) / name))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("plan-measured"))
    return lambda name: _records(name, folder)


def model_name(record: dict) -> str:
    return tiny_models.CLASSES[record["model"]]


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_model_states_per_rank_are_what_the_plan_says(measured, launch: str) -> None:
    records = measured(launch)
    _, ranks, _, _, cases = LAUNCHES[launch]
    seen = {(case(r), model_name(r)) for r in records}
    assert seen == {(c, m) for c in cases for m in ("llama", "bert")}, seen
    assert len(records) == ranks * len(cases) * 2
    worst = 0.0
    for record in records:
        for figure in state_figures(record, PRECISION):
            assert figure.measured is not None and figure.measured > 0, (case(record), figure)
            worst = max(worst, abs(figure.error))
            assert abs(figure.error) <= 0.02, (launch, case(record), model_name(record), record["rank"], figure)
    print(f"{launch}: worst model-state error {worst:.4%}")


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_activations_on_every_rank_are_the_traced_ones(measured, launch: str) -> None:
    """The plan's meta-device trace, with the CPU's kernels, against the bytes each rank's forward really saved."""
    from accelkit.plan.models import ModelSpec

    for record in measured(launch):
        name = model_name(record)
        spec = ModelSpec(label=name, build=lambda name=name: tiny_models.build(name), inputs=hf_inputs, step=hf_step)
        batch, seq = record["inputs"]["shapes"]["input_ids"]
        family = {"deepspeed": "deepspeed", "fsdp": "fsdp"}.get(record["backend"], "torch")
        planned = trace(spec, compute_for(family, PRECISION), batch, seq, False, device="cpu").activations
        measured_bytes = record["activations"]["total"]
        assert abs(planned - measured_bytes) <= 0.15 * measured_bytes, (launch, case(record), name, planned,
                                                                        measured_bytes)


def test_fsdp_units_are_the_ones_accelerate_builds(measured) -> None:
    import torch

    from accelkit.plan.shape import shape_from_model

    modes = set()
    for record in measured("fsdp-2") + measured("fsdp-4"):
        name = model_name(record)
        with torch.device("meta"):
            model = tiny_models.build(name)
        tiny_models.embeddings_in_their_own_unit(model)
        shape = shape_from_model(model, name)
        planned = sorted((sorted(shape.tensors[i].name for i in u.params), u.reshard_after_forward)
                         for u in shape.units)
        real = sorted((sorted(u["params"]), u["reshard_after_forward"]) for u in record["fsdp_units"])
        assert [p for p, _ in planned] == [p for p, _ in real], (name, planned, real)
        if case(record) == "fsdp-full":
            assert planned == real
        else:  # grad-op: nothing is freed after the forward
            assert not any(flag for _, flag in real)
        modes.add(case(record))
    assert modes == {"fsdp-full", "fsdp-grad-op"}


def test_bucket_buffers_are_the_planned_ones(measured) -> None:
    from accelkit.plan import buffers, states

    for record in measured("ddp-2") + measured("zero-2"):
        shape = shape_of(record)
        if record["backend"] == "ddp":
            dt = states.dtypes_for("torch", PRECISION)
            bucket = next(p for p in buffers.torch_parts(BY_NAME["ddp"], shape, dt, 0) if "bucket" in p.what)
            assert record["buffers"] == bucket.bytes  # the reducer's own bucket sizes (DDP logging data)
        else:  # one reduce bucket of reduce_bucket_size 16-bit elements, whatever the model size
            assert record["reduce_bucket_size"] == ZERO_REDUCE_BUCKET
            assert ZERO_REDUCE_BUCKET * 2 <= record["buffers"] <= ZERO_REDUCE_BUCKET * 2 * 1.001
