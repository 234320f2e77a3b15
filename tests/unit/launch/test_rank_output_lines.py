"""PrefixedLines (accelkit.ranks.rank_output): whole lines, each with its prefix once, partial lines on flush."""

from __future__ import annotations

import io

from accelkit.ranks.rank_output import PrefixedLines


class Recorder(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_lines_are_written_whole_and_prefixed_once() -> None:
    out = Recorder()
    stream = PrefixedLines(out, "[rank 3] ")
    stream.write("a")
    stream.write("b\nc")
    assert out.writes == ["[rank 3] ab\n"]  # one write per batch of whole lines; "c" waits for its end
    stream.write("d\ne\n")
    assert out.getvalue() == "[rank 3] ab\n[rank 3] cd\n[rank 3] e\n"


def test_a_flushed_partial_line_gets_its_prefix_once() -> None:
    out = Recorder()
    stream = PrefixedLines(out, "[rank 0] ")
    print("loading", end="", file=stream, flush=True)
    print(" ... done", file=stream)
    assert out.getvalue() == "[rank 0] loading ... done\n"


def test_carriage_returns_start_a_line_as_progress_bars_redraw() -> None:
    out = Recorder()
    stream = PrefixedLines(out, "[rank 1] ")
    stream.write("\r 10%")
    stream.write("\r 20%")
    stream.flush()
    stream.write("\n")
    assert out.getvalue() == "[rank 1] \r[rank 1]  10%\r[rank 1]  20%\n"


_RANK = """
import sys
from accelkit.line_state import track_line_state
track_line_state(sys.argv[1])
for piece in sys.argv[2:]:
    sys.stderr.write(piece)
    sys.stderr.flush()
"""


def _rank_writes(log, watch_dir, *pieces: str) -> None:
    """A rank process (its stderr the job's log, as it inherits it) writing `pieces`, each flushed (tqdm's way)."""
    import subprocess
    import sys

    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-c", _RANK, str(watch_dir), *pieces], stderr=out, check=True, timeout=60)


def test_accelkit_lines_start_a_line_after_a_ranks_unfinished_progress_bar(tmp_path) -> None:
    """tqdm redraws `\\r 45%|####` with no newline until it closes: a rank that fails midway leaves the line open,
    and the supervisor's next line (written by another process to the same log) must not be glued to it
    (`grep ^accelkit` on a SLURM log). After a rank's whole line, no blank line is added."""
    from accelkit.line_state import start_line

    log, watch_dir = tmp_path / "job.log", tmp_path / "launch"
    watch_dir.mkdir()
    start_line(None, watch_dir)  # before any rank ran: nothing known, nothing written
    _rank_writes(log, watch_dir, "\r 10%|#", "\r 45%|####")
    with open(log, "a") as supervisor:
        for text in ("rank 1 failed first", "restarting every rank: attempt 2 of 3"):
            start_line(supervisor, watch_dir)
            print(f"accelkit: {text}", file=supervisor, flush=True)
    _rank_writes(log, watch_dir, "resumed\n")
    with open(log, "a") as supervisor:
        start_line(supervisor, watch_dir)
        print("accelkit: done", file=supervisor, flush=True)
    text = log.read_bytes().decode()  # as written: no newline translation
    assert text == ("\r 10%|#\r 45%|####\naccelkit: rank 1 failed first\n"
                               "accelkit: restarting every rank: attempt 2 of 3\nresumed\naccelkit: done\n")
    assert [line for line in text.split("\n") if "accelkit:" in line and not line.startswith("accelkit:")] == []


def test_without_a_supervisor_a_ranks_streams_are_left_alone(tmp_path, monkeypatch) -> None:
    import sys

    from accelkit.line_state import track_line_state

    monkeypatch.delenv("ACCELKIT_WATCH_DIR", raising=False)
    before = (sys.stdout, sys.stderr)
    track_line_state()
    assert (sys.stdout, sys.stderr) == before
