"""Rehearsal fidelity on scripts nobody here wrote: Accelerate's own multi-GPU CI scripts (the cheap pairs of
benchmarks/accelerate_test_scripts.py that used to fail: a hang, and hand-built DDP), a hand-written DDP script in
the style of PyTorch's DDP tutorial, and the FSDP1 rehearsal of a template down to its final `get_state_dict` (which
used to segfault)."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import DATA, OP_CACHE, run_accelkit
from safetensors.torch import load_file

from accelkit.scaffold import init_project

TUTORIAL = DATA / "rehearsal" / "ddp_tutorial.py"


def accelerate_script(name: str) -> Path:
    import accelerate

    return Path(accelerate.__file__).resolve().parent / "test_utils" / "scripts" / name


def launch(cwd: Path, backend: str, *args: str, timeout: float = 400):
    env = {"OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(OP_CACHE)}
    return run_accelkit("launch", "--cpu", "--backend", backend, "--num-processes", "2", "--stall-timeout", "120",
                        *args, cwd=cwd, env=env, timeout=timeout)


def test_distributed_data_loop_joins_uneven_inputs_instead_of_hanging(tmp_path):
    # Accelerate's join_uneven_inputs does nothing on its CPU type, so this script used to hang at "Test joining
    # uneven inputs" (rank 0 in DDP's gradient all-reduce, rank 1 already in the next collective).
    proc = launch(tmp_path, "ddp", str(accelerate_script("test_distributed_data_loop.py")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Test joining uneven inputs" in proc.stdout
    assert "Test DataLoader with sampler as an instance of `BatchSampler`" in proc.stdout  # ran to the end
    assert "only supported for multi-GPU training" not in proc.stderr  # the warning that Join was skipped


def test_hand_built_ddp_with_device_ids_and_comm_hooks(tmp_path):
    # The script wraps a model in DistributedDataParallel(device_ids=[i], output_device=i) itself and compares the
    # gradients with Accelerate's, for every DDP communication hook (bf16 ones included).
    proc = launch(tmp_path, "ddp", str(accelerate_script("test_ddp_comm_hook.py")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("Test DDP comm hook: batched_power_sgd, comm wrapper: bf16") == 2
    assert "DistributedDataParallel(device_ids=[0], output_device=0) of a CPU module runs without device ids" in (
        proc.stderr)


def test_pytorch_tutorial_style_ddp_script(tmp_path):
    proc = launch(tmp_path, "ddp", str(TUTORIAL))
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = sorted(re.findall(r"TUTORIAL rank=(\d) world=2 same_weights=(\w+) device=(\w+) current_device=(\d)",
                              proc.stdout))
    assert lines == [("0", "True", "cpu", "0"), ("1", "True", "cpu", "1")]  # DDP averaged gradients: same weights
    mapped = [line for line in proc.stderr.splitlines() if line.startswith("accelkit: rehearsal on CPU:")]
    assert [line.split(": ", 2)[2].split(" at ")[0] for line in mapped] == [
        "torch.cuda.set_device(0) does nothing",
        "init_process_group(backend='nccl') uses gloo",
        "module.to(device(type='cuda', index=0)) keeps it on the CPU",
        "module.cuda() keeps it on the CPU",
        "DistributedDataParallel(device_ids=[0], output_device=0) of a CPU module runs without device ids",
        "tensor.to(device(type='cuda', index=0)) keeps it on the CPU",
        "tensor.cuda() keeps it on the CPU",
    ]
    assert all(f"{TUTORIAL}:" in line for line in mapped)  # each names the script's line


def test_fsdp1_rehearsal_writes_the_final_model(tmp_path):
    project = init_project(tmp_path / "run", "minimal", backend="fsdp").directory
    proc = launch(project, "fsdp", "--fsdp-version", "1", "train.py", "--max-steps", "2", "--checkpoint-every", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    final = project / "outputs" / "final" / "model.safetensors"
    assert final.is_file()
    merged = tmp_path / "merged.safetensors"
    merge = run_accelkit("merge-ckpt", str(project / "outputs" / "checkpoint-2"), "-o", str(merged),
                         env={"OMP_NUM_THREADS": "1"})
    assert merge.returncode == 0, merge.stderr
    # get_state_dict (FULL_STATE_DICT, offload_to_cpu, rank0_only) gathered exactly the sharded checkpoint's weights.
    expected, got = load_file(merged), load_file(final)
    assert set(expected) == set(got) and all(expected[k].equal(got[k]) for k in got)
