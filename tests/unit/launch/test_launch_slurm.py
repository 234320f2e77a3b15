"""`accelkit launch --slurm`: the sbatch script is valid bash, and run under a fake `srun`/`scontrol` for two
simulated nodes it starts one launcher per node with the right machine rank and main address, for a GPU job (the
launcher replaced by a recorder, checked with Accelerate's parser) and for a real 2-node CPU job."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import DATA

from accelkit.cli import cli
from accelkit.launch.plan import LAUNCHER_MODULE
from accelkit.launch.ports import free_port

PROBE = DATA / "launch" / "probe.py"

FAKE_SRUN = """#!/bin/bash
# Fake srun: skip srun's own options, then run the command once per simulated node, in parallel.
while [[ $# -gt 0 && "$1" == -* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_JOB_NUM_NODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/bin/bash
# Fake scontrol: `scontrol show hostnames LIST` prints one host per line; node 0 is this machine.
[[ "$1 $2" == "show hostnames" ]] || exit 1
printf '127.0.0.1\\nnode-b\\n'
sleep 0.2  # a long node list keeps writing after `head -n1` has exited: SIGPIPE, which the script must survive
printf 'node-c\\n'
"""
# Stands in for the cluster's python: records argv and the SLURM variables of each node instead of launching.
FAKE_PYTHON = """#!/bin/bash
exec {real} -c 'import json, os, sys
record = {{"argv": sys.argv[1:], "node": os.environ["SLURM_NODEID"], "env": dict(os.environ)}}
path = os.path.join(os.environ["RECORD_DIR"], "node-" + os.environ["SLURM_NODEID"] + ".json")
open(path, "w").write(json.dumps(record))
' "$@"
"""


def _bin(tmp_path: Path, with_python: bool) -> Path:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    scripts = {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL}
    if with_python:
        scripts["python"] = FAKE_PYTHON.format(real=sys.executable)
    for name, text in scripts.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    return fake


def _write(tmp_path: Path, monkeypatch, *args: str):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["launch", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _run_sbatch(script: Path, fake: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    path = f"{fake}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    full_env = {**os.environ, "PATH": path, "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_NUM_NODES": "2",
                "SLURM_NNODES": "2", **env}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=240)


def test_sbatch_for_two_gpu_nodes_starts_one_launcher_per_node(tmp_path, monkeypatch):
    script = tmp_path / "job.sbatch"
    result = _write(tmp_path, monkeypatch, "--backend", "deepspeed", "--zero-stage", "3", "--offload", "--slurm",
                    str(script), "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu", "--time", "04:00:00",
                    "--job-name", "ft", str(PROBE), "--lr", "1e-4")
    assert f"sbatch {script}" in result.stdout
    text = script.read_text()
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=04:00:00", "#SBATCH --job-name=ft",
                 f"#SBATCH --chdir={tmp_path}"):
        assert line in text.splitlines()
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    config = yaml.safe_load((tmp_path / "job.accelerate.yaml").read_text())
    assert (config["distributed_type"], config["num_machines"], config["num_processes"]) == ("DEEPSPEED", 2, 16)

    records = tmp_path / "records"
    records.mkdir()
    proc = _run_sbatch(script, _bin(tmp_path, with_python=True), {"RECORD_DIR": str(records)}, tmp_path)
    assert proc.returncode == 0, proc.stderr

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    for node in (0, 1):
        record = json.loads((records / f"node-{node}.json").read_text())
        argv = record["argv"]
        assert argv[:2] == ["-m", LAUNCHER_MODULE]
        args = launch_command_parser().parse_args(argv[2:])
        assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (node, "127.0.0.1", 29500)
        assert args.training_script == str(PROBE) and args.training_script_args == ["--lr", "1e-4"]
        args, _, _ = _validate_launch_command(args)
        assert args.use_deepspeed and args.num_machines == 2 and args.num_processes == 16
        assert args.deepspeed_multinode_launcher == "standard"
        assert args.zero_stage == 3 and args.offload_param_device == "cpu"


@pytest.mark.slow  # a real 2-process job
def test_sbatch_cpu_job_runs_for_real_on_two_simulated_nodes(tmp_path, monkeypatch):
    script = tmp_path / "cpu.sbatch"
    _write(tmp_path, monkeypatch, "--cpu", "--backend", "ddp", "--slurm", str(script), "--nodes", "2",
           "--gpus-per-node", "1", str(PROBE), "--exit-after-accelerator")
    text = script.read_text()
    assert "--gpus-per-node" not in text and "export ACCELERATE_USE_CPU=true" in text
    subprocess.run(["bash", "-n", str(script)], check=True)

    proc = _run_sbatch(script, _bin(tmp_path, with_python=False),
                       {"MAIN_PROCESS_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # Each simulated node started one rank; together they formed one gloo process group of size 2.
    found = re.findall(r"PROBE accelerator rank=(\d) t=[\d.]+ world=(\d) type=([A-Z_]+)", proc.stdout)
    assert sorted(found) == [("0", "2", "MULTI_CPU"), ("1", "2", "MULTI_CPU")], proc.stdout


def test_slurm_refuses_inconsistent_shapes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["launch", "--backend", "ddp", "--slurm", "j.sbatch", "--nodes", "2",
                                 "--num-machines", "3", "--gpus-per-node", "8", str(PROBE)])
    assert result.exit_code == 1 and "--nodes 2 and --num-machines 3 disagree" in result.stderr
    result = runner.invoke(cli, ["launch", "--backend", "ddp", "--slurm", "j.sbatch", "--nodes", "2", str(PROBE)])
    assert result.exit_code == 1 and "--gpus-per-node" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written on error
