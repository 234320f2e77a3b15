"""Benchmark: run the whole fault catalogue (tests/faults) and count what happened, per command and in total.

    python benchmarks/faults.py [PYTEST_ARGS ...]      # e.g. tests/faults/test_merge_faults.py -k dcp

Every fault test runs its command through the harness in tests/helpers/faults.py, which appends one JSON line per
run to $ACCELKIT_FAULT_RECORD: the command, what a correct tool does (`expect`: "refused", "signal", "ok", or
"killed" for SIGKILL, which no program can catch), the exit code, the `Error:` lines, whether a traceback was shown,
the files created/changed/deleted, temporary leftovers and orphan processes. This script runs pytest with that
variable set and turns the lines into the table of the Reliability page (docs/reliability.md):

- tried: command runs observed;
- refused clearly: an expected refusal that exited non-zero with exactly one `Error:` line, a `Hint:` and no
  traceback;
- as expected: expected successes and clean stops on a signal (exit 128+N, no traceback, nothing left);
- tracebacks: runs that printed a Python traceback;
- silent wrong outputs: runs that should have been refused but exited 0;
- leftovers: runs that left a temporary file (a SIGKILLed run is not counted: the next run must clean up, and that
  next run is counted);
- orphans: runs that left a process behind.

The goal is 0 in the last four columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ("tried", "refused clearly", "as expected", "tracebacks", "silent wrong outputs", "leftovers", "orphans")


def classify(row: dict) -> dict[str, int]:
    expect, code = row["expect"], row["returncode"]
    counts = dict.fromkeys(COLUMNS, 0)
    counts["tried"] = 1
    # one Error: line with a Hint:, or click's usage error (exit 2: the usage line stands for the hint)
    clear = (len(row["error_lines"]) == 1 and ("Hint:" in row["stderr"] or code == 2)
             and not row["traceback"])
    if expect == "refused":
        counts["refused clearly"] = int(code != 0 and clear)
        counts["silent wrong outputs"] = int(code == 0)
    elif expect == "ok":
        counts["as expected"] = int(code == 0 and not row["traceback"])
    elif expect in ("signal", "killed"):
        counts["as expected"] = int(code != 0 and not row["traceback"])
    counts["tracebacks"] = int(row["traceback"])
    counts["leftovers"] = int(bool(row["leftovers"]) and expect != "killed")
    counts["orphans"] = int(bool(row["orphans"]))
    return counts


def command_of(row: dict) -> str:
    return next((arg for arg in row["args"] if not arg.startswith("-")), "?")


def table(rows: list[dict]) -> str:
    per_command: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    for row in rows:
        for column, value in classify(row).items():
            per_command[command_of(row)][column] += value
            per_command["total"][column] += value
    lines = ["| command | " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for command in [*sorted(c for c in per_command if c != "total"), "total"]:
        values = per_command[command]
        name = f"**{command}**" if command == "total" else f"`{command}`"
        lines.append(f"| {name} | " + " | ".join(str(values[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def offenders(rows: list[dict]) -> list[str]:
    out = []
    for row in rows:
        counts = classify(row)
        bad = [c for c in COLUMNS[3:] if counts[c]]
        if bad:
            out.append(f"{row['test']}: {', '.join(bad)} (exit {row['returncode']}, {' '.join(row['args'])[:120]})")
    return out


def main() -> int:
    pytest_args = sys.argv[1:] or [str(REPO / "tests" / "faults")]
    with tempfile.TemporaryDirectory(prefix="accelkit-faults-") as folder:
        record = Path(folder) / "faults.jsonl"
        env = {**os.environ, "ACCELKIT_FAULT_RECORD": str(record)}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                              cwd=REPO, env=env, text=True, capture_output=True)
        rows = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no pytest output)"
    print(f"pytest: {summary}\n")
    print(table(rows))
    bad = offenders(rows)
    unclassified = [f"{row['test']}: expect {row['expect']}, exit {row['returncode']}, {row['error_lines'][:1]}"
                    for row in rows if not any(classify(row)[c] for c in COLUMNS[1:])]
    if unclassified:
        print("\nruns in no column but `tried` (e.g. a refusal without a Hint:):")
        print("\n".join(f"- {line}" for line in unclassified))
    if bad:
        print("\nruns counted in the last four columns:")
        print("\n".join(f"- {line}" for line in bad))
    if proc.returncode != 0:
        print("\nfailing tests:\n" + "\n".join(line for line in proc.stdout.splitlines() if line.startswith("FAILED")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
