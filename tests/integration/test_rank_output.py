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
