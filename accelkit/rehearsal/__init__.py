"""CPU rehearsal: run an unmodified Accelerate script on N CPU processes with the real DDP / FSDP / DeepSpeed code.

How CPU rehearsal works
-----------------------
`accelkit launch --cpu --backend {ddp,fsdp,deepspeed} --num-processes N script.py` starts N real ranks with
Accelerate's torchrun-based launcher, talking over gloo (`accelerate launch --cpu --num_processes N` alone starts
only ONE process). Each rank runs `accelkit.ranks.bootstrap`, which installs a small shim and then runs your
script unmodified as `__main__` (same argv, tracebacks and exit code). The shim patches two decisions Accelerate
makes when it builds its state, and only when your script imports Accelerate; everything after that (DDP wrapping,
FSDP sharding, DeepSpeed ZeRO, checkpointing) is Accelerate's, PyTorch's and DeepSpeed's real code:

- Backend selection: under torchrun without a GPU, Accelerate picks "no distributed backend" unless it was told
  cpu=True, so a script that touches `PartialState()` before `Accelerator()` would train N separate single-process
  copies, and DeepSpeed (which Accelerate ignores when cpu=True) could not run at all. In rehearsal the selection
  yields gloo / MULTI_CPU, Accelerate's own CPU choice.
- FSDP: Accelerate only turns FSDP on for GPU-like process types, although FSDP2 (`fully_shard`) and distributed
  checkpointing work on CPU with gloo. In rehearsal the MULTI_CPU state is upgraded to FSDP with the plugin
  Accelerate built from your config, as Accelerate does on GPUs.

Where the CPU path still differs from the GPU one, rehearsal takes the GPU behaviour (see shim.py and cuda_calls.py):
`join_uneven_inputs` runs torch's Join (it used to hang), FSDP1 full state dicts skip a CPU "offload" that freed the
parameters it returned (it used to segfault), and hand-written GPU code (`set_device`, `device_ids=[i]`, "nccl",
`.to("cuda:i")`, `.cuda()`, DDP's bf16 hooks) is mapped to the CPU, one line per kind on rank 0. Failures that cannot
be mapped (a 0-dim parameter under FSDP/DeepSpeed, a tensor created on "cuda") end the job with one line naming the
parameter or the line (explain.py).

What you get:
- ddp: the model is wrapped in DistributedDataParallel over gloo.
- fsdp: `accelerator.distributed_type` is FSDP; `prepare` shards parameters (DTensor), `save_state` writes
  `pytorch_model_fsdp_0/` and `optimizer_0/` DCP shards, `load_state` restores them. FSDP1 works too, with
  `fsdp_sync_module_states` and `fsdp_cpu_ram_efficient_loading` turned off (they need a GPU), so seed your model
  init; `fsdp_offload_params` is turned off (on CPU parameters already live in host memory).
- deepspeed: with `DS_ACCELERATOR=cpu`, a real DeepSpeedEngine runs ZeRO-1/2/3 (CPU offload of optimizer and
  parameters works); `save_state` writes `<ckpt>/latest` and ZeRO shards under `<ckpt>/pytorch_model/`. DeepSpeed
  compiles small C++ ops with the local compiler on first use and caches them in ~/.cache/torch_extensions: its
  shared-memory comm op (about a minute), and for optimizer offload its CPU Adam, for a JSON Adam/AdamW optimizer
  its FusedAdam (a few minutes each on 2 cores). Creating `torch.optim.AdamW` in the script needs neither. A build
  lock that a killed build left there is removed before the launch (accelkit.launch.build_locks).
  Multi-machine DeepSpeed rehearsals use the torchrun launcher (`deepspeed_multinode_launcher: standard`).
- bf16 mixed precision works (DeepSpeed bf16 casts the model, so inputs must be cast as on GPUs).

A one-GPU mode (ACCELKIT_REHEARSAL=one-gpu, one_gpu.py) is not a backend: it runs a single-GPU script's own
process with its CUDA calls on the CPU, for `accelkit convert --check`'s run of an original written for a GPU.

Refused before anything starts, with a hint: fp16 and fp8 mixed precision, NVMe offload, DeepSpeed JSON optimizers
built from CUDA kernels only (Lamb, 1-bit Adam/Lamb, 0/1 Adam, Lion without optimizer offload), a missing DeepSpeed
install (`pip install 'accelkit[deepspeed]'`), distributed types other than single/cpu/ddp/fsdp/deepspeed, and
library versions the shim was not tested with (the table in versions.py: SUPPORTED);
ACCELKIT_REHEARSAL_ALLOW_UNTESTED=1 lets you try another version. The shim only runs in rehearsal ranks, where GPUs
are hidden (CUDA_VISIBLE_DEVICES=''), and refuses to patch a process that sees CUDA. Speed on CPU says nothing
about speed on GPUs: a rehearsal checks wiring, sharding and checkpoints, not performance.
"""


from __future__ import annotations

from accelkit.exports import lazy_exports

# Lazy: a rehearsal rank imports this package for its shim, which needs none of cpu_config.py (the config
# machinery), so a rank starts as fast as the script would alone.
__all__, __getattr__ = lazy_exports(__name__, {
    "rehearse": "cpu_config",
    "REHEARSAL_ENV": "shim",
    "install": "shim",
    "DEEPSPEED_INSTALL_HINT": "versions",
})
