"""Scripts that train through a framework's trainer: nothing to convert, one line on how to launch them.

transformers' `Trainer` (and TRL's trainers, which subclass it) already run on Accelerate: the process group, the
wrapping (DDP/FSDP/DeepSpeed), sharded loaders and main-process saving are the trainer's, and `accelerate launch`
(hence `accelkit launch`) with an FSDP or DeepSpeed config is how their documentation runs them. Lightning runs its
own strategies (`Trainer(strategy=..., devices=N)`) and reads torchrun's environment when launched by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelkit.convert.context import Context

ACCELERATE_TRAINERS = ("transformers.", "trl.")
LIGHTNING = ("lightning.", "pytorch_lightning.", "lightning.pytorch.")


@dataclass(frozen=True)
class TrainerUse:
    framework: str  # transformers | trl | lightning
    name: str  # the class the script calls (`Trainer`, `SFTTrainer`, `pl.Trainer`)
    line: int

    def advice(self, script: str) -> str:
        if self.framework == "lightning":
            return (f"{script} trains with Lightning's `{self.name}` (line {self.line}), which runs its own "
                    "distributed strategies: nothing to convert; choose one in the script (`strategy=\"fsdp\"` or "
                    f"\"deepspeed_stage_2\"`) and launch it as it is: accelkit launch {script}")
        owner = {"transformers": "transformers'", "trl": "TRL's"}[self.framework]
        return (f"{script} trains with {owner} `{self.name}` (line {self.line}), which already runs on Accelerate: "
                f"nothing to convert; launch it as it is with the backend you want: accelkit launch --backend fsdp "
                f"{script} (or --backend deepspeed --zero-stage 3, or --config CONFIG.yaml from `accelkit config`)")


def find_trainer(ctx: Context) -> TrainerUse | None:
    """The first call of a transformers/TRL/Lightning trainer class, or of a script class derived from one."""
    derived: dict[str, str] = {}
    for cls in ctx.of_type(cst.ClassDef):
        for base in cls.bases:
            for q in ctx.qnames(base.value):
                framework = _framework(q)
                if framework and (q.endswith("Trainer") or q.rsplit(".", 1)[-1] == "LightningModule"):
                    derived[cls.name.value] = framework if q.endswith("Trainer") else ""
    for call in ctx.of_type(cst.Call):
        func = call.func
        local = func.value if isinstance(func, cst.Name) else None
        if local and derived.get(local):
            return TrainerUse(derived[local], local, ctx.line(call))
        for q in ctx.qnames(call):
            framework = _framework(q)
            if framework and q.rsplit(".", 1)[-1].endswith("Trainer"):
                return TrainerUse(framework, ctx.code(func), ctx.line(call))
    return None


def _framework(qname: str) -> str | None:
    if qname.startswith(LIGHTNING):
        return "lightning"
    if qname.startswith("trl."):
        return "trl"
    if qname.startswith("transformers."):
        return "transformers"
    return None
