"""The lost-machine verdict (accelkit.launch.cluster.heartbeat) and the restart lines (accelkit.launch.restarts), on a
real job board object and real watch files, with time given by the test."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from accelkit.launch.cluster import job_board
from accelkit.launch.cluster.heartbeat import HEARTBEAT_PREFIX, LossWatcher, describe_loss, wait_for_cause
from accelkit.launch.restarts import RestartReporter, ResumeAnnouncer, is_peer_loss, peer_detail
from accelkit.ranks.rank_files import RankFailure, RankFiles, RankInfo, write_failure, write_info


def beat(board: job_board.Board, machine: int, number: int, step: int | None = 5, done: bool = False) -> None:
    entry = {"beat": number, "machine": machine, "node": f"n{machine + 1}", "address": f"10.0.0.{machine + 11}",
             "step": step}
    if done:
        entry["done"] = True
    board.put(f"{HEARTBEAT_PREFIX}{machine}", entry)


def watcher(board: job_board.Board, timeout: float = 10.0) -> LossWatcher:
    return LossWatcher(board, machines=3, timeout=timeout, on_lost=lambda record: None)


def test_a_machine_silent_for_the_timeout_is_lost_with_its_node_address_and_step() -> None:
    board = job_board.Board()
    watch = watcher(board)
    for number in range(1, 4):
        beat(board, 0, number)
        beat(board, 1, number, step=17)
        beat(board, 2, number)
        assert watch.check(float(number)) is None
    beat(board, 0, 9)
    beat(board, 2, 9)
    assert watch.check(12.9) is None  # machine 1 last beat new at t=3: silent 9.9 s
    beat(board, 0, 10)
    beat(board, 2, 10)
    lost = watch.check(13.0)
    assert lost is not None and lost["machine"] == 1 and lost["node"] == "n2" and lost["address"] == "10.0.0.12"
    assert lost["step"] == 17 and lost["silent"] == 10 and lost["lost"] and lost["status"] == 1
    assert describe_loss(lost) == ("machine 1 (node n2, address 10.0.0.12) was lost: no heartbeat for 10 s (its "
                                   "processes are gone or it is unreachable); its ranks were last at step 17")
    assert watch.check(30.0) is None  # once per job


def test_a_machine_whose_address_the_ranks_lost_is_judged_after_a_short_silence() -> None:
    board = job_board.Board()
    watch = watcher(board, timeout=20.0)
    beat(board, 1, 1)
    beat(board, 2, 1)
    assert watch.check(0.0) is None
    watch.suspects.add("10.0.0.12")  # gloo: "Connection closed by peer [10.0.0.12]:PORT"
    beat(board, 2, 2)
    assert watch.check(2.9) is None
    lost = watch.check(3.1)
    assert lost is not None and lost["machine"] == 1 and lost["silent"] == 3


def test_a_machine_that_ended_by_itself_or_never_beat_is_not_lost() -> None:
    board = job_board.Board()
    watch = watcher(board)
    beat(board, 1, 1)
    beat(board, 2, 1)
    assert watch.check(0.0) is None
    beat(board, 1, 2, done=True)  # done or failed on its own: says so, then goes quiet
    beat(board, 2, 2)
    assert watch.check(1.0) is None
    beat(board, 2, 3)
    assert watch.check(100.0) is None  # machine 2 beat again; machine 1 is done; machine 0 never beat (not judged)


def test_machine_zero_never_declares_itself_lost() -> None:
    board = job_board.Board()
    watch = watcher(board)
    beat(board, 0, 1)
    watch.check(0.0)
    assert watch.check(60.0) is None


def test_a_peer_loss_waits_for_the_cause_the_board_names() -> None:
    board = job_board.Board()
    assert wait_for_cause(board, 0.3) is None
    board.put_first(job_board.FIRST_FAILURE, {"machine": 1, "lost": True})
    assert wait_for_cause(board, 0.3) == {"machine": 1, "lost": True}


def test_gloo_errors_of_a_vanished_peer_are_told_from_a_ranks_own_error() -> None:
    gloo = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[10.77.0.12]:45491. This is typically caused by a remote worker crashing.")
    assert is_peer_loss(gloo) and peer_detail(gloo) == "Connection closed by peer [10.77.0.12]:45491"
    assert is_peer_loss("Read error [127.0.0.1]:3479: Connection reset by peer")
    assert not is_peer_loss("ValueError: bad batch") and not is_peer_loss("")


def _rank(watch_dir: Path, pid: int, rank: int) -> RankFiles:
    files = RankFiles.of(watch_dir, pid)
    files.folder.mkdir(parents=True, exist_ok=True)
    write_info(files, RankInfo(pid=pid, rank=rank, local_rank=0, main_thread=1, cpu_job=True))
    return files


def _record(message: str, *args) -> logging.LogRecord:
    return logging.LogRecord("torch", logging.INFO, __file__, 1, message, args, None)


def _joined(round_number: int) -> logging.LogRecord:
    """What torch's c10d rendezvous logs as an agent joins a round, before it starts that round's ranks."""
    message = (f"The node 'n1_1_0' has joined round {round_number} of the rendezvous '1234' as rank 0 in a world of "
               "size 2.")
    return logging.LogRecord("torch.distributed.elastic.rendezvous.dynamic_rendezvous", logging.INFO, __file__, 1,
                             message, (), None)


def test_each_restart_is_one_line_naming_the_rank_its_signal_and_the_attempt(tmp_path: Path, capsys, monkeypatch
                                                                            ) -> None:
    monkeypatch.delenv("ACCELKIT_RENDEZVOUS_ROUND", raising=False)
    monkeypatch.delenv("ACCELKIT_ATTEMPT", raising=False)
    _rank(tmp_path, 4242, rank=3)
    reporter = RestartReporter(tmp_path, 2, machine=1, machines=2, node="n2")
    reporter.emit(_joined(0))
    reporter.emit(_record("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", -9, 1, 4242, "python"))
    reporter.emit(_record("[%s] Worker group %s. %s/%s attempts left; will restart worker group", "default",
                          "FAILED", 2, 2))
    line = capsys.readouterr().err.strip()
    assert line == ("accelkit: rank 3 (pid 4242) was killed by SIGKILL on node n2 (machine 1); restarting every "
                    "rank: attempt 2 of 3 (--max-restarts 2)")
    # the restarted ranks meet under the round they were started in (accelkit.ranks.restart_store)
    import os

    assert os.environ["ACCELKIT_RENDEZVOUS_ROUND"] == "0"
    reporter.emit(_joined(1))
    assert (os.environ["ACCELKIT_RENDEZVOUS_ROUND"], os.environ["ACCELKIT_ATTEMPT"]) == ("1", "2")
    entries = [json.loads(text) for text in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert [entry["attempt"] for entry in entries] == [2]


def test_a_rank_that_only_lost_its_peer_names_the_cause_another_machine_published(tmp_path: Path, capsys,
                                                                                  monkeypatch) -> None:
    monkeypatch.delenv("ACCELKIT_RENDEZVOUS_ROUND", raising=False)
    files = _rank(tmp_path, 77, rank=0)
    write_failure(files, RankFailure(rank=0, pid=77, error="RuntimeError: Connection closed by peer [10.0.0.12]:9",
                                     exit_code=1, time=1.0))
    board = job_board.Board()
    board.put_first("restart/2", {"cause": "rank 1 (pid 5) was killed by SIGKILL on node n2 (machine 1)"})
    reporter = RestartReporter(tmp_path, 1, machine=0, machines=2, node="n1", board=board)
    reporter.emit(_record("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", 1, 0, 77, "python"))
    reporter.emit(_record("[%s] Worker group %s. %s/%s attempts left; will restart worker group", "default",
                          "FAILED", 1, 1))
    assert capsys.readouterr().err.startswith("accelkit: rank 1 (pid 5) was killed by SIGKILL on node n2 (machine 1);"
                                              " restarting every rank: attempt 2 of 2")
    assert board.get("restart/2")["cause"].startswith("rank 1 (pid 5)")  # a consequence never replaces the cause


def test_the_checkpoint_a_restarted_attempt_resumed_from_is_said_once_and_listed_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "attempts.jsonl").write_text(json.dumps({"attempt": 2, "cause": "rank 1 (pid 9) was killed by "
                                                                                 "SIGKILL"}) + "\n")
    for pid in (10, 11):  # both ranks of attempt 2 resumed from the same checkpoint
        (tmp_path / "ranks" / f"{pid}.resumed").write_text(json.dumps(
            {"path": "out/checkpoint-20", "step": 20, "attempt": 2, "requeue": 0}))
    announcer = ResumeAnnouncer(tmp_path)
    assert announcer.poll() == ["attempt 2: the ranks resumed from out/checkpoint-20 (step 20)"]
    assert announcer.poll() == []
    assert announcer.summary_lines(0) == ["this run took 2 attempt(s):",
                                          "  attempt 1: started; ended: rank 1 (pid 9) was killed by SIGKILL",
                                          "  attempt 2: resumed from out/checkpoint-20 (step 20); finished"]


def test_a_first_attempt_that_resumed_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "10.resumed").write_text(json.dumps({"path": "out/checkpoint-20", "step": 20,
                                                                "attempt": 1, "requeue": 0}))
    announcer = ResumeAnnouncer(tmp_path)
    assert announcer.poll() == [] and announcer.summary_lines(0) == []


def test_a_restarted_attempt_that_loaded_no_checkpoint_is_not_said_to_resume(tmp_path: Path) -> None:
    """A script that does not load its checkpoint on restart (no --resume-from-checkpoint) starts over: the
    summary says so instead of claiming a resume."""
    (tmp_path / "attempts.jsonl").write_text(json.dumps({"attempt": 2, "cause": "rank 1 (pid 9) was killed by "
                                                                                 "SIGKILL", "time": 0.0}) + "\n")
    (tmp_path / "ranks").mkdir()
    announcer = ResumeAnnouncer(tmp_path)
    assert announcer.summary_lines(0) == ["this run took 2 attempt(s):",
                                          "  attempt 1: started; ended: rank 1 (pid 9) was killed by SIGKILL",
                                          "  attempt 2: started without loading a checkpoint; finished"]


def test_a_machine_restarted_for_another_machines_failure_numbers_the_attempt_as_the_others_do(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """The agent whose own ranks were healthy restarts them when another machine's agent waits in the next round
    (torchrun does not count it): its line, its attempts file and its summary use the same attempt number as the
    machine that failed (each counts the group restarts it made, of either kind); the store keys follow the
    rendezvous round, which need not start at 0 (a requeued job's ranks were measured starting in round 1)."""
    monkeypatch.delenv("ACCELKIT_RENDEZVOUS_ROUND", raising=False)
    monkeypatch.delenv("ACCELKIT_ATTEMPT", raising=False)
    board = job_board.Board()
    board.put_first("restart/2", {"cause": "rank 1 (pid 5) was killed by SIGKILL on node n2 (machine 1)"})
    reporter = RestartReporter(tmp_path, 4, machine=0, machines=2, node="n1", board=board)
    reporter.emit(_joined(1))  # this run's first round
    import os

    assert (os.environ["ACCELKIT_RENDEZVOUS_ROUND"], os.environ["ACCELKIT_ATTEMPT"]) == ("1", "1")
    reporter.emit(_record("[%s] Detected %s new nodes from group_rank=%s; will restart worker group", "default", 1,
                          0))
    assert capsys.readouterr().err.strip() == (
        "accelkit: rank 1 (pid 5) was killed by SIGKILL on node n2 (machine 1); restarting this machine's ranks "
        "with the others: attempt 2")
    reporter.emit(_joined(2))
    assert (os.environ["ACCELKIT_RENDEZVOUS_ROUND"], os.environ["ACCELKIT_ATTEMPT"]) == ("2", "2")
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "10.resumed").write_text(json.dumps({"path": "out/checkpoint-20", "step": 20,
                                                                "attempt": 2, "requeue": 0}))
    summary = ResumeAnnouncer(tmp_path).summary_lines(0)
    assert summary == ["this run took 2 attempt(s):",
                       "  attempt 1: started; ended: rank 1 (pid 5) was killed by SIGKILL on node n2 (machine 1)",
                       "  attempt 2: resumed from out/checkpoint-20 (step 20); finished"]


def test_a_launch_drops_attempt_numbers_it_inherited(tmp_path: Path) -> None:
    """ACCELKIT_ATTEMPT and ACCELKIT_RENDEZVOUS_ROUND are the launch's own, for the ranks it starts: exported ones
    (an enclosing run's, a shell's) would make a first attempt say attempt 2 and key its store by a stale round."""
    from helpers import run_accelkit

    script = tmp_path / "show.py"
    script.write_text("import os\nprint('seen', os.environ.get('ACCELKIT_ATTEMPT'), "
                      "os.environ.get('ACCELKIT_RENDEZVOUS_ROUND'))\n")
    proc = run_accelkit("launch", "--cpu", "--num-processes", "1", str(script), cwd=tmp_path,
                        env={"ACCELKIT_ATTEMPT": "2", "ACCELKIT_RENDEZVOUS_ROUND": "3"})
    assert proc.returncode == 0, proc.stderr
    assert "seen None None" in proc.stdout, proc.stdout + proc.stderr
