"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

The entry point is `run_merge` (the command as one call, a CommandResult) over `merge_checkpoint` (and
`inspect_checkpoint`) in api.py, beside what a merge is asked and reports (MergeOptions, MergeReport). The
request is checked and the format recognised once there (check_merge_request, detect); then the merge is made without
torch when every tensor is a byte range of the input (DCP row blocks proven by light_dcp, DeepSpeed ZeRO partitions
by light_deepspeed, their pickles read by the restricted unpicklers of light_pickle); else, decided before anything
is written, the torch path goes on from what was found (torch_merge.merge_with_torch: the detected format opened
with its reader, dcp, deepspeed, hf_sharded, torch_files, or the proven byte ranges as they are,
source.ProvenSource; tensors as segments of source, copied with stream). Written once for both paths: the dtype
table (dtypes), the non-finite scan and its refusal (nonfinite), the DeepSpeed layout and consistency checks
(deepspeed_layout), the safetensors header, writer and --verify (writer), the zip records and their CRC-32
(records), the output's rules and layout (output), side files and tied weights (extras), the manifest (manifest),
the step counters (counters), the `.metadata` unpickler (light_pickle) and the checks of `.metadata` against its
folder (light_dcp). Torch-only: safe torch pickles and one-file state dicts (torch_files), DCP items opened with
torch (dcp), Accelerate's save_state files (savestate).
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "MergeOptions": "api",
    "run_merge": "api",
})
