"""Pipeline parallelism for train.py: the decoder layers split into stages, run by a torch.distributed.pipelining
schedule, with FSDP2 (dp_shard) inside each stage group, all on one DeviceMesh (pp, dp_shard, tp).

train.py calls `train_with_pipeline` when $ACCELKIT_PIPELINE is set (`accelkit launch --pp-size N` exports it, e.g.
`pp=2,schedule=1f1b,microbatches=4,dp_shard=2,tp=1`; docs/guides/nd-parallelism.md). Accelerate starts the processes
and the process group; the mesh, the stages and the schedule are torch's:

- stages: each keeps whole decoder layers under their own names (`model.layers.3....`), the first also the
  embeddings, the last also the final norm and the LM head, so every checkpoint holds the model's own FQNs;
- the loss of each microbatch is divided by microbatches x accumulation and the schedule runs with
  `scale_grads=False`, so the gradients are those of the batch mean, as in one process;
- gradient clipping takes the norm over every stage (an all-reduce over the pp dimension);
- checkpoints are torch distributed checkpoints (each rank saves its stage's shards; `accelkit merge-ckpt` merges
  them), and the final model is written as one safetensors file per stage plus an index, for from_pretrained.

Models: decoder-only Transformers models laid out as Llama's (`model.embed_tokens`, `model.layers`, `model.norm`,
`model.rotary_emb`, `lm_head`): Llama, Mistral, Qwen2 and the like.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn

ENV_VAR = "ACCELKIT_PIPELINE"
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved1f1b": "ScheduleInterleaved1F1B",
             "interleavedzerobubble": "ScheduleInterleavedZeroBubble"}
ONE_STAGE_PER_RANK = ("gpipe", "1f1b")


def spec_from_env() -> dict | None:
    """The layout `accelkit launch --pp-size` exports, or None without a pipeline."""
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return None
    spec = {"pp": 1, "schedule": "1f1b", "microbatches": 0, "dp_shard": 1, "tp": 1}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in spec:
            raise SystemExit(f"{ENV_VAR}: {item!r} is not a pipeline setting (pp, schedule, microbatches, dp_shard, "
                             "tp)")
        spec[key] = value if key == "schedule" else int(value)
    if spec["schedule"] not in SCHEDULES:
        raise SystemExit(f"{ENV_VAR}: unknown schedule {spec['schedule']!r}; use one of {', '.join(SCHEDULES)}")
    if spec["pp"] < 2:
        return None
    spec["microbatches"] = spec["microbatches"] or spec["pp"]
    spec["stages_per_rank"] = 1 if spec["schedule"] in ONE_STAGE_PER_RANK else 2
    return spec


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Consecutive decoder layers per stage, as even as can be (the first stages take one more)."""
    if num_layers < num_stages:
        raise SystemExit(f"the model has {num_layers} decoder layers, fewer than the {num_stages} pipeline stages: "
                         "use a smaller --pp-size or a one-stage schedule (1f1b, gpipe)")
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for stage in range(num_stages):
        size = base + (stage < extra)
        out.append(range(start, start + size))
        start += size
    return out


def _causal_mask(config, hidden: torch.Tensor, position_ids: torch.Tensor):
    """The model's own causal mask (transformers' create_causal_mask), through whichever signature it has."""
    from transformers.masking_utils import create_causal_mask

    names = inspect.signature(create_causal_mask).parameters
    kwargs = {"config": config, "attention_mask": None, "position_ids": position_ids}
    kwargs["inputs_embeds" if "inputs_embeds" in names else "input_embeds"] = hidden
    if "cache" in names:
        kwargs["cache"] = None
    else:
        kwargs.update(past_key_values=None, cache_position=position_ids[0])
    return create_causal_mask(**kwargs)


class StageModule(nn.Module):
    """One pipeline stage: the full model's own submodules for `layers` (and the embeddings on the first stage, the
    norm and LM head on the last), under the full model's names."""

    def __init__(self, full: nn.Module, layers: range, first: bool, last: bool, checkpointing: bool = False) -> None:
        super().__init__()
        inner = full.model
        self.config = full.config
        self.first, self.last = first, last
        self.checkpointing = checkpointing  # each decoder layer's activations recomputed in backward
        self.model = nn.Module()
        if first:
            self.model.embed_tokens = inner.embed_tokens
        self.model.layers = nn.ModuleDict({str(i): inner.layers[i] for i in layers})
        self.model.rotary_emb = inner.rotary_emb  # non-persistent buffers only: in no state dict
        if last:
            self.model.norm = inner.norm
            self.lm_head = full.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.model.embed_tokens(x) if self.first else x
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = _causal_mask(self.config, hidden, position_ids)
        position_embeddings = self.model.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.model.layers.values():
            if self.checkpointing and torch.is_grad_enabled():
                out = torch.utils.checkpoint.checkpoint(layer, hidden, use_reentrant=False, attention_mask=mask,
                                                        position_embeddings=position_embeddings,
                                                        position_ids=position_ids)
            else:
                out = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                            position_ids=position_ids)
            hidden = out[0] if isinstance(out, tuple) else out
        if self.last:
            return self.lm_head(self.model.norm(hidden))
        return hidden


def check_model(model: nn.Module) -> None:
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, name) for name in needed) or not hasattr(model, "lm_head"):
        raise SystemExit(f"pipeline parallelism: {type(model).__name__} is not laid out as a Llama-style decoder "
                         "(model.embed_tokens, model.layers, model.norm, lm_head); run it without --pp-size")
    if model.lm_head.weight is inner.embed_tokens.weight:
        raise SystemExit("pipeline parallelism: this model ties its LM head to its embeddings, which live on "
                         "different stages; use a model with tie_word_embeddings=false")


class StageOptions(NamedTuple):
    """What the launch asked of FSDP that the pipeline applies itself (its stages are sharded here, not by
    Accelerate's prepare); `accelkit config` refuses the FSDP options it cannot apply."""

    checkpointing: bool = False  # --activation-checkpointing: each decoder layer recomputed in backward
    reshard_after_forward: bool = True  # --sharding: full (True) or grad-op (False), FSDP2's reshard_after_forward

    @classmethod
    def of(cls, accelerator) -> StageOptions:
        plugin = getattr(accelerator.state, "fsdp_plugin", None)
        if plugin is None:
            return cls()
        reshard = plugin.reshard_after_forward
        return cls(bool(plugin.activation_checkpointing), reshard if isinstance(reshard, bool) else True)


class Pipeline:
    """This rank's part of the pipeline: its stage modules, their PipelineStages and the schedule."""

    def __init__(self, spec: dict, model: nn.Module, device: torch.device, loss_fn,
                 options: StageOptions | None = None) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, schedules

        check_model(model)
        self.spec = spec
        world = dist.get_world_size()
        pp, dp, tp = spec["pp"], spec["dp_shard"], spec["tp"]
        if pp * dp * tp != world:
            raise SystemExit(f"{ENV_VAR}: pp {pp} x dp_shard {dp} x tp {tp} is not the {world} processes launched")
        self.mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp_shard", "tp"))
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.dp_rank = self.mesh.get_local_rank("dp_shard")
        per_rank = spec["stages_per_rank"]
        num_stages = pp * per_rank
        ranges = split_layers(len(model.model.layers), num_stages)
        # Rank r holds stages r, r + pp, ...: the loop order the interleaved schedules expect.
        self.stage_ids = [self.pp_rank + k * pp for k in range(per_rank)]
        self.options = options or StageOptions()
        self.modules = [StageModule(model, ranges[s], s == 0, s == num_stages - 1, self.options.checkpointing)
                        for s in self.stage_ids]
        for module in self.modules:
            module.to(device)
            if tp > 1:
                self._tensor_parallel(module)
            if dp > 1:
                self._shard(module)
        self.has_last = num_stages - 1 in self.stage_ids
        self.has_first = 0 in self.stage_ids
        pp_group = self.mesh.get_group("pp")
        self.stages = [PipelineStage(m, s, num_stages, device, group=pp_group)
                       for m, s in zip(self.modules, self.stage_ids, strict=True)]
        kind = getattr(schedules, SCHEDULES[spec["schedule"]])
        stages = self.stages[0] if per_rank == 1 else self.stages
        self.schedule = kind(stages, n_microbatches=spec["microbatches"], loss_fn=loss_fn, scale_grads=False)
        # step() below uses only the losses: without return_outputs=False (newer torch has it) the last stage keeps
        # every micro-batch's logits until the step returns (measured: 4 micro-batches' worth held under 1F1B too)
        self.keep_outputs = {} if "return_outputs" not in inspect.signature(self.schedule.step).parameters \
            else {"return_outputs": False}

    def _tensor_parallel(self, module: StageModule) -> None:
        """Megatron-style TP over the tp dimension inside each decoder layer: the q/k/v and gate/up projections
        split by output features (whole heads per rank), o/down by input features (one all-reduce each); the
        embeddings, norms and LM head stay whole on every tp rank."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        heads, kv = module.config.num_attention_heads, getattr(module.config, "num_key_value_heads", None)
        tp = self.spec["tp"]
        if heads % tp or (kv or heads) % tp:
            raise SystemExit(f"tensor parallelism: tp {tp} does not split the model's {heads} attention heads "
                             f"and {kv or heads} kv heads")
        plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel()}
        for layer in module.model.layers.values():
            parallelize_module(layer, self.mesh["tp"], plan)

    def _shard(self, module: StageModule) -> None:
        """FSDP2 over the dp_shard dimension: each decoder layer one unit, the stage's rest one more."""
        from torch.distributed.fsdp import fully_shard

        dp_mesh = self.mesh["dp_shard"]
        reshard = self.options.reshard_after_forward
        for layer in module.model.layers.values():
            fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(module, mesh=dp_mesh, reshard_after_forward=reshard)

    def parameters(self):
        for module in self.modules:
            yield from module.parameters()

    def named_parameters(self):
        for module in self.modules:
            yield from module.named_parameters()

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One forward and backward of the batch through the pipeline; the batch's loss on every rank (the sum of
        the microbatch losses the last stage computed, each already divided by the microbatches)."""
        losses: list[torch.Tensor] = []
        kwargs = {"target": labels, "losses": losses} if self.has_last else {}
        kwargs.update(self.keep_outputs)
        if self.has_first:
            self.schedule.step(input_ids, **kwargs)
        else:
            self.schedule.step(**kwargs)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=input_ids.device)
        dist.all_reduce(loss, group=self.mesh.get_group("pp"))  # only the last stage holds a loss
        return loss

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of every gradient of the model: this rank's shards, summed over dp_shard (DTensor) and
        over the pipeline's stages."""
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in self.parameters() if p.grad is not None]
        squares = torch.zeros((), device=grads[0].device if grads else None)
        for grad in grads:
            square = grad.float().pow(2).sum()
            squares = squares + (square.full_tensor() if isinstance(square, DTensor) else square)
        dist.all_reduce(squares, group=self.mesh.get_group("pp"))
        total = squares.sqrt()
        # torch's clip_grads_with_norm_ arithmetic, one gradient at a time: TP and FSDP gradients live on
        # different meshes, which one foreach call cannot mix.
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0).item()
        for grad in grads:
            grad.mul_(coef)
        return total

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state(self, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        model_state: dict = {}
        for module in self.modules:
            model_state.update(get_model_state_dict(module))
        optim_state = {f"stage{s}": get_optimizer_state_dict(m, o)
                       for s, m, o in zip(self.stage_ids, self.modules, optimizer, strict=True)}
        return {"model": model_state, "optim": optim_state}

    def save(self, optimizer, schedulers, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self.state(optimizer), checkpoint_id=str(directory))
        if self.dp_rank == 0 and self.mesh.get_local_rank("tp") == 0:
            for s, scheduler in zip(self.stage_ids, schedulers, strict=True):
                torch.save(scheduler.state_dict(), directory / f"scheduler-stage{s}.bin")

    def load(self, optimizer, schedulers, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        state = self.state(optimizer)
        dcp.load(state, checkpoint_id=str(directory))
        for s, module, opt, scheduler in zip(self.stage_ids, self.modules, optimizer, schedulers, strict=True):
            names = {name for name, _ in module.state_dict().items()}
            set_model_state_dict(module, {k: v for k, v in state["model"].items() if k in names})
            set_optimizer_state_dict(module, opt, state["optim"][f"stage{s}"])
            scheduler.load_state_dict(torch.load(directory / f"scheduler-stage{s}.bin", weights_only=True))

    def save_final(self, full_model: nn.Module, directory: Path, is_main: bool) -> None:
        """One safetensors file per stage (its full weights, gathered over dp_shard) and the index that
        from_pretrained reads; the main process writes the config and the index."""
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True)
        weights: dict[str, torch.Tensor] = {}
        for module in self.modules:
            weights.update({k: v.detach().cpu().contiguous() for k, v in
                            get_model_state_dict(module, options=options).items()})
        count = self.spec["pp"]
        name = f"model-{self.pp_rank + 1:05d}-of-{count:05d}.safetensors"
        writer = self.dp_rank == 0 and self.mesh.get_local_rank("tp") == 0
        directory.mkdir(parents=True, exist_ok=True)
        if writer:
            save_file(weights, str(directory / name), metadata={"format": "pt"})
        keys: list = [None] * dist.get_world_size()
        dist.all_gather_object(keys, (name, sorted(weights), sum(v.numel() * v.element_size()
                                                                 for v in weights.values())) if writer else None)
        if is_main:
            full_model.config.save_pretrained(directory)
            weight_map, total = {}, 0
            for item in filter(None, keys):
                file, names, size = item
                weight_map.update({key: file for key in names})
                total += size
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        dist.barrier()


def causal_lm_loss(scale: float):
    """The loss of one microbatch, already divided by `scale` (microbatches x accumulation): summed over the
    microbatches it is the mean loss of the batch, as one process computes it."""
    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = logits[:, :-1].float()
        loss = nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), labels[:, 1:].reshape(-1),
                                           ignore_index=-100)
        return loss / scale

    return loss_fn


def train_with_pipeline(t, args, accelerator, spec: dict, tokenizer, model, train_set, output_dir: Path,
                        run_id: str) -> None:
    """The training loop of train.py (module `t`: its logging, checkpoint discovery and manifest) for a pipeline."""
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from transformers import default_data_collator, get_scheduler

    m, dp = spec["microbatches"], spec["dp_shard"]
    if args.per_device_batch_size % m:
        raise SystemExit(f"--per-device-batch-size {args.per_device_batch_size} does not split into {m} pipeline "
                         f"microbatches: use a multiple of {m}")
    accumulation = args.gradient_accumulation_steps
    options = StageOptions.of(accelerator)
    pipeline = Pipeline(spec, model, accelerator.device, causal_lm_loss(m * accumulation), options)
    # Every rank reads the global batch (dp_shard x per-device) in the same seeded order; each data-parallel rank
    # takes its slice, so the run sees what one process with the global batch sees.
    # Accelerate's seedable sampler, seeded as Accelerator.prepare seeds it: the one-process run's order.
    from accelerate.data_loader import SeedableRandomSampler

    global_batch = args.per_device_batch_size * dp
    sampler = SeedableRandomSampler(data_source=train_set, generator=torch.Generator(),
                                    data_seed=torch.random.initial_seed())
    loader = DataLoader(train_set, global_batch, sampler=sampler, drop_last=True, collate_fn=default_data_collator)
    no_decay = ("bias", "norm")
    optimizers, schedulers = [], []
    steps_per_epoch = max(len(loader) // accumulation, 1)
    max_steps = args.max_steps or args.epochs * steps_per_epoch
    num_epochs = math.ceil(max_steps / steps_per_epoch)
    warmup = min(args.warmup_steps, max_steps)
    for module in pipeline.modules:  # one optimizer per stage module: its state dict keeps the stage's FQNs
        named = list(module.named_parameters())
        groups = [{"params": [p for n, p in named if not any(k in n.lower() for k in no_decay)]},
                  {"params": [p for n, p in named if any(k in n.lower() for k in no_decay)], "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, weight_decay=args.weight_decay)
        optimizers.append(optimizer)
        schedulers.append(get_scheduler(t.SCHEDULERS[args.lr_scheduler], optimizer, warmup, max_steps))

    completed_steps = 0
    if args.resume_from_checkpoint:
        checkpoint = t.find_checkpoint(output_dir, args.resume_from_checkpoint)
        if checkpoint is None:
            t.log(accelerator, f"no checkpoint in {output_dir}; starting from scratch")
        else:
            pipeline.load(optimizers, schedulers, checkpoint)
            completed_steps = t.step_of(checkpoint)
            t.log(accelerator, f"resumed from {checkpoint} at step {completed_steps}")
    starting_epoch = completed_steps // steps_per_epoch
    batches_to_skip = (completed_steps % steps_per_epoch) * accumulation

    num_params = sum(p.numel() for p in model.parameters())
    t.log(accelerator, f"pipeline {spec['schedule']} | pp {spec['pp']} x dp_shard {dp} x tp {spec['tp']} | "
                       f"{pipeline_stage_count(spec)} stages, {m} microbatches | precision "
                       f"{accelerator.mixed_precision} | activation checkpointing "
                       f"{'on' if options.checkpointing else 'off'} | world size "
                       f"{accelerator.num_processes} | device {accelerator.device}\n"
                       f"effective batch {global_batch * accumulation} = {args.per_device_batch_size} per device x "
                       f"{dp} data-parallel processes x {accumulation} accumulation | learning rate "
                       f"{args.learning_rate:g} (warmup {warmup}, {args.lr_scheduler}) | steps {max_steps} | "
                       f"{num_params:,} parameters")
    dp_group = pipeline.mesh.get_group("dp_shard")
    preemption, preempted = t.Preemption(accelerator), False  # SIGUSR1: save at the next step, stop
    guard = t.NonFiniteGuard(accelerator, args.max_nonfinite_steps, completed_steps)  # NaN/inf: skip the step
    progress = tqdm(total=max_steps, initial=completed_steps, disable=not accelerator.is_local_main_process)
    for module in pipeline.modules:
        module.train()
    done = False
    for epoch in range(starting_epoch, num_epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        if epoch == starting_epoch:
            for _ in range(batches_to_skip):
                next(batches)
        step_loss, micro = torch.zeros(()), 0
        for batch in batches:
            lo = pipeline.dp_rank * args.per_device_batch_size
            input_ids = batch["input_ids"][lo:lo + args.per_device_batch_size].to(accelerator.device)
            labels = batch["labels"][lo:lo + args.per_device_batch_size].to(accelerator.device)
            # The pipeline has already run backward: the guard reads the (detached) loss and the gradient norm.
            with accelerator.autocast():  # --mixed-precision bf16: every stage's forward in bf16, as in one process
                step_loss = step_loss + guard.watch(pipeline.step(input_ids, labels)).cpu()
            micro += 1
            if micro < accumulation:
                continue
            micro = 0
            finite = guard.step_is_finite(pipeline.clip_grad_norm_(args.max_grad_norm))
            for optimizer, scheduler in zip(optimizers, schedulers, strict=True):
                if finite:
                    optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            loss = step_loss.to(accelerator.device)
            dist.all_reduce(loss, group=dp_group)  # once per step: the mean over the data-parallel ranks
            step_loss = torch.zeros(())
            completed_steps += 1
            progress.update(1)
            last_step = completed_steps == max_steps
            if completed_steps % args.log_every == 0 or last_step:
                t.log(accelerator, f"step {completed_steps} | loss {loss.item() / dp:.6f} | lr "
                                   f"{schedulers[0].get_last_lr()[0]:.2e}")
            preempted = preemption.now()
            if (args.checkpoint_every and completed_steps % args.checkpoint_every == 0) or last_step or \
                    preempted or guard.stop:
                checkpoint_dir = output_dir / f"checkpoint-{completed_steps}"
                pipeline.save(optimizers, schedulers, checkpoint_dir)
                if accelerator.is_main_process:  # lets `accelkit merge-ckpt` write a from_pretrained-ready dir
                    model.config.save_pretrained(checkpoint_dir)
                    tokenizer.save_pretrained(checkpoint_dir)
                t.write_manifest(accelerator, checkpoint_dir, completed_steps, run_id)
            if last_step or preempted or guard.stop:
                done = True
                break
        if done:
            break
    progress.close()
    if guard.stop:
        t.log(accelerator, f"stopped: {guard.in_a_row} optimizer steps in a row had a non-finite loss or gradient "
                           f"norm (to step {completed_steps}); checkpoint-{completed_steps} holds the last finite "
                           "weights")
        accelerator.end_training()
        raise SystemExit(1)
    if preempted:
        t.log(accelerator, f"stopped on SIGUSR1 after step {completed_steps} with a checkpoint; resume with "
                           "--resume-from-checkpoint latest")
        accelerator.end_training()
        return
    final_dir = output_dir / "final"
    pipeline.save_final(model, final_dir, accelerator.is_main_process)
    if accelerator.is_main_process:
        tokenizer.save_pretrained(final_dir)
        t.log(accelerator, f"final model: {final_dir} (load with AutoModelForCausalLM.from_pretrained)")
    accelerator.wait_for_everyone()
    accelerator.end_training()


def pipeline_stage_count(spec: dict) -> int:
    return spec["pp"] * spec["stages_per_rank"]
