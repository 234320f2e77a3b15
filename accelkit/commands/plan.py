"""`accelkit plan`: which backend, how many GPUs, will it fit: memory per GPU for every strategy, checked against
measurement with --measure."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from accelkit.commands.config_options import PipelineSchedule
from accelkit.commands.printing import finish
from accelkit.commands.script_args import ScriptCommand
from accelkit.commands.supervision_options import stall_timeout_option
from accelkit.shellwords import command_line

# Kept literal (this module imports only click at load); tests/unit/plan/test_plan_cli.py checks they match.
STRATEGY_NAMES = ("single", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid", "zero1", "zero2", "zero3",
                  "fsdp-offload", "zero3-offload")
# --mixed-precision (Accelerate's values, and bf16-true: the script casts the model itself) -> the planner's precision.
PRECISIONS = {"no": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed", "bf16-true": "bf16"}
OPTIMIZERS = ("adamw", "sgd-momentum", "sgd", "adafactor")


@click.command(name="plan", cls=ScriptCommand)
@click.argument("model", required=False, metavar="[MODEL] [-- SCRIPT_ARGS]")
@click.option("--params", metavar="COUNT", help="Parameter count instead of a model, e.g. 7B or 1.3e9: "
                                                "planned as the Llama shape of that size (named in the output).")
@click.option("--layers", type=int, help="Shape flags (a Llama-shaped model): decoder layers.")
@click.option("--hidden", type=int, help="Hidden size.")
@click.option("--heads", type=int, help="Attention heads.")
@click.option("--kv-heads", type=int, help="Key/value heads (grouped-query attention). Default: --heads.")
@click.option("--vocab", type=int, help="Vocabulary size. Default 32000.")
@click.option("--intermediate", type=int, help="MLP width. Default: Llama's 8h/3 rounded up to 256.")
@click.option("--num-processes", "gpus", type=int, metavar="N",
              help="Total GPUs (one process each) over all machines. Default: the GPUs of this machine x "
                   "--num-machines, else 1.")
@click.option("--num-machines", "nodes", type=int, default=1, show_default=True, metavar="N", help="Machines.")
@click.option("--gpu-memory", metavar="SIZE", help="Memory per GPU, e.g. 80GB or 24GiB. Default: detected; "
                                                   "required without GPUs.")
@click.option("--cpu-memory", metavar="SIZE", help="Memory per machine for CPU offload, e.g. 512GB (10^9 bytes) or "
                                                   "512GiB (2^30). Default: this machine's when the GPUs are "
                                                   "detected here, else unknown (offload rows then never fit).")
@click.option("--mixed-precision", "precision", type=click.Choice(list(PRECISIONS)), default="bf16", show_default=True,
              help="Accelerate's mixed precision; bf16-true: pure bf16, the script casts the model itself.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True)
@click.option("--seq-len", type=int, help="Tokens per sample. Default: the project's, else 2048.")
@click.option("--micro-batch", type=int, help="Samples per GPU per forward. Default: the project's, else 1.")
@click.option("--activation-checkpointing", is_flag=True, help="Recompute each layer in the backward.")
@click.option("--global-batch", type=int, metavar="B", help="Samples per optimizer step across all GPUs: derives "
                                                            "the gradient accumulation.")
@click.option("--base-lr", type=float, metavar="LR", help="A learning rate known to work at --base-batch.")
@click.option("--base-batch", type=int, metavar="B0", help="The batch --base-lr was tuned for.")
@click.option("--layout", metavar="LAYOUT", help='Plan one N-D or pipeline layout, in bench\'s syntax: '
                                                  '"dp_shard=8,tp=8,pp=8" (dp_replicate, dp_shard, cp, sp, tp, pp); '
                                                  'sets --num-processes.')
@click.option("--pp-schedule", type=PipelineSchedule(), metavar="SCHEDULE",
              help="With pp in --layout: GPipe, 1F1B (default), Interleaved1F1B or InterleavedZeroBubble (the "
                   "interleaved ones: 2 stages per rank); any case, as `accelkit config` takes it.")
@click.option("--microbatches", type=int, metavar="M",
              help="With pp in --layout: micro-batches per step (of --micro-batch samples): at least pp, at most "
                   "4096, a multiple of pp for the interleaved schedules. Default: one per stage.")
@click.option("--strategy", type=click.Choice(STRATEGY_NAMES), help="Recommend (write, measure) this strategy "
                                                                    "instead of the decision tree's.")
@click.option("--prefer", type=click.Choice(("any", "fsdp", "deepspeed")), default="any", show_default=True,
              help="Backend to pick where FSDP and DeepSpeed both fit.")
@click.option("--write-config", "write_config", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the recommended Accelerate config (built like `accelkit config`).")
@click.option("--force", is_flag=True, help="With --write-config: overwrite FILE.")
@click.option("--measure", "measure_script", metavar="SCRIPT",
              help="Run SCRIPT for one optimizer step under the recommended launch (CPU rehearsal without GPUs) "
                   "and print planned vs measured per rank. Script arguments go after `--`.")
@stall_timeout_option(effect="exit 124 (with --measure)")
@click.option("--grad-compression", type=click.Choice(("none", "fp16", "bf16", "powersgd", "int8")), default=None,
              help="Count the communication column with this gradient compression (ddp hooks, fsdp reduce dtype, "
                   "ZeRO-3 int8 = ZeRO++).")
@click.option("--powersgd-rank", type=click.IntRange(min=1), default=None, metavar="R",
              help="With --grad-compression powersgd: its rank. Default 1.")
@click.option("--powersgd-start-step", type=click.IntRange(min=0), default=None, metavar="S",
              help="With --grad-compression powersgd: the step it starts compressing at (written with "
                   "--write-config). Default 1000 (torch's).")
@click.option("--interconnect", default=None, metavar="LINK",
              help="The link between GPUs: nvlink, infiniband, ethernet, pcie, a bandwidth per GPU (25GB/s, 100Gb/s), "
                   "or the results folder of `accelkit bench --comm`; the recommendation then says whether the link, "
                   "not memory, limits the run.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (bytes as integers).")
def command(model: str | None, as_json: bool, write_config: Path | None, force: bool, measure_script: str | None,
            script_args: tuple[str, ...], precision: str, layers: int | None, hidden: int | None, heads: int | None,
            kv_heads: int | None, vocab: int | None, intermediate: int | None, **options) -> int:
    """Plan memory per GPU for every strategy (single, DDP, FSDP, ZeRO, offload), and recommend one.

    \b
    MODEL: a model directory or config.json, a Hugging Face Hub id (only config.json is fetched), a project made
    by `accelkit init`, or nothing with --params / --layers --hidden --heads.
    \b
      accelkit plan meta-llama/Llama-2-7b-hf --num-processes 4 --gpu-memory 24GiB --cpu-memory 256GiB
      accelkit plan ./my-model --num-processes 8 --gpu-memory 80GB --seq-len 4096 --activation-checkpointing --json
      accelkit plan --layers 32 --hidden 4096 --heads 32 --num-processes 4 --gpu-memory 24GiB
      accelkit plan my-run --num-processes 2 --gpu-memory 24GiB --measure my-run/train.py -- --max-steps 2
      accelkit plan --params 70B --num-processes 64 --num-machines 8 --gpu-memory 80GB --global-batch 1024 \\
          --base-lr 3e-4 --base-batch 256
    """
    from accelkit.plan import PlanRequest, ShapeFlags, run_plan

    if script_args and measure_script is None:
        raise click.UsageError(f"unexpected arguments {shlex.join(script_args)}: arguments after `--` go to the "
                               "script of --measure")
    shape = ShapeFlags(layers, hidden, heads, kv_heads, vocab, intermediate)
    return finish(run_plan(PlanRequest(model=model, shape=shape, write_config=write_config, force=force,
                                       measure_script=measure_script, script_args=tuple(script_args),
                                       command_line=_command_line(), precision=PRECISIONS[precision],
                                       as_json=as_json, **options)))


def _command_line() -> str:
    """The accelkit command that reproduces this plan (every value given, in the options' order), for the header
    of a written config."""
    ctx = click.get_current_context()
    given = [(param, ctx.params.get(param.name)) for param in ctx.command.params]
    # an unset is_flag is False and has no --no- spelling: only what was given, and differs from the default
    given = [(param, value) for param, value in given
             if value is not None and value is not False and value != param.default]
    return command_line("accelkit", "plan", *(value for param, value in given if isinstance(param, click.Argument)),
                        flags=[(param.opts[0], value) for param, value in given
                               if not isinstance(param, click.Argument)],
                        script_args=ctx.params["script_args"])
