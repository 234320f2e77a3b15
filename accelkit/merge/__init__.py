"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

One reader per format (dcp, deepspeed, hf_sharded, single_file) describing each tensor as byte segments (source),
detection in detect. Trust: zip records and their CRC-32 in records, safe torch pickles in torch_files, DCP metadata
against its shards in dcp_layout, DeepSpeed's consistency signals in deepspeed_checks, Accelerate's save_state files
in savestate, the templates' manifest in manifest, every step counter of the folder cross-checked in counters.
Writing: pieces mapped from the page cache (or, when cast, in two reused buffers) in stream, a streaming
safetensors writer in writer, output layout in shards, side files and tied weights in extras, what may be replaced
in output, and the orchestration in run. Importing this package imports torch: the CLI imports it inside the
command.
"""

from accelkit.merge.run import DTYPES, MergeOptions, MergeReport, inspect_checkpoint, merge_checkpoint

__all__ = ["DTYPES", "MergeOptions", "MergeReport", "inspect_checkpoint", "merge_checkpoint"]
