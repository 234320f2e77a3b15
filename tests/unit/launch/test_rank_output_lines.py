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
