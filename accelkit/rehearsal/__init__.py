"""CPU rehearsal: run an unmodified Accelerate script on N CPU processes with the real DDP / FSDP / DeepSpeed code.

How CPU rehearsal works
-----------------------
`accelkit launch --cpu --backend {ddp,fsdp,deepspeed} --num-processes N script.py` starts N real ranks with
Accelerate's torchrun-based launcher, talking over gloo, each running `accelkit.rehearsal.bootstrap`, which installs
a small shim and then runs your script unmodified as `__main__` (same argv, tracebacks and exit code).

- ddp: nothing is patched. `ACCELERATE_USE_CPU=true` under the torchrun launcher gives Accelerate's own MULTI_CPU
  state; `prepare` wraps the model in DistributedDataParallel over gloo. (`accelerate launch --cpu --num_processes
  N` alone starts only ONE process.)
- fsdp: Accelerate never turns FSDP on for CPU processes, although torch's FSDP2 (`fully_shard`) and distributed
  checkpointing work on CPU with gloo. The shim changes only that decision: after Accelerate builds its MULTI_CPU
  state it is upgraded to FSDP with the plugin Accelerate built from your config, exactly as Accelerate does on
  GPUs. `prepare` shards parameters (DTensor), training is sharded, `save_state` writes `pytorch_model_fsdp_0/`
  DCP shards and `load_state` restores them. FSDP1 also works; `fsdp_sync_module_states` and
  `fsdp_cpu_ram_efficient_loading` are turned off for it (they look up a GPU), so seed your model init.
- deepspeed: with `DS_ACCELERATOR=cpu`, DeepSpeed runs ZeRO-1/2/3 on CPU. Accelerate ignores DeepSpeed when it
  runs on CPU, so the shim makes its backend selection pick gloo (instead of "no backend") when no accelerator is
  present; Accelerate then builds a real DeepSpeedEngine and `save_state` writes `<ckpt>/latest` and ZeRO shards
  under `<ckpt>/pytorch_model/`. DeepSpeed compiles a small shared-memory op with the local C++ compiler the first
  time (about a minute; cached in ~/.cache/torch_extensions). Use `torch.optim.AdamW` (or a DeepSpeed JSON
  optimizer among Adam/AdamW/SGD/Adagrad/Lion).

Refused before anything starts: fp16 (and fp8) mixed precision (bf16 works), NVMe offload, DeepSpeed JSON
optimizers with no CPU implementation, a missing DeepSpeed install (`pip install 'accelkit[deepspeed]'`),
distributed types other than single/ddp/fsdp/deepspeed, and untested library versions (the shim is tested with
accelerate 1.13-1.15 and deepspeed 0.19.x; ACCELKIT_REHEARSAL_ALLOW_UNTESTED=1 overrides). The shim only ever runs in
rehearsal ranks, where GPUs are hidden (CUDA_VISIBLE_DEVICES=''); it refuses to patch a process that sees CUDA.
Speed on CPU says nothing about GPU speed: rehearsal checks wiring, sharding and checkpoints, not performance.
"""

from accelkit.rehearsal.plan import RehearsalPlan, prepare_rehearsal

__all__ = ["RehearsalPlan", "prepare_rehearsal"]
