"""The templates train for real: every template under DDP, FSDP and DeepSpeed on 2 CPU ranks through `accelkit
launch`, loss going down on the bundled data, bit-identical resume, and a final model that reloads with the
template's model class and holds the weights of the last checkpoint.

The runs are subprocesses started together at the first test (a few at a time, so both cores stay busy while ranks
wait on each other); each test then checks its own run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from accelkit.scaffold import init_project

TEMPLATES = ("minimal", "causal-lm", "seq-classification", "image-classification")
BACKENDS = ("ddp", "fsdp", "deepspeed")
EXPECTED_STATE = {"ddp": "MULTI_CPU", "fsdp": "FSDP", "deepspeed": "DEEPSPEED"}
AUTO_CLASS = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
}
# Per-device batch that gives 2 optimizer steps per epoch at accumulation 2, so a 6-step run crosses two epoch
# boundaries and the resume at step 3 lands mid-epoch (skip_first_batches) with evaluations on both sides.
RESUME_FLAGS = {
    "minimal": ["--num-samples", "128", "--per-device-batch-size", "32"],
    "causal-lm": ["--per-device-batch-size", "22"],
    "seq-classification": ["--per-device-batch-size", "80"],
    "image-classification": ["--per-device-batch-size", "30"],
}
COMMON_RESUME = ["--gradient-accumulation-steps", "2", "--lr-scheduler", "constant", "--warmup-steps", "2"]
RUN_TIMEOUT = 420
LOSS_LINE = re.compile(r"step (\d+) \| loss ([0-9.]+)")


def _run(argv: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_DATASETS_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=RUN_TIMEOUT)


def _check(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc


class TemplateRuns:
    """Scaffolded projects plus the training runs the collected tests need, started in a small thread pool."""

    def __init__(self, root: Path, wanted: set[tuple]) -> None:
        self.root = root
        self.projects = {name: init_project(root / name, name, backend="ddp").directory for name in TEMPLATES}
        self.pool = ThreadPoolExecutor(max_workers=4)
        self.jobs: dict[tuple, Future] = {}
        # Longest first (DeepSpeed starts slowest), so the pool finishes evenly.
        for key in sorted(wanted, key=lambda k: (k[0] != "launch", k[-1] != "deepspeed")):
            self.jobs[key] = self.pool.submit(self._job(key))

    def out(self, *key: str) -> Path:
        return self.root / "runs" / "-".join(key)

    def _train(self, template: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "train.py", "--output-dir", str(out), *args]
        return _run(argv, self.projects[template], self.root / "cache" / out.name)

    def _job(self, key: tuple) -> Callable[[], object]:
        kind, template, *rest = key
        if kind == "launch":
            backend = rest[0]
            argv = [sys.executable, "-m", "accelkit", "launch", "--backend", backend, "--cpu", "--num-processes", "2",
                    "train.py", "--max-steps", "2", "--output-dir", str(self.out(*key))]
            return lambda: _run(argv, self.projects[template], self.root / "cache" / "-".join(key))
        if kind == "loss":
            return lambda: self._train(template, self.out(*key), "--log-every", "5")
        if kind == "resume":
            def resume() -> dict[str, subprocess.CompletedProcess[str]]:
                flags = [*RESUME_FLAGS[template], *COMMON_RESUME]
                straight, split = self.out(*key, "straight"), self.out(*key, "split")
                return {
                    "straight": self._train(template, straight, "--max-steps", "6", *flags),
                    "first": self._train(template, split, "--max-steps", "3", *flags),
                    "resumed": self._train(template, split, "--max-steps", "6", "--resume-from-checkpoint", "latest",
                                           *flags),
                }
            return resume
        raise ValueError(key)

    def result(self, *key: str):
        return self.jobs[key].result(timeout=3 * RUN_TIMEOUT)


def _wanted_jobs(session: pytest.Session) -> set[tuple]:
    wanted: set[tuple] = set()
    for item in session.items:
        if item.module is not sys.modules[__name__]:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        template = params.get("template")
        if item.originalname in ("test_launch_on_two_cpu_ranks",):
            wanted.add(("launch", template, params["backend"]))
        elif item.originalname == "test_loss_goes_down_on_bundled_data":
            wanted.add(("loss", template))
        elif item.originalname == "test_resume_is_bit_identical":
            wanted.add(("resume", template))
    return wanted


@pytest.fixture(scope="session")
def runs(request, tmp_path_factory) -> TemplateRuns:
    template_runs = TemplateRuns(tmp_path_factory.mktemp("templates"), _wanted_jobs(request.session))
    yield template_runs
    template_runs.pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------------------------------------------------------
# Reference weights read back from the checkpoint each backend wrote, with the backend's own tools.


def checkpoint_state(checkpoint: Path, backend: str, scratch: Path) -> dict[str, torch.Tensor]:
    if backend == "ddp":
        return load_file(checkpoint / "model.safetensors")
    if backend == "fsdp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(checkpoint / "pytorch_model_fsdp_0", scratch / "full.pt")
        return torch.load(scratch / "full.pt", weights_only=True)["model"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


def load_final(template: str, project: Path, final: Path):
    """The final model through the template's own model class: (from_pretrained model, same class from config)."""
    if template == "minimal":
        spec = importlib.util.spec_from_file_location("minimal_train", project / "train.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        import json

        config = json.loads((final / "config.json").read_text())
        return module.MLPClassifier.from_pretrained(final), module.MLPClassifier(**config)
    import transformers

    auto = getattr(transformers, AUTO_CLASS[template])
    return auto.from_pretrained(final), auto.from_config(transformers.AutoConfig.from_pretrained(final))


def example_input(template: str, model) -> dict[str, torch.Tensor] | torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if template == "minimal":
        return torch.randn(5, 16, generator=generator)
    if template == "image-classification":
        return {"pixel_values": torch.randn(3, 3, 16, 16, generator=generator)}
    return {"input_ids": torch.randint(0, model.config.vocab_size, (2, 12), generator=generator)}


def outputs_of(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out = model(batch) if isinstance(batch, torch.Tensor) else model(**batch)
    return out if isinstance(out, torch.Tensor) else out.logits


# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_launch_on_two_cpu_ranks(runs: TemplateRuns, template: str, backend: str, tmp_path: Path) -> None:
    proc = _check(runs.result("launch", template, backend))
    assert f"backend {EXPECTED_STATE[backend]} | world size 2" in proc.stdout
    assert "effective batch" in proc.stdout
    # Checkpoints are written in the background except under DeepSpeed, which says it saves synchronously. The
    # non-finite guard is on everywhere (under DeepSpeed it reads DeepSpeed's own skip) and silent on finite runs.
    said_sync = "--async-checkpoint: DEEPSPEED saves synchronously here (save_state)" in proc.stdout
    assert said_sync == (backend == "deepspeed"), proc.stdout
    assert "non-finite" not in proc.stdout, proc.stdout

    out = runs.out("launch", template, backend)
    checkpoint = out / "checkpoint-2"
    assert {p.name for p in checkpoint.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}
    assert (checkpoint / "config.json").is_file()  # so a merged checkpoint is from_pretrained-ready
    manifest = json.loads((checkpoint / "accelkit-manifest.json").read_text())  # written last, by the main process
    assert manifest["step"] == 2 and manifest["world_size"] == 2
    listed = {str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file()} - {"accelkit-manifest.json"}
    assert set(manifest["files"]) == listed
    if backend == "fsdp":
        assert (checkpoint / "pytorch_model_fsdp_0" / ".metadata").is_file()
        assert len(list((checkpoint / "pytorch_model_fsdp_0").glob("*.distcp"))) == 2  # one shard per rank
    if backend == "deepspeed":
        tag = (checkpoint / "latest").read_text().strip()
        assert len(list((checkpoint / tag).glob("*optim_states.pt"))) == 2

    # The final model reloads with the template's class and holds exactly the weights of the last checkpoint.
    reference = checkpoint_state(checkpoint, backend, tmp_path)
    final = out / "final"
    assert (final / "model.safetensors").is_file() and (final / "config.json").is_file()
    loaded, rebuilt = load_final(template, runs.projects[template], final)
    loaded_state = loaded.state_dict()  # names as the model uses them (transformers may store older names on disk)
    assert set(loaded_state) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(loaded_state[name], tensor), name
    rebuilt.load_state_dict(reference)
    batch = example_input(template, loaded)
    assert torch.equal(outputs_of(loaded, batch), outputs_of(rebuilt, batch))
    if template != "minimal":
        processor_file = "preprocessor_config.json" if template == "image-classification" else "tokenizer.json"
        assert (final / processor_file).is_file()

    if backend != "ddp":
        # The sharded save_state folder merges into a from_pretrained-ready folder holding the same weights.
        from accelkit.merge import MergeOptions
        from accelkit.merge.api import merge_checkpoint

        merged = tmp_path / "merged"
        report = merge_checkpoint(MergeOptions(input=checkpoint, output=merged, verify=True, progress=False))
        assert any(line.startswith("manifest accelkit-manifest.json") for line in report.checks), report.checks
        from_merged, _ = load_final(template, runs.projects[template], merged)
        merged_state = from_merged.state_dict()
        assert set(merged_state) == set(reference)
        for name, tensor in reference.items():
            assert torch.equal(merged_state[name], tensor), name


@pytest.mark.parametrize("template", TEMPLATES)
def test_loss_goes_down_on_bundled_data(runs: TemplateRuns, template: str) -> None:
    proc = _check(runs.result("loss", template))
    losses = [float(loss) for _, loss in LOSS_LINE.findall(proc.stdout)]
    assert len(losses) >= 5, proc.stdout
    assert losses[-1] < 0.6 * losses[0], losses
    assert "backend NO | world size 1" in proc.stdout


@pytest.mark.parametrize("template", TEMPLATES)
def test_resume_is_bit_identical(runs: TemplateRuns, template: str) -> None:
    procs = runs.result("resume", template)
    for proc in procs.values():
        _check(proc)
    assert "resumed from" in procs["resumed"].stdout and "checkpoint-3 at step 3" in procs["resumed"].stdout
    straight = load_file(runs.out("resume", template, "straight") / "final" / "model.safetensors")
    resumed = load_file(runs.out("resume", template, "split") / "final" / "model.safetensors")
    assert set(straight) == set(resumed)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    # The split run really stopped at step 3 and continued from its checkpoint.
    assert (runs.out("resume", template, "split") / "checkpoint-3").is_dir()
    assert "step 3 |" in procs["first"].stdout and "step 4 |" not in procs["first"].stdout
