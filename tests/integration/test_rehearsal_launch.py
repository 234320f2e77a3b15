"""Real 2-rank CPU rehearsals of an unmodified Accelerate script: FSDP2 (bf16), FSDP1 and DeepSpeed ZeRO-3.

Each test builds the plan with `rehearse_dict`, writes its launch config, and starts
`accelerate launch --config_file <cfg> -m accelkit.ranks.bootstrap probe.py` with the plan's env, exactly as
`accelkit launch --cpu` does. The probe prints what Accelerate really ran; the checkpoint on disk is inspected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import DATA
from helpers.rehearsal import rehearse_dict

PROBE = DATA / "rehearsal" / "probe.py"


def rehearse(config: dict, tmp_path: Path, *probe_args: str) -> tuple[list[dict], Path]:
    plan = rehearse_dict(config)
    config_file = tmp_path / "launch.yaml"
    config_file.write_text(yaml.safe_dump(plan.launch_config))
    env = {**os.environ, **plan.env, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--main_process_port", "0", "-m", "accelkit.ranks.bootstrap", str(PROBE), str(tmp_path), *probe_args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, text=True, capture_output=True, timeout=400)
    assert proc.returncode == 0, f"rehearsal failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr[-6000:]}"
    probes = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("probe_rank*.json"))]
    assert sorted(p["rank"] for p in probes) == [0, 1], proc.stdout
    for probe in probes:
        assert probe["world_size"] == 2 and probe["backend"] == "gloo" and probe["losses_finite"]
        # load_state really restored the saved weights (the extra step had moved them).
        assert probe["moved_loss"] != probe["saved_loss"]
        assert probe["restored_loss"] == probe["saved_loss"]
    return probes, tmp_path / "ckpt"


def test_fsdp2_bf16_rehearsal_shards_parameters_and_writes_dcp(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    config = {"distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "bf16",
              "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "NO_WRAP",
                              "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_reshard_after_forward": True,
                              "fsdp_cpu_ram_efficient_loading": False}}
    probes, ckpt = rehearse(config, tmp_path)
    for probe in probes:
        assert probe["distributed_type"] == "FSDP"
        assert probe["wrapper"].startswith("FSDP")  # fully_shard's dynamic FSDP<Module> class
        assert probe["is_dtensor"]
        assert probe["first_param_shape"] == [16, 8] and probe["local_shard_shape"] == [8, 8]
    model_dir = ckpt / "pytorch_model_fsdp_0"
    assert sorted(p.name for p in model_dir.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert (ckpt / "optimizer_0" / ".metadata").is_file()
    metadata = dcp.FileSystemReader(str(model_dir)).read_metadata().state_dict_metadata
    # Accelerate saves the model under a "model." prefix; every tensor has its global shape and one chunk per rank.
    assert {name: list(meta.size) for name, meta in metadata.items()} == {
        "model.0.weight": [16, 8], "model.0.bias": [16], "model.2.weight": [4, 16], "model.2.bias": [4]}
    assert all(len(meta.chunks) == 2 for meta in metadata.values())


def test_fsdp1_rehearsal_with_partial_state_first(tmp_path: Path):
    config = {"distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "no",
              "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "FULL_SHARD",
                              "fsdp_state_dict_type": "SHARDED_STATE_DICT"}}
    # The probe builds PartialState() before Accelerator(): without the shim's backend selection that state would
    # be a lone single process per rank.
    probes, ckpt = rehearse(config, tmp_path, "--partial-state-first")
    for probe in probes:
        assert probe["distributed_type"] == "FSDP" and probe["wrapper"] == "FullyShardedDataParallel"
        assert not probe["is_dtensor"]  # FSDP1 flat parameters
    assert sorted(p.name for p in (ckpt / "pytorch_model_fsdp_0").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_deepspeed_zero3_rehearsal_partitions_and_writes_zero_checkpoint(tmp_path: Path):
    config = {"distributed_type": "DEEPSPEED", "num_processes": 2, "mixed_precision": "no",
              "deepspeed_config": {"zero_stage": 3, "gradient_accumulation_steps": 1,
                                   "offload_optimizer_device": "none", "offload_param_device": "none",
                                   "zero3_init_flag": False}}
    probes, ckpt = rehearse(config, tmp_path)
    for probe in probes:
        assert probe["distributed_type"] == "DEEPSPEED" and probe["wrapper"] == "DeepSpeedEngine"
        assert probe["zero_stage"] == 3
        assert probe["ds_shape"] == [16, 8] and probe["ds_partition_numel"] == 64  # half of 16x8 per rank
    tag = (ckpt / "latest").read_text().strip()
    names = sorted(p.name for p in (ckpt / tag).iterdir())
    assert names == [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1) for kind in ("model", "optim")]
