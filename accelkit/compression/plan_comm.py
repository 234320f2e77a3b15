"""`accelkit plan --grad-compression M [--interconnect LINK]`: the communication column with the compression
applied (bytes per GPU per optimizer step, accelkit.plan.traffic's ring model), and a recommendation that names
compression when the interconnect, not memory, limits the run.

What each method changes in the modelled traffic:
    DDP rows    fp16/bf16: the gradient all-reduce in 2 bytes per element; powersgd: the elements PowerSGD sends
                for the model's parameter shapes (accelkit.compression.grad_bytes, torch's compress-or-not rule)
    FSDP rows   fp16/bf16: the gradient reduce-scatter in 2 bytes (no change when the run already computes in 16 bits:
                Accelerate's mixed precision reduces in that dtype)
    ZeRO-3 rows int8: ZeRO++, a quarter of ZeRO-3's traffic (DeepSpeed's documented 4x: qwZ halves the weight
                all-gathers, qgZ sends int4 gradients, hpZ keeps backward's all-gather within a machine)
Rows a method does not apply to keep their traffic and are named in the note.

"Interconnect-limited": the modelled communication time of the recommended row (its bytes / the link's bandwidth)
exceeds its compute time, 6 x parameters x tokens per GPU per step at ASSUMED_FLOPS (no overlap assumed).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.compression.compression_spec import CompressionSpec
from accelkit.compression.grad_bytes import traffic_factor
from accelkit.errors import AccelkitError

# Nominal per-GPU bandwidths (bytes/s, as nccl-tests' bus bandwidth): H100 NVLink 4, 400 Gb/s InfiniBand NDR per
# GPU, 100 Gb/s Ethernet, PCIe 4 x16.
INTERCONNECTS = {"nvlink": 400e9, "infiniband": 50e9, "ethernet": 12.5e9, "pcie": 25e9}
ASSUMED_FLOPS = 400e12  # achieved per GPU: 40% of an H100's dense bf16 peak


def parse_interconnect(text: str) -> tuple[float, str]:
    """`nvlink` | `infiniband` | `ethernet` | `pcie` | `25GB/s` | `100Gb/s` | the bench.json (or its folder) of an
    `accelkit bench --comm` run -> (bytes per second, its label)."""
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "bench.json"
    if path.suffix == ".json" or path.name == "bench.json":
        return _measured_bandwidth(path, text)
    name = text.strip().lower()
    if name in INTERCONNECTS:
        return INTERCONNECTS[name], f"{name} (nominal {INTERCONNECTS[name] / 1e9:g} GB/s)"
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(GB|Gb)/s", text.strip())
    if not match or float(match.group(1)) <= 0:
        raise AccelkitError(f"--interconnect {text!r} is not a link or a bandwidth",
                            hint=f"use {', '.join(INTERCONNECTS)}, or a bandwidth per GPU like 25GB/s or 100Gb/s")
    value = float(match.group(1)) * (1e9 if match.group(2) == "GB" else 1e9 / 8)
    return value, f"{text.strip()} ({value / 1e9:g} GB/s)"


def _measured_bandwidth(path: Path, given: str) -> tuple[float, str]:
    """The all-reduce bus bandwidth `accelkit bench --comm` measured at its largest size and world size."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = [(record["num_processes"], row["size_bytes"], row["busbw_gbs"]) for record in data.get("comm", [])
                for row in record.get("results", []) if row.get("op") == "all_reduce" and row.get("busbw_gbs")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AccelkitError(f"--interconnect {given}: cannot read an `accelkit bench --comm` result ({exc})",
                            hint="give the bench.json (or its folder) of `accelkit bench --comm`, a link name, or "
                                 "a bandwidth like 25GB/s") from None
    if not rows:
        raise AccelkitError(f"--interconnect {given}: {path} holds no all-reduce measurement",
                            hint="run `accelkit bench --comm --num-processes N -o DIR` first, then pass DIR")
    processes, size, busbw = max(rows)
    return busbw * 1e9, f"{busbw:g} GB/s (all-reduce busbw measured by bench --comm: {processes} processes, " \
                        f"{size:,} bytes)"


def _compressed_network(row: Any, spec: CompressionSpec, shape: Any, training: Any, hardware: Any) -> int | None:
    """The row's network bytes under `spec`, or None where the method does not apply to the row's strategy."""
    s, network = row.strategy, row.traffic.network
    if s.family == "torch" and s.distributed:
        if spec.method in ("fp16", "bf16"):
            grad_bytes = 2 if training.precision == "bf16" else 4  # DDP's gradients: fp32 unless pure bf16
            return round(network * min(1.0, 2 / grad_bytes))
        if spec.method == "powersgd":
            shapes = [t.shape for t in shape.tensors if t.trainable] if shape.exact else []
            return round(network * traffic_factor(spec, shapes)) if shapes else None
        return None
    if s.family == "fsdp" and spec.method in ("fp16", "bf16"):
        compute_bytes = 4 if training.precision == "fp32" else 2
        gpus = hardware.gpus_per_node if s.sharding == "hybrid" else hardware.gpus
        reduce = (gpus - 1) / gpus * shape.trainable * compute_bytes if gpus > 1 else 0
        return round(network - reduce * (1 - 2 / compute_bytes))
    if s.family == "deepspeed" and s.zero_stage == 3 and spec.method == "int8":
        return round(network * traffic_factor(spec))
    return None


def apply_compression(plan: Any, spec: CompressionSpec, interconnect: tuple[float, str] | None) -> dict[str, Any]:
    """Rewrite the plan's communication column for `spec`, add its notes and the recommendation's words; the JSON
    section describing what was applied."""
    applied, rows = [], []
    for row in plan.rows:
        network = _compressed_network(row, spec, plan.shape, plan.training, plan.hardware) \
            if spec.active and row.unavailable is None else None
        if network is not None:
            applied.append(row.strategy.label)
            row = replace(row, traffic=replace(row.traffic, network=network))
        rows.append(row)
    plan.rows[:] = rows
    section: dict[str, Any] = {"method": spec.method, "applied_to": applied}
    if spec.active:
        where = ", ".join(applied) if applied else "no row"
        plan.notes.append(f"comm/step accounts for --grad-compression {spec.label()} on: {where} (other rows: "
                          "the method does not apply to their backend; docs/guides/gradient-compression.md)")
    if interconnect is not None and plan.chosen is not None:
        on_chosen = spec if plan.chosen.strategy.label in applied else CompressionSpec()
        section.update(_interconnect_verdict(plan, on_chosen, interconnect))
    return section


def _interconnect_verdict(plan: Any, spec: CompressionSpec, interconnect: tuple[float, str]) -> dict[str, Any]:
    bandwidth, label = interconnect
    row, training = plan.chosen, plan.training
    tokens = training.micro_batch * training.seq_len * row.accumulation
    compute_s = 6 * plan.shape.trainable * tokens / ASSUMED_FLOPS
    comm_s = row.traffic.network / bandwidth
    limited = comm_s > compute_s
    verdict = {"interconnect": label, "comm_seconds": comm_s, "compute_seconds": compute_s,
               "interconnect_limited": limited}
    said = f"at {label} the {row.traffic.network / 1e9:.2f} GB each GPU sends per step take {comm_s:.3g} s " \
           f"against ~{compute_s:.3g} s of compute"
    if limited and not spec.active:
        words = f" The interconnect, not memory, is the limit: {said}."
        suggestion = _suggest(plan, row)
        if suggestion is not None:
            method, network = suggestion
            words += f" --grad-compression {method} would send {network / 1e9:.2f} GB ({network / bandwidth:.3g} s)."
            verdict["suggested"] = method
        else:
            other = next(((r, found) for r in plan.rows if r is not row and r.fits
                          and (found := _suggest(plan, r)) is not None and found[1] < row.traffic.network), None)
            words += " Gradient compression has nothing to cut in this strategy's traffic"
            if other is not None:
                (method, network), label = other[1], other[0].strategy.label
                words += (f"; {label} with --grad-compression {method} would send {network / 1e9:.2f} GB "
                          f"({network / bandwidth:.3g} s)")
                verdict["suggested"] = f"{other[0].strategy.name} + {method}"
            words += "."
        plan.recommendation = replace(plan.recommendation, reason=plan.recommendation.reason + words)
    elif spec.active and not limited:
        plan.recommendation = replace(plan.recommendation, reason=plan.recommendation.reason +
                                      f" Compression pays little here: {said} (compute dominates).")
    elif spec.active:
        plan.recommendation = replace(plan.recommendation, reason=plan.recommendation.reason +
                                      f" With --grad-compression {spec.label()}, {said}: the link still limits.")
    return verdict


def _suggest(plan: Any, row: Any) -> tuple[str, int] | None:
    s = row.strategy
    candidates = {"torch": ("powersgd", "fp16"), "fsdp": ("bf16",), "deepspeed": ("int8",)}.get(s.family, ())
    for method in candidates:
        spec = CompressionSpec(method, 4, 1000) if method == "powersgd" else CompressionSpec(method)
        network = _compressed_network(row, spec, plan.shape, plan.training, plan.hardware)
        if network is not None and network < row.traffic.network:
            return spec.method if method != "powersgd" else "powersgd --powersgd-rank 4", network
    return None
