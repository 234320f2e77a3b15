"""`accelkit env`: versions, GPUs and the default Accelerate config, for bug reports and sanity checks."""

from __future__ import annotations

import click

from accelkit.commands.vocabulary import AccelkitCommand


@click.command(name="env", cls=AccelkitCommand)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
def command(as_json: bool) -> None:
    """Show versions (python, torch, accelerate, transformers, datasets, deepspeed), CUDA/NCCL availability,
    GPUs with their memory, and the default Accelerate config `accelerate launch` would use."""
    import json

    from accelkit.envinfo import collect, format_text

    info = collect()
    click.echo(json.dumps(info, indent=2) if as_json else format_text(info))
