"""`accelkit convert` on public training scripts it was not written for (benchmarks/convert_corpus/manifest.json):
each script is materialized from the fetched git mirrors with offline stand-ins for its data, converted, and, when
converted and runnable here, proved with `accelkit convert --check` (the original on 1 process, the conversion on 2
CPU ranks). Prints one line per script: converted / refused (reason) / left alone, the `--check` verdict per
invariant, and the totals per split (the manifest splits by repository: "development", the repositories the
converter is fixed on, and "held-out", run as they are; the held-out figure is the one that counts).

    python benchmarks/convert_corpus.py [--split NAME] [--only NAME ...] [--no-check] [--timeout S] [--json OUT.json]

Needs the mirrors (/work/.mirror/OWNER+NAME/repo, made by the search tool's `fetch`; ACCELKIT_CORPUS_MIRRORS moves
them). Nothing is downloaded. The third-party scripts are never copied into this repository.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "convert_corpus"))
from materialize import STANDINS, Materialized, load_manifest, materialize  # noqa: E402

ACCELKIT = [sys.executable, "-m", "accelkit"]
MAX_RAISED_STEPS = 1000  # a --steps hint of the check is followed up to this many steps (makemore: 501)
VERDICT = re.compile(r"^\s+(PASS|FAIL|SKIP)\s+(\w[\w ]*?)\s{2,}(.*)$")


def _run(command: list[str], cwd: Path, timeout: int, made: Materialized | None = None) -> tuple[int | None, str]:
    extra = dict(made.env) if made else {}  # the manifest's `env`; its PYTHONPATH (opt-in stand-ins) goes first
    standins = str(STANDINS) if made is None or made.torchvision else None
    path = [extra.pop("PYTHONPATH", None), standins, os.environ.get("PYTHONPATH")]
    env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(filter(None, path)),
           "ACCELKIT_CORPUS_SAMPLES": os.environ.get("ACCELKIT_CORPUS_SAMPLES", "96"), "NO_COLOR": "1",
           "PATH": os.pathsep.join([str(STANDINS / "bin"), os.environ.get("PATH", "")])}  # `stty size`: no tty
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out
    return done.returncode, done.stdout + done.stderr


def convert_one(entry: dict, out: Path, check: bool, timeout: int, steps: int) -> dict:
    row: dict = {"name": entry["name"], "repo": entry["repo"], "path": entry["path"], "style": entry["style"],
                 "split": entry["split"]}
    made = materialize(entry, out)
    if made.script is None:
        row.update(outcome="missing", reason=made.why)
        return row
    converted = made.script.with_name(made.script.stem + "_accelerate.py")
    started = time.perf_counter()
    for first in entry.get("convert_first", []):  # the file that trains, converted first, as the refusal says
        code, text = _run([*ACCELKIT, "convert", str(out / entry["name"] / first), "--in-place"], made.cwd, 120,
                          made)
        if code != 0:
            row.update(outcome="refused", reason=f"{first}: {_refusal(text)}")
            return row
    code, text = _run([*ACCELKIT, "convert", str(made.script), "-o", str(converted)], made.cwd, 120, made)
    row["convert_s"] = round(time.perf_counter() - started, 2)
    if code == 0 and converted.exists():
        row["outcome"] = "converted"
    elif code == 0:
        row["outcome"] = "left alone"
        row["reason"] = _first(text, r"(trains with .*|nothing to convert.*|already .*)") or text.strip()[-200:]
    else:
        row["outcome"] = "refused"
        row["reason"] = _refusal(text)
    if row["outcome"] != "converted" or not check:
        return row
    missing = [n for n in made.needs if importlib.util.find_spec(n.split()[0]) is None]
    if missing:  # a package this environment lacks (`pip install gymnasium` runs pe-reinforce), or data
        row["check"] = "not run"
        row["reason"] = "needs " + ", ".join(missing)
        return row
    started = time.perf_counter()
    code, text = _run([*ACCELKIT, "convert", "--check", str(made.script), "--converted", str(converted),
                       "--steps", str(steps), "--", *made.args], made.cwd, timeout, made)
    raised = re.search(r"raise the limit: `accelkit convert --check --steps (\d+) ", text)
    if raised and int(raised.group(1)) <= MAX_RAISED_STEPS:  # the check's own limit stopped it: lift it once
        row["steps"] = int(raised.group(1))
        code, text = _run([*ACCELKIT, "convert", "--check", str(made.script), "--converted", str(converted),
                           "--steps", raised.group(1), "--", *made.args], made.cwd, timeout, made)
    row["check_s"] = round(time.perf_counter() - started, 1)
    verdicts = {}
    for line in text.splitlines():
        match = VERDICT.match(line)
        if match:
            verdicts[match.group(2).strip()] = match.group(1)
            if match.group(1) == "FAIL":
                row.setdefault("fails", []).append(f"{match.group(2).strip()}: {match.group(3)[:300]}")
    row["verdicts"] = verdicts
    row["check"] = "timeout" if code is None else "PASS" if code == 0 else "FAIL"
    original_failed = re.search(r"original, 1 process[^:]*: exit status \d+: (.*)", text)
    if row["check"] == "FAIL" and original_failed:  # the script itself does not run here: nothing to compare
        row["check"] = "original fails"
        row["reason"] = f"the original fails on 1 CPU process here: {original_failed.group(1)[:200]}"
        return row
    converted_failed = re.search(r"converted, \d+ processes: exit status \d+: (.*)", text)
    if converted_failed:
        row.setdefault("fails", []).append(f"converted run: {converted_failed.group(1)[:300]}")
    if row["check"] != "PASS" and not verdicts:
        row["check_error"] = text.strip()[-600:]
    return row


def _first(text: str, pattern: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(1).strip() if match else None


def _refusal(text: str) -> str:
    """The first NOT CONVERTED item, else the Error line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "NOT CONVERTED" in line and i + 1 < len(lines):
            return lines[i + 1].strip()[:300]
    error = next((line for line in lines if line.startswith("Error:")), "")
    return error[:300] or text.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--split", choices=sorted({e["split"] for e in load_manifest()}), default=None,
                        help="run one split of the manifest only")
    parser.add_argument("--no-check", action="store_true", help="convert only")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per --check")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of the 2-process run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    entries = [e for e in load_manifest() if (not args.only or e["name"] in args.only)
               and (args.split is None or e["split"] == args.split)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="accelkit-corpus-") as tmp:
        for entry in entries:
            row = convert_one(entry, Path(tmp), not args.no_check, args.timeout, args.steps)
            rows.append(row)
            _print_row(row)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    _print_totals(rows)
    return 0


def _print_row(row: dict) -> None:
    outcome = row["outcome"]
    check = row.get("check", "")
    verdicts = " ".join(f"{k}={v}" for k, v in row.get("verdicts", {}).items())
    line = f"{row['name']:28} {outcome:10} {check:8} {verdicts}"
    if row.get("steps"):
        line += f" (re-run with --steps {row['steps']}, the check's own hint)"
    if row.get("reason"):
        line += f"\n{'':28} reason: {row['reason']}"
    for fail in row.get("fails", []):
        line += f"\n{'':28} FAIL {fail}"
    if row.get("check_error"):
        line += f"\n{'':28} check error: {row['check_error'][-300:]}"
    print(line, flush=True)


def _print_totals(rows: list[dict]) -> None:
    splits = sorted({r["split"] for r in rows})
    for split in splits:
        _print_split(split, [r for r in rows if r["split"] == split])
    if len(splits) > 1:
        _print_split("all", rows)


def _print_split(split: str, rows: list[dict]) -> None:
    """The split's figure (converted and `--check` PASS over its scripts), then where the rest went."""
    count = len(rows)
    converted = [r for r in rows if r["outcome"] == "converted"]
    passed = [r for r in converted if r.get("check") == "PASS"]
    failed = [r for r in converted if r.get("check") in {"FAIL", "timeout"}]
    not_run = [r for r in converted if r.get("check") in {None, "not run", "original fails"}]
    refused = [r for r in rows if r["outcome"] == "refused"]
    alone = [r for r in rows if r["outcome"] == "left alone"]
    crashed = [r for r in failed if any(f.startswith("converted run:") for f in r.get("fails", []))]
    if not any("check" in r for r in converted):  # --no-check: no figure to give, only the conversion outcomes
        print(f"\n{split}: {len(converted)}/{count} converted, --check not run; {len(refused)} refused")
    else:
        print(f"\n{split}: {len(passed)}/{count} converted and --check PASS ({100 * len(passed) / count:.0f}%); "
              f"{len(refused)} refused, {len(crashed)} crashed (the converted run exits non-zero), "
              f"{len(failed) - len(crashed)} FAIL/timeout")
    print(f"{count} scripts: {len(converted)} converted ({len(passed)} --check PASS, {len(failed)} FAIL/timeout, "
          f"{len(not_run)} not run here), {len(refused)} refused, {len(alone)} left alone, "
          f"{count - len(converted) - len(refused) - len(alone)} missing")


if __name__ == "__main__":
    sys.exit(main())
