"""The sections of `--help`: which heading each option of `launch`, `bench` and `config` is listed under.

One table says it for every command (SECTION_OF: an option's flag -> its heading), with a few per-command entries
where one flag means another thing in another command (COMMAND_SECTION_OF). A new option of a sectioned command
goes into one of these tables; tests/unit/commands/test_help_sections.py fails, naming the option and this file,
when one is missing. Headings are shown in the order of SECTIONS (each command shows those it has options in).
Plain click (Command.format_options), no extension: `accelkit --help` imports nothing more.
"""

from __future__ import annotations

import click

CONFIG = "Config and backend"
RESOURCES = "Resources (processes and machines)"
SWEEP = "Sweep (what each run varies)"
MEASUREMENT = "Measurement"
RUNNING = "Running (CPU rehearsal, module, dry run)"
FSDP = "FSDP backend"
DEEPSPEED = "DeepSpeed backend"
PARALLELISM = "N-D parallelism"
COMPRESSION = "Gradient compression"
SUPERVISION = "Supervision and rendezvous"
CLUSTER_JOB = "Cluster job (written instead of launching)"
CLUSTER_RESOURCES = "Cluster job resources, environment and storage"
RAY = "Ray cluster (run on its workers instead of this machine)"
OUTPUT = "Output"
HELP = "Help"

# The headings, in the order every --help shows them.
SECTIONS: tuple[str, ...] = (CONFIG, RESOURCES, SWEEP, MEASUREMENT, RUNNING, FSDP, DEEPSPEED, PARALLELISM,
                             COMPRESSION, SUPERVISION, CLUSTER_JOB, CLUSTER_RESOURCES, RAY, OUTPUT, HELP)

# The commands whose --help is in sections; the others keep click's one "Options" list (a handful of options each).
SECTIONED = ("config", "launch", "bench")


def _each(section: str, *flags: str) -> dict[str, str]:
    return dict.fromkeys(flags, section)


# An option's longest flag -> its section, the same in every command that has the option.
SECTION_OF: dict[str, str] = {
    **_each(CONFIG, "--config", "--backend", "--preset", "--mixed-precision", "--gradient-accumulation-steps",
            "--model-config"),
    **_each(RESOURCES, "--num-processes", "--num-machines", "--machine-rank", "--main-process-ip",
            "--main-process-port"),
    **_each(SWEEP, "--compare-backends", "--layouts", "--scaling", "--batch-arg", "--global-batch"),
    **_each(MEASUREMENT, "--steps", "--min-time", "--warmup", "--comm", "--comm-sizes", "--comm-iters"),
    **_each(RUNNING, "--cpu", "--module", "--dry-run", "--rank-prefix"),
    **_each(FSDP, "--fsdp-version", "--sharding", "--wrap-policy", "--wrap-cls", "--min-num-params", "--state-dict",
            "--offload", "--activation-checkpointing", "--cpu-ram-efficient-loading", "--reduce-dtype"),
    **_each(DEEPSPEED, "--zero-stage", "--offload-optimizer", "--offload-params", "--nvme-path",
            "--zero3-save-16bit-model", "--deepspeed-json"),
    **_each(PARALLELISM, "--dp-replicate-size", "--dp-shard-size", "--tp-size", "--cp-size", "--cp-backend",
            "--sp-size", "--sp-backend", "--pp-size", "--pp-schedule", "--microbatches"),
    **_each(COMPRESSION, "--grad-compression", "--powersgd-rank", "--powersgd-start-step"),
    **_each(SUPERVISION, "--max-restarts", "--monitor-interval", "--rdzv-backend", "--rdzv-conf", "--same-network",
            "--lost-timeout", "--stall-timeout", "--timeout", "--preemption-grace"),
    **_each(CLUSTER_JOB, "--slurm", "--skypilot", "--kubernetes", "--gpus-per-node", "--job-name", "--partition",
            "--time", "--requeue", "--signal-before", "--accelerator", "--image"),
    **_each(CLUSTER_RESOURCES, "--cpus-per-node", "--mem-per-node", "--setup", "--exclusive", "--account", "--qos",
            "--sbatch-arg", "--container-image", "--storage", "--shm-size"),
    **_each(RAY, "--ray", "--ray-storage", "--ray-cpus-per-worker"),
    **_each(OUTPUT, "--output", "--show-output", "--list", "--check"),
    **_each(HELP, "--help"),
}

# Where a command's flag differs from SECTION_OF (the same spelling, another job in that command).
COMMAND_SECTION_OF: dict[str, dict[str, str]] = {
    "config": {"--force": OUTPUT},
    "launch": {"--force": CLUSTER_JOB},  # replaces a job file
    "bench": {"--force": OUTPUT, "--num-processes": SWEEP},  # bench's --num-processes is a list of world sizes
}

UNSECTIONED = "Options"  # an option missing from the tables still shows (under this heading); the tests refuse it


def option_flag(param: click.Parameter) -> str:
    """The flag an option is known by in the tables: its longest spelling (`--module` for `-m/--module`)."""
    return max(param.opts, key=len)


def section_of(command_name: str, param: click.Parameter) -> str | None:
    """The heading `param` is listed under in `command_name`'s --help (None: in no table)."""
    flag = option_flag(param)
    return COMMAND_SECTION_OF.get(command_name, {}).get(flag) or SECTION_OF.get(flag)


def format_sections(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """Write the command's options under their headings, in the order of SECTIONS."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None  # arguments: in Usage
        if record is not None:
            rows.setdefault(section_of(command.name or "", param) or UNSECTIONED, []).append(record)
    for heading in (*SECTIONS, UNSECTIONED):
        if heading in rows:
            with formatter.section(heading):
                formatter.write_dl(rows[heading])
