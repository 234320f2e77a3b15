"""Read the Python stacks faulthandler dumped for each rank and say where the job hangs.

For every rank: the main thread's frames, the collective it waits in (the innermost frame in torch.distributed or
deepspeed.comm, e.g. `all_reduce`, `barrier`; a DDP gradient all-reduce runs inside `backward`; a pipeline stage waits
in torch.distributed.pipelining's point-to-point send/recv to its neighbour) and the line of the
user's code that called it. Across ranks: whether they wait in different collectives (the usual cause: a rank took
another branch) or whether some rank is not in a collective at all (the others wait for it).
"""

from __future__ import annotations

import linecache
import re
from dataclasses import dataclass

from accelkit.ranks import is_library_file

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
# Frames of the machinery every rank starts in; not worth showing.
_STARTUP = ("accelkit/ranks/bootstrap.py", "<frozen runpy>")
# torch.utils.cpp_extension waits here, polling, until the process building an op deletes its lock file.
_BUILD_LOCK_WAIT = "torch/utils/file_baton.py"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def short(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class RankStack:
    rank: int
    pid: int
    frames: tuple[Frame, ...]  # main thread, outermost first (as in a Python traceback)

    @property
    def wait(self) -> str | None:
        """The collective (or distributed wait) this rank is blocked in, or None."""
        frame = _innermost_distributed(self.frames)
        if frame is None:
            return None
        if frame.function == "_engine_run_backward":
            return "backward (DDP's gradient all-reduce)"
        if "/torch/distributed/pipelining/" in frame.file.replace("\\", "/"):
            return f"the pipeline's send/recv to a neighbouring stage ({frame.function})"
        return frame.function

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame of the user's own code."""
        return next((f for f in reversed(self.frames) if not is_library_file(f.file)), None)

    def where(self) -> str:
        frame = self.user_frame or (self.frames[-1] if self.frames else None)
        return frame.short() if frame else "an unknown place (no Python frame)"


def parse_dump(text: str) -> dict[int, list[Frame]]:
    """faulthandler's text (possibly several dumps appended) -> thread id -> frames, outermost first. The last
    dump of each thread wins."""
    threads: dict[int, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            current = threads[int(header.group(1), 16)] = []
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return {ident: list(reversed(frames)) for ident, frames in threads.items()}  # faulthandler: innermost first


def main_thread_stack(rank: int, pid: int, main_thread: int, text: str) -> RankStack | None:
    threads = parse_dump(text)
    frames = threads.get(main_thread)
    if frames is None and len(threads) == 1:
        frames = next(iter(threads.values()))
    if frames is None:
        return None
    shown = tuple(f for f in frames if not any(part in f.file for part in _STARTUP))
    return RankStack(rank=rank, pid=pid, frames=shown)


def stall_diagnosis(stacks: list[RankStack]) -> tuple[str, str]:
    """(where the ranks wait and what that usually means, what to do about it)."""
    if not stacks:
        return "no rank's stack could be read", "rerun with a longer --stall-timeout to get the stacks"
    building = [s for s in stacks if s.frames and s.frames[-1].file.replace("\\", "/").endswith(_BUILD_LOCK_WAIT)]
    if building:
        ranks = ", ".join(str(s.rank) for s in building)
        return (f"rank(s) {ranks} wait for the build lock of a torch extension (a C++ op DeepSpeed compiles on "
                "first use): another process builds it, or a build that was killed left its lock file",
                "if no build is running, delete the file named `lock` in the op's folder under TORCH_EXTENSIONS_DIR "
                "or ~/.cache/torch_extensions (accelkit launch removes such files before a DeepSpeed launch)")
    waiting = [s for s in stacks if s.wait is not None]
    elsewhere = [s for s in stacks if s.wait is None]
    if waiting and elsewhere:
        others = ", ".join(f"rank {s.rank} waits in {s.wait} at {s.where()}" for s in waiting)
        if len(elsewhere) == 1:
            stuck = f"rank {elsewhere[0].rank}"
            text = (f"{stuck} is not in any collective (it is at {elsewhere[0].where()}) while {others}: "
                    f"the others wait for {stuck}")
        else:
            stuck = "ranks " + ", ".join(str(s.rank) for s in elsewhere)
            places = ", ".join(f"rank {s.rank} at {s.where()}" for s in elsewhere)
            text = f"{stuck} are not in any collective ({places}) while {others}: the others wait for them"
        return text, f"look at the line {stuck} is stuck at (its stack is above)"
    if waiting:
        kinds = {s.wait for s in waiting}
        if len(kinds) > 1:
            detail = ", ".join(f"rank {s.rank} in {s.wait} at {s.where()}" for s in waiting)
            return (f"ranks wait in different collectives ({detail}): a rank took another branch",
                    "every rank must call the same collectives in the same order: decide rank- or data-dependent "
                    "branches on all ranks alike")
        places = ", ".join(f"rank {s.rank} at {s.where()}" for s in waiting)
        return (f"every rank here waits in {waiting[0].wait} ({places})",
                "a rank on another machine, or one that exited, never joined: check the other machines' output")
    places = "; ".join(f"rank {s.rank} at {s.where()}" for s in elsewhere)
    return f"no rank is in a collective ({places})", "look at the line each rank is stuck at (stacks above)"


def format_stack(stack: RankStack) -> list[str]:
    lines = [f"accelkit: rank {stack.rank} (pid {stack.pid}), main thread, most recent call last:"]
    for f in stack.frames:  # as a Python traceback shows them: each frame, then its source line when readable
        lines.append(f'  File "{f.file}", line {f.line}, in {f.function}')
        source = linecache.getline(f.file, f.line).strip()
        if source:
            lines.append(f"    {source}")
    if not stack.frames:
        lines.append("  (no Python frame: the rank is inside native code)")
    return lines


def _innermost_distributed(frames: tuple[Frame, ...]) -> Frame | None:
    """The innermost frame, when it is a distributed wait: a collective in torch.distributed or deepspeed.comm (the
    native wait runs under it), or autograd's backward (DDP all-reduces gradients inside it). A rank whose innermost
    frame is anything else (a sleep, a subprocess, a file lock) waits for something other than its peers."""
    if not frames:
        return None
    frame = frames[-1]
    path = frame.file.replace("\\", "/")
    if "/torch/distributed/" in path or "/deepspeed/comm/" in path:
        return frame
    if path.endswith("/torch/autograd/graph.py") and frame.function == "_engine_run_backward":
        return frame
    return None
