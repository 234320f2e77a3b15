"""`accelkit bench`: scaling efficiency, throughput and interconnect bandwidth of the user's own script.

    api.py          the command as one library call (run_bench): checks, the sweep, the files, the exit status
    cli_spec.py     command-line values -> a checked BenchSpec (defaults for world sizes, backends, --comm sizes)
    spec.py         what to run: a typed sweep (world sizes x backends, steps, scaling mode) and its checks
    launching.py    the ONE module that talks to the config -> launch spine (options, requests, supervised runs)
    sweep.py        runs the sweep: a launch per point, progress lines, the failure policy, results after each run
    probe.py        the per-rank instrument: step times, data-loading wait, samples/tokens, peak memory
    window.py       how long a run measures: at least --steps steps and --min-time seconds (checkpoints)
    comm_count.py   the collectives one step issues (bytes by op and group size), counted in the rank
    layouts.py      --layouts: N-D parallelism layouts of one world size (parsing, checks, launch options)
    stage_clock.py  the probe's pipeline side: each stage's busy vs schedule time, its boundary tensor
    pipeline_stats.py  a pp layout's measured bubble and point-to-point bytes beside the plan's figures
    rerun.py        the command that measures a noisy result again over a longer window
    loaders.py      the data-loader side of the probe (time blocked on the loader, samples and tokens per batch)
    stats.py        pure arithmetic: per-run summary from rank results, speedup and efficiency across a sweep
    report.py       table, diagnosis lines, bench.json, bench.csv
    plot.py         scaling.png (matplotlib, optional extra `accelkit[plot]`)
    comm.py         collective benchmarks with nccl-tests conventions (pure math)
    comm_worker.py  the rank side of `accelkit bench --comm` (all-reduce, all-gather, reduce-scatter)
    compression.py  --grad-compression: compression vs none, same seed (bytes counted and computed, loss, time)
    compression_cli.py      the command-line side of --grad-compression (checks, then compression.py)
    compression_runs.py     which runs it makes (per backend or --layouts layout), where a compression applies
    compression_probe.py    its per-rank instrument: collectives inside backward, losses, compression_stats()
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

PROBE_MODULE = "accelkit.bench.probe"
PROBE_NAME = "bench"  # per-rank results: $ACCELKIT_PROBE_DIR/bench.rank<R>.json
COMM_MODULE = "accelkit.bench.comm_worker"
COMM_NAME = "comm"
WARMUP_ENV = "ACCELKIT_BENCH_WARMUP"  # tells the probe where the measured window starts
MIN_TIME_ENV = "ACCELKIT_BENCH_MIN_TIME"  # the measured window's minimum length in seconds (0: --steps alone)

__all__, __getattr__ = lazy_exports(__name__, {
    "run_bench": "api",
}, also=[])
