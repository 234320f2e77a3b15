"""`accelkit launch` planning: the argv/env it resolves, checked against Accelerate's own launch parser, and the
errors it gives before anything starts. No ranks start here (see test_launch_run.py for real processes)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA, invoke_accelkit, run_accelkit

from accelkit.configs.reader import read_config
from accelkit.errors import AccelkitError
from accelkit.launch.launch_plan import BOOTSTRAP_MODULE, LAUNCHER_MODULE, LauncherFlags, LaunchTarget, plan_launch
from accelkit.launch.request import LaunchRequest

PROBE = DATA / "launch" / "probe.py"
DDP = {"distributed_type": "MULTI_GPU", "num_processes": 2, "num_machines": 1, "mixed_precision": "no"}


def _config(raw: dict):
    """A config dict as the ResolvedConfig it describes (as it is, nothing filled in)."""
    return read_config(raw)[0]


@pytest.fixture(autouse=True)
def _temp_dir_in_tmp_path(tmp_path, monkeypatch):
    """Dry runs keep their config in a temporary directory (it is printed for reuse): keep it in this test's dir."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def _launcher_args(argv: list[str]) -> list[str]:
    return argv[argv.index(LAUNCHER_MODULE) + 1:]


def _parse(argv: list[str]):
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser().parse_args(_launcher_args(argv))


def _cli(*args: str):
    """`accelkit ARGS` in this process (click's runner): no new interpreter importing torch for every case."""
    from click.testing import CliRunner

    from accelkit.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _dry_run(*args: str) -> tuple[list[str], str]:
    """Run `accelkit launch --dry-run ARGS`; return the planned argv (last line, shell-split) and the output."""
    result = _cli("launch", "--dry-run", *args)
    assert result.exit_code == 0, result.output
    words = shlex.split(result.stdout.strip().splitlines()[-1])
    while "=" in words[0] and not words[0].startswith("/"):  # VAR=value prefix
        words.pop(0)
    return words, result.stdout + result.stderr


# -- the pure plan -------------------------------------------------------------------------------------------------
def test_plan_passes_script_args_verbatim_and_lifts_flag_only_keys(tmp_path):
    config = {**DDP, "rdzv_backend": "c10d", "same_network": True}
    target = LaunchTarget("train.py", ("--lr", "3e-4", "--", "--config", "x y"))
    plan = plan_launch(_config(config), tmp_path / "c.yaml", target,
                       LauncherFlags(main_process_port=1234, max_restarts=2), python="python")
    args = _parse(plan.argv)
    assert args.training_script == "train.py"
    assert args.training_script_args == ["--lr", "3e-4", "--", "--config", "x y"]
    # Accelerate ignores these keys in a YAML; the plan turns them into launcher flags.
    assert args.rdzv_backend == "c10d" and args.same_network is True
    assert args.main_process_port == 1234 and args.max_restarts == 2
    assert args.config_file == str(tmp_path / "c.yaml")
    # The printed command round-trips through a shell.
    assert shlex.split(plan.shell_command()) == plan.argv


def test_plan_rehearsal_runs_bootstrap_with_script_or_module(tmp_path):
    env = {"ACCELERATE_USE_CPU": "true", "X": "a b"}
    plan = plan_launch(_config(DDP), tmp_path / "c.yaml", LaunchTarget("t.py", ("--a",)), LauncherFlags(),
                       python="python", env=env, rehearsal="fsdp")
    args = _parse(plan.argv)
    assert args.module is True and args.training_script == BOOTSTRAP_MODULE
    assert args.training_script_args == ["t.py", "--a"]
    assert plan.shell_command().startswith("ACCELERATE_USE_CPU=true X='a b' ")

    plan = plan_launch(_config(DDP), tmp_path / "c.yaml", LaunchTarget("pkg.train", ("--a",), module=True),
                       LauncherFlags(), python="python", rehearsal="deepspeed")
    assert _parse(plan.argv).training_script_args == ["-m", "pkg.train", "--a"]

    plan = plan_launch(_config(DDP), tmp_path / "c.yaml", LaunchTarget("pkg.train", ("--a",), module=True),
                       LauncherFlags(), python="python")
    args = _parse(plan.argv)
    assert args.module is True and args.training_script == "pkg.train" and args.training_script_args == ["--a"]
    assert plan.accelerate_cli_argv()[:2] == ["accelerate", "launch"]


def test_plan_multinode_deepspeed_uses_one_launcher_per_machine(tmp_path):
    config = _config({"distributed_type": "DEEPSPEED", "num_processes": 16, "num_machines": 2,
                      "deepspeed_config": {"zero_stage": 3}})
    plan = plan_launch(config, tmp_path / "c.yaml", LaunchTarget("t.py"),
                       LauncherFlags(machine_rank=1, main_process_ip="10.0.0.1", main_process_port=29500),
                       python="python")
    args = _parse(plan.argv)
    assert args.deepspeed_multinode_launcher == "standard"  # not pdsh (ssh from node 0 into every node)
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (1, "10.0.0.1", 29500)


def test_request_survives_json(tmp_path):
    from accelkit.configs import ConfigOptions

    request = LaunchRequest(
        target=LaunchTarget("t.py", ("--x", "1"), module=False),
        options=ConfigOptions(backend="deepspeed", zero_stage=3, wrap_cls=(), deepspeed_json=tmp_path / "ds.json"),
        config_file=tmp_path / "c.yaml", cpu=True, flags=LauncherFlags(max_restarts=1, same_network=True),
        command_line="accelkit launch x")
    assert LaunchRequest.from_json(request.to_json()) == request


# -- dry runs of GPU jobs, checked against what Accelerate and torchrun make of them -------------------------------
def _torchrun_args(args):
    """The torchrun namespace Accelerate builds from a launch namespace (what multi_gpu_launcher passes on)."""
    import torch.distributed.run as distrib_run
    from accelerate.utils.launch import _filter_args

    return _filter_args(args, distrib_run.get_args_parser(),
                        ["--training_script", args.training_script, "--training_script_args",
                         args.training_script_args])


def test_dry_run_fsdp_8_gpus_is_what_accelerate_expects(tmp_path):
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils.launch import prepare_multi_gpu_env

    argv, output = _dry_run("--backend", "fsdp", "--num-processes", "8", "--mixed-precision", "bf16",
                            str(PROBE), "--", "--max-steps", "10")
    assert "nothing was started" in output
    assert "backend=fsdp (--backend)" in output and "processes=8 (--num-processes)" in output
    assert argv[:3] == [sys.executable, "-m", LAUNCHER_MODULE]
    args = _parse(argv)
    assert args.training_script == str(PROBE) and args.training_script_args == ["--max-steps", "10"]
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp and args.num_processes == 8 and args.num_machines == 1 and args.mixed_precision == "bf16"
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT" and env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    torchrun = _torchrun_args(args)
    assert torchrun.nproc_per_node == "8" and torchrun.training_script == str(PROBE)
    # Not a CPU rehearsal: no environment prefix, no bootstrap.
    assert BOOTSTRAP_MODULE not in argv and "ACCELERATE_USE_CPU" not in output.splitlines()[-1]


def test_dry_run_two_nodes_deepspeed_zero3_offload_is_what_accelerate_expects(tmp_path):
    from accelerate.commands.launch import _validate_launch_command
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    argv, output = _dry_run("--backend", "deepspeed", "--zero-stage", "3", "--offload", "--num-machines", "2",
                            "--num-processes", "16", "--machine-rank", "1", "--main-process-ip", "10.1.2.3",
                            "--main-process-port", "29555", "--rdzv-backend", "c10d", str(PROBE), "--lr", "1e-4")
    args = _parse(argv)
    assert args.training_script_args == ["--lr", "1e-4"]
    args, defaults, _ = _validate_launch_command(args)
    assert args.use_deepspeed and args.num_processes == 16 and args.num_machines == 2
    # What launch_command does before calling the DeepSpeed launcher:
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    cmd, env = prepare_deepspeed_cmd_env(args)
    assert cmd is None  # the "standard" multi-node launcher: torchrun on this machine, no pdsh
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "cpu"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"] == "cpu"
    torchrun = _torchrun_args(args)
    assert (torchrun.nproc_per_node, torchrun.nnodes, torchrun.node_rank) == ("8", "2", 1)
    assert torchrun.rdzv_endpoint == "10.1.2.3:29555" and torchrun.rdzv_backend == "c10d"
    assert "machine_rank=1 (--machine-rank)" in output and "zero_stage=3 (--zero-stage)" in output


def test_dry_run_config_file_with_overrides_says_where_values_came_from(tmp_path):
    config = tmp_path / "fsdp.yaml"
    result = _cli("config", "--backend", "fsdp", "--num-processes", "4", "--mixed-precision", "bf16", "-o",
                  str(config))
    assert result.exit_code == 0, result.output
    argv, output = _dry_run("--config", str(config), "--num-processes", "8", str(PROBE))
    assert "processes=8 (--num-processes)" in output
    assert f"mixed_precision=bf16 ({config})" in output
    from accelerate.commands.launch import _validate_launch_command

    args, _, _ = _validate_launch_command(_parse(argv))
    assert args.num_processes == 8 and args.mixed_precision == "bf16" and args.use_fsdp
    assert config.read_text().count("num_processes: 4") == 1  # the input file is never modified


def test_dry_run_cpu_rehearsal_prints_its_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(_make_package(tmp_path))
    argv, output = _dry_run("--cpu", "--backend", "fsdp", "--num-processes", "2", "-m", "pkg.train", "--x")
    command = [line for line in output.splitlines() if not line.startswith("#") and LAUNCHER_MODULE in line][0]
    assert "ACCELERATE_USE_CPU=true" in command and "ACCELKIT_REHEARSAL=fsdp" in command
    args = _parse(argv)
    assert args.module and args.training_script == BOOTSTRAP_MODULE
    assert args.training_script_args == ["-m", "pkg.train", "--x"]


def _make_package(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("print('hi')\n")
    return tmp_path


# -- errors before anything starts -----------------------------------------------------------------------------------
def test_missing_script_is_one_line_error_before_anything_starts(tmp_path):
    proc = invoke_accelkit("launch", "--cpu", "--backend", "ddp", "missing.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Error: script not found: missing.py")
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


def test_gpu_backend_without_gpus_fails_fast_suggesting_cpu(tmp_path):
    proc = run_accelkit("launch", "--backend", "fsdp", "--num-processes", "2", str(PROBE))  # a real process
    assert proc.returncode == 1
    assert "Error: --backend fsdp runs on GPUs, and this machine has none" in proc.stderr
    assert "--cpu" in proc.stderr and "PROBE" not in proc.stdout


def test_bad_config_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnot_a_key: 1\n")
    result = _cli("launch", "--config", str(bad), "--dry-run", str(PROBE))
    assert result.exit_code == 1 and result.stderr.startswith("Error: ") and "not_a_key" in result.stderr
    assert not result.stdout


def test_missing_deepspeed_is_refused_before_anything_starts(monkeypatch):
    import importlib.metadata
    import importlib.util

    from accelkit.configs import ConfigOptions
    from accelkit.launch.build_plan import check_deepspeed, prepare_launch

    real_find_spec, real_version = importlib.util.find_spec, importlib.metadata.version

    def find_spec(name, *args):
        return None if name.split(".")[0] == "deepspeed" else real_find_spec(name, *args)

    def version(name):
        if name == "deepspeed":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(AccelkitError) as excinfo:  # the GPU path
        check_deepspeed()
    assert "pip install" in excinfo.value.hint
    request = LaunchRequest(target=LaunchTarget(str(PROBE)), cpu=True,
                            options=ConfigOptions(backend="deepspeed", num_processes=2))
    with pytest.raises(AccelkitError) as excinfo:  # the CPU rehearsal path
        prepare_launch(request, check_hardware=False)
    assert "DeepSpeed" in excinfo.value.message and "deepspeed" in excinfo.value.hint


def test_fp16_rehearsal_and_slurm_only_flags_are_refused():
    result = _cli("launch", "--cpu", "--backend", "ddp", "--mixed-precision", "fp16", "--dry-run", str(PROBE))
    assert result.exit_code == 1 and "fp16" in result.stderr and "Hint:" in result.stderr
    result = _cli("launch", "--gpus-per-node", "2", str(PROBE))
    assert result.exit_code == 2 and "--gpus-per-node only applies with --slurm" in result.stderr
    result = _cli("launch", "--nodes", "2", "--dry-run", str(PROBE))  # `--nodes` is `--num-machines`, slurm or not
    assert result.exit_code == 1 and "--num-machines 2 but no main_process_ip" in result.stderr


def test_help_does_not_import_torch():
    code = ("import sys; from accelkit.cli import main\n"
            "try:\n    main(['launch', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'accelerate' not in sys.modules, 'heavy import'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--cpu" in proc.stdout and "--slurm" in proc.stdout and "--max-restarts" in proc.stdout


def test_gradient_accumulation_goes_to_the_config_or_the_environment():
    argv, output = _dry_run("--backend", "ddp", "--num-processes", "2", "--gradient-accumulation-steps", "4",
                            str(PROBE))
    command = output.strip().splitlines()[-1]
    # DDP configs have no key for it: Accelerator() reads it from the environment the ranks inherit.
    assert command.startswith("ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4 ")
    assert "gradient_accumulation_steps=4 (--gradient-accumulation-steps)" in output
    argv, output = _dry_run("--backend", "deepspeed", "--num-processes", "2", "--gradient-accumulation-steps", "4",
                            str(PROBE))
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in output.strip().splitlines()[-1]
    from accelerate.commands.launch import _validate_launch_command

    args, _, _ = _validate_launch_command(_parse(argv))
    assert args.gradient_accumulation_steps == 4  # from the DeepSpeed section of the written config


def test_multi_machine_launch_needs_the_main_address(tmp_path):
    result = _cli("launch", "--backend", "ddp", "--num-machines", "2", "--num-processes", "4", "--machine-rank", "1",
                  "--dry-run", str(PROBE))
    assert result.exit_code == 1 and "--main-process-ip" in result.stderr
    # A file without the address launches once the command line gives it (the rules judge the merged config).
    config = tmp_path / "two_nodes.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 1\n")
    argv, output = _dry_run("--config", str(config), "--main-process-ip", "10.0.0.1", str(PROBE))
    args = _parse(argv)
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (1, "10.0.0.1", 29500)
    assert f"machine_rank=1 ({config})" in output and "main_process_ip=10.0.0.1 (--main-process-ip)" in output
