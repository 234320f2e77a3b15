"""Gradient compression: one option (`--grad-compression`) for every backend, checked, written, applied, measured.

    compression_spec.py  CompressionSpec: the method and its settings; the one documented place a launch carries
                it ($ACCELKIT_GRAD_COMPRESSION, and a `# accelkit-grad-compression:` line in a written config)
    checks.py   what each backend can do with it (refusals in one line, warnings), from the resolved config
    zeropp.py   int8 for DeepSpeed ZeRO-3: the ZeRO++ keys, accepted by DeepSpeed's own config class
    grad_bytes.py    the bytes a step sends, computed from parameter shapes (DDP hooks, PowerSGD, FSDP2 reduce dtype)
    launch_side.py    what `accelkit launch` does with it (the config's comment line, the ranks' variable, warnings)
    plan_comm.py    `accelkit plan --grad-compression/--interconnect`: the comm column and the recommendation
    plan_config.py  `accelkit plan --grad-compression --write-config`: the compression in the written config
The measuring side lives in accelkit.bench (compression.py, compression_runs.py, compression_probe.py):
`bench --grad-compression [--layouts ...]`.

Light to import (standard library only at module level).
"""
