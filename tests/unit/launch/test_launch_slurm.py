"""`accelkit launch --slurm`: the sbatch script is valid bash and carries the job's request; each node's launch, as
accelkit.launch.cluster.node derives it from that request, is what Accelerate's parser expects for that node (a GPU job,
checked without GPUs). The job itself runs on a real Slurm cluster in tests/integration/test_slurm.py; here: the
pure parts (machine 0's address, the failure line, the preflight comparison, the job board)."""

from __future__ import annotations

import stat
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from helpers import DATA

from accelkit.cli import cli
from accelkit.errors import AccelkitError
from accelkit.launch.cluster import job_board
from accelkit.launch.cluster.node import job_failure_line, node_request
from accelkit.launch.cluster.node_preflight import differences
from accelkit.launch.cluster.slurm_job import main_address
from accelkit.launch.cluster.targets.slurm import REQUEST_DELIMITER
from accelkit.launch.request import LaunchRequest

PROBE = DATA / "launch" / "probe.py"


def _write(tmp_path, monkeypatch, *args: str):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["launch", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def embedded_request(text: str) -> LaunchRequest:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith(f"<<'{REQUEST_DELIMITER}'"))
    return LaunchRequest.from_json(lines[start + 1])


def test_sbatch_for_two_gpu_nodes_starts_one_launcher_per_node(tmp_path, monkeypatch):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    from accelkit.launch.build_plan import prepare_launch

    script = tmp_path / "job.sbatch"
    result = _write(tmp_path, monkeypatch, "--backend", "deepspeed", "--zero-stage", "3", "--offload", "--slurm",
                    str(script), "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu", "--time", "04:00:00",
                    "--job-name", "ft", "--stall-timeout", "600", str(PROBE), "--lr", "1e-4")
    assert f"sbatch {script}" in result.stdout
    text = script.read_text()
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=04:00:00", "#SBATCH --job-name=ft",
                 f"#SBATCH --chdir={tmp_path}", "exec python -m accelkit.launch.cluster.slurm_job --stall-timeout 600"):
        assert line in text.splitlines()
    assert "scontrol show hostnames" not in text and "29500" not in text  # address and port come at run time
    config = yaml.safe_load((tmp_path / "job.accelerate.yaml").read_text())
    assert (config["distributed_type"], config["num_machines"], config["num_processes"]) == ("DEEPSPEED", 2, 16)

    request = embedded_request(text)
    for node in (0, 1):  # what accelkit.launch.cluster.node runs on each node, read back with Accelerate's own parser
        mine = node_request(request, node, "10.1.2.3", 29411)
        prepared = prepare_launch(mine, config_path=tmp_path / f"node{node}.yaml", check_hardware=False)
        args = launch_command_parser().parse_args(prepared.plan.launcher_args())
        assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (node, "10.1.2.3", 29411)
        assert args.training_script == str(PROBE) and args.training_script_args == ["--lr", "1e-4"]
        args, _, _ = _validate_launch_command(args)
        assert args.use_deepspeed and args.num_machines == 2 and args.num_processes == 16
        assert args.deepspeed_multinode_launcher == "standard"
        assert args.zero_stage == 3 and args.offload_param_device == "cpu"


def test_a_fixed_port_is_kept(tmp_path, monkeypatch):
    script = tmp_path / "job.sbatch"
    _write(tmp_path, monkeypatch, "--cpu", "--slurm", str(script), "--nodes", "2", "--gpus-per-node", "1",
           "--main-process-port", "29633", str(PROBE))
    text = script.read_text()
    assert "exec python -m accelkit.launch.cluster.slurm_job --port 29633" in text
    assert "#SBATCH --gpus-per-node" not in text  # a CPU job asks SLURM for no GPU
    request = embedded_request(text)
    assert request.cpu and request.options.num_machines == 2 and request.options.num_processes == 2


def test_machine_zero_address_comes_from_node_addr_not_the_name():
    assert main_address("n1", "10.0.0.7") == "10.0.0.7"
    with pytest.raises(AccelkitError, match="cannot find an address of machine 0 .node gpu-a01, NodeAddr "
                                            "gpu-a01.invalid."):
        main_address("gpu-a01", "gpu-a01.invalid")


def test_the_failure_line_names_rank_node_and_signal():
    record = {"node": "n2", "machine": 1, "status": 7, "rank": 3, "signal": None, "stalled": False}
    assert job_failure_line(record) == "the job failed: rank 3 on node n2 (machine 1) exited with status 7"
    killed = {**record, "status": 137, "signal": "SIGKILL"}
    assert job_failure_line(killed) == "the job failed: rank 3 on node n2 (machine 1) was killed by SIGKILL (exit 137)"
    stalls = {"stall/0": {"node": "n1", "machine": 0, "where": "every rank here waits in all_reduce",
                          "all_waiting": True},
              "stall/1": {"node": "n2", "machine": 1, "where": "no rank is in a collective (rank 3 at t.py:9)",
                          "all_waiting": False}}
    stalled = {**record, "status": 124, "stalled": True, "node": "n1", "machine": 0}
    assert job_failure_line(stalled, stalls) == ("the job stalled (exit 124): on node n2 (machine 1), no rank is in "
                                                 "a collective (rank 3 at t.py:9)")


def test_preflight_names_the_nodes_and_what_differs():
    facts = {"torch": "2.13.0", "script sha256": "a" * 64, "world size": "4"}
    published = {0: {"node": "n1", "facts": facts},
                 1: {"node": "n2", "facts": {**facts, "script sha256": "b" * 64}},
                 2: {"node": "n3", "facts": facts}}
    assert differences(published) == [f"script sha256: n1 (machine 0) has {'a' * 12}, n2 (machine 1) has {'b' * 12}"]
    assert differences({0: published[0], 2: published[2]}) == []


def test_job_board_keeps_the_first_failure():
    hosted = job_board.HostedBoard()
    try:
        board = job_board.connect(hosted.env("127.0.0.1"))
        assert board.put_first("first_failure", {"node": "n2"}) == {"node": "n2"}
        assert board.put_first("first_failure", {"node": "n1"}) == {"node": "n2"}
        board.put("preflight/0", {"x": 1})
        assert board.with_prefix("preflight/") == {"preflight/0": {"x": 1}}
        assert job_board.connect({}) is None
    finally:
        hosted.close()


def test_slurm_refuses_inconsistent_shapes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["launch", "--backend", "ddp", "--slurm", "j.sbatch", "--nodes", "2",
                                 "--num-machines", "3", "--gpus-per-node", "8", str(PROBE)])
    assert result.exit_code == 1 and "--nodes 2 and --num-machines 3 disagree" in result.stderr
    result = runner.invoke(cli, ["launch", "--backend", "ddp", "--slurm", "j.sbatch", "--nodes", "2", str(PROBE)])
    assert result.exit_code == 1 and "--gpus-per-node" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written on error


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("0:30", 30), ("04:00:00", 14400), ("2-0", 172800), ("1-2:03", 93780), ("1-2:03:04", 93784),
    ("UNLIMITED", None), ("infinite", None), ("0", None),
])
def test_slurm_time_limits_read_as_sbatch_reads_them(text, seconds):
    from accelkit.launch.cluster.slurm_values import time_limit_seconds

    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "-5", "1-", "4h", "04:00:00x"])
def test_slurm_time_limits_sbatch_would_refuse(text):
    from accelkit.launch.cluster.slurm_values import time_limit_seconds

    with pytest.raises(AccelkitError, match="is not a SLURM time limit"):
        time_limit_seconds(text)


def test_values_with_spaces_are_quoted_in_sbatch_lines(tmp_path, monkeypatch):
    folder = tmp_path / "my project"
    folder.mkdir()
    _write(folder, monkeypatch, "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
           "--job-name", "fine tune", str(PROBE))
    lines = (folder / "job.sbatch").read_text().splitlines()
    assert '#SBATCH --job-name="fine tune"' in lines and f'#SBATCH --chdir="{folder}"' in lines
