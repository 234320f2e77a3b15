"""FSDP2 x TP on the newest transformers (accelkit.ranks.fsdp2_tp_compat): the launch adds the rank module only for
an FSDP2 layout with tp > 1 on versions that need it, the module patches nothing on compatible versions, and what it
provides behaves like the class Accelerate imports (the 4-rank runs: tests/integration/test_nd_rehearsal.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from accelkit import package_files
from accelkit.configs import ConfigOptions, compat, machine_defaults
from accelkit.configs.resolve import resolve_config
from accelkit.launch.build_plan import fsdp2_tp_workaround
from accelkit.ranks import fsdp2_tp_compat


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)
    monkeypatch.setattr(compat, "gaps", lambda **_: iter(()))  # the layout rules alone


def config(**given):
    return resolve_config(ConfigOptions(**given), launch=True)


@pytest.mark.parametrize("needed", [True, False])
def test_launch_adds_the_rank_module_only_for_fsdp2_x_tp_on_versions_that_need_it(monkeypatch, needed):
    monkeypatch.setattr(package_files, "fsdp2_tp_workaround_needed", lambda: needed)
    expected = [fsdp2_tp_compat.MODULE] if needed else []
    assert fsdp2_tp_workaround(config(backend="fsdp", num_processes=4, tp_size=2)) == expected
    assert fsdp2_tp_workaround(config(backend="fsdp", num_processes=8, dp_replicate_size=2, tp_size=2)) == expected
    # Nothing for layouts without TP under FSDP2, or TP without FSDP.
    assert fsdp2_tp_workaround(config(backend="fsdp", num_processes=4, dp_replicate_size=2)) == []
    assert fsdp2_tp_workaround(config(backend="ddp", num_processes=2, tp_size=2)) == []


def test_install_patches_nothing_on_compatible_versions(monkeypatch):
    from accelerate import Accelerator

    monkeypatch.setattr(package_files, "fsdp2_tp_workaround_needed", lambda: False)
    before = Accelerator._prepare_tp
    fsdp2_tp_compat.install()
    assert Accelerator._prepare_tp is before and not hasattr(before, "_accelkit_fsdp2_tp")


RANK = r"""
import json, os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from transformers import LlamaConfig, LlamaForCausalLM
from accelkit.ranks import fsdp2_tp_compat
from accelkit.package_files import fsdp2_tp_workaround_needed

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters())
ids = torch.randint(0, 64, (2, 8))
whole = model(input_ids=ids).logits
needed = fsdp2_tp_workaround_needed()  # the TP plan is applied with the newest transformers' API
split = fsdp2_tp_compat.split_by_tp_plan(model, [optimizer], mesh) if needed else None
again = fsdp2_tp_compat.split_by_tp_plan(model, [optimizer], mesh) if needed else None
params = dict(model.named_parameters())
norm = model.model.norm
plain = norm(whole[..., :32].detach())
norm.weight = torch.nn.Parameter(DTensor.from_local(norm.weight.detach(), mesh, [Replicate()]))
for _ in range(2):  # Accelerate calls it once per parameter of the module
    fsdp2_tp_compat.ReplicateParallel().prepare_module_tp(norm, mesh)
hooked = norm(whole[..., :32].detach())
fsdp2_tp_compat.install(); fsdp2_tp_compat.install()
from accelerate import Accelerator
from transformers.integrations.tensor_parallel import ReplicateParallel
print(json.dumps({
    "needed": needed, "split": split, "again": again,
    "dtensors": sorted(n for n, p in params.items() if isinstance(p, DTensor)),
    "optimizer_follows": [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in params.values()],
    "same_logits": torch.allclose(model(input_ids=ids).logits, whole, atol=1e-6),
    "hooks": [len(norm._forward_pre_hooks), len(norm._forward_hooks)],
    "norm_local": not isinstance(hooked, DTensor), "norm_same": torch.equal(hooked, plain),
    "provided": ReplicateParallel is fsdp2_tp_compat.ReplicateParallel,
    "wrapped_once": getattr(Accelerator._prepare_tp, "_accelkit_fsdp2_tp", False)
                    and not hasattr(Accelerator._prepare_tp.__wrapped__, "_accelkit_fsdp2_tp"),
}))
dist.destroy_process_group()
"""


@pytest.mark.slow  # one gloo process with torch and transformers (seconds)
def test_split_by_tp_plan_and_replicate_parallel_on_a_real_process_group(tmp_path):
    """One gloo rank: the model's TP plan makes its planned weights DTensors with the same logits, the optimizer
    follows them, a second call leaves the model alone; the provided ReplicateParallel hooks a module once and keeps
    its output local and unchanged; install() provides the class and wraps Accelerate's preparation once."""
    from accelkit.launch.ports import free_port

    proc = subprocess.run([sys.executable, "-c", RANK], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PORT": str(free_port())})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hooks"] == [1, 1] and result["norm_local"] and result["norm_same"] and result["same_logits"]
    if not result["needed"]:  # a transformers that has the class (constraints/nd-layouts.txt): left as it is
        assert not result["provided"] and not result["wrapped_once"]
        return
    assert result["split"] and not result["again"]
    assert "model.layers.0.self_attn.q_proj.weight" in result["dtensors"]
    assert "model.layers.0.mlp.down_proj.weight" in result["dtensors"]
    assert "model.norm.weight" not in result["dtensors"]  # left whole by the plan: Accelerate replicates it
    assert result["optimizer_follows"]
    assert result["provided"] and result["wrapped_once"]
