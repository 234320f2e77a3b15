"""`accelkit merge-ckpt`: merge sharded checkpoints (DCP, DeepSpeed ZeRO, HF shards) into safetensors, streaming.

One reader per format (dcp, deepspeed, hf_sharded, single_file) describing each tensor as byte segments (source),
detection in detect. Trust: zip records and their CRC-32 in records, safe torch pickles in torch_files, DCP metadata
against its shards in dcp_layout, DeepSpeed's consistency signals in deepspeed_checks, Accelerate's save_state files
in savestate, the templates' manifest in manifest, every step counter of the folder cross-checked in counters.
Writing: pieces mapped from the page cache (or, when cast, in two reused buffers) in stream, a streaming
safetensors writer in writer, output layout in shards, side files and tied weights in extras, what may be replaced
in output, the orchestration in pipeline, and the report for people in report; what a merge is asked and reports in
options. The torch-free path for DCP folders stored as row blocks and for DeepSpeed ZeRO checkpoints: restricted
unpicklers in light_pickle, the layouts proven in light_dcp and light_deepspeed (what both DeepSpeed readers share
in deepspeed_layout), the range copies in light_run, which is also the entry point of merging and of --inspect
(it hands everything else to pipeline); the safetensors header both paths write in header.

Importing this package is cheap: its names load on first use, and the first one that needs torch imports it without
collecting garbage (see _load).
"""

from __future__ import annotations

import importlib
from typing import Any

from accelkit.exports import lazy_exports


def _load(module: str) -> Any:
    """Import `module` without collecting garbage. Importing torch creates a few hundred thousand long-lived objects;
    collecting cycles among them while importing, and once more when the interpreter exits, costs more CPU than
    merging a small model: import without collecting, then freeze what was imported (exempt from every later
    collection)."""
    import gc
    import sys

    if module in sys.modules:
        return sys.modules[module]
    collecting = gc.isenabled()
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


__all__, __getattr__ = lazy_exports(__name__, {
    "MergeOptions": "options",
    "MergeReport": "options",
    "inspect_checkpoint": "light_run",
    "merge_checkpoint": "light_run",
    "format_report": "report",
}, load=_load)
