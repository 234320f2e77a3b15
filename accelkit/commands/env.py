"""`accelkit env`: versions, GPUs and the default Accelerate config, for bug reports and sanity checks."""

from __future__ import annotations

import click

from accelkit.commands.printing import finish
from accelkit.commands.vocabulary import AccelkitCommand


@click.command(name="env", cls=AccelkitCommand)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
def command(as_json: bool) -> int:
    """Show versions (python, torch, accelerate, transformers, datasets, deepspeed), CUDA/NCCL availability,
    GPUs with their memory, and the default Accelerate config `accelerate launch` would use."""
    from accelkit.envinfo import run_env

    return finish(run_env(as_json))
