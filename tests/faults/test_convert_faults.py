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
from helpers.faults import invoke_fault, run_fault

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
    result = invoke_fault(["convert", str(script)], watch=[tmp_path])
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
    result = invoke_fault(["convert", str(script)], watch=[tmp_path])
    line = result.assert_refused(r"train\.py cannot be converted completely: line 6: the loop at line 6 runs while "
                                 r"`loss\.item\(\) > 0\.01`")
    assert "--partial" in result.stderr and "NOT CONVERTED (1)" in result.stdout, line
    written = invoke_fault(["convert", str(script), "--partial"], watch=[tmp_path], expect="ok")
    assert written.returncode == 0, written.stderr
    assert written.created == [str(tmp_path / "train_accelerate.py")] and not written.changed
    written.assert_clean(owned=[tmp_path / "train_accelerate.py"])


def test_models_made_inside_a_list_are_refused_with_the_line_and_nothing_written(tmp_path: Path) -> None:
    # MorvanZhou's 504_batch_normalization.py: "converted" with nothing prepared before the refusal existed
    script = _script(tmp_path, "nets.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
        nets = [torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)]
        opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
        for x, y in loader:
            for net, opt in zip(nets, opts):
                loss = torch.nn.functional.mse_loss(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    """)
    result = invoke_fault(["convert", str(script)], watch=[tmp_path])
    result.assert_refused(r"nets\.py cannot be converted completely: line 4: models made inside a container "
                          r"\(`nets`, line 4\) have no name to prepare them by")


def test_a_model_handed_to_an_imported_trainer_is_refused_even_with_nothing_else_to_change(tmp_path: Path) -> None:
    # the refusal was dropped when the file had nothing else to edit: "nothing to convert", exit 0
    script = _script(tmp_path, "handed.py", """
        import torch
        from trainlib import Trainer
        net = torch.nn.Linear(1, 1)
        Trainer(net).run()
    """)
    result = invoke_fault(["convert", str(script)], watch=[tmp_path])
    result.assert_refused(r"handed\.py cannot be converted completely: line \d: .*imported code")


@pytest.mark.parametrize("args, message", [
    (["--exit-code"], "--exit-code goes with --diff"),
    (["--converted", "{x}"], "--converted goes with --check"),
    (["--check", "--diff"], "use only one of"),
    (["--lr", "0.1"], "arguments after SCRIPT are passed to the script by --check only"),
    (["--check", "--steps", "0"], "0 is not in the range x>=1"),
    (["--check", "--stall-timeout", "nan"], "'nan' is not a finite number of seconds"),
    (["--check", "--stall-timeout", "inf"], "'inf' is not a finite number of seconds"),
    (["--backend", "fsdp"], "--backend goes with --check"),
    (["--check", "--backend", "deepspeed"], "'deepspeed' is not one of 'ddp', 'fsdp'"),
])
def test_bad_arguments_are_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "lbfgs.py").read_text())
    (tmp_path / "x.py").write_text("")
    args = [a.replace("{x}", str(tmp_path / "x.py")) for a in args]
    result = invoke_fault(["convert", str(script), *args], watch=[tmp_path], expect="refused")
    assert result.returncode == 2, result.stderr
    assert not result.traceback and len(result.error_lines) == 1 and message in result.error_lines[0], result.stderr
    result.assert_clean()


def test_a_missing_script_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke_fault(["convert", "--check", str(tmp_path / "nope.py")], watch=[tmp_path])
    assert result.returncode == 2 and "does not exist" in result.error_lines[0] and not result.traceback
    result.assert_clean()


@pytest.mark.slow
def test_a_check_that_finds_a_violation_fails_with_the_evidence_and_leaves_nothing(tmp_path: Path) -> None:
    """The StepLR of mnist_style prepared (the naive conversion): the learning rate decays twice as fast."""
    from accelkit.convert.codemod import convert_source

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
    from accelkit.convert.codemod import convert_source

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
    assert f"rank 1: stuck.py:{sleep_line} in main" in result.stdout, result.stdout  # the file the user gave
    assert result.seconds < 200


@pytest.mark.slow
def test_sigterm_during_a_check_stops_both_runs_and_removes_the_scratch_folder(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "mnist_style.py").read_text())
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=tmp_path,
                       # 3 s after the check says what it runs (SIGCONT is a no-op): inside the converted run, which
                       # comes first and takes ~6 s; a fixed delay from the start raced the check's end
                       send_signal=[("each in a copy of the working directory", signal.SIGCONT),
                                    (3.0, signal.SIGTERM)], kind="signal", expect="signal")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert not result.traceback
    result.assert_clean()


# -- the sandbox: nothing a check runs can reach the user's files -------------------------------------------------
CARELESS = """
    import contextlib
    import os
    import shutil
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    # what careless training scripts do to their working directory, in the original's run and in every rank
    with open("results.txt", "w") as f:
        f.write("overwritten")
    with open("log.txt", "a") as f:
        f.write("appended")
    with contextlib.suppress(FileNotFoundError):
        os.remove("delete_me.txt")
    with contextlib.suppress(FileNotFoundError):
        os.rename("sub/rename_me.txt", "sub/renamed.txt")
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree("sub/deep")
    Path("sub/new.txt").write_text("new")
    (Path(__file__).parent / "beside.txt").write_text("beside")
    with open("data/through_the_link.txt", "w") as f:
        f.write("x")
    with open("data/existing.txt", "a") as f:
        f.write("appended through a link")

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    torch.save(model.state_dict(), "ckpt.pt")
"""


@pytest.mark.slow
def test_a_check_never_writes_appends_deletes_or_renames_the_users_files(tmp_path: Path) -> None:
    """Issue 19 item 1: the scratch folder held links to the working directory, so both runs overwrote the user's
    results.txt and ckpt.pt and left files in its subfolders. Every file and folder is hashed before and after."""
    project, datasets = tmp_path / "project", tmp_path / "datasets"
    (project / "sub" / "deep").mkdir(parents=True)
    datasets.mkdir()
    script = _script(project, "train.py", CARELESS)
    for name, text in (("results.txt", "mine"), ("log.txt", "mine"), ("delete_me.txt", "mine"), ("ckpt.pt", "mine"),
                       ("sub/rename_me.txt", "mine"), ("sub/deep/f.txt", "mine")):
        (project / name).write_text(text)
    (datasets / "existing.txt").write_text("mine")
    (project / "data").symlink_to("../datasets")  # a data folder linked from elsewhere
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=project, kind="sandbox",
                       expect="ok")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Check passed" in result.stdout and "ckpt.pt" in result.stdout  # the runs really wrote, in the sandbox
    result.assert_clean()


def test_a_working_directory_over_the_sandbox_limit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", CARELESS)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard.bin").write_bytes(b"x" * 5000)
    result = invoke_fault(["convert", "--check", "--sandbox-limit", "4KiB", str(script)], watch=[tmp_path],
                          cwd=tmp_path, kind="sandbox")
    result.assert_refused(r"copy of the working directory .* holds more than 4\.00 KiB \(the --sandbox-limit "
                          r"limit\): data/ 4\.88 KiB")
    assert "--sandbox-limit SIZE" in result.stderr and "Usage" not in result.stderr
    bad = invoke_fault(["convert", "--check", "--sandbox-limit", "12", str(script)], watch=[tmp_path], cwd=tmp_path)
    bad.assert_refused(r"--sandbox-limit '12' is not a size")


# -- verdicts: a check that checked nothing, or could not reach what it compares, fails and says why -------------
@pytest.mark.slow
@pytest.mark.parametrize("text", ["", """
    import torch
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        print(model(torch.randn(2, 4)).sum().item())
"""], ids=["empty", "no-optimizer"])
def test_a_check_that_checked_nothing_fails_saying_so(text: str, tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", text)
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=tmp_path, kind="check verdict")
    result.assert_refused(r"nothing was checked: the original train\.py ran to its end without a training step")
    assert "Check passed" not in result.stdout
    assert "FAIL  ran           nothing was checked" in result.stdout


EVALUATES_AFTER_AN_EPOCH = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def evaluate(model, loader):
        model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in loader:
                total += torch.nn.functional.mse_loss(model(x), y, reduction="sum").item()
        print(f"EVAL loss={total / len(loader.dataset):.6f}")


    def main():
        torch.manual_seed(0)
        train = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=2, shuffle=True)
        test = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(2):
            model.train()
            for x, y in train:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
            evaluate(model, test)


    if __name__ == "__main__":
        main()
"""


@pytest.mark.slow
def test_an_evaluation_the_step_limit_never_reaches_fails_with_the_steps_that_reach_it(tmp_path: Path) -> None:
    """32 batches per epoch on one process, 16 on each of 2: the default 8 steps stop before the evaluation."""
    script = _script(tmp_path, "train.py", EVALUATES_AFTER_AN_EPOCH)
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=tmp_path, kind="check verdict")
    result.assert_refused(r"the check of train\.py could not run metrics: its runs stopped at 8 step\(s\)")
    assert "--steps 17" in result.stderr.split("Hint:")[1], result.stderr
    assert "FAIL  metrics       not checked: the script evaluates (loop at line 9)" in result.stdout


@pytest.mark.slow
def test_an_original_that_crashes_is_blamed_not_the_conversion(tmp_path: Path) -> None:
    script = _script(tmp_path, "train.py", """
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        raise FileNotFoundError("no such file: 'data/train.csv'")
    """)
    result = run_fault(["convert", "--check", str(script)], watch=[tmp_path], cwd=tmp_path, kind="check verdict")
    result.assert_refused(r"the original train\.py itself failed on 1 process \(exit status 1: FileNotFoundError: "
                          r"no such file: 'data/train\.csv'\)")
    assert "python " in result.stderr.split("Hint:")[1] and "converted train.py failed" not in result.stderr


@pytest.mark.slow
def test_a_hang_in_a_conversion_is_reported_at_the_original_scripts_line(tmp_path: Path) -> None:
    """Rank 1 of the conversion sleeps (the original, one process, does not): the stack names the original's line,
    not the line of the converted copy (which the conversion's added lines shift)."""
    script = _script(tmp_path, "train.py", """
        import os
        import time

        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            torch.manual_seed(0)
            loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                if step == 1 and os.environ.get("RANK") == "1":
                    time.sleep(600)


        main()
    """)
    sleep_line = [line.strip() for line in script.read_text().splitlines()].index("time.sleep(600)") + 1
    result = run_fault(["convert", "--check", "--stall-timeout", "5", str(script)], watch=[tmp_path], cwd=tmp_path,
                       kind="hang under --check", timeout=240)
    result.assert_refused(r"failed \d of 8 checks: .*no hang")
    assert f"rank 1: train.py:{sleep_line} in main" in result.stdout, result.stdout
