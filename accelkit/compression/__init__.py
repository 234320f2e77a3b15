"""Gradient compression: one option (`--grad-compression`) for every backend, checked, written, applied, measured.

    spec.py     CompressionSpec: the method and its settings; the one documented place a launch carries it
                ($ACCELKIT_GRAD_COMPRESSION, and a `# accelkit-grad-compression:` line in a written config)
    checks.py   what each backend can do with it (refusals in one line, warnings), from the resolved config
    zeropp.py   int8 for DeepSpeed ZeRO-3: the ZeRO++ keys, accepted by DeepSpeed's own config class
    sizes.py    the bytes a step sends, computed from parameter shapes (DDP hooks, PowerSGD, FSDP2 reduce dtype)
    probe.py    a rank probe: the collectives of every step, counted; PowerSGD's compression_stats(); weight digest
    measure.py  `accelkit bench --grad-compression`: compression vs none, same seed, bytes / step time / loss

Light to import (standard library only at module level).
"""
