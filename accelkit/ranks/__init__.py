"""The code that runs inside every rank of every launch (GPU launches and CPU rehearsals alike), around the user's
unmodified script.

- bootstrap.py   each rank's entry point: installs the probes named in $ACCELKIT_PROBES (and, in a CPU rehearsal,
                 accelkit.rehearsal's shim), then runs the script as `__main__` with its own argv and exit status;
- watch.py       the probe every supervised launch installs: registers the rank, counts its steps, dumps its stack
                 on request, so the supervisor can tell a stalled rank and say where it is;
- rank_files.py  the files a rank and its supervisor share in the launch's watch folder (registration, step
                 counter, failure record, one-line explanations);
- resume_record.py, restart_store.py   which checkpoint a rank resumed from; a restarted group's store keys, by round;
- rank_output.py each rank's output in whole lines (line-buffered); the `--rank-prefix` probe;
- explain.py     known failures of a rank, turned into one line naming the cause and the fix;
- user_code.py   telling the user's frames from library frames in a stack;
- probes/        what the per-feature probes (bench, plan --measure, convert --check) share.

Nothing here may import torch at module level: it runs before the user's script, in every rank.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

# The supervisor's side (accelkit.launch) reads what ranks leave in the watch folder through these names.
__all__, __getattr__ = lazy_exports(__name__, {
    "ATTEMPT_ENV": "resume_record",
    "PROBES_ENV": "bootstrap",
    "RENDEZVOUS_ROUND_ENV": "restart_store",
    "STACK_SIGNAL": "rank_files",
    "WATCH_DIR_ENV": "rank_files",
    "RankFiles": "rank_files",
    "RankInfo": "rank_files",
    "read_rank_error": "rank_files",
    "read_failures": "rank_files",
    "read_resumed": "resume_record",
    "read_steps": "rank_files",
    "read_text": "rank_files",
    "registered_ranks": "rank_files",
    "caller_location": "user_code",
    "is_library_file": "user_code",
    "is_user_file": "user_code",
})
