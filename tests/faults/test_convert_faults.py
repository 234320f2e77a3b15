"""`accelkit convert` faults: scripts it cannot convert, conversions it cannot finish, a --check that finds a
violation, a script that hangs under --check, a --check stopped by a signal, and bad arguments. Each one: the exit
code, one `Error:` line (with a `Hint:`), nothing created or changed outside what the command owns, no temporary
files (the check's scratch folder included), no processes left behind."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import run_fault

CORPUS = DATA / "convert" / "corpus"


def _script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_a_script_that_spawns_its_own_processes_is_refused(tmp_path: Path) -> None:
    # torchrun-style scripts (init_process_group + DDP) are converted (issue #23); mp.spawn ones are not
    script = _script(tmp_path, "spawn.py", """
        import torch
        import torch.multiprocessing as mp
        def worker(rank):
            model = torch.nn.Linear(2, 2)
        mp.spawn(worker, nprocs=2)
    """)
    result = run_fault(["convert", str(script)], watch=[tmp_path])
    result.assert_refused(r"spawn\.py already does distributed training: it spawns its own worker processes "
                          r"\(torch\.multiprocessing\.spawn\) \(line 5\)")


def test_a_script_that_cannot_be_converted_completely_writes_nothing_unless_partial(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", """
        import torch
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 2)
        loss = model(x).pow(2).mean()
        while loss.item() > 0.01:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
    """)
    result = run_fault(["convert", str(script)], watch=[tmp_path])
    line = result.assert_refused(r"train\.py cannot be converted completely: line 6: the loop at line 6 runs while "
                                 r"`loss\.item\(\) > 0\.01`")
    assert "--partial" in result.stderr and "NOT CONVERTED (1)" in result.stdout, line
    written = run_fault(["convert", str(script), "--partial"], watch=[tmp_path], expect="ok")
    assert written.returncode == 0, written.stderr
    assert written.created == [str(tmp_path / "train_accelerate.py")] and not written.changed
    written.assert_clean(owned=[tmp_path / "train_accelerate.py"])


@pytest.mark.parametrize("args, message", [
    (["--exit-code"], "--exit-code goes with --diff"),
    (["--converted", "{x}"], "--converted goes with --check"),
    (["--check", "--diff"], "use only one of"),
    (["--lr", "0.1"], "arguments after SCRIPT are passed to the script by --check only"),
    (["--check", "--steps", "0"], "0 is not in the range x>=1"),
])
def test_bad_arguments_are_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "lbfgs.py").read_text())
    (tmp_path / "x.py").write_text("")
    args = [a.replace("{x}", str(tmp_path / "x.py")) for a in args]
    result = run_fault(["convert", str(script), *args], watch=[tmp_path], expect="refused")
    assert result.returncode == 2, result.stderr
    assert not result.traceback and len(result.error_lines) == 1 and message in result.error_lines[0], result.stderr
    result.assert_clean()


def test_a_missing_script_is_a_usage_error(tmp_path: Path) -> None:
    result = run_fault(["convert", "--check", str(tmp_path / "nope.py")], watch=[tmp_path])
    assert result.returncode == 2 and "does not exist" in result.error_lines[0] and not result.traceback
    result.assert_clean()


@pytest.mark.slow
def test_a_check_that_finds_a_violation_fails_with_the_evidence_and_leaves_nothing(tmp_path: Path) -> None:
    """The StepLR of mnist_style prepared (the naive conversion): the learning rate decays twice as fast."""
    from accelkit.convert import convert_source

    script = tmp_path / "train.py"
    script.write_text((CORPUS / "mnist_style.py").read_text())
    code = convert_source(script.read_text()).code.replace(
        "model, optimizer, train_loader, test_loader = accelerator.prepare(\n        model, optimizer, train_loader, "
        "test_loader\n    )", "model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(\n"
        "        model, optimizer, train_loader, test_loader, scheduler\n    )")
    naive = tmp_path / "naive.py"
    naive.write_text(code)
    result = run_fault(["convert", "--check", "--converted", str(naive), str(script)], watch=[tmp_path],
                       cwd=tmp_path, kind="check finds a violation")
    result.assert_refused(r"the converted train\.py failed 1 of 8 checks: lr$")
    assert "FAIL  lr            step 4 of optimizer #0 used lr 0.245 on 2 processes; the original used 0.35" \
        in result.stdout


@pytest.mark.slow
def test_a_hanging_conversion_ends_in_seconds_saying_where_each_rank_is(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "manual_batching.py").read_text())
    from accelkit.convert import convert_source

    # rank 1 stops making progress after its second step while rank 0 waits for it in the next all-reduce
    code = convert_source(script.read_text()).code.replace(
        "            opt.step()\n",
        "            opt.step()\n            if step == 1 and accelerator.process_index == 1:\n"
        "                import time\n                time.sleep(600)\n")
    stuck = tmp_path / "stuck.py"
    stuck.write_text(code)
    sleep_line = code.splitlines().index("                time.sleep(600)") + 1
    result = run_fault(["convert", "--check", "--stall-timeout", "5", "--converted", str(stuck), str(script)],
                       watch=[tmp_path], cwd=tmp_path, kind="hang under --check", timeout=240)
    result.assert_refused(r"failed \d of 8 checks: .*no hang")
    assert "FAIL  no hang       the converted run made no progress" in result.stdout
    assert f"rank 1: train.py:{sleep_line} in main" in result.stdout, result.stdout  # the checked copy is train.py
    assert result.seconds < 200


@pytest.mark.slow
def test_sigterm_during_a_check_stops_both_runs_and_removes_the_scratch_folder(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "mnist_style.py").read_text())
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=tmp_path,
                       send_signal=(8.0, signal.SIGTERM), kind="signal", expect="signal")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert not result.traceback
    result.assert_clean()
