"""What the check probe records in one process, and how the checking side reads it back.

One `Record` per process (rank), written as JSON by the probe when the script ends (or hits the step limit) and read
back by `invariants.py`. Plain data only: the checking side never imports torch to read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelkit.ranks.probes import read_results, write_rank_result

PROBE_NAME = "convert-check"
PROBE_MODULE = "accelkit.convert.check.probe"  # installed in every process of both runs
ROLE_ENV = "ACCELKIT_CHECK_ROLE"  # "original" (1 process) or "converted" (N ranks)
REPLAY_ENV = "ACCELKIT_CHECK_REPLAY_DIR"  # original run: load the converted run's weights before each eval pass
BACKEND_ENV = "ACCELKIT_CHECK_BACKEND"  # converted run: "ddp" or "fsdp" (how the probe reads the weights)
WORLD_ENV = "ACCELKIT_CHECK_WORLD"  # converted run's world size, known to the original run (progress alignment)
# the run keeps the trained weights after each optimizer step (rank 0), for the comparison with the original
WEIGHTS_ENV = "ACCELKIT_CHECK_KEEP_WEIGHTS"
WEIGHTS_FILE = "weights.pt"  # in the probe folder: {index in Record.steps: {parameter name: tensor}}
ORDER_ENV = "ACCELKIT_CHECK_ORDER"  # equivalence run: a JSON file, "loader:pass" -> the ranks' batches together
EQUIVALENCE_ROLE = "equivalence"  # the original on 1 process, its DataLoaders' batch scaled to the global batch


@dataclass
class Step:
    number: int  # steps the clock optimizer has completed (its own count; the other optimizers share it)
    optimizer: int  # index of the stepping optimizer, in the order optimizers first stepped
    is_clock: bool
    lrs: list[float]  # learning rate of each param group, as the step used it
    digest: str  # sha256 of the optimizer's parameters right after the step
    before: str | None = None  # digest right before the step (first step of each optimizer only)
    progress: list[int] | None = None  # [loader, pass, batches yielded, batches in the pass or -1] of the training pass


@dataclass
class Pass:
    """One iteration over a DataLoader (an epoch of it), keyed by the loader's dataset in order of first use."""

    loader: int
    number: int  # 0 for the first pass over this dataset, 1 for the next, ...
    length: int  # batches in the pass (len of the loader; -1 unknown)
    dataset_length: int  # samples in the dataset (-1 unknown)
    batch_size: int  # samples per batch as the loader was built (-1 unknown)
    indices: list[int] = field(default_factory=list)  # dataset indices fetched by this process
    batches: int = 0  # batches the script took
    steps: int = 0  # optimizer steps taken while the pass was running
    complete: bool = False  # the script iterated to the end
    owner: str = ""  # "train.py:evaluate": the script's function that iterated the loader
    # an IterableDataset (no indices): a short hash of each sample (row of the batch's first tensor) the script
    # took from the loader -> times taken
    stream: bool = False
    rows: dict[str, int] = field(default_factory=dict)
    replacement: bool = False  # drawn by a sampler with replacement: repeats and gaps are the sampler's own
    draws: bool = False  # torch's generator advanced while the script iterated (random noise in an evaluation)


@dataclass
class Record:
    rank: int = 0
    world: int = 1
    role: str = "original"
    script: str = ""
    reason: str = ""  # "step limit" | "script end"
    steps: list[Step] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)  # class names, by index
    unwrapped: list[dict[str, Any]] = field(default_factory=list)  # optimizers whose params no wrapper owns
    backend: str = "ddp"  # converted run: the rehearsed backend ("ddp" or "fsdp")
    wrapped: list[str] = field(default_factory=list)  # class names of the modules DDP wrapped (FSDP: sharded)
    # modules the script called at top level, in order: {"name": class, "wrapper": DDP class or "", "trained": bool}
    models: list[dict[str, Any]] = field(default_factory=list)
    passes: list[Pass] = field(default_factory=list)
    fingerprints: dict[str, int] = field(default_factory=dict)  # training inputs (a hash per row) -> times fed
    step_inputs: list[str] = field(default_factory=list)  # per clock step: a hash of the inputs it trained on
    step_rows: list[list[str]] = field(default_factory=list)  # the first clock steps: the hash of each input row
    # [tag, function, text] of each stdout line: tag = last loader event ("0:1:end"), function = who printed it
    lines: list[list[str]] = field(default_factory=list)
    stdout_lines: int = 0
    # other ranks: [why, text] of lines printed by code the conversion did not edit or gate: before this process
    # had an Accelerator ("before its Accelerator existed"), or by a module beside the script ("model.py")
    unedited_lines: list[list[str]] = field(default_factory=list)
    progress_writes: int = 0  # carriage-return writes to stderr (progress bars)
    files: dict[str, int] = field(default_factory=dict)  # path -> times this process wrote it
    backward_passes: int = 0
    returns: dict[str, Any] = field(default_factory=dict)  # "loader:pass" -> what the evaluating function returned
    saved_eval_weights: list[str] = field(default_factory=list)  # converted rank 0: "loader:pass" weights saved
    replayed: list[str] = field(default_factory=list)  # original: "loader:pass" weights loaded before the pass
    notes: list[str] = field(default_factory=list)
    # equivalence run: [batch size as the script built the DataLoader, the global batch the check gave it]
    batch_scaled: list[list[int]] = field(default_factory=list)
    batch_norm: list[str] = field(default_factory=list)  # trained modules normalising over the process's batch
    step_draws: list[bool] = field(default_factory=list)  # per clock step: torch's generator advanced in training
    weights_kept: list[int] = field(default_factory=list)  # indexes in `steps` whose weights are in WEIGHTS_FILE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        record = cls(**{k: v for k, v in data.items() if k not in {"steps", "passes"}})
        record.steps = [Step(**s) for s in data.get("steps", [])]
        record.passes = [Pass(**p) for p in data.get("passes", [])]
        return record


def a_look_at_the_data(passes: list[Pass | None]) -> bool:
    """Every rank read the same batches of a loader not sharded, trained on none and stopped within the epoch: a look
    at the data (the first batch for a data-dependent init, a shape) before `prepare`, the same on every rank."""
    present = [p for p in passes if p is not None]
    return (len(present) == len(passes) > 0 and bool(present[0].indices) and not present[0].stream
            and not any(p.steps or p.complete for p in present)
            and all(p.indices == present[0].indices for p in present))


def replay_order(ranks: list[Record]) -> dict[str, list[list[int]]]:
    """For the equivalence run: each training pass's batches as the N ranks took them at the same step, together
    (rank 0's k-th batch, then rank 1's, ...), so that one process at N times the batch trains on the same samples;
    a look at the data every rank took alike, as each rank took it (an ActNorm init from the first batch reads the
    script's batch, not N times it)."""
    order: dict[str, list[list[int]]] = {}
    keys = sorted({(p.loader, p.number) for r in ranks for p in r.passes if p.indices and not p.stream})
    for key in keys:
        passes = [next((p for p in r.passes if (p.loader, p.number) == key), None) for r in ranks]
        if any(p is None or p.batch_size <= 0 for p in passes):
            continue
        per_rank = [[p.indices[i:i + p.batch_size] for i in range(0, len(p.indices), p.batch_size)]
                    for p in passes if p is not None]
        if a_look_at_the_data(passes):
            order[f"{key[0]}:{key[1]}"] = per_rank[0]
        elif any(p.steps for p in passes if p is not None):
            order[f"{key[0]}:{key[1]}"] = [sum(batches, []) for batches in zip(*per_rank, strict=False)]
    return order


def write_record(record: Record) -> None:
    write_rank_result(PROBE_NAME, record.to_json())


def read_records(folder: Path) -> list[Record]:
    return [Record.from_json(data) for data in read_results(folder, PROBE_NAME)]
