"""`accelkit launch` starting real processes on CPU: every backend on 2 gloo ranks, a crashing rank, Ctrl-C, and
two launches acting as two machines over loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import DATA, run_accelkit

from accelkit.launch.ports import free_port

PROBE = DATA / "launch" / "probe.py"
# Ranks share one stdout, so a line may run into another rank's: match up to the end of each field.
RESULT = re.compile(r"PROBE rank=(\d+) world=(\d+) type=(\w+) wrapper=(\w+) shard=(\w+:\d+/\d+) backend=(\w+) "
                    r"argv=(\[.*?\])")


def results(stdout: str) -> dict[int, dict[str, str]]:
    out = {}
    for rank, world, dtype, wrapper, shard, backend, argv in RESULT.findall(stdout):
        out[int(rank)] = {"world": world, "type": dtype, "wrapper": wrapper, "shard": shard, "backend": backend,
                          "argv": argv}
    return out


@pytest.mark.parametrize(
    ("backend", "extra", "dtype", "wrapper", "shard"),
    [
        ("ddp", [], "MULTI_CPU", "DistributedDataParallel", "full"),
        ("fsdp", [], "FSDP", "FSDPSequential", "dtensor"),
        ("deepspeed", ["--zero-stage", "3"], "DEEPSPEED", "DeepSpeedEngine", "zero3"),
    ],
)
def test_backend_really_runs_on_two_cpu_ranks(tmp_path, backend, extra, dtype, wrapper, shard):
    ckpt = tmp_path / "ckpt"
    proc = run_accelkit("launch", "--cpu", "--backend", backend, *extra, "--num-processes", "2", str(PROBE),
                        "--output", str(ckpt), "--unused", "a b", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"accelkit: launching {PROBE}: backend={backend} (--backend)" in proc.stderr
    assert "accelkit: CPU rehearsal of" in proc.stderr
    ranks = results(proc.stdout)
    assert sorted(ranks) == [0, 1], proc.stdout
    for info in ranks.values():
        assert (info["world"], info["type"], info["wrapper"], info["backend"]) == ("2", dtype, wrapper, "gloo")
        assert info["argv"] == repr(["--output", str(ckpt), "--unused", "a b"])  # verbatim, spaces and all
        kind, sizes = info["shard"].split(":")
        local, total = map(int, sizes.split("/"))
        assert kind == shard
        # Sharded backends hold half of the 8x16 first weight on each rank; DDP holds all of it.
        assert local == (total if backend == "ddp" else total // 2) and total == 128

    files = {str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()}
    if backend == "ddp":
        assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"} <= files
    elif backend == "fsdp":  # torch.distributed.checkpoint shards, one per rank
        for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
            assert {f"{sub}/.metadata", f"{sub}/__0_0.distcp", f"{sub}/__1_0.distcp"} <= files
        assert "model.safetensors" not in files
    else:  # DeepSpeed ZeRO-3 layout: a `latest` tag file and one model + optimizer partition per rank
        tag = (ckpt / "latest").read_text().strip()
        assert {f"{tag}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in (0, 1)
                for kind in ("model", "optim")} <= files


def test_natural_cpu_command_runs_n_data_parallel_processes(tmp_path):
    """`accelkit launch --cpu --num-processes 2 train.py` (no --backend: what `accelkit convert` prints as "Try it")
    runs 2 data-parallel CPU ranks, as `accelerate launch --cpu --num_processes 2` users expect."""
    proc = run_accelkit("launch", "--cpu", "--num-processes", "2", str(PROBE), "--exit-after-accelerator",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "backend=cpu (--cpu)" in proc.stderr and "CPU job (DDP): 2 gloo rank(s)" in proc.stderr
    found = sorted(re.findall(r"PROBE accelerator rank=(\d) t=[\d.]+ world=(\d) type=(\w+)", proc.stdout))
    assert found == [("0", "2", "MULTI_CPU"), ("1", "2", "MULTI_CPU")], proc.stdout


def test_crashing_rank_ends_the_job_with_its_exit_code(tmp_path):
    # Rank 1 exits with 7 at once while rank 0 is busy for 10 minutes: only the launcher can end this job.
    start = time.time()
    proc = run_accelkit("launch", "--cpu", "--backend", "ddp", "--num-processes", "2", str(PROBE), "--early",
                        "--crash-rank", "1", "--crash-code", "7", "--sleep", "600", cwd=tmp_path, timeout=240)
    end = time.time()
    assert proc.returncode == 7, proc.stdout + proc.stderr[-3000:]
    crashed_at = float(re.search(r"PROBE crashing rank=1 code=7 t=([\d.]+)", proc.stdout).group(1))
    assert end - crashed_at < 30, f"job ran {end - crashed_at:.1f}s after the crash"
    assert "accelkit: rank 1" in proc.stderr and "exit code 7" in proc.stderr
    assert end - start < 200


def test_sigint_stops_every_process(tmp_path):
    err = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp",
                             "--num-processes", "2", str(PROBE), "--sleep", "600"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        ready = 0
        deadline = time.time() + 180
        while ready < 2 and time.time() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "launch ended early"
            ready += line.startswith("PROBE ready")
        assert ready == 2
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3  # the launcher process and two ranks
        started = time.time()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        stopped = time.time() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        err.close()
    assert proc.returncode == 130
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert not alive, f"orphans left: {alive}"
    assert stopped < 60


def test_two_launches_form_one_job_over_loopback(tmp_path):
    port = str(free_port())
    common = ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "--num-machines", "2",
              "--main-process-ip", "127.0.0.1", "--main-process-port", port]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "accelkit", *common, "--machine-rank", str(rank), str(PROBE),
                               "--output", str(tmp_path / "ckpt")],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out + err[-3000:]
    machine0, machine1 = results(outputs[0][0]), results(outputs[1][0])
    assert list(machine0) == [0] and list(machine1) == [1]  # one rank per machine, global ranks 0 and 1
    assert machine0[0]["world"] == machine1[1]["world"] == "2"
    assert machine0[0]["wrapper"] == "DistributedDataParallel"
    assert "machine_rank=1 (--machine-rank)" in outputs[1][1]
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}


def test_dry_run_command_runs_when_pasted_into_a_shell(tmp_path):
    dry = run_accelkit("launch", "--dry-run", "--cpu", "--backend", "ddp", "--num-processes", "2", str(PROBE),
                       "--first-line-only", cwd=tmp_path, env={"TMPDIR": str(tmp_path)}, check=True)
    script = tmp_path / "pasted.sh"
    script.write_text(dry.stdout)  # comments and all, as a user would paste it
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(re.findall(r"PROBE first_line rank=(\d)", proc.stdout)) == ["0", "1"]


def test_module_runs_on_every_rank_with_its_arguments(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hello.py").write_text(
        "import os, sys\nprint(f\"HELLO rank={os.environ['RANK']} name={__name__} argv={sys.argv[1:]}\", flush=True)\n")
    proc = run_accelkit("launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "-m", "pkg.hello", "--x",
                        "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # (the two ranks share one stdout, so their lines may interleave)
    found = sorted(re.findall(r"HELLO rank=(\d) name=(\S+) argv=(\[[^\]]*\])", proc.stdout))
    assert found == [(r, "__main__", "['--x', '1']") for r in ("0", "1")], proc.stdout
