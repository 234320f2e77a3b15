"""The per-process probe of `accelkit convert --check` (ACCELKIT_PROBES=accelkit.convert.check.probe).

Installed by accelkit.ranks.bootstrap before the script runs, in the original's one process and in every rank
of the converted run. It records, without changing what the script computes:
- every optimizer step (accelkit.ranks.probes.steps): the learning rates it used, a digest of the weights right
  after it, the digest before the first step of each optimizer, and the training pass it belongs to;
- whether each optimizer's parameters belong to a module DDP wrapped or FSDP sharded (and if not, which variable
  holds it);
- the modules the script calls at top level (its models), and fingerprints of their training inputs;
- DataLoader passes and sample indices (probe_data), files written and lines printed (probe_io);
(Hangs are the supervisor's: every process of both runs is watched by accelkit.launch's one stall watchdog.)

Under FSDP (fully_shard) every rank holds a shard of each parameter (a DTensor): weights are read as the full
tensors gathered from the shards (`full_tensor()`, a collective every rank runs at the same optimizer step, as the
training itself does), so "identical on every rank" compares whole models under DDP and FSDP alike.

Metrics at equal weights: rank 0 of the converted run saves the weights it evaluated with after each evaluation
pass (a DataLoader pass without optimizer steps); the original run loads them right before its pass with the same
number, so both print their metrics for the same model and the numbers can be compared.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import sys
from pathlib import Path

from accelkit.convert.check.frames import qualname, user_frames
from accelkit.convert.check.probe_batch import scale_batches
from accelkit.convert.check.probe_data import LoaderTracker, fingerprint_rows, rng_digest, step_digest
from accelkit.convert.check.probe_io import OutputTracker
from accelkit.convert.check.probe_metrics import CallerMetrics
from accelkit.convert.check.record import (
    BACKEND_ENV,
    EQUIVALENCE_ROLE,
    ORDER_ENV,
    REPLAY_ENV,
    ROLE_ENV,
    WEIGHTS_ENV,
    WEIGHTS_FILE,
    WORLD_ENV,
    Pass,
    Record,
    Step,
    write_record,
)
from accelkit.ranks import WATCH_DIR_ENV, is_user_file
from accelkit.ranks.probes import MAX_STEPS_ENV, PROBE_DIR_ENV, StepEvent, after_import, clock

WRAPPER_CLASSES = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "OptimizedModule"}
MAX_STEPS_WITH_ROWS = 64  # steps whose input rows are kept one by one (the check runs a few steps)
MAX_ROWS_PER_STEP = 4096
# weights kept after every step up to this many values (all steps together); beyond it, the last step's only
MAX_KEPT_VALUES = 8_000_000


START_SEED = 0  # the converter's seed for unseeded draws (transforms/seeding.py): rank 0 starts where it does


class CheckProbe:
    def __init__(self) -> None:
        self.folder = Path(os.environ.get(PROBE_DIR_ENV) or ".")
        role = os.environ.get(ROLE_ENV, "original")
        self.record = Record(rank=int(os.environ.get("RANK", "0")), world=int(os.environ.get("WORLD_SIZE", "1")),
                             role=role, backend=os.environ.get(BACKEND_ENV, "ddp"))
        self.main = self.record.rank == 0
        self.optimizer_index: dict[int, int] = {}  # id(torch optimizer) -> index
        self._keep: list[object] = []  # optimizers and models, alive, so ids are never reused
        self.first_done: set[int] = set()
        self.pending_before: dict[int, str] = {}
        self.wrapped_params: set[int] = set()
        self.models: list[object] = []
        self.model_ids: set[int] = set()
        self.depth = 0
        self.max_steps = int(os.environ[MAX_STEPS_ENV]) if os.environ.get(MAX_STEPS_ENV) else None
        self.finished = False
        self.watching = 0  # frames whose return value is awaited
        self.step_keys: list[str] = []  # input hashes since the last clock step
        self.keep_weights = os.environ.get(WEIGHTS_ENV) == "1"
        self.kept: dict[int, dict[str, object]] = {}  # index in record.steps -> parameter name -> tensor
        self.kept_values = 0
        self.rng_at_forward: str | None = None  # torch's generator when the step's first training forward began
        self.loaders = LoaderTracker(self.record, _nothing, self._pass_started, self._pass_ended)
        # the probe's own files, and the launch's per-rank watch files (accelkit.ranks.watch), not the script's
        ignore = [str(self.folder), *filter(None, [os.environ.get(WATCH_DIR_ENV)])]
        self.callers = CallerMetrics()
        self.io = OutputTracker(self.record, ignore, lambda: self.loaders.tag, keep_lines=self.main,
                                metric_positions=self.callers.positions)

    # -- installation ----------------------------------------------------------------------------------------
    def install(self) -> None:
        # Every run of the check starts its generators from one seed per rank (the script's own seeds still win): an
        # unseeded original and rank 0 of its conversion then draw the same initial weights, so the weights compared
        # after each step differ only by what the conversion changed (they started from two OS-seeded draws, a false
        # FAIL of `weights` on 4 of 4 unseeded held-out scripts). Other ranks draw other numbers, as they would on
        # their own: a model never broadcast from rank 0 still starts from different weights there.
        seed = START_SEED + self.record.rank
        random.seed(seed)
        after_import("numpy", lambda: sys.modules["numpy"].random.seed(seed))
        after_import("torch", lambda: sys.modules["torch"].manual_seed(seed))
        steps = clock()
        steps.on_before_step(self._before_step)
        steps.on_step(self._after_step)
        steps.on_finish(self.finish)
        steps.install()
        self.io.install()
        after_import("torch", self._hook_torch)
        after_import("torch.utils.data.dataloader", self.loaders.hook_torch)
        if self.record.role == EQUIVALENCE_ROLE:
            world = int(os.environ.get(WORLD_ENV) or 1)
            after_import("torch.utils.data.dataloader", lambda: scale_batches(self.record, world))
            order = os.environ.get(ORDER_ENV)
            if order and Path(order).exists():
                self.loaders.replay = json.loads(Path(order).read_text(encoding="utf-8"))
        after_import("torch.nn.parallel.distributed", self._hook_ddp)
        after_import("accelerate.data_loader", self.loaders.hook_accelerate)
        after_import("safetensors.torch", self.io.hook_safetensors)

    def _hook_torch(self) -> None:
        import torch

        self.io.hook_torch()
        probe = self
        module_call = torch.nn.Module.__call__

        def call(module, *args, **kwargs):
            if probe.depth == 0:
                probe._top_level_call(module, args)
            probe.depth += 1
            try:
                return module_call(module, *args, **kwargs)
            finally:
                probe.depth -= 1

        torch.nn.Module.__call__ = call
        backward = torch.autograd.backward

        def backward_and_note(*args, **kwargs):
            probe._backward()
            return backward(*args, **kwargs)

        torch.autograd.backward = backward_and_note

    def _hook_ddp(self) -> None:
        from torch.nn.parallel.distributed import DistributedDataParallel

        init = DistributedDataParallel.__init__
        probe = self

        @functools.wraps(init)  # its signature stays DDP's: the CPU rehearsal binds device_ids by name
        def init_and_note(ddp, *args, **kwargs):
            init(ddp, *args, **kwargs)
            probe.wrapped_params |= {id(p) for p in ddp.module.parameters()}
            probe.record.wrapped.append(type(ddp.module).__name__)

        DistributedDataParallel.__init__ = init_and_note

    # -- models ----------------------------------------------------------------------------------------------
    def _top_level_call(self, module, args: tuple) -> None:
        import torch

        if id(module) not in self.model_ids and next(iter(module.parameters()), None) is not None:
            self.model_ids.add(id(module))
            self.models.append(module)
            inner = unwrap(module)
            self.record.models.append({"name": class_name(inner), "trained": False,
                                       "wrapper": wrapper_name(module, inner)})
        if module.training and torch.is_grad_enabled() and id(module) in self.model_ids:  # a model, not a loss
            entry = self.record.models[self.models.index(module)]
            if not entry["trained"]:
                self._note_batch_norm(module)
            entry["trained"] = True
            self.step_keys += fingerprint_rows(self.record, args)
            if self.rng_at_forward is None:
                self.rng_at_forward = rng_digest()

    def _note_batch_norm(self, module) -> None:
        """BatchNorm normalises over each process's own batch: N ranks at batch B differ from one at N x B by design
        (SyncBatchNorm does not)."""
        import torch

        for inner in module.modules():
            if isinstance(inner, torch.nn.modules.batchnorm._BatchNorm) and \
                    not isinstance(inner, torch.nn.SyncBatchNorm) and inner.track_running_stats is not None:
                name = type(inner).__name__
                if name not in self.record.batch_norm:
                    self.record.batch_norm.append(name)

    # -- optimizer steps -------------------------------------------------------------------------------------
    def _index(self, optimizer) -> int:
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps the real one
        index = self.optimizer_index.get(id(inner))
        if index is None:
            index = self.optimizer_index[id(inner)] = len(self.optimizer_index)
            self._keep.append(inner)
            self.record.optimizers.append(type(inner).__name__)
        return index

    def _before_step(self, event) -> None:
        optimizer = event.optimizer
        index = self._index(optimizer)
        if index in self.first_done:
            return
        self.first_done.add(index)
        params = optimizer_params(optimizer)
        self.pending_before[index] = digest(params)
        if self.record.world > 1:
            self._note_sharded(params)
            missing = [p for p in params if p.requires_grad and id(p) not in self.wrapped_params and not sharded(p)]
            if missing:
                self.record.unwrapped.append({
                    "optimizer": index, "kind": type(getattr(optimizer, "optimizer", optimizer)).__name__,
                    "tensors": len(missing), "numel": int(sum(p.numel() for p in missing)),
                    "owners": owners(missing)})

    def _note_sharded(self, params: list) -> None:
        """FSDP2 shards in place (no wrapper object to hook): the models whose parameters are DTensors."""
        if not any(sharded(p) for p in params):
            return
        for model in self.models:
            name = class_name(unwrap(model))
            if wrapper_name(model, unwrap(model)) == "fully_shard" and name not in self.record.wrapped:
                self.record.wrapped.append(name)
        if not self.record.wrapped:
            self.record.wrapped.append("parameters sharded by FSDP")

    def _after_step(self, event: StepEvent) -> None:
        optimizer = event.optimizer
        index = self._index(optimizer)
        self.loaders.on_step()
        if event.is_clock:
            self._note_step_inputs()
            self.record.step_draws.append(self.rng_at_forward not in (None, rng_digest()))
            self.rng_at_forward = None
        params = optimizer_params(optimizer)
        tensors = [full(p.detach()).to("cpu").reshape(-1).clone() for p in params]  # FSDP: a collective
        if self.keep_weights and self.main:
            self._keep_weights(len(self.record.steps), params, tensors)
        self.record.steps.append(Step(
            number=event.clock_steps, optimizer=index, is_clock=event.is_clock,
            lrs=[float(group["lr"]) for group in optimizer.param_groups],
            digest=digest_of(tensors), before=self.pending_before.pop(index, None),
            progress=self.loaders.progress()))

    def _keep_weights(self, position: int, params: list, tensors: list) -> None:
        """The weights after step `position`, by parameter name, for the comparison with the original (every step
        while they are small; the latest only past MAX_KEPT_VALUES)."""
        names = self._parameter_names()
        values = sum(t.numel() for t in tensors)
        if self.kept_values + values > MAX_KEPT_VALUES:
            self.kept.clear()  # the latest steps that fit
        named: dict[str, object] = {}
        for i, (param, tensor) in enumerate(zip(params, tensors, strict=True)):
            named[names.get(id(param), f"parameter #{i} of the optimizer")] = tensor
        self.kept[position] = named
        self.kept_values = sum(t.numel() for step in self.kept.values() for t in step.values())

    def _parameter_names(self) -> dict[int, str]:
        """id(parameter) -> `Net.fc.weight` (the model's class and the name inside it, without wrappers)."""
        names: dict[int, str] = {}
        for model in self.models:
            inner = unwrap(model)
            for name, param in inner.named_parameters():
                names.setdefault(id(param), f"{class_name(inner)}.{name}")
        return names

    def _note_step_inputs(self) -> None:
        """The inputs of the clock step that just ended: one hash for all of them, and the rows themselves for the
        first steps (which samples each rank trained on, for hand-made batches)."""
        self.record.step_inputs.append(step_digest(self.step_keys))
        if len(self.record.step_rows) < MAX_STEPS_WITH_ROWS:
            self.record.step_rows.append(self.step_keys[:MAX_ROWS_PER_STEP])
        self.step_keys = []

    def _backward(self) -> None:
        """Scripts that update weights by hand have no optimizer step: each backward pass is their step."""
        self.record.backward_passes += 1
        if self.optimizer_index:
            return
        self.loaders.on_step()
        self._note_step_inputs()
        params = [p for model in self.models for p in model.parameters()]
        self.record.steps.append(Step(number=self.record.backward_passes, optimizer=-1, is_clock=True, lrs=[],
                                      digest=digest(params), progress=self.loaders.progress()))
        if self.max_steps is not None and self.record.backward_passes > self.max_steps:
            self.record.steps.pop()
            self.finish("step limit")
            raise SystemExit(0)

    # -- evaluation passes: weights for metrics at equal weights ---------------------------------------------
    def _pass_started(self, record: Pass) -> None:
        if self.main:  # only the main process keeps its lines
            self.callers.pass_started(list(user_frames(2)))
        replay = os.environ.get(REPLAY_ENV)
        if not replay or not self.models:
            return
        path = Path(replay) / eval_weights_name(record.loader, record.number)
        if not path.exists():
            return
        import torch

        states = torch.load(path, weights_only=True)
        if len(states) != len(self.models):
            self.record.notes.append(f"pass {record.loader}:{record.number}: {len(states)} models saved, "
                                     f"{len(self.models)} here; weights not replayed")
            return
        try:
            for model, state in zip(self.models, states, strict=True):
                unwrap(model).load_state_dict(state)
        except (RuntimeError, KeyError) as exc:
            self.record.notes.append(f"pass {record.loader}:{record.number}: weights not replayed ({exc})")
            return
        self.record.replayed.append(f"{record.loader}:{record.number}")

    def _pass_ended(self, record: Pass) -> None:
        if not record.steps and record.batches:
            self._watch_return(record)
        if self.record.role != "converted" or record.steps or not record.batches or not self.models:
            return
        if not self.main and self.record.backend != "fsdp":
            return
        import torch

        # under FSDP every rank gathers the full tensors of its shards (a collective); rank 0 saves them
        states = [{k: full(v).detach().cpu() for k, v in unwrap(m).state_dict().items()} for m in self.models]
        if not self.main:
            return
        torch.save(states, self.folder / eval_weights_name(record.loader, record.number))
        self.record.saved_eval_weights.append(f"{record.loader}:{record.number}")

    def _watch_return(self, record: Pass) -> None:
        """Note what the function iterating this loader returns (an evaluation function's metric), with a trace
        function on that one frame; nothing is traced when the script (or a debugger) traces itself."""
        frame = next(user_frames(2), None)
        if frame is None or frame.f_code.co_name == "<module>" or sys.gettrace() is not None:
            return
        key = f"{record.loader}:{record.number}"
        probe = self

        def on_event(traced, event, arg):
            if event == "return":
                probe.record.returns.setdefault(key, plain(arg))
                probe.watching -= 1
                if not probe.watching:
                    sys.settrace(None)
            return on_event

        frame.f_trace_lines = False
        frame.f_trace = on_event
        self.watching += 1
        sys.settrace(_no_trace)  # tracing must be on for a frame's own trace function to run

    # -- the end ---------------------------------------------------------------------------------------------
    def finish(self, reason: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.record.reason = reason
        self.record.script = sys.argv[0] if sys.argv else ""
        if self.kept:
            import torch

            torch.save(self.kept, self.folder / WEIGHTS_FILE)
            self.record.weights_kept = sorted(self.kept)
        write_record(self.record)


def _nothing() -> None:
    pass


def _no_trace(frame, event, arg):
    return None


def plain(value, depth: int = 0):
    """A JSON-able copy of a metric: numbers, 0-d tensors, and lists/tuples/dicts of them; None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return float(value.item())
    if depth < 2 and isinstance(value, (list, tuple)):
        items = [plain(v, depth + 1) for v in value]
        return items if any(i is not None for i in items) else None
    if depth < 2 and isinstance(value, dict):
        items = {str(k): plain(v, depth + 1) for k, v in value.items()}
        return items if any(i is not None for i in items.values()) else None
    return None


def unwrap(module):
    while type(module).__name__ in WRAPPER_CLASSES:
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if inner is None:
            break
        module = inner
    return module


def class_name(module) -> str:
    """The script's class of a module: FSDP2 makes `FSDPNet`, a subclass of FSDPModule and `Net`."""
    cls = type(module)
    if _is_fsdp2(module):
        cls = next((c for c in cls.__mro__[1:] if c.__name__ != "FSDPModule" and "FSDPModule" not in
                    {b.__name__ for b in c.__mro__}), cls)
    return cls.__name__


def wrapper_name(module, inner) -> str:
    """"DistributedDataParallel" & co. for a wrapper object, "fully_shard" for an FSDP2 module, "" for a bare one."""
    if inner is not module:
        return type(module).__name__
    return "fully_shard" if _is_fsdp2(inner) else ""


def _is_fsdp2(module) -> bool:
    return any(c.__name__ == "FSDPModule" for c in type(module).__mro__)


def sharded(tensor) -> bool:
    """A DTensor: a parameter FSDP2 sharded across the ranks."""
    return any(c.__name__ == "DTensor" for c in type(tensor).__mro__)


def full(tensor):
    """The whole tensor: gathered from every rank's shard for a DTensor (a collective), the tensor itself else."""
    return tensor.full_tensor() if sharded(tensor) else tensor


def optimizer_params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def digest(params) -> str:
    # copies: a numpy view would pin the storage, which FSDP frees (resizes to 0) after the backward pass
    return digest_of([full(p.detach()).to("cpu").reshape(-1).clone() for p in params])


def digest_of(tensors: list) -> str:
    import torch

    sha = hashlib.sha256()
    for flat in tensors:
        sha.update(flat.view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()[:16]


def eval_weights_name(loader: int, number: int) -> str:
    return f"eval-weights-{loader}-{number}.pt"


def owners(params: list) -> list[str]:
    """Which of the script's variables hold the modules these parameters belong to: "`model` (Net) in
    `Trainer.run` (train.py:57)", from the frames of the script's own code on the stack (the optimizer.step())."""
    import torch

    wanted = {id(p) for p in params}
    found: list[str] = []
    seen: set[int] = set()
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            where = f"`{qualname(frame)}` ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"
            candidates: list[tuple[str, object]] = list(frame.f_locals.items())
            owner = frame.f_locals.get("self")
            if hasattr(owner, "__dict__"):
                candidates += [(f"self.{k}", v) for k, v in vars(owner).items()]
            for name, value in candidates:
                if isinstance(value, torch.nn.Module) and id(value) not in seen and \
                        any(id(p) in wanted for p in value.parameters()):
                    seen.add(id(value))
                    found.append(f"`{name}` ({type(value).__name__}) in {where}")
        frame = frame.f_back
    return found


@functools.cache  # one probe per rank, however often the bootstrap asks
def install() -> CheckProbe:
    probe = CheckProbe()
    probe.install()
    return probe
