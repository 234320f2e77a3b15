"""`accelkit launch` resuming a DeepSpeed ZeRO checkpoint of another world size that cannot be converted: one
`Error:` line with its `Hint:`, exit 1, no traceback, no rank started, the checkpoint untouched and no universal
copy (nor a staging folder) written. On the real launch (the launcher process reads the checkpoint) and on
--dry-run (the same reading, in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.faults import invoke_fault, run_fault

ZERO2_ON_2 = ["launch", "--cpu", "--backend", "deepspeed", "--zero-stage", "2", "--num-processes", "2"]


def broken_checkpoint(work: Path) -> Path:
    """checkpoint-10 of 4 ZeRO-2 ranks with rank 2's optimizer state missing."""
    import torch

    tag = work / "out" / "checkpoint-10" / "pytorch_model"
    tag.mkdir(parents=True)
    (tag.parent / "latest").write_text("pytorch_model")
    torch.save({"module": {}}, tag / "mp_rank_00_model_states.pt")
    for rank in (0, 1, 3):
        torch.save({"optimizer_state_dict": {"zero_stage": 2, "partition_count": 4}},
                   tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (work / "train.py").write_text("raise SystemExit('the script must not start')\n")
    return tag.parent


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_missing_rank_file_is_refused_before_any_rank_starts(tmp_path: Path, dry_run: bool) -> None:
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    tmp.mkdir()
    broken_checkpoint(work)
    args = [*ZERO2_ON_2, *(["--dry-run"] if dry_run else []), "train.py", "--output-dir", "out",
            "--resume-from-checkpoint", "latest"]
    env = {"TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    if dry_run:
        result = invoke_fault(args, watch=[tmp_path], cwd=work, env=env)
    else:
        result = run_fault(args, watch=[tmp_path], cwd=work, env=env, timeout=120)
    result.assert_refused(r"optimizer-state file of rank 2 is missing in .*checkpoint-10/pytorch_model "
                          r"\(found ranks \[0, 1, 3\]\)")
    assert "the script must not start" not in result.stderr
    assert sorted(p.name for p in (work / "out").iterdir()) == ["checkpoint-10"]
    assert not list(tmp.iterdir())  # no launch folder left
