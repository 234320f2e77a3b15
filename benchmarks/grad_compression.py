"""Benchmark: gradient compression vs none, side by side in one run: bytes per step and loss after N steps.

    python benchmarks/grad_compression.py [--steps 20] [--hidden-size 64] [--output DIR]

The minimal template (an MLP, synthetic data, seed 42) trains on 2 gloo CPU ranks, each run launched the way
`accelkit launch --cpu --num-processes 2` launches it, with accelkit's compression probe in every rank:

- DDP: none, the fp16 hook, PowerSGD rank 1 and rank 4 from step 0 (torch then turns error feedback and warm start
  off) and from step 2 (both on; the first two steps plain all-reduce), through Accelerate's
  DistributedDataParallelKwargs;
- FSDP2: fp32 reduction vs a bf16 reduce dtype (MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)).

Per run: the gradient bytes of the last step counted from the collectives (accelkit.bench.comm_count, inside
backward), the bytes computed from the parameter shapes, their ratio to the uncompressed run, the median step time,
the loss after the last step and its difference from the uncompressed run (same seed, same data), whether every
rank ended with the same weights, and PowerSGD's own compression_stats(). bf16 under DDP is not run: torch's
bf16_compress_hook refuses gloo, and `accelkit launch --cpu` refuses it in one line. Nothing here is asserted (the
slow tests in tests/integration/test_grad_compression.py assert the bytes and the loss bounds). Step times on a
shared 2-core machine are noisy: read them with the load average printed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--output", type=Path, default=None, help="keep the results here (default: a temp folder)")
    args = parser.parse_args()

    from accelkit.bench.compression import compression_table, run_compression_bench
    from accelkit.compression.compression_spec import CompressionSpec

    output = args.output or Path(tempfile.mkdtemp(prefix="grad-compression-"))
    script = REPO / "templates" / "minimal" / "train.py"
    script_args = ("--hidden-size", str(args.hidden_size), "--output-dir", str(output / "train"))
    rows = []
    powersgd = [CompressionSpec("powersgd", rank, start) for start in (0, 2) for rank in (1, 4)]
    for backend, specs in (("ddp", [CompressionSpec("fp16"), *powersgd]),
                           ("fsdp", [CompressionSpec("bf16")])):
        rows += run_compression_bench(script=str(script), script_args=script_args, specs=specs, backends=[backend],
                                      num_processes=2, cpu=True, output=output / backend, steps=args.steps,
                                      progress=lambda line: print(f"  {line}", flush=True))
    print()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{os.cpu_count()} CPU cores, 2 gloo ranks, minimal template (hidden {args.hidden_size}), "
          f"{args.steps} steps, seed 42")
    print("\n".join(compression_table(rows)))
    print("bf16 (DDP hook) on gloo: refused (torch's bf16_compress_hook needs CUDA 11+ and NCCL 2.10+, or XPU/XCCL)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; results: {output}")


if __name__ == "__main__":
    main()
