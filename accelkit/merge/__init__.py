"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

The entry point is `run_merge` (the command as one call, a CommandResult) over `merge_checkpoint` (and
`inspect_checkpoint`) in api.py: the request checked and the format recognised once, the input opened by its
format's one reader (dcp, deepspeed, per_rank for FSDP2's per-rank files, hf_sharded, torch_files: every tensor as
segments of the one tensor model, source), the output planned and written by the one writer loop (stream) through
the one safetensors writer and `--verify` (writer). Written once: the dtype table (dtypes), the restricted
unpicklers (light_pickle), zip records and their CRC-32 (records), the ZeRO layout and checks (deepspeed_layout),
the non-finite scan (nonfinite), the output's rules (output), side files and tied weights (extras), the manifest
(manifest), the step counters (counters), a training state's files (savestate, torch); a ZeRO checkpoint's world
size for launch's resume on another one (zero_world).
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "MergeOptions": "api",
    "run_merge": "api",
    "read_zero_checkpoint": "zero_world",
})
