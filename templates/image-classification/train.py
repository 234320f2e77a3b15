"""Image classification with a transformers vision model on an image folder (or a hub data set), reporting accuracy.

Run it on one process:             python train.py
Run it on every backend:           accelerate launch --config_file <config.yaml> train.py [flags]
Rehearse a GPU backend on CPU:     accelkit launch --backend fsdp --cpu --num-processes 2 train.py [flags]

With no flags it trains a tiny randomly initialised ViT on the 16x16 PNGs in data/ (stripes and checkerboards),
offline, in seconds on a CPU. Images are read by `datasets` (no torchvision). A real model and data are one flag away:
    python train.py --model <hub name or path> --dataset <hub name, or a folder of <split>/<label>/*.png>
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import signal
import time
import uuid
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, is_tensorboard_available, set_seed
from datasets import DatasetDict, load_dataset
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    ViTConfig,
    get_scheduler,
)

try:  # transformers >= 5 has one image processor per backend; the PIL one needs no torchvision
    from transformers import ViTImageProcessorPil as ViTImageProcessor
except ImportError:
    from transformers import ViTImageProcessor

BUNDLED_IMAGES = Path(__file__).resolve().parent / "data"
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="hub name or path of a pretrained vision model (default: tiny ViT)"
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="hub name, or a folder of images laid out <split>/<label>/<file> (default: the bundled data/)",
    )
    parser.add_argument("--dataset-config", default=None, help="configuration name of --dataset")
    parser.add_argument("--image-column", default="image")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--image-size", type=int, default=16, help="side of the square input of the tiny ViT")
    parser.add_argument(
        "--output-dir", default=None, help="checkpoints, logs and the final model (default: outputs/ beside train.py)"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps to run (overrides --epochs)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--per-device-batch-size", type=int, default=8)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=3e-3,
        help="peak LR for your effective batch; scale it linearly when the effective batch changes",
    )
    parser.add_argument("--lr-scheduler", choices=sorted(SCHEDULERS), default="linear", help="shape after warmup")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="save_state every N steps (0: only at the end)")
    parser.add_argument("--resume-from-checkpoint", default=None, help="'latest' or a checkpoint directory")
    parser.add_argument(
        "--async-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write checkpoints in the background while training goes on (DDP, one process, FSDP2 sharded)",
    )
    parser.add_argument(
        "--max-nonfinite-steps",
        type=int,
        default=10,
        help="stop with a checkpoint after this many optimizer steps in a row skipped for a NaN/inf (0: never)",
    )
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: once per epoch)")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--with-tracking", action="store_true", help="also log to TensorBoard, if installed")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------------
# Data: `datasets` reads an image folder (the label is the folder name) or a hub data set; images are
# resized and normalised on the fly by the model's image processor.


def load_raw_datasets(args: argparse.Namespace) -> DatasetDict:
    source = args.dataset or str(BUNDLED_IMAGES)
    if Path(source).is_dir():
        raw = load_dataset("imagefolder", data_dir=source)
    else:
        raw = load_dataset(source, args.dataset_config)
    if "validation" not in raw:
        split = raw["train"].train_test_split(test_size=0.1, seed=0)  # fixed seed: the split does not move with --seed
        raw = DatasetDict(train=split["train"], validation=split["test"])
    for column in (args.image_column, args.label_column):
        if column not in raw["train"].column_names:
            raise SystemExit(f"no column {column!r} in the data (columns: {raw['train'].column_names})")
    if not hasattr(raw["train"].features[args.label_column], "names"):
        raise SystemExit(f"column {args.label_column!r} is not a ClassLabel; name the label column or class_encode it")
    return raw


def with_pixel_values(raw: DatasetDict, processor, args: argparse.Namespace) -> DatasetDict:
    def transform(batch: dict) -> dict:
        images = [image.convert("RGB") for image in batch[args.image_column]]
        pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixel_values, "labels": torch.tensor(batch[args.label_column])}

    return raw.with_transform(transform)  # applied when a sample is read, so nothing is cached on disk


def collate(samples: list[dict]) -> dict:
    return {key: torch.stack([sample[key] for sample in samples]) for key in ("pixel_values", "labels")}


# ----------------------------------------------------------------------------------------------------------------
# Model and image processor. Offline default: a tiny ViT and a processor that resizes and normalises to [-1, 1].


def build_processor_and_model(args: argparse.Namespace, labels: list[str]):
    id2label = dict(enumerate(labels))
    label2id = {name: i for i, name in id2label.items()}
    if args.model:
        processor = AutoImageProcessor.from_pretrained(args.model)
        model = AutoModelForImageClassification.from_pretrained(
            args.model, num_labels=len(labels), id2label=id2label, label2id=label2id, ignore_mismatched_sizes=True
        )
        return processor, model
    size = args.image_size
    processor = ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    config = ViTConfig(
        image_size=size,
        patch_size=4,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_labels=len(labels),
        id2label=id2label,
        label2id=label2id,
    )
    return processor, AutoModelForImageClassification.from_config(config)


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints: <output-dir>/checkpoint-<step>, written by accelerator.save_state on every rank (model, optimizer,
# scheduler, every RNG state; sharded for FSDP, DeepSpeed's own layout for DeepSpeed). The step is in the name; the
# shuffle order is a function of (seed, epoch), so the data position follows from the step.

# >>> shared block "checkpoint-discovery": the same in every template (source: templates/minimal/train.py; tested)
CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def find_checkpoint(output_dir: Path, resume_from: str) -> Path | None:
    """The checkpoint to resume from: the path given, or for "latest" the newest complete one. The manifest is
    written last, so a save that was interrupted has none and is skipped (checkpoints of runs without manifests all
    count as complete)."""
    if resume_from != "latest":
        path = Path(resume_from)
        if not path.is_dir():
            raise SystemExit(f"--resume-from-checkpoint: {path} is not a directory")
        return path
    found = [(int(m.group(1)), p) for p in output_dir.glob("checkpoint-*") if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    complete = [(step, p) for step, p in found if (p / MANIFEST_NAME).is_file()]
    return max(complete or found)[1] if found else None


def step_of(checkpoint: Path) -> int:
    match = CHECKPOINT_NAME.fullmatch(checkpoint.resolve().name)
    if match is None:
        raise SystemExit(f"cannot read the step from {checkpoint}: expected a directory named checkpoint-<step>")
    return int(match.group(1))


# <<< shared block "checkpoint-discovery"


# >>> shared block "manifest": the same in every template (source: templates/minimal/train.py; tested)
MANIFEST_NAME = "accelkit-manifest.json"


def write_manifest(accelerator: Accelerator, checkpoint_dir: Path, step: int, run_id: str,
                   batch: dict | None = None) -> None:
    """Once every process has finished saving, the main process records what the checkpoint is."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_manifest_file(checkpoint_dir, step, run_id, accelerator.num_processes, batch)
    accelerator.wait_for_everyone()


def write_manifest_file(checkpoint_dir: Path, step: int, run_id: str, world_size: int,
                        batch: dict | None = None) -> None:
    """The record of a complete checkpoint: run id, step, world size, the batch (`batch_record`: what a resume on
    another number of processes keeps), and the size and sha256 of every file. `accelkit merge-ckpt` checks it, so a
    file from another run or step, a damaged copy or bit rot is caught. Written last and atomically: a checkpoint
    without one is incomplete."""
    files = {}
    for path in sorted(p for p in checkpoint_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        files[path.relative_to(checkpoint_dir).as_posix()] = {"size": path.stat().st_size, "sha256": digest.hexdigest()}
    manifest = {
        "format": "accelkit-checkpoint-manifest",
        "run_id": run_id,
        "step": step,
        "world_size": world_size,
        **(batch or {}),
        "files": files,
    }
    partial = checkpoint_dir / f".{MANIFEST_NAME}.partial"
    partial.write_text(json.dumps(manifest, indent=1) + "\n")
    partial.replace(checkpoint_dir / MANIFEST_NAME)


# <<< shared block "manifest"


# >>> shared block "resume-batch": the same in every template (source: templates/minimal/train.py; tested)
def batch_record(per_device: int, data_parallel: int, accumulation: int) -> dict:
    """What the manifest records of the batch, so a resume on another number of processes keeps the run's meaning."""
    return {"per_device_batch_size": per_device, "data_parallel_size": data_parallel,
            "gradient_accumulation_steps": accumulation, "global_batch_size": per_device * data_parallel * accumulation}


def resume_accumulation(checkpoint_name: str, manifest: dict, per_device: int, data_parallel: int, world_size: int,
                        accumulation: int) -> tuple[int, str | None]:
    """The accumulation that keeps the checkpoint's global batch (per-device batch x data-parallel processes x
    accumulation) on this run's processes, and the line that says what changed. A manifest without a batch record
    (written before accelkit recorded it, or by another tool), or a resume with the same processes and per-device
    batch, keeps the accumulation asked for, as before (no line). ValueError, in one line naming the numbers, when
    no whole accumulation keeps the batch."""
    global_batch = manifest.get("global_batch_size")
    if global_batch is None:
        return accumulation, None
    was = (manifest["per_device_batch_size"], manifest["data_parallel_size"], manifest["gradient_accumulation_steps"])
    if (per_device, data_parallel) == was[:2]:  # the same processes and per-device batch: nothing to keep
        return accumulation, None
    per_round = per_device * data_parallel
    if global_batch % per_round:
        fits = [n for n in range(1, global_batch // per_device + 1) if global_batch % (per_device * n) == 0]
        where = f"on {', '.join(map(str, fits[:-1]))} or {fits[-1]} processes" if len(fits) > 1 else \
            f"on {fits[0]} process" if fits else "with another --per-device-batch-size"
        raise ValueError(f"cannot resume from {checkpoint_name} on {world_size} processes: its global batch of "
                         f"{global_batch} ({was[0]} per device x {was[1]} processes x {was[2]} accumulation) is no "
                         f"whole accumulation of {per_device} per device x {data_parallel} processes; resume {where}")
    kept = global_batch // per_round
    changes = f"per-device batch {was[0]} -> {per_device}, " if per_device != was[0] else ""
    asked = f" (not the {accumulation} asked for)" if accumulation not in (was[2], kept) else ""
    return kept, (f"resumed from {checkpoint_name} (written by {manifest.get('world_size', was[1])} processes) on "
                  f"{world_size}: {changes}accumulation {was[2]} -> {kept}{asked} keeps the global batch of "
                  f"{global_batch}")


def batches_to_skip(samples_into_epoch: int, per_device: int, data_parallel: int) -> int:
    """Batches each process skips to resume mid-epoch: the samples the epoch has consumed (in any earlier world
    size), spread over this run's processes, so no sample is seen twice or skipped."""
    per_round = per_device * data_parallel
    if samples_into_epoch % per_round:
        raise ValueError(f"{samples_into_epoch} samples into the epoch is not a whole number of batches of "
                         f"{per_device} per device x {data_parallel} processes")
    return samples_into_epoch // per_round


def keep_global_batch(accelerator: Accelerator, checkpoint: Path | None, per_device: int,
                      data_parallel: int) -> str | None:
    """Before prepare(): sets the accelerator's accumulation to the one that keeps the checkpoint's global batch on
    this run's processes (`resume_accumulation`); returns the line that says what changed. A batch no whole
    accumulation keeps stops every process, with that one line from the main process."""
    manifest_path = checkpoint / MANIFEST_NAME if checkpoint is not None else None
    if manifest_path is None or not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    try:
        accumulation, line = resume_accumulation(checkpoint.resolve().name, manifest, per_device, data_parallel,
                                                 accelerator.num_processes, accelerator.gradient_accumulation_steps)
    except ValueError as refusal:
        raise SystemExit(str(refusal) if accelerator.is_main_process else 1) from None
    accelerator.gradient_accumulation_steps = accumulation
    if line is not None and accelerator.state.deepspeed_plugin is not None:
        # DeepSpeed accumulates in its engine, by its own config's value (which prepare() would otherwise keep)
        accelerator.state.deepspeed_plugin.deepspeed_config["gradient_accumulation_steps"] = accumulation
    return line


# <<< shared block "resume-batch"


# >>> shared block "logging-window": the same in every template (source: templates/minimal/train.py; tested)
def log(accelerator: Accelerator, message: str) -> None:
    """Print once (main process), above the progress bar."""
    if accelerator.is_main_process:
        tqdm.write(message)


class LogWindow:
    """Loss and throughput averaged over the optimizer steps since the last log line (every process calls `log`:
    the loss is averaged across processes)."""

    def __init__(self, accelerator: Accelerator, step: int, unit: str) -> None:
        self.accelerator, self.unit = accelerator, unit
        self.reset(step)

    def reset(self, step: int) -> None:
        self.loss = torch.zeros((), device=self.accelerator.device)
        self.items, self.start, self.from_step = 0, time.perf_counter(), step

    def add(self, loss: torch.Tensor, items: int, accumulation: int) -> None:
        self.loss += loss.detach().float() / accumulation
        self.items += items

    def log(self, step: int, lr: float) -> None:
        mean_loss = self.accelerator.reduce(self.loss, "mean").item() / (step - self.from_step)
        rate = self.items * self.accelerator.num_processes / (time.perf_counter() - self.start)
        log(self.accelerator, f"step {step} | loss {mean_loss:.4f} | lr {lr:.2e} | {rate:.0f} {self.unit}/s")
        self.accelerator.log({"train_loss": mean_loss, "lr": lr, f"{self.unit}_per_s": rate}, step=step)
        self.reset(step)


# <<< shared block "logging-window"


# >>> shared block "final-save": the same in every template (source: templates/minimal/train.py; tested)
def save_final_model(accelerator: Accelerator, model, final_dir: Path, write_files, load_with: str) -> None:
    """Every process takes part in gathering the full weights (FSDP and DeepSpeed ZeRO-3 shards meet here); the main
    process then writes them with `write_files(final_dir, state_dict)`."""
    accelerator.wait_for_everyone()
    try:
        state_dict = accelerator.get_state_dict(model)
    except ValueError as exc:  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save
        log(accelerator, f"final model not written ({exc}); merge the last checkpoint with `accelkit merge-ckpt`")
        return
    if accelerator.is_main_process:
        final_dir.mkdir(parents=True, exist_ok=True)
        write_files(final_dir, state_dict)
        log(accelerator, f"final model: {final_dir} (load with {load_with})")
    accelerator.wait_for_everyone()


# <<< shared block "final-save"


# >>> shared block "preemption": the same in every template (source: templates/minimal/train.py; tested)
class Preemption:
    """SIGUSR1 asks the run to stop early with a checkpoint (accelkit's SLURM job sends it ahead of a preemption or
    the time limit: `accelkit launch --slurm ... --requeue --signal-before S`; `accelkit launch` sends it on the
    first SIGTERM, what Kubernetes and spot instances send before they stop a job: --preemption-grace). Every rank
    finishes its optimizer step and the ranks agree on the step (one may get the signal a step later than another);
    the run then saves a checkpoint and ends. The requeued job, started with `--resume-from-checkpoint latest`,
    continues from it."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.requested = False
        signal.signal(signal.SIGUSR1, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True

    def now(self) -> bool:
        """Called once per optimizer step on every rank: True on all ranks once any rank got the signal."""
        flag = torch.tensor([float(self.requested)], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).max().item() > 0)


# <<< shared block "preemption"


# >>> shared block "grad-compression": the same in every template (source: templates/minimal/train.py; tested)
def grad_compression_kwargs() -> dict:
    """Accelerator(...) arguments for the gradient compression `accelkit launch --grad-compression` exports in
    ACCELKIT_GRAD_COMPRESSION (fp16 | bf16 | powersgd:rank=R,start=S; docs/guides/gradient-compression.md): a DDP
    communication hook, or under FSDP2 the reduce dtype. Nothing when unset (int8, ZeRO++, is in the DeepSpeed JSON)."""
    import os

    method, _, settings = os.environ.get("ACCELKIT_GRAD_COMPRESSION", "none").partition(":")
    if method in ("", "none", "int8"):
        return {}
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true"):
        from accelerate.utils import FullyShardedDataParallelPlugin
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
        compute = dtypes.get(os.environ.get("ACCELERATE_MIXED_PRECISION", "no"))
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=dtypes[method])
        return {"fsdp_plugin": FullyShardedDataParallelPlugin(mixed_precision_policy=policy)}
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    if method != "powersgd":
        hook = {"fp16": DDPCommunicationHookType.FP16, "bf16": DDPCommunicationHookType.BF16}[method]
        return {"kwargs_handlers": [DistributedDataParallelKwargs(comm_hook=hook)]}
    values = dict(item.split("=", 1) for item in settings.split(",") if "=" in item)
    start = int(values.get("start", 1000))
    state = {"matrix_approximation_rank": int(values.get("rank", 1)), "start_powerSGD_iter": start}
    if start <= 1:  # torch allows error feedback and warm start only from iteration 2 on
        state.update(use_error_feedback=False, warm_start=False)
    handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD, comm_state_option=state)
    return {"kwargs_handlers": [handler]}


# <<< shared block "grad-compression"


# >>> shared block "async-checkpoint": the same in every template (source: templates/minimal/train.py; tested)
class Checkpointer:
    """Writes <output-dir>/checkpoint-<step> in the layout `accelerator.load_state` and `accelkit merge-ckpt` read.

    Asynchronous (--async-checkpoint, the default under DDP, one process and FSDP2 with sharded state dicts): the
    save copies the model and optimizer state to CPU memory (pinned where CUDA is) and returns; a background thread
    writes them while training goes on (FSDP: torch.distributed.checkpoint.async_save into pytorch_model_fsdp_0/ and
    optimizer_0/; DDP: model.safetensors and optimizer.bin, the files save_state writes, which DCP does not). The
    small files (scheduler, RNG, samplers, config) are written at once. When every rank has finished writing, the
    main process writes the manifest, last: until then `--resume-from-checkpoint latest` skips the checkpoint. A save
    first waits for the one before. DeepSpeed and other layouts save synchronously with save_state."""

    def __init__(self, accelerator: Accelerator, asynchronous: bool, run_id: str, batch: dict | None = None) -> None:
        import os

        self.accelerator, self.run_id, self.batch = accelerator, run_id, batch  # batch: batch_record(), manifest's
        # What save_state saves: the prepared model and optimizer as the accelerator holds them (one of each here).
        self.model, self.optimizer = accelerator._models[0], accelerator._optimizers[0]
        backend = accelerator.distributed_type.value
        self.fsdp = backend == "FSDP"
        supported = backend in ("NO", "MULTI_CPU", "MULTI_GPU") or (
            self.fsdp and accelerator.is_fsdp2 and accelerator.state.fsdp_plugin.state_dict_type.name
            == "SHARDED_STATE_DICT")
        if asynchronous and not supported:
            log(accelerator, f"--async-checkpoint: {backend} saves synchronously here (save_state)")
        self.asynchronous = asynchronous and supported
        self.pending = None  # the background write of the last checkpoint
        self.groups = []
        if self.asynchronous and torch.distributed.is_initialized():
            # Own gloo groups, so the writing thread's collectives never interleave with the training loop's
            # (one each for the model and the optimizer writes, which run at the same time).
            self.groups = [torch.distributed.new_group(backend="gloo") for _ in range(2)]
        # Test hook: "STEP:SECONDS" holds the write of checkpoint-STEP between the model and the optimizer files.
        step, _, seconds = os.environ.get("ACCELKIT_TEST_CHECKPOINT_WRITE_DELAY", "").partition(":")
        self.delay = (int(step), float(seconds)) if seconds else None

    def save(self, checkpoint_dir: Path, step: int, write_extras, save_state=None) -> None:
        """Save on every process; `write_extras(checkpoint_dir)` runs on the main process (config, tokenizer)."""
        self.wait()
        if not self.asynchronous:
            (save_state or (lambda path: self.accelerator.save_state(str(path))))(checkpoint_dir)
            if self.accelerator.is_main_process:
                write_extras(checkpoint_dir)
            write_manifest(self.accelerator, checkpoint_dir, step, self.run_id, self.batch)
            return
        from concurrent.futures import ThreadPoolExecutor

        from accelerate.checkpointing import save_accelerator_state, save_custom_state

        accelerator = self.accelerator
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        delay = self.delay[1] if self.delay and self.delay[0] == step else 0.0
        writes = self._start_fsdp(checkpoint_dir, delay) if self.fsdp else self._start_ddp(checkpoint_dir, delay)
        # The rest of what save_state writes (no model or optimizer: those are in flight), at once.
        save_accelerator_state(str(checkpoint_dir), [], [], accelerator._schedulers, accelerator._dataloaders,
                               accelerator.process_index, accelerator.step, accelerator.scaler)
        for index, obj in enumerate(accelerator._custom_objects):
            save_custom_state(obj, str(checkpoint_dir), index)
        if accelerator.is_main_process:
            write_extras(checkpoint_dir)

        def complete() -> None:
            for write in writes:
                write()
            if self.groups:
                torch.distributed.barrier(group=self.groups[0])  # every rank's files are on disk
            if accelerator.is_main_process:
                write_manifest_file(checkpoint_dir, step, self.run_id, accelerator.num_processes, self.batch)

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelkit-checkpoint")
        self.pending = executor.submit(complete)
        executor.shutdown(wait=False)

    def _start_fsdp(self, checkpoint_dir: Path, delay: float) -> list:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        class DelayedWriter(dcp.FileSystemWriter):
            def write_data(self, plan, planner):
                time.sleep(delay)
                return super().write_data(plan, planner)

        cuda = torch.cuda.is_available()
        states = {"pytorch_model_fsdp_0": {"model": get_model_state_dict(self.model)},
                  "optimizer_0": {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}}
        futures = []
        for (folder, state), group in zip(states.items(), self.groups or [None, None], strict=True):
            stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                  use_async_staging=False, use_non_blocking_copy=cuda))
            writer = (DelayedWriter if delay and folder == "optimizer_0" else dcp.FileSystemWriter)(
                checkpoint_dir / folder)
            futures.append((dcp.async_save(state, storage_writer=writer, process_group=group, async_stager=stager),
                            stager))

        def finish(future, stager) -> None:
            future.result()
            stager.close()

        return [lambda future=future, stager=stager: finish(future, stager) for future, stager in futures]

    def _start_ddp(self, checkpoint_dir: Path, delay: float) -> list:
        if not self.accelerator.is_main_process:  # save_state writes the replicated model and optimizer once
            return []
        from accelerate.utils import save
        from torch.distributed.checkpoint.staging import StateDictStager

        stager = StateDictStager(pin_memory=torch.cuda.is_available())
        model_state = stager.stage(self.accelerator.get_state_dict(self.model, unwrap=False))
        optimizer_state = stager.stage(self.optimizer.state_dict())

        def write() -> None:
            save(model_state, checkpoint_dir / "model.safetensors", safe_serialization=True)
            time.sleep(delay)
            save(optimizer_state, checkpoint_dir / "optimizer.bin", safe_serialization=False)

        return [write]

    def wait(self) -> None:
        """Block until the last save is complete (its manifest written); call before the run ends."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()


# <<< shared block "async-checkpoint"


# >>> shared block "non-finite-guard": the same in every template (source: templates/minimal/train.py; tested)
class NonFiniteGuard:
    """A non-finite loss or gradient norm on any rank skips the optimizer step on every rank (the ranks agree at each
    step) and is named in one line. The scheduler still steps, so the schedule and the data stay functions of the
    step. After --max-nonfinite-steps in a row the run saves a checkpoint and stops with an error: no skipped step
    changed the weights, so it holds the last finite ones. Under fp16 the GradScaler keeps its own overflow skipping
    (only the loss is checked). DeepSpeed steps inside backward: its ZeRO optimizers skip a step whose global gradient
    norm is not finite (and clear the gradients) on every rank; the guard names, counts and stops on those."""

    def __init__(self, accelerator: Accelerator, limit: int, step: int) -> None:
        import os

        self.accelerator, self.limit, self.step = accelerator, limit, step
        self.deepspeed = accelerator.distributed_type.value == "DEEPSPEED"
        self.bad = torch.zeros((), dtype=torch.bool, device=accelerator.device)
        self.in_a_row = self.total = 0
        # Test hook: "RANK:STEP,STEP..." makes that rank's loss NaN at those optimizer steps.
        rank, _, steps = os.environ.get("ACCELKIT_TEST_NONFINITE_LOSS", "").partition(":")
        self.inject = {int(s) for s in steps.split(",") if s} if rank == str(accelerator.process_index) else set()

    def watch(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to backpropagate (every micro-batch); notes whether it is finite."""
        if self.step + 1 in self.inject:
            loss = loss * float("nan")
        self.bad |= ~torch.isfinite(loss.detach()).all()
        return loss

    def step_is_finite(self, grad_norm) -> bool:
        """At each optimizer step, on every rank: False on all ranks when any rank saw a non-finite value."""
        self.step += 1
        if self.deepspeed:
            # Its fp16 loss scaler skips overflowing steps as routine (like the GradScaler): only the loss counts there.
            if self.accelerator.mixed_precision != "fp16" and self.accelerator.optimizer_step_was_skipped:
                self.bad = torch.ones_like(self.bad)
        elif grad_norm is not None and self.accelerator.scaler is None:
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: DTensor
            self.bad |= ~torch.isfinite(torch.as_tensor(grad_norm, device=self.bad.device)).all()
        bad = self.accelerator.gather(self.bad.float().reshape(1)).max().item() > 0
        self.bad = torch.zeros_like(self.bad)
        if not bad:
            self.in_a_row = 0
            return True
        self.in_a_row, self.total = self.in_a_row + 1, self.total + 1
        if self.deepspeed and not self.accelerator.optimizer_step_was_skipped:  # ZeRO stage 0 checks no norm
            log(self.accelerator, f"step {self.step}: non-finite loss; DeepSpeed ZeRO stage 0 applied the step all "
                                  "the same (stages 1-3 skip it): the weights may no longer be finite")
            return False
        log(self.accelerator, f"step {self.step}: non-finite loss or gradient norm; optimizer step skipped on every "
                              f"rank ({self.in_a_row} in a row, {self.total} in this run)")
        return False

    @property
    def stop(self) -> bool:
        return bool(self.limit) and self.in_a_row >= self.limit


# <<< shared block "non-finite-guard"


def embeddings_in_their_own_fsdp_unit(model) -> None:
    """FSDP2 in Accelerate shards the input embedding as a unit of its own. When a module around it is also listed
    in `_no_split_modules` (BertEmbeddings, ViTEmbeddings, ...), both claim it and `fully_shard` fails, so that
    module is left out of the wrap list; its other parameters join the root unit."""
    embeddings = model.get_input_embeddings()
    around = {type(m).__name__ for m in model.modules() if m is not embeddings and embeddings in list(m.modules())}
    model._no_split_modules = [name for name in (model._no_split_modules or []) if name not in around]


def evaluate(accelerator: Accelerator, model, loader: DataLoader) -> dict[str, float]:
    model.eval()
    correct, losses = [], []
    for batch in loader:
        with torch.no_grad():
            outputs = model(**batch)
        # gather_for_metrics drops the samples the sampler duplicated to even out the last batch across processes.
        preds, refs = accelerator.gather_for_metrics((outputs.logits.argmax(dim=-1), batch["labels"]))
        correct.append(preds == refs)
        losses.append(accelerator.gather_for_metrics(outputs.loss.detach().float().repeat(len(batch["labels"]))))
    model.train()
    return {"eval_loss": torch.cat(losses).mean().item(), "accuracy": torch.cat(correct).float().mean().item()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_id = uuid.uuid4().hex  # names this run in every checkpoint manifest (the main process's)
    # Default beside this script, so `accelkit launch my-run/train.py` writes my-run/outputs from any directory.
    output_dir = Path(args.output_dir) if args.output_dir else Path(__file__).resolve().parent / "outputs"
    tracking = args.with_tracking and is_tensorboard_available()
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with="tensorboard" if tracking else None,
        project_dir=str(output_dir),
        # A seedable sampler makes the shuffle order a function of (seed, epoch): resumable and equal on all ranks.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        # --grad-compression of `accelkit launch`: a DDP comm hook or FSDP2's reduce dtype (see the block above)
        **grad_compression_kwargs(),
    )
    set_seed(args.seed)
    if args.with_tracking and not tracking:
        log(accelerator, "--with-tracking: TensorBoard is not installed (pip install tensorboard); not tracking")
    # The checkpoint to resume from is found before prepare(): on another number of processes the accumulation
    # changes to keep its global batch (or the run stops here, in one line, when no whole accumulation does).
    checkpoint = find_checkpoint(output_dir, args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    batch_change = keep_global_batch(accelerator, checkpoint, args.per_device_batch_size, accelerator.num_processes)

    # -- data and model --------------------------------------------------------------------------------------------
    with accelerator.main_process_first():  # rank 0 fills the datasets cache, the others read it
        raw = load_raw_datasets(args)
    labels = raw["train"].features[args.label_column].names
    processor, model = build_processor_and_model(args, labels)
    datasets = with_pixel_values(raw, processor, args)
    train_set, eval_set = datasets["train"], datasets["validation"]
    # Each loader owns a generator, so starting an epoch or an evaluation never draws from the global RNG that
    # dropout uses: a resumed run sees exactly the random numbers the uninterrupted run saw.
    shuffle_generator = torch.Generator().manual_seed(args.seed)
    train_loader = DataLoader(
        train_set, args.per_device_batch_size, shuffle=True, generator=shuffle_generator, collate_fn=collate
    )
    eval_loader = DataLoader(eval_set, args.per_device_batch_size, collate_fn=collate, generator=torch.Generator())

    # -- optimizer and schedule ------------------------------------------------------------------------------------
    no_decay = ("bias", "norm")  # biases and norm weights are not decayed
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n.lower() for k in no_decay)]},
        {
            "params": [p for n, p in model.named_parameters() if any(k in n.lower() for k in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, weight_decay=args.weight_decay)
    if accelerator.is_fsdp2:
        embeddings_in_their_own_fsdp_unit(model)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    # Read accumulation back from the accelerator: a DeepSpeed config may set its own value.
    accumulation = accelerator.gradient_accumulation_steps
    steps_per_epoch = math.ceil(len(train_loader) / accumulation)
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    num_epochs = math.ceil(max_steps / steps_per_epoch)
    warmup = min(args.warmup_steps, max_steps)
    # The loop steps the scheduler once per optimizer step on every backend (a prepared scheduler would step
    # num_processes times per step, and not at all under DeepSpeed); save_state still stores it.
    scheduler = get_scheduler(SCHEDULERS[args.lr_scheduler], optimizer, warmup, max_steps)
    accelerator.register_for_checkpointing(scheduler)

    # -- resume ----------------------------------------------------------------------------------------------------
    completed_steps = 0
    if args.resume_from_checkpoint and checkpoint is None:
        log(accelerator, f"no checkpoint in {output_dir}; starting from scratch")
    elif checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        accelerator.step = 0  # micro-batches into the optimizer step: none at a checkpoint, in any accumulation
        completed_steps = step_of(checkpoint)
        log(accelerator, f"resumed from {checkpoint} at step {completed_steps}")
        if batch_change:
            log(accelerator, batch_change)
    effective_batch = args.per_device_batch_size * accelerator.num_processes * accumulation
    starting_epoch = completed_steps // steps_per_epoch
    # Counted in samples, so a resume on another number of processes starts at the first sample not yet seen.
    skip = batches_to_skip((completed_steps % steps_per_epoch) * effective_batch, args.per_device_batch_size,
                           accelerator.num_processes)

    # -- start-up summary ------------------------------------------------------------------------------------------
    # ZeRO-3 partitions parameters (numel 0 here); ds_numel keeps the full size.
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in accelerator.unwrap_model(model).parameters())
    log(
        accelerator,
        f"backend {accelerator.distributed_type.value} | world size {accelerator.num_processes} | "
        f"device {accelerator.device} | mixed precision {accelerator.mixed_precision}\n"
        f"effective batch {effective_batch} = {args.per_device_batch_size} per device x "
        f"{accelerator.num_processes} processes x {accumulation} accumulation | "
        f"learning rate {args.learning_rate:g} (warmup {warmup}, {args.lr_scheduler}) | "
        f"steps {max_steps} ({steps_per_epoch} per epoch) | {len(train_set)} train / {len(eval_set)} eval samples | "
        f"{len(labels)} labels | {num_params:,} parameters",
    )
    if tracking:
        accelerator.init_trackers("image-classification", config={k: v for k, v in vars(args).items() if v is not None})

    preemption, preempted = Preemption(accelerator), False  # SIGUSR1: save at the next step, stop
    guard = NonFiniteGuard(accelerator, args.max_nonfinite_steps, completed_steps)  # NaN/inf: skip the step
    checkpointer = Checkpointer(accelerator, args.async_checkpoint, run_id,
                                batch_record(args.per_device_batch_size, accelerator.num_processes, accumulation))

    def write_config(checkpoint_dir: Path) -> None:  # lets `accelkit merge-ckpt` write a from_pretrained-ready dir
        accelerator.unwrap_model(model).config.save_pretrained(checkpoint_dir)
        processor.save_pretrained(checkpoint_dir)

    # -- train -----------------------------------------------------------------------------------------------------
    model.train()
    progress = tqdm(total=max_steps, initial=completed_steps, disable=not accelerator.is_local_main_process)
    window = LogWindow(accelerator, completed_steps, "samples")
    for epoch in range(starting_epoch, num_epochs):
        train_loader.set_epoch(epoch)
        loader = train_loader
        if epoch == starting_epoch and skip:
            loader = accelerator.skip_first_batches(train_loader, skip)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = guard.watch(model(**batch).loss)
                accelerator.backward(loss)
                finite = True
                if accelerator.sync_gradients:
                    finite = guard.step_is_finite(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm))
                if finite:
                    optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
            window.add(loss, batch["labels"].shape[0], accumulation)
            if not accelerator.sync_gradients:
                continue
            completed_steps += 1
            progress.update(1)
            last_step = completed_steps == max_steps

            if completed_steps % args.log_every == 0 or last_step:
                window.log(completed_steps, scheduler.get_last_lr()[0])

            # Checkpoint before evaluating, so the saved RNG state is the one the next training step would see.
            preempted = preemption.now()
            if (args.checkpoint_every and completed_steps % args.checkpoint_every == 0) or last_step or \
                    preempted or guard.stop:
                checkpointer.save(output_dir / f"checkpoint-{completed_steps}", completed_steps, write_config)
            end_of_epoch = completed_steps % steps_per_epoch == 0
            if (completed_steps % args.eval_every == 0 if args.eval_every else end_of_epoch) or last_step:
                metrics = evaluate(accelerator, model, eval_loader)
                log(accelerator, f"step {completed_steps} | " + " | ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                accelerator.log(metrics, step=completed_steps)
            if last_step or preempted or guard.stop:
                break
        if preempted or guard.stop:
            break
    progress.close()
    checkpointer.wait()  # the last checkpoint is complete (manifest written) before the run ends
    if guard.stop:
        log(accelerator, f"stopped: {guard.in_a_row} optimizer steps in a row had a non-finite loss or gradient norm "
                         f"(to step {completed_steps}); checkpoint-{completed_steps} holds the last finite weights")
        accelerator.end_training()
        raise SystemExit(1)
    if preempted:
        log(accelerator, f"stopped on SIGUSR1 after step {completed_steps} with a checkpoint; resume with "
                         "--resume-from-checkpoint latest")
        accelerator.end_training()
        return

    # -- final model: config + safetensors + image processor, for AutoModelForImageClassification.from_pretrained ------
    def write_final_files(final_dir: Path, state_dict: dict) -> None:
        accelerator.unwrap_model(model).save_pretrained(final_dir, state_dict=state_dict)
        processor.save_pretrained(final_dir)

    load_with = "AutoModelForImageClassification.from_pretrained"
    save_final_model(accelerator, model, output_dir / "final", write_final_files, load_with)
    accelerator.end_training()


if __name__ == "__main__":
    main()
