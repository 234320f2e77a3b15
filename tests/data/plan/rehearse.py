"""Run two_models.py on CPU ranks with accelkit plan's probe in every rank and read back what each rank recorded.

Shared by tests/integration/test_plan_measured.py and benchmarks/plan_accuracy.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCH = """
import sys
from accelkit.configs import ConfigOptions
from accelkit.launch.launch_plan import LaunchTarget
from accelkit.launch.request import LaunchRequest
from accelkit.launch.supervised import run_request
backend, processes, stage, script, *args = sys.argv[1:]
options = ConfigOptions(backend=backend, num_processes=int(processes), mixed_precision="bf16",
                        zero_stage=int(stage) if stage != "-" else None)
sys.exit(run_request(LaunchRequest(target=LaunchTarget(script, tuple(args)), cpu=True, options=options,
                                   probes=("accelkit.plan.measure.probe",))))
"""


def rehearse(backend: str, ranks: int, stage: str, args: tuple[str, ...], out: Path) -> list[dict]:
    """One launch (`stage`: the config's ZeRO stage or "-"); every rank's records, in rank order."""
    from accelkit.ranks.probes.results import read_results

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ACCELKIT_PROBE_DIR": str(out),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", LAUNCH, backend, str(ranks), stage, str(HERE / "two_models.py"),
                           *args], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} on {ranks} ranks failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    results = read_results(out, "plan")
    if len(results) != ranks or any(r["reason"] != "script end" for r in results):
        raise RuntimeError(f"{backend} on {ranks} ranks: {len(results)} rank results, {[r['reason'] for r in results]}")
    return [record for result in results for record in result["records"]]


def case(record: dict) -> str:
    """Which strategy a record measured: the ZeRO stage, or FSDP's mode as its layers' units show it."""
    if record["backend"] == "deepspeed":
        return f"zero{record['zero_stage']}"
    if record["backend"] == "fsdp":
        layers = [u["reshard_after_forward"] for u in record["fsdp_units"] if ".layer" in u["params"][0]]
        return "fsdp-full" if any(layers) else "fsdp-grad-op"
    return record["backend"]
