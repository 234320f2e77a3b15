"""Each rank's output reaches the terminal in whole lines (accelkit.ranks.rank_output), with `[rank N] ` before each
line under --rank-prefix: two real CPU ranks print 5,000 lines each at the same moment (tests/data/launch/
chatty_ranks.py). Before the fix, torchrun's `python -u` glued 276 of 10,000 lines in this test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import DATA, run_accelkit

SCRIPT = DATA / "launch" / "chatty_ranks.py"
LINE = re.compile(r"LINE rank=([01]) i=(\d+) x{40}")


@pytest.mark.parametrize("prefixed", [False, True])
def test_every_line_of_two_ranks_printing_at_once_arrives_whole(tmp_path: Path, prefixed: bool) -> None:
    proc = run_accelkit("launch", "--cpu", "--num-processes", "2", *(["--rank-prefix"] if prefixed else []),
                        str(SCRIPT), str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "LINE" in line]
    pattern = re.compile(r"\[rank ([01])\] " + LINE.pattern) if prefixed else LINE
    matches = [pattern.fullmatch(line) for line in lines]
    assert [line for line, match in zip(lines, matches, strict=True) if match is None] == []
    assert len(lines) == 10_000
    if prefixed:  # the prefix names the rank that printed the line
        assert all(match.group(1) == match.group(2) for match in matches)
        assert "[rank 0] rank 0 done" in proc.stderr.splitlines() and "[rank 1] rank 1 done" in proc.stderr.splitlines()
    else:
        assert "rank 0 done" in proc.stderr.splitlines() and "rank 1 done" in proc.stderr.splitlines()


def test_accelkit_lines_start_a_line_after_unfinished_progress_bars(tmp_path: Path) -> None:
    """Two ranks leave tqdm-like bars unfinished (`\\r 45%|####`, no newline) and rank 1 fails, twice (--max-restarts
    1): the restart line and the failure line each start a line (`grep ^accelkit` finds them in a log). Before the
    fix: `\\r 45%|####accelkit: rank 1 (pid ...) exited with status 3 ...; restarting every rank`."""
    proc = run_accelkit("launch", "--cpu", "--num-processes", "2", "--max-restarts", "1",
                        str(DATA / "launch" / "bar_then_fail.py"), timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = proc.stderr.split("\n")
    assert [line for line in lines if "accelkit:" in line and not line.startswith("accelkit:")] == [], proc.stderr
    said = [line for line in lines if line.startswith("accelkit: rank 1")]
    assert "restarting every rank: attempt 2 of 2" in said[0] and "failed first, exit code 3" in said[1], said
    assert proc.stderr.count("45%|####") == 4  # the bars themselves are left as the ranks drew them
