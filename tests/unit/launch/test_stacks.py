"""Reading faulthandler's dumps (made by the real faulthandler) and saying where the ranks wait."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from accelkit.launch.stacks import Frame, RankStack, format_stack, main_thread_stack, parse_dump, stall_diagnosis

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"


def real_dump(tmp_path: Path) -> tuple[str, int]:
    """A dump of a process whose main thread sits in nested functions while a helper thread waits."""
    script = tmp_path / "user_train.py"
    script.write_text(textwrap.dedent("""
        import faulthandler, sys, threading
        ready = threading.Event()
        def helper():
            ready.set()
            threading.Event().wait(30)
        threading.Thread(target=helper, daemon=True).start()
        ready.wait()
        def inner():
            with open(sys.argv[1], "w") as out:
                faulthandler.dump_traceback(out, all_threads=True)
        def outer():
            inner()
        outer()
        print(threading.main_thread().ident)
    """))
    dump = tmp_path / "dump.txt"
    result = subprocess.run([sys.executable, str(script), str(dump)], capture_output=True, text=True, check=True)
    return dump.read_text(), int(result.stdout.strip())


def test_parse_a_real_dump_finds_the_main_thread_in_call_order(tmp_path):
    text, main_ident = real_dump(tmp_path)
    threads = parse_dump(text)
    assert len(threads) == 2 and main_ident in threads
    functions = [frame.function for frame in threads[main_ident]]
    assert functions == ["<module>", "outer", "inner"]  # outermost first, like a Python traceback
    stack = main_thread_stack(3, 4242, main_ident, text)
    assert stack is not None and stack.user_frame.function == "inner"
    assert stack.user_frame.file.endswith("user_train.py")


def test_dumps_appended_twice_keep_the_last(tmp_path):
    text, main_ident = real_dump(tmp_path)
    older = text.replace("inner", "older_place")
    assert parse_dump(older + text)[main_ident][-1].function == "inner"


def stack(rank: int, *frames: tuple[str, int, str]) -> RankStack:
    return RankStack(rank=rank, pid=1000 + rank, frames=tuple(Frame(*f) for f in frames))


def in_all_reduce(rank: int, line: int = 12) -> RankStack:
    return stack(rank, ("/work/train.py", line, "main"), (LOGGER, 83, "wrapper"), (C10D, 3252, "all_reduce"))


def test_rank_stuck_outside_any_collective_is_named_with_its_line():
    sleeping = stack(1, ("/work/train.py", 20, "main"))
    text, advice = stall_diagnosis([in_all_reduce(0), sleeping])
    assert text.startswith("rank 1 is not in any collective (it is at /work/train.py:20 in main)")
    assert "rank 0 waits in all_reduce at /work/train.py:12 in main" in text
    assert text.endswith("the others wait for rank 1")
    assert advice == "look at the line rank 1 is stuck at (its stack is above)"


def test_ranks_in_different_collectives_point_at_a_branch():
    barrier = stack(1, ("/work/train.py", 15, "main"), (C10D, 4990, "barrier"))
    text, advice = stall_diagnosis([in_all_reduce(0), barrier])
    assert text.startswith("ranks wait in different collectives")
    assert "rank 0 in all_reduce at /work/train.py:12" in text and "rank 1 in barrier at /work/train.py:15" in text
    assert text.endswith("a rank took another branch") and "same order" in advice


def test_ranks_in_the_same_collective():
    text, advice = stall_diagnosis([in_all_reduce(0), in_all_reduce(1)])
    assert text.startswith("every rank here waits in all_reduce") and "other machines" in advice


def test_ddp_backward_counts_as_waiting_in_its_all_reduce():
    backward = stack(0, ("/work/train.py", 30, "main"),
                     ("/venv/lib/python3.11/site-packages/torch/_tensor.py", 630, "backward"),
                     ("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 829, "_engine_run_backward"))
    assert backward.wait == "backward (DDP's gradient all-reduce)"
    assert backward.where() == "/work/train.py:30 in main"


def test_a_pipeline_stage_waiting_in_its_point_to_point_receive_waits_for_its_neighbour():
    schedules = "/venv/lib/python3.11/site-packages/torch/distributed/pipelining/schedules.py"
    receiving = stack(0, ("/work/train.py", 46, "main"), (schedules, 928, "_step_microbatches"),
                      (schedules, 683, "_wait_batch_p2p"))
    assert receiving.wait == "the pipeline's send/recv to a neighbouring stage (_wait_batch_p2p)"
    text, advice = stall_diagnosis([receiving, stack(1, ("/work/train.py", 30, "forward"))])
    assert text == ("rank 1 is not in any collective (it is at /work/train.py:30 in forward) while rank 0 waits in "
                    "the pipeline's send/recv to a neighbouring stage (_wait_batch_p2p) at /work/train.py:46 in main: "
                    "the others wait for rank 1")
    assert advice == "look at the line rank 1 is stuck at (its stack is above)"


def test_no_rank_in_a_collective():
    text, _ = stall_diagnosis([stack(0, ("/work/a.py", 1, "f")), stack(1, ("/work/a.py", 2, "g"))])
    assert text == "no rank is in a collective (rank 0 at /work/a.py:1 in f; rank 1 at /work/a.py:2 in g)"


def test_format_stack_reads_like_a_traceback_without_claiming_to_be_one():
    lines = format_stack(in_all_reduce(0))
    assert lines[0] == "accelkit: rank 0 (pid 1000), main thread, most recent call last:"
    assert lines[1] == '  File "/work/train.py", line 12, in main'
    assert not any("Traceback (most recent call last)" in line for line in lines)


def test_a_rank_waiting_on_a_subprocess_under_deepspeed_comm_is_not_in_a_collective():
    # rank 0 compiles DeepSpeed's comm op (ninja in a subprocess) while rank 1 waits for the build's file lock
    compiling = stack(0, ("/work/train.py", 44, "<module>"),
                      ("/venv/lib/python3.11/site-packages/deepspeed/comm/torch.py", 51, "build_shm_op"),
                      ("/usr/lib/python3.11/subprocess.py", 1196, "communicate"))
    assert compiling.wait is None


def test_supervisor_confirms_a_busy_stall_only_when_an_idle_rank_waits_in_a_collective():
    from accelkit.launch.supervisor import Supervisor
    from accelkit.launch.watchdog import Stall

    spinning = stack(1, ("/work/train.py", 20, "main"))
    lock = stack(1, ("/work/train.py", 44, "<module>"),
                 ("/venv/lib/python3.11/site-packages/torch/utils/file_baton.py", 50, "wait"))
    busy_1 = Stall(seconds=10, idle_ranks=(0,), busy_ranks=(1,))
    assert Supervisor._confirmed(busy_1, [in_all_reduce(0), spinning])  # rank 0 waits for the spinning rank 1
    busy_0 = Stall(seconds=10, idle_ranks=(1,), busy_ranks=(0,))
    assert not Supervisor._confirmed(busy_0, [stack(0, ("/work/train.py", 44, "<module>")), lock])
    assert Supervisor._confirmed(Stall(seconds=10, idle_ranks=(0, 1), busy_ranks=()), [lock])  # nothing moves


def test_ranks_waiting_for_an_op_build_lock_are_told_so():
    """torch.utils.cpp_extension polls in FileBaton.wait while another process builds a DeepSpeed op, or forever
    when a killed build left its lock file."""
    baton = "/venv/lib/python3.11/site-packages/torch/utils/file_baton.py"
    waiting = [stack(r, ("/work/train.py", 9, "main"), (baton, 53, "wait")) for r in (0, 1)]
    text, advice = stall_diagnosis(waiting)
    assert text.startswith("rank(s) 0, 1 wait for the build lock of a torch extension")
    assert "killed left its lock file" in text
    assert "delete the file named `lock`" in advice and "~/.cache/torch_extensions" in advice
