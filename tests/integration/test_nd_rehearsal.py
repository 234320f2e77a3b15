"""N-D layouts rehearsed on real gloo ranks through `accelkit launch --cpu` (issue 22, items 1, 2 and 4).

One tiny Llama, three steps, the same global batch: tensor parallelism 2 (the model split by its TP plan, DTensor
weights), HSDP 2 x 2 (FSDP2 over Accelerate's dp_replicate x dp_shard mesh) and FSDP2 2 x TP 2 (on the newest
releases through accelkit.ranks.fsdp2_tp_compat; unpatched on constraints/nd-layouts.txt, CI's second N-D leg) give
the one-process losses, resume exactly from their checkpoint, and `accelkit merge-ckpt` rebuilds the model bit for
bit from that checkpoint, loadable with from_pretrained. Sequence parallelism 2 (DeepSpeed Ulysses) gives the
one-process losses. Kept small: 4 ranks on the 2-core CI machine (8 for HSDP x TP).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA, run_accelkit

from accelkit.configs.mesh import Mesh

SCRIPT = DATA / "nd" / "train_nd.py"
SP_SCRIPT = DATA / "nd" / "train_sp.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny Llama saved once, and its one-process run (the reference)."""
    root = tmp_path_factory.mktemp("nd")
    code = ("import torch; from transformers import LlamaConfig, LlamaForCausalLM; torch.manual_seed(0); "
            "c = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, "
            "num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64); "
            f"LlamaForCausalLM(c).save_pretrained({str(root / 'base')!r})")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    one = root / "one"
    one.mkdir()
    shutil.copytree(root / "base", one / "base")
    subprocess.run([sys.executable, str(SCRIPT), str(one)], check=True, timeout=300, capture_output=True)
    return root


WORKAROUND_NOTE = "FSDP2 x TP through accelkit's workaround"


def run_layout(base: Path, name: str, layout: str, *flags: str, workaround: bool = False) -> tuple[dict, dict, Path]:
    """`workaround`: the launch must (True) or must not (False) go through accelkit.ranks.fsdp2_tp_compat."""
    work = base / name
    work.mkdir()
    shutil.copytree(base / "base", work / "base")
    proc = run_accelkit("launch", "--cpu", *flags, str(SCRIPT), str(work), cwd=work, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"layout={layout}" in proc.stderr  # the launch summary names the layout
    assert (WORKAROUND_NOTE in proc.stderr) == workaround  # compatible versions run unpatched
    reference = json.loads((base / "one" / "result.json").read_text())
    return json.loads((work / "result.json").read_text()), reference, work


def check_merge(work: Path) -> None:
    """merge-ckpt of the layout's checkpoint equals the model gathered in the run, and loads with from_pretrained."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    out = work / "merged"
    proc = run_accelkit("merge-ckpt", str(work / "ckpt"), "-o", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged, full = load_file(str(out / "model.safetensors")), load_file(str(work / "full.safetensors"))
    assert sorted(merged) == sorted(full)
    for key, tensor in full.items():
        assert merged[key].dtype == tensor.dtype and torch.equal(merged[key], tensor), key
    shutil.copy(work / "base" / "config.json", out / "config.json")
    model = LlamaForCausalLM.from_pretrained(out)
    assert torch.equal(model.state_dict()["lm_head.weight"], full["lm_head.weight"])


def assert_plan_predicts_the_states(result: dict, layout) -> None:
    """`accelkit plan`'s N-D row for the layout gives rank 0's measured parameters, gradients and moments (2%)."""
    from accelkit.plan import nd
    from accelkit.plan.nd_report import tp_plan_of

    model = nd.Model.llama(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, intermediate=64)
    row = nd.row(layout, model, gpus=layout.world, nodes=1, gpu_memory=None, seq_len=16,
                 tp_plan=tp_plan_of("LlamaForCausalLM"))  # the installed transformers' plan
    measured = sum(result["state_bytes"].values())
    assert row.states == pytest.approx(measured, rel=0.02), (row.states, result["state_bytes"])


def assert_same_run(result: dict, reference: dict) -> None:
    for got, want in zip(result["losses"], reference["losses"], strict=True):
        assert math.isclose(got, want, rel_tol=1e-5), (result["losses"], reference["losses"])
    assert result["resumed"] == result["losses"][2]  # load_state restored the step-2 state exactly


def test_tensor_parallel_2_matches_one_process_resumes_and_merges(base: Path):
    result, reference, work = run_layout(base, "tp2", "tp 2", "--backend", "ddp", "--num-processes", "2",
                                         "--tp-size", "2")
    assert result["mesh"] == {"tp": 2} and result["dtensor"]
    assert_same_run(result, reference)
    from accelkit.plan import nd

    assert_plan_predicts_the_states(result, nd.Layout("ddp", Mesh(tp=2)))
    check_merge(work)


def test_hsdp_2x2_matches_one_process_resumes_and_merges(base: Path):
    result, reference, work = run_layout(base, "hsdp", "dp_replicate 2 x dp_shard 2", "--backend", "fsdp",
                                         "--num-processes", "4", "--dp-replicate-size", "2", "--dp-shard-size", "2")
    assert result["mesh"] == {"dp_replicate": 2, "dp_shard": 2} and result["dtensor"]
    assert result["distributed_type"].endswith("FSDP")
    assert_same_run(result, reference)
    from accelkit.plan import nd

    assert_plan_predicts_the_states(result, nd.Layout("fsdp", Mesh(dp_replicate=2, dp_shard=2)))
    check_merge(work)


def test_fsdp2_x_tp_2x2_matches_one_process_resumes_and_merges_or_is_refused_by_version(base: Path):
    """dp_shard 2 x tp 2 (Accelerate's FSDP2+TP preparation over a 2-D mesh). With the newest releases (transformers
    without the ReplicateParallel Accelerate imports: the default install) through accelkit's workaround, and
    unpatched under a version set that has it (constraints/nd-layouts.txt, CI's second N-D leg), it trains like one
    process, resumes exactly and merges bit for bit; a set that lacks both is refused in one line before any rank
    starts."""
    from accelkit.configs import compat
    from accelkit.plan import nd

    flags = ("--backend", "fsdp", "--num-processes", "4", "--dp-shard-size", "2", "--tp-size", "2")
    gap = compat.fsdp2_tp_gap()
    if gap is not None:
        work = base / "fsdp2-tp-refused"
        work.mkdir()
        proc = run_accelkit("launch", "--cpu", *flags, str(SCRIPT), str(work), cwd=work, timeout=120)
        assert proc.returncode != 0
        assert gap.message in proc.stderr and "transformers==5.0.0" in gap.hint
        assert "Traceback" not in proc.stderr and "[rank" not in proc.stderr  # refused before any rank started
        assert sorted(p.name for p in work.iterdir()) == []
        return
    result, reference, work = run_layout(base, "fsdp2-tp", "dp_shard 2 x tp 2", *flags,
                                         workaround=compat.fsdp2_tp_workaround_needed())
    assert result["mesh"] == {"dp_shard": 2, "tp": 2} and result["dtensor"]
    assert result["distributed_type"].endswith("FSDP")
    assert_same_run(result, reference)
    assert_plan_predicts_the_states(result, nd.Layout("fsdp", Mesh(dp_shard=2, tp=2)))
    check_merge(work)


def test_hsdp_x_fsdp2_x_tp_2x2x2_on_eight_ranks_matches_one_process_or_is_refused_by_version(base: Path):
    """dp_replicate 2 x dp_shard 2 x tp 2 (HSDP x TP, a 3-D mesh, 8 gloo ranks): like FSDP2 x TP, on the newest
    releases through accelkit's workaround (and unpatched on the pinned set, run by hand: CI's pinned N-D leg takes
    `-k "fsdp2_x_tp and not hsdp"`, eight ranks cost minutes), it trains like one process, resumes exactly and
    merges bit for bit."""
    from accelkit.configs import compat
    from accelkit.plan import nd

    flags = ("--backend", "fsdp", "--num-processes", "8", "--dp-replicate-size", "2", "--dp-shard-size", "2",
             "--tp-size", "2")
    gap = compat.fsdp2_tp_gap()
    if gap is not None:
        work = base / "hsdp-tp-refused"
        work.mkdir()
        proc = run_accelkit("launch", "--cpu", *flags, str(SCRIPT), str(work), cwd=work, timeout=120)
        assert proc.returncode != 0 and gap.message in proc.stderr
        assert "Traceback" not in proc.stderr and "[rank" not in proc.stderr
        assert sorted(p.name for p in work.iterdir()) == []
        return
    result, reference, work = run_layout(base, "hsdp-tp", "dp_replicate 2 x dp_shard 2 x tp 2", *flags,
                                         workaround=compat.fsdp2_tp_workaround_needed())
    assert result["mesh"] == {"dp_replicate": 2, "dp_shard": 2, "tp": 2} and result["dtensor"]
    assert_same_run(result, reference)
    assert_plan_predicts_the_states(result, nd.Layout("fsdp", Mesh(dp_replicate=2, dp_shard=2, tp=2)))
    check_merge(work)


def test_sequence_parallel_2_matches_one_process_resumes_and_merges(base: Path):
    """sp 2 (DeepSpeed Ulysses through Accelerate, ZeRO-2): each micro-batch split along the sequence over 2 ranks
    gives the one-process loss at every step (each shard's loss weighted by its tokens, the model in train mode:
    Accelerate registers Ulysses with disable_in_eval, and in eval mode each rank attends over its shard alone),
    resumes exactly from its checkpoint, and the checkpoint merges bit for bit."""
    losses = {}
    for name in ("sp-one", "sp2"):
        work = base / name
        work.mkdir()
        shutil.copytree(base / "base", work / "base")
        if name == "sp-one":
            subprocess.run([sys.executable, str(SP_SCRIPT), str(work)], check=True, timeout=300, capture_output=True)
        else:
            proc = run_accelkit("launch", "--cpu", "--backend", "deepspeed", "--num-processes", "2", "--sp-size", "2",
                                str(SP_SCRIPT), str(work), cwd=work, timeout=500)
            assert proc.returncode == 0, proc.stderr[-4000:]
            assert "layout=sp 2" in proc.stderr
        result = json.loads((work / "result.json").read_text())
        losses[name] = result["losses"]
    assert result["sp"] == 2 and result["distributed_type"].endswith("DEEPSPEED")
    assert len(losses["sp2"]) == 4
    for got, want in zip(losses["sp2"], losses["sp-one"], strict=True):
        assert math.isclose(got, want, rel_tol=1e-5), losses
    assert result["resumed"] == losses["sp2"][2:]  # load_state restored the step-2 ZeRO state exactly
    check_merge(base / "sp2")


def test_causal_lm_template_loads_its_model_with_the_tp_plan_and_resumes(tmp_path: Path):
    """The causal-lm template under tp 2 reads the layout, loads the model split by its TP plan (transformers'
    DistributedConfig), trains like one process, checkpoints with DCP and resumes to the same final weights."""
    import torch
    from safetensors.torch import load_file

    template = Path(__file__).resolve().parents[2] / "templates" / "causal-lm"
    project = tmp_path / "project"
    shutil.copytree(template, project)
    common = ("--max-steps", "4", "--checkpoint-every", "2", "--block-size", "64", "--eval-every", "0")
    one = subprocess.run([sys.executable, str(project / "train.py"), *common, "--output-dir", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    tp = ("launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "--tp-size", "2", str(project / "train.py"))
    run = run_accelkit(*tp, *common, "--output-dir", str(tmp_path / "tp"), timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "x 1 data-parallel processes" in run.stdout + run.stderr
    (tmp_path / "tp" / "final").rename(tmp_path / "tp-final")
    resumed = run_accelkit(*tp, *common, "--output-dir", str(tmp_path / "tp"), "--resume-from-checkpoint",
                           str(tmp_path / "tp" / "checkpoint-2"), timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    single = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    split = load_file(str(tmp_path / "tp-final" / "model.safetensors"))
    again = load_file(str(tmp_path / "tp" / "final" / "model.safetensors"))
    assert sorted(single) == sorted(split) == sorted(again)
    for key, tensor in single.items():
        assert torch.allclose(split[key], tensor, rtol=1e-4, atol=1e-6), key
        assert torch.equal(again[key], split[key]), key  # resuming from checkpoint-2 changes nothing


def test_causal_lm_template_under_fsdp2_x_tp_trains_like_one_process(tmp_path: Path):
    """The causal-lm template under dp_shard 2 x tp 2 (the user's command unchanged, on whatever versions run it:
    the newest through accelkit's workaround, the pinned set unpatched) ends with the weights of one process that
    takes the same global batch of 16 blocks."""
    import torch
    from safetensors.torch import load_file

    template = Path(__file__).resolve().parents[2] / "templates" / "causal-lm"
    project = tmp_path / "project"
    shutil.copytree(template, project)
    common = ("--max-steps", "4", "--checkpoint-every", "0", "--block-size", "64", "--eval-every", "0")
    one = subprocess.run([sys.executable, str(project / "train.py"), *common, "--per-device-batch-size", "16",
                          "--output-dir", str(tmp_path / "one")], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    run = run_accelkit("launch", "--cpu", "--backend", "fsdp", "--num-processes", "4", "--tp-size", "2",
                       str(project / "train.py"), *common, "--per-device-batch-size", "8",
                       "--output-dir", str(tmp_path / "fsdp2-tp"), timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "layout=dp_shard 2 x tp 2" in run.stderr and "x 2 data-parallel processes" in run.stdout + run.stderr
    single = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    split = load_file(str(tmp_path / "fsdp2-tp" / "final" / "model.safetensors"))
    assert sorted(single) == sorted(split)
    for key, tensor in single.items():
        assert torch.allclose(split[key], tensor, rtol=1e-4, atol=1e-6), key
