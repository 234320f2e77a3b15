"""`accelkit launch` when the job goes wrong: a stall, ranks in different collectives, a rank killed by a signal, Ctrl-C
(twice), SIGTERM, a syntax error, a 0-dim parameter, a machine waiting for machine 0, a GPU config on a machine
without GPUs, and a slow job that must not be stopped. Each checks the exit status, the one `Error:` line with its
`Hint:`, no traceback, nothing created or changed outside the job's own outputs, no launch folder left in the temp
directory, no process left behind.

Every launch gets its own TMPDIR inside the test folder, so the leftover check sees this launch only (other jobs on
the machine use the system temp folder); torch's own caches, which a user's TMPDIR would hold too, go elsewhere. The
ones that start ranks are marked slow.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import DATA, OP_CACHE
from helpers.faults import FaultResult, invoke_fault, run_fault

from accelkit.launch.ports import free_port

FAULTS = DATA / "launch" / "faults.py"
PROBE = DATA / "launch" / "probe.py"
CPU_DDP = ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2"]


def line_of(marker: str) -> int:
    """The line of faults.py that carries `marker` (a comment), so tests do not hard-code line numbers."""
    return next(i for i, text in enumerate(FAULTS.read_text().splitlines(), 1) if marker in text)




def launch(tmp_path: Path, *args: str, in_process: bool = False, **kwargs) -> FaultResult:
    """Run `accelkit ARGS` in tmp_path/work with a private TMPDIR, watching the whole test folder (`in_process`: a
    refusal made before any process starts, observed in this process by `invoke_fault`)."""
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {"TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(OP_CACHE),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path.parent / f"{tmp_path.name}-inductor"), **kwargs.pop("env", {})}
    if in_process:
        return invoke_fault(list(args), watch=[tmp_path], cwd=work, env=env, **kwargs)
    return run_fault(list(args), watch=[tmp_path], cwd=work, env=env, timeout=kwargs.pop("timeout", 240), **kwargs)


@pytest.mark.slow
def test_rank_stalled_in_python_is_reported_with_both_stacks(tmp_path):
    started = time.time()
    result = launch(tmp_path, *CPU_DDP, "--stall-timeout", "5", str(FAULTS), "stall-in-python", kind="stall")
    line = result.assert_refused(r"the job stalled for \d+ s and was stopped: rank 1 is not in any collective",
                                 exit_code=124)
    sleeping, waiting = line_of("rank 1 stalls here"), line_of("rank 0 waits here")
    assert f"faults.py:{sleeping} in collectives" in line and "rank 0 waits in all_reduce at" in line
    # Both stacks: rank 1 at its sleeping line, rank 0 inside all_reduce called from its line.
    stacks = result.stderr.split("\nError:")[0].split("accelkit: rank ")
    rank0 = next(s for s in stacks if s.startswith("0 (pid"))
    rank1 = next(s for s in stacks if s.startswith("1 (pid"))
    assert f'faults.py", line {waiting}, in collectives' in rank0 and "in all_reduce" in rank0
    assert f'faults.py", line {sleeping}, in collectives' in rank1 and "all_reduce" not in rank1
    # Reported within the timeout + 10 s of the stall (the ranks' ready lines; the last one starts it).
    stalled_at = max(float(t) for t in re.findall(r"FAULTS ready rank=\d t=([\d.]+)", result.stdout))
    assert started + result.seconds - stalled_at < 5 + 10


@pytest.mark.slow
def test_ranks_in_different_collectives_are_told_apart(tmp_path):
    result = launch(tmp_path, *CPU_DDP, "--stall-timeout", "5", str(FAULTS), "branch", kind="stall")
    line = result.assert_refused("ranks wait in different collectives", exit_code=124)
    assert f"rank 0 in all_reduce at {FAULTS}:{line_of('rank 0 branch')}" in line
    assert f"rank 1 in barrier at {FAULTS}:{line_of('rank 1 branch')}" in line
    assert "same order" in result.stderr


@pytest.mark.slow
def test_rank_killed_by_a_signal_is_named(tmp_path):
    result = launch(tmp_path, *CPU_DDP, str(FAULTS), "segfault", kind="crash")
    line = result.assert_refused(r"rank 0 \(pid \d+\) died of SIGSEGV at ", exit_code=139)
    assert f"faults.py:{line_of('rank 0 dies here')} in segfault" in line
    assert "native code" in result.stderr  # the hint


@pytest.mark.slow
def test_ctrl_c_twice_exits_130_and_leaves_nothing(tmp_path):
    result = launch(tmp_path, *CPU_DDP, str(FAULTS), "sleep", kind="signal", expect="signal",
                    send_signal=[("FAULTS all ready", signal.SIGINT), (0.3, signal.SIGINT)])
    assert result.returncode == 130, result.stderr[-3000:]
    assert "stopped by SIGINT (Ctrl-C)" in result.stderr and not result.traceback
    result.assert_clean(owned=[tmp_path / "work"])
    assert not list((tmp_path / "tmp").iterdir())  # no accelkit-launch-* folder, nor anything else


@pytest.mark.slow
def test_ctrl_c_held_down_exits_130_with_the_stop_said_once(tmp_path):
    # A SIGINT every 20 ms until accelkit is gone: one lands in every window of the way out (the supervisor's
    # cleanup, its last lines, the command's return, the interpreter's teardown). Each must end as the first did: 130,
    # the stop said, no KeyboardInterrupt status (-2) and no traceback. CI caught a second Ctrl-C 0.3 s after the first
    # ending accelkit with -2 once the supervisor had put Python's handler back.
    result = launch(tmp_path, *CPU_DDP, str(FAULTS), "sleep", kind="signal", expect="signal",
                    send_signal=[("FAULTS all ready", signal.SIGINT)] + [(0.02, signal.SIGINT)] * 1500)
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.count("stopped by SIGINT (Ctrl-C)") == 1 and not result.traceback
    result.assert_clean(owned=[tmp_path / "work"])
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.slow
def test_sigterm_exits_143_and_leaves_nothing(tmp_path):
    result = launch(tmp_path, *CPU_DDP, str(FAULTS), "sleep", kind="signal", expect="signal",
                    send_signal=("FAULTS all ready", signal.SIGTERM))
    assert result.returncode == 143, result.stderr[-3000:]
    assert not result.traceback
    result.assert_clean(owned=[tmp_path / "work"])
    assert not list((tmp_path / "tmp").iterdir())


def test_syntax_error_is_one_message_before_any_rank_starts(tmp_path):
    script = tmp_path / "work" / "train.py"
    script.parent.mkdir()
    script.write_text("import torch\n\ndef main(:\n    pass\n")
    result = launch(tmp_path, *CPU_DDP, "train.py", in_process=True)
    result.assert_refused(r"train\.py:3:10: SyntaxError: invalid syntax: def main\(:")
    assert "no process was started" in result.stderr and result.seconds < 30


@pytest.mark.slow
def test_scalar_parameter_under_deepspeed_is_named_with_the_ways_out(tmp_path):
    # Every rank fails in DeepSpeed's flattening; the launcher prints the explanation once. (FSDP2's and FSDP1's
    # refusals of the same model are explained from torch's real errors in tests/unit/rehearsal/test_explain.py.)
    result = launch(tmp_path, "launch", "--cpu", "--backend", "deepspeed", "--num-processes", "2", str(FAULTS),
                    "scalar-parameter", timeout=600)
    result.assert_refused("the model's parameter `temperature` is 0-dim \\(a scalar\\), which DeepSpeed ZeRO cannot "
                          "shard \\(it flattens every parameter into its partitions\\)")
    assert "shape (1,)" in result.stderr and "--backend ddp" in result.stderr


# What DeepSpeed's compile probe (op_builder's `has_function`) writes in a `tempfile.mkdtemp()` folder, which it
# removes in a `finally`. torchrun stops ranks with SIGTERM, which Python does not unwind, so a rank stopped inside the
# probe leaves the folder in the user's TMPDIR, exactly as under plain torchrun or `accelerate launch`.
DEEPSPEED_PROBE_FILES = {"test.c", "test.o", "stderr.txt", "a.out"}


def deepspeed_probe_folders(result: FaultResult, tmp: Path) -> list[Path]:
    """The folders, directly in `tmp`, that the stopped job created holding DeepSpeed's probe files and nothing else
    (DeepSpeed's, not accelkit's: the one exception to the clean-stop check, and only for a signal mid-build)."""
    created = [Path(p) for p in result.created]
    folders = {p.parent for p in created if p.parent.parent == tmp and p.parent.name.startswith("tmp")}
    return [folder for folder in folders
            if all(p == folder or p.parent != folder or p.name in DEEPSPEED_PROBE_FILES for p in created)
            and {p.name for p in folder.iterdir()} <= DEEPSPEED_PROBE_FILES]


@pytest.mark.slow
def test_a_deepspeed_op_build_killed_by_sigterm_does_not_hang_the_next_launch(tmp_path, deepspeed_shm_op):
    """SIGTERM while DeepSpeed compiles its shared-memory comm op on first use: torchrun ends the building rank, whose
    build lock (torch's FileBaton) stays behind. Every later load of the op would wait for it forever; the next launch
    removes it, says so, and runs."""
    extensions = tmp_path / "extensions"  # empty: the first launch builds the op
    lock = extensions / "deepspeed_shm_comm" / "lock"
    args = ["launch", "--cpu", "--backend", "deepspeed", "--zero-stage", "2", "--num-processes", "2", str(PROBE)]
    env = {"TORCH_EXTENSIONS_DIR": str(extensions)}
    stopped = launch(tmp_path, *args, env=env, kind="signal", expect="signal", send_signal=(lock, signal.SIGTERM),
                     timeout=300)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert not stopped.traceback
    stopped.assert_clean(owned=[tmp_path / "work", extensions, *deepspeed_probe_folders(stopped, tmp_path / "tmp")])
    assert lock.exists()  # what the interrupted build left

    # the compile itself is not what this test is about: the suite's built op (same sources, same flags) is put beside
    # the stale lock, so the next launch's load finds its objects up to date (ninja builds nothing) once it may
    # take the lock, and hangs forever if it may not
    for built in deepspeed_shm_op.iterdir():
        if built.name != "lock":
            shutil.copy2(built, lock.parent / built.name)
    result = launch(tmp_path, *args, env=env, kind="stale lock", expect="ok", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"accelkit: removed {lock}: a build lock of the torch extension 'deepspeed_shm_comm', created " \
        in result.stderr
    assert sorted(re.findall(r"PROBE done rank=(\d)", result.stdout)) == ["0", "1"]
    assert not lock.exists() and (extensions / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").is_file()
    result.assert_clean(owned=[tmp_path / "work", extensions])


@pytest.mark.slow
def test_a_stale_op_build_lock_that_cannot_be_removed_stops_the_launch_in_one_line(tmp_path):
    """The lock lies in a folder the user cannot write (another user's cache, a read-only image): waiting for it
    would hang every rank, so the launch stops before any rank starts, naming the file."""
    extensions = tmp_path / "extensions"
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # left by a killed build
    lock.parent.chmod(0o555)  # no one may write there; in a user namespace not even root
    try:
        result = launch(tmp_path, "launch", "--cpu", "--backend", "deepspeed", "--num-processes", "2", str(PROBE),
                        env={"TORCH_EXTENSIONS_DIR": str(extensions)}, unprivileged=True)
    finally:
        lock.parent.chmod(0o755)
    line = result.assert_refused(f"{re.escape(str(lock))} is a build lock that an interrupted build of the torch "
                                 r"extension 'deepspeed_shm_comm' left behind \(no process has it open\), and it "
                                 r"cannot be removed \(Permission denied\)")
    assert line.endswith("DeepSpeed would wait for it forever")
    assert "TORCH_EXTENSIONS_DIR" in result.stderr and "PROBE" not in result.stdout  # no rank started
    assert lock.exists()


@pytest.mark.slow
def test_ranks_waiting_for_an_op_build_lock_that_another_process_holds_are_told_so(tmp_path):
    """A build that hangs (stopped with Ctrl-Z, stuck on a full disk) holds the lock: the launch leaves it alone and
    names the process, the ranks wait for it, and the stall watchdog says what they wait for."""
    extensions = tmp_path / "extensions"
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        result = launch(tmp_path, "launch", "--cpu", "--backend", "deepspeed", "--num-processes", "2",
                        "--stall-timeout", "5", str(PROBE), env={"TORCH_EXTENSIONS_DIR": str(extensions)},
                        kind="stall")
        assert holder.poll() is None and lock.exists()  # not ours: left alone
    finally:
        holder.kill()
        holder.wait()
    assert f"accelkit: process {holder.pid} (python" in result.stderr
    assert "holds the build lock of the torch extension 'deepspeed_shm_comm'" in result.stderr
    result.assert_refused(r"the job stalled for \d+ s and was stopped: rank\(s\) 0, 1 wait for the build "
                                 "lock of a torch extension", exit_code=124, owned=[tmp_path / "work", extensions])
    assert "delete the file named `lock`" in result.stderr and "file_baton.py" in result.stderr


# torch's FileBaton, taken and held as a building process holds it.
HOLD_LOCK = """
import sys, time
from torch.utils.file_baton import FileBaton
assert FileBaton(sys.argv[1]).try_acquire()
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_machine_waiting_for_machine_zero_says_for_whom_and_what_to_check(tmp_path):
    port = str(free_port())  # nothing listens there: machine 0 never started
    result = launch(tmp_path, *CPU_DDP, "--num-machines", "2", "--machine-rank", "1", "--main-process-ip",
                    "127.0.0.1", "--main-process-port", port, "--rdzv-conf", "timeout=3", str(FAULTS), "sleep")
    result.assert_refused(f"machine 1 waited 3 s for machine 0 at 127.0.0.1:{port}, which never answered")
    assert f"accelkit: waiting for machine 0 at 127.0.0.1:{port} (timeout 3 s)" in result.stderr
    assert "--machine-rank 0" in result.stderr and "firewall" in result.stderr
    assert "FAULTS ready" not in result.stdout  # no rank started


@pytest.mark.slow
def test_gpu_config_on_a_machine_without_gpus_says_cpu_rehearses_it(tmp_path):
    config = tmp_path / "work" / "ddp.yaml"
    config.parent.mkdir()
    made = run_fault(["config", "--backend", "ddp", "--num-processes", "2", "-o", str(config)], watch=[tmp_path],
                     expect="ok")
    assert made.returncode == 0, made.stderr
    result = launch(tmp_path, "launch", "--config", "ddp.yaml", str(FAULTS), "sleep")
    line = result.assert_refused(r"the ddp config ddp\.yaml runs on GPUs, and this machine has none")
    assert re.search(r"Hint: add --cpu to rehearse it on 2 CPU processes \(`accelkit launch --cpu --config ddp\.yaml",
                     result.stderr), line


@pytest.mark.slow
def test_slow_job_that_progresses_is_not_stopped(tmp_path):
    # 4 silent pauses of 2.5 s with a 4 s timeout: 10 s+ in all, longer than the timeout, never 4 s without a
    # collective or a line.
    started = time.monotonic()
    result = launch(tmp_path, *CPU_DDP, "--stall-timeout", "4", str(FAULTS), "slow", "4", "2.5", expect="ok")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stalled" not in result.stderr
    assert sorted(re.findall(r"FAULTS step (\d) rank=(\d)", result.stdout)) == [
        (str(step), str(rank)) for step in range(4) for rank in (0, 1)]
    assert time.monotonic() - started > 10
    result.assert_clean()


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_a_stall_timeout_that_is_not_a_finite_number_of_seconds_is_refused(tmp_path, value):
    # parsed in one place for launch, bench, plan --measure (accelkit.commands.supervision_options)
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    result = invoke_fault([*CPU_DDP, "--stall-timeout", value, str(script)], watch=[tmp_path], cwd=tmp_path,
                          kind="bad option")
    assert result.returncode == 2 and "Invalid value for '--stall-timeout'" in result.stderr, result.stderr
    assert not result.traceback and not result.touched_outside([])


@pytest.mark.slow
def test_launch_settings_left_in_the_shell_do_not_reach_the_ranks(tmp_path):
    """ACCELKIT_GRAD_COMPRESSION / ACCELKIT_PIPELINE exported in the shell, a launch whose options set neither: the
    launcher drops them with a line each (a bad compression value was a KeyError traceback on every rank)."""
    from accelkit.scaffold import init_project

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    env = {"ACCELKIT_GRAD_COMPRESSION": "bogus", "ACCELKIT_PIPELINE": "pp=2,schedule=gpipe,microbatches=4",
           "TMPDIR": str(tmp_path)}
    result = run_fault([*CPU_DDP, str(project / "train.py"), "--max-steps", "2", "--num-samples", "64"],
                       watch=[project], cwd=tmp_path, env=env, expect="ok")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not result.traceback
    for name in ("ACCELKIT_GRAD_COMPRESSION", "ACCELKIT_PIPELINE"):
        assert f"accelkit: ignoring {name}=" in result.stderr, result.stderr[-3000:]
    assert "effective batch" in result.stdout + result.stderr
