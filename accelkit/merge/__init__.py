"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

The entry point is `run_merge` (the command as one call, a CommandResult) over `merge_checkpoint` (and
`inspect_checkpoint`) in light_run: without torch when every tensor is
a byte range of the input (DCP row blocks proven by light_dcp, DeepSpeed ZeRO partitions by light_deepspeed,
their pickles read by the restricted unpicklers of light_pickle), else, decided before anything is written, with
the torch path (torch_merge.merge_with_torch: detect, the
readers dcp, deepspeed, hf_sharded, single_file describing tensors as segments of source, the streaming copy in
stream). Written once for both paths: the dtype table (dtypes), the non-finite scan (nonfinite), the DeepSpeed
consistency checks (deepspeed_checks, over what both DeepSpeed readers share in deepspeed_layout), the safetensors
header and writer (writer), the zip records and their CRC-32 (records), the output's rules and layout (output),
side files and tied weights (extras), the manifest (manifest), the step counters (counters), what a merge is asked
and reports (merge_request), the `.metadata` unpickler (light_pickle) and the checks of `.metadata` against its folder
(light_dcp). Torch-only: safe torch pickles (torch_files), DCP items opened with torch (dcp_layout), Accelerate's
save_state files (savestate).

Importing this package is cheap: its names load on first use, and none of them imports torch.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "MergeOptions": "merge_request",
    "run_merge": "light_run",
})
