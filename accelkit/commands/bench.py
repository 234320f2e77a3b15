"""`accelkit bench`: scaling efficiency, throughput and interconnect bandwidth of the user's own script."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from accelkit.commands.config_options import config_options_except, options_from_kwargs
from accelkit.commands.launcher_options import config_file_option, rendezvous_options, run_options
from accelkit.commands.printing import finish, progress
from accelkit.commands.script_args import ScriptCommand, script_args_argument
from accelkit.commands.supervision_options import Seconds, stall_timeout_option

DEFAULT_MIN_TIME = 2.0  # seconds: 1,000 steps of the minimal template's 2 ms; pyperf and timeit use 0.1 to 0.2 s


@click.command(name="bench", cls=ScriptCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_file_option
@config_options_except("num_processes", "model_config")
@click.option("--num-processes", "num_processes_list", default=None, metavar="N,N,...",
              help="World sizes to run, e.g. 1,2,4,8. Default: 1 and every power of two up to the GPUs present "
                   "(with --cpu: up to the cores), times --num-machines.")
@click.option("--compare-backends", default=None, metavar="B,B,...",
              help="Run each of these backends (e.g. ddp,fsdp,deepspeed); default world size: the largest.")
@click.option("--layouts", "layouts", multiple=True, metavar="DIM=N,...;...",
              help="Compare N-D parallelism layouts of one world size, e.g. \"dp_shard=4;dp_shard=2,tp=2\" "
                   "(dimensions dp_replicate, dp_shard, tp, cp, sp, pp; `;` between layouts, or repeat the option). "
                   "Each layout runs with the backend that composes it unless --backend names one. With "
                   "--grad-compression: compression vs none per layout.")
@run_options
@click.option("--steps", type=int, default=20, show_default=True, metavar="N",
              help="Measured optimizer steps per run, at least (after warmup); every rank then stops cleanly.")
@click.option("--min-time", type=Seconds(minimum=0), default=DEFAULT_MIN_TIME, show_default=True, metavar="SECONDS",
              help="Measure each run for at least this long (and at least --steps steps): a short window's "
                   "figures are noise. 0: exactly --steps steps.")
@click.option("--warmup", type=int, default=5, show_default=True, metavar="W",
              help="Optimizer steps run before measuring (first-step allocations, autotuning, caches).")
@click.option("--scaling", type=click.Choice(("weak", "strong")), default="weak", show_default=True,
              help="weak: per-device batch fixed (script arguments unchanged); strong: global batch fixed, each run "
                   "gets global / N through --batch-arg.")
@click.option("--batch-arg", default=None, metavar="FLAG",
              help="The script's per-device batch flag, e.g. --per-device-batch-size (needed for --scaling strong).")
@click.option("--global-batch", type=click.IntRange(min=1), default=None, metavar="G",
              help="Strong scaling's global batch. Default: the value of --batch-arg in the script's arguments.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True,
              metavar="DIR", help="Folder for bench.json, bench.csv, scaling.png and each run's logs.")
@click.option("--force", is_flag=True, default=False, help="Replace the results already in DIR.")
@click.option("--comm", is_flag=True, default=False,
              help="Time all-reduce, all-gather and reduce-scatter at each world size (nccl-tests conventions); "
                   "with SCRIPT, also predict each step's communication time from the model's gradient bytes.")
@click.option("--comm-sizes", default=None, metavar="MIN:MAX",
              help="Message sizes for --comm, x4 apart. Default 1K:256M on GPUs, 4K:16M on CPU.")
@click.option("--comm-iters", type=click.IntRange(min=1), default=None, metavar="N",
              help="Timed iterations per size for --comm. Default 20 on GPUs, 5 on CPU.")
@click.option("--timeout", type=Seconds(minimum=1), default=None, metavar="SECONDS",
              help="Stop a run that takes longer (recorded as timed out; the sweep goes on).")
@stall_timeout_option(effect="record the run as stalled")
@click.option("--show-output", is_flag=True, default=False,
              help="Show the script's output instead of saving it to DIR/runs/<run>/output.log.")
@rendezvous_options
@click.argument("script", metavar="[SCRIPT]", required=False)
@script_args_argument()
def command(num_processes_list: str | None, force: bool, **kwargs: Any) -> int:
    """Measure how SCRIPT scales: a run per world size (and backend), each through `accelkit launch` with a probe
    in every rank; the script is not edited. Everything after SCRIPT goes to the script.

    \b
      accelkit bench --cpu --backend ddp --num-processes 1,2 train.py --max-steps 1000
      accelkit bench --num-processes 1,2,4,8 --backend fsdp train.py
      accelkit bench --compare-backends ddp,fsdp,deepspeed --num-processes 8 train.py
      accelkit bench --layouts "dp_shard=4;dp_shard=2,tp=2" train.py
      accelkit bench --cpu --backend ddp --grad-compression powersgd --powersgd-start-step 0 train.py
      accelkit bench --cpu --layouts "dp_shard=2;dp_replicate=2" --grad-compression fp16 train.py
      accelkit bench --scaling strong --batch-arg --per-device-batch-size --global-batch 256 train.py
      accelkit bench --comm --num-processes 8                # interconnect only
      accelkit bench --comm --backend ddp train.py           # and predicted communication per step

    Table: the measured window, step time (median of the slowest rank's steps) and its spread (IQR), samples/s,
    tokens/s, speedup and efficiency (all from the median), data-wait share, peak memory per rank, and a noise flag
    (superlinear or too variable) with the command that measures longer. Exit status: 0 when every run succeeded,
    1 when one failed, 128+N when stopped by signal N.
    """
    from accelkit.bench import run_bench

    options = options_from_kwargs(kwargs)  # with --grad-compression, run_bench runs the compression comparison
    return finish(run_bench(argv=tuple(sys.argv[1:]), force=force, options=options, num_processes=num_processes_list,
                            progress=progress, **kwargs))
