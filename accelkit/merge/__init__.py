"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

One reader per format (dcp, deepspeed, hf_sharded, single_file), detection in detect, a streaming safetensors
writer in writer, output layout in shards, side files and tied weights in extras, safe output in output, and the
orchestration in run. Importing this package imports torch: the CLI imports it inside the command.
"""

from accelkit.merge.run import DTYPES, MergeOptions, MergeReport, inspect_checkpoint, merge_checkpoint

__all__ = ["DTYPES", "MergeOptions", "MergeReport", "inspect_checkpoint", "merge_checkpoint"]
