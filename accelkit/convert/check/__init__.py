"""`accelkit convert --check`: prove a conversion by running it.

The original script runs on one process and the converted one on 2 CPU ranks (DDP rehearsal, or FSDP2 with
`CheckOptions(backend="fsdp")`), both with the
probe in `probe.py` installed in every process; `invariants.py` then compares what the probes saw against the
invariants of correct data parallelism (every trainable module wrapped, weights identical across ranks after every
step and equal to those of the original run once more at the global batch (the equivalence run), learning rates
equal to the original's at the same point of training, each sample seen once per epoch, metrics equal to the
one-process value, each file written once, no hang).

    from accelkit.convert.check.run_check import CheckOptions, check_script
    outcome = check_script(Path("train.py"), ["--epochs", "1"], CheckOptions(steps=8))
    print(outcome.format())

(Loaded on first use: the probe runs in every rank and needs none of the checking side.)
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
})
