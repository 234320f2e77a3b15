"""`accelkit merge-ckpt`: merge a sharded checkpoint into safetensors, streaming in bounded memory."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import click

from accelkit.commands.printing import finish, progress
from accelkit.commands.vocabulary import AccelkitCommand
from accelkit.errors import AccelkitError  # noqa: F401 - raised by the library; documented here for readers

DTYPE_CHOICES = ("keep", "fp32", "bf16", "fp16")


@click.command(name="merge-ckpt", cls=AccelkitCommand)
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="OUTPUT.safetensors for one file; any other path is a folder loadable with from_pretrained.")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="keep", show_default=True,
              help="Cast floating-point tensors (integer buffers are kept as they are).")
@click.option("--max-shard-size", metavar="SIZE",
              help="Split a folder output into HF-named shards of at most SIZE (e.g. 5GB) plus an index.")
@click.option("--verify", is_flag=True,
              help="Re-read the written output and compare it with the input read again: proves the copy; the "
                   "input itself is proven by its checksums, consistency checks and manifest, always on.")
@click.option("--allow-nonfinite", is_flag=True,
              help="Write tensors holding NaN or inf (refused by default: a flipped bit or a diverged run).")
@click.option("--force", is_flag=True,
              help="Replace an existing output file, or a folder holding only an earlier merge's output (only once "
                   "the new one is complete).")
@click.option("--inspect", "inspect_only", is_flag=True, help="Describe the checkpoint; write nothing.")
@click.option("--tag", help="DeepSpeed tag folder to merge (default: the one `latest` names).")
@click.option("--model-index", type=int, help="Which pytorch_model_fsdp_N/ of an Accelerate save_state folder.")
@click.option("--config-from", type=click.Path(path_type=Path),
              help="Folder (or config.json) to copy config/tokenizer files from (default: found beside or above "
                   "the input).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar (it is shown only when stderr is a terminal).")
def command(input_path: Path, output: Path | None, dtype: str, max_shard_size: str | None, verify: bool,
            allow_nonfinite: bool, force: bool, inspect_only: bool, tag: str | None, model_index: int | None,
            config_from: Path | None, quiet: bool) -> int:
    """Merge a sharded checkpoint INPUT into one safetensors file or a from_pretrained folder.

    \b
    INPUT is detected and the detection explained: a torch DCP folder (FSDP; or an Accelerate
    save_state folder, using pytorch_model_fsdp_0/), a DeepSpeed ZeRO-1/2/3 checkpoint (the folder
    with `latest`, or a tag folder), HF sharded safetensors (*.index.json), or a .bin/.pt state dict.

    \b
      accelkit merge-ckpt outputs/checkpoint-1000 -o merged/
      accelkit merge-ckpt ds_ckpt/ -o model.safetensors --dtype bf16 --verify
      accelkit merge-ckpt outputs/checkpoint-1000 -o merged/ --max-shard-size 5GB
      accelkit merge-ckpt outputs/checkpoint-1000 --inspect

    Every checksum and consistency signal the input carries is checked (and the manifest accelkit's
    templates write). Streams in bounded memory; the output is written under a temporary name and
    renamed at the end, so a failure never leaves a partial output and the input is never modified.
    """
    if output is None and not inspect_only:
        raise click.UsageError("missing -o/--output (or pass --inspect to only describe the checkpoint)")
    # A merge copies about as many bytes as a `cp` does: what else the process does shows. Its imports and the merge
    # make no reference cycles, yet the collector ran 29 times while they were imported (0.03 s); and NumPy's
    # OpenBLAS starts a spinning thread per core the scan never uses, on the cores the writer needs.
    one_blas_thread = "OPENBLAS_NUM_THREADS" not in os.environ  # read once, when NumPy loads OpenBLAS
    if one_blas_thread:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
    collecting = gc.isenabled()
    gc.disable()
    try:
        from accelkit.merge import MergeOptions, run_merge  # light: torch only when needed

        result = run_merge(MergeOptions(
            input=input_path, output=None if inspect_only else output, dtype=dtype, max_shard_size=max_shard_size,
            verify=verify, force=force, tag=tag, model_index=model_index, config_from=config_from,
            allow_nonfinite=allow_nonfinite, progress=not quiet and sys.stderr.isatty(),
            notify=lambda message: progress(f"accelkit: {message}")))
    finally:
        if one_blas_thread:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        if collecting:
            gc.enable()
    return finish(result)
