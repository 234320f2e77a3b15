"""Recording stub for the GPU-shaped SLURM job: each rank writes what it would see (its place in the job, the
rendezvous address, the GPUs SLURM gave its node) to OUT/rank-RANK.json and exits. It never imports torch."""

import json
import os
import sys
from pathlib import Path

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_GPUS_ON_NODE", "ACCELERATE_USE_CPU",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

out = Path(sys.argv[1])
seen = {key: os.environ.get(key) for key in KEYS}
path = out / f"rank-{seen['RANK']}.json"
path.with_suffix(".tmp").write_text(json.dumps(seen))
path.with_suffix(".tmp").rename(path)
