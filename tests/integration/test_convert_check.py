"""`accelkit convert --check` on 2 CPU ranks, both directions.

Every corpus script (one per idiom of issue #16, and their combinations) converts and passes every invariant; the
naive conversions the issue measured (an epoch scheduler prepared, prepare before a custom init, the model never
prepared, hand-made batches not sharded, a metric not reduced, an early stop decided per process, files written by
every process) and issue #41's mutants (a per-batch scheduler not prepared, a metric reduced twice, a data-dependent
init run per rank after prepare) fail the invariant they break, with evidence. All checks run at the start of the
module, two at a time, and each test reads its result.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.convert.codemod import convert_source

CORPUS_DIR = DATA / "convert" / "corpus"
CORPUS = sorted(p.stem for p in CORPUS_DIR.glob("*.py"))
PARALLEL = 2
# the module's first test waits for every check (about 2 minutes on an idle 2-core machine, much longer when loaded)
pytestmark = pytest.mark.timeout(3600)
VERDICT = re.compile(r"^  (PASS|FAIL|SKIP)  (\S+(?: \S+)?)\s{2,}(.*)$")


@dataclass
class Checked:
    returncode: int
    stdout: str
    stderr: str

    def verdicts(self) -> dict[str, tuple[str, str]]:
        found = {}
        for line in self.stdout.splitlines():
            match = VERDICT.match(line)
            if match:
                found[match.group(2).strip()] = (match.group(1), match.group(3))
        return found

    def text(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr[-4000:]}"


def _converted(name: str) -> str:
    return convert_source((CORPUS_DIR / f"{name}.py").read_text(), filename=f"{name}.py").code


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"the conversion changed: {old!r} not found"
    return text.replace(old, new)


# The naive conversions issue #16 measured, made from our conversion by undoing one thing.
def naive_epoch_scheduler_prepared() -> str:
    return _replace(_converted("mnist_style"),
                    "model, optimizer, train_loader, test_loader = accelerator.prepare(\n"
                    "        model, optimizer, train_loader, test_loader\n    )",
                    "model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(\n"
                    "        model, optimizer, train_loader, test_loader, scheduler\n    )")


def naive_prepare_before_init() -> str:
    code = _replace(_converted("dcgan"), "netG = Generator(opt.nz)\n",
                    "netG = Generator(opt.nz)\nnetG = accelerator.prepare(netG)\n")
    # issue #16's naive conversion adds no seed: the common seed our conversion gives this unseeded script (for its
    # fixed_noise draw) would make every process draw the same initial weights, and hide the init after the wrap
    code = re.sub(r"\n# one random task on every process:.*\ntorch\.manual_seed\(0\)\n", "\n", code)
    assert "torch.manual_seed(0)" not in code
    # netG leaves the later prepare, wherever it stands there: a second prepare would wrap it again, and DDP's
    # broadcast at that wrap would hide the different initial weights
    later = re.search(r"^(\w+(?:, \w+)+) = accelerator\.prepare\(\s*(\w+(?:, \w+)+)\s*\)$", code, re.M)
    assert later is not None and later.group(1) == later.group(2) and "netG" in later.group(1).split(", "), later
    rest = ", ".join(name for name in later.group(1).split(", ") if name != "netG")
    return code.replace(later.group(0), f"{rest} = accelerator.prepare({rest})")


def naive_model_not_prepared() -> str:
    return _replace(_converted("trainer_class"),
                    "model, self.optimizer, train_loader = accelerator.prepare(\n"
                    "            model, self.optimizer, train_loader\n        )",
                    "train_loader = accelerator.prepare(train_loader)")


def naive_batches_not_sharded() -> str:
    shard = r"\n    # each process trains on an equal share.*\n    shard = .*\n    x, y = x\[shard\], y\[shard\]"
    return re.sub(shard, "", _converted("manual_batching"))


def naive_metric_not_reduced() -> str:
    code = _converted("eval_metrics")
    return re.sub(r"\n        total_(loss|correct) = accelerator\.reduce\(.*\)", "", code)


def naive_stop_per_process() -> str:
    return _replace(_converted("random_batches"),
                    "        accelerator.set_trigger()\n    if accelerator.check_trigger():\n        break",
                    "        break")


def naive_files_on_every_process() -> str:
    return _replace(_converted("side_effects"), "    if accelerator.is_main_process:\n        plt.savefig",
                    "    if True:\n        plt.savefig")


def naive_prepare_after_training() -> str:
    # issue #23: prepare inserted after the `if __name__ == "__main__":` block, i.e. after training
    code = _replace(_converted("main_guard"), "    model, optimizer = accelerator.prepare(model, optimizer)\n", "")
    return code + "model, optimizer = accelerator.prepare(model, optimizer)\n"


def naive_distributed_sampler_kept() -> str:
    code = _replace(_converted("ddp_torchrun"), "train_loader = DataLoader(train_set, batch_size=8, shuffle=True)",
                    "train_loader = DataLoader(train_set, batch_size=8, sampler=torch.utils.data.distributed."
                    "DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0))")
    return code


def naive_caller_metric_not_gathered() -> str:
    # each process sums its own shard and divides by len(dataset); the caller prints the result object
    gather = "            output, y = accelerator.gather_for_metrics((output, y))\n"
    return _replace(_converted("caller_metrics"), gather, "")


def naive_stream_not_prepared() -> str:
    # the training stream left out of prepare: every process reads the whole IterableDataset
    return _replace(_converted("iterable_eval"),
                    "    model, optimizer, train_loader, val_loader = accelerator.prepare(\n"
                    "        model, optimizer, train_loader, val_loader\n    )",
                    "    model, optimizer, val_loader = accelerator.prepare(model, optimizer, val_loader)")


def naive_batch_scheduler_not_prepared() -> str:
    # the per-batch warm-up left out of prepare: it steps once per process step, half as often per sample (issue #41)
    return _replace(_converted("warmup_plateau"),
                    "model, optimizer, train_loader, val_loader, warmup = accelerator.prepare(\n"
                    "        model, optimizer, train_loader, val_loader, warmup\n    )",
                    "model, optimizer, train_loader, val_loader = accelerator.prepare(\n"
                    "        model, optimizer, train_loader, val_loader\n    )")


def naive_metric_reduced_twice() -> str:
    # the reduced sum reduced again: the same value on every rank, summed once more (issue #41)
    reduce = ('        total_loss = accelerator.reduce(torch.as_tensor(total_loss, device=accelerator.device), "sum")'
              '.item()\n')
    return _replace(_converted("eval_metrics"), reduce, reduce + reduce)


def naive_data_init_after_prepare() -> str:
    # ActNorm's data-dependent init moved after prepare: each rank initialises from its own first batch after the
    # broadcast (what the converter wrote before issue #41) (issue #41)
    prepare = "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    code = _replace(_converted("actnorm_init"), "    data_init(model, loader)\n", "")
    return _replace(code, prepare, prepare + "    data_init(model, loader)\n")


NAIVE = {
    # name: (original corpus script, naive conversion, invariant that must fail, words the evidence must hold)
    "epoch_scheduler_prepared": ("mnist_style", naive_epoch_scheduler_prepared, "lr", "0.245"),
    "prepare_before_init": ("dcgan", naive_prepare_before_init, "weights", "started from different weights"),
    "model_not_prepared": ("trainer_class", naive_model_not_prepared, "wrapped", "`model` (TinyGPT) in `Trainer.run`"),
    "batches_not_sharded": ("manual_batching", naive_batches_not_sharded, "samples", "trained on the same inputs"),
    "metric_not_reduced": ("eval_metrics", naive_metric_not_reduced, "metrics", "EVAL validation loss"),
    "stop_per_process": ("random_batches", naive_stop_per_process, "no hang", "left training at different steps"),
    "files_on_every_process": ("side_effects", naive_files_on_every_process, "side effects", "loss.png"),
    "prepare_after_training": ("main_guard", naive_prepare_after_training, "wrapped", "SeqRegressor"),
    "distributed_sampler_kept": ("ddp_torchrun", naive_distributed_sampler_kept, "samples", "loader #0"),
    "caller_metric_not_gathered": ("caller_metrics", naive_caller_metric_not_gathered, "metrics",
                                   "printed by its caller: 0.4457 on `valid loss` where one process prints 0.6363"),
    "stream_not_prepared": ("iterable_eval", naive_stream_not_prepared, "samples",
                            "(IterableDataset), epoch 1: 70 sample(s) taken by more than one rank"),
    "batch_scheduler_not_prepared": ("warmup_plateau", naive_batch_scheduler_not_prepared, "lr",
                                     "used lr 0.0166667 on 2 processes; the original used 0.025"),
    "metric_reduced_twice": ("eval_metrics", naive_metric_reduced_twice, "metrics",
                             "2.725705 on `EVAL validation loss` where one process prints 1.362852"),
    "data_init_after_prepare": ("actnorm_init", naive_data_init_after_prepare, "weights",
                                "the ranks started from different weights"),
}
# converted DDP (torchrun) scripts checked under FSDP too: `--check --backend fsdp`
FSDP = ["ddp_torchrun"]


def naive_state_dict_under_rank_guard() -> str:
    # the full state dict asked for by rank 0 alone: harmless under DDP, a collective under FSDP (rank 0 waits in it,
    # rank 1 at the barrier after the guard)
    return _replace(_converted("ddp_torchrun"),
                    "        model_state_dict = accelerator.get_state_dict(model)\n        if rank == 0:\n",
                    "        if rank == 0:\n            model_state_dict = accelerator.get_state_dict(model)\n")


FSDP_NAIVE = {
    # name: (original, naive conversion, invariant that must fail under FSDP, words the evidence must hold)
    "state_dict_under_rank_guard": ("ddp_torchrun", naive_state_dict_under_rank_guard, "no hang",
                                    "rank 0: ddp_torchrun_naive.py:67 in main"),
}


def _check(script: Path, workdir: Path, converted: Path | None = None, backend: str = "ddp",
           stall: int = 120) -> Checked:
    args = [sys.executable, "-m", "accelkit", "convert", "--check", "--stall-timeout", str(stall), "--backend", backend]
    if converted is not None:
        args += ["--converted", str(converted)]
    proc = subprocess.run([*args, str(script)], cwd=workdir, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "CKPT_DIR": str(workdir)})
    return Checked(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checked]:
    jobs = {}
    for name in CORPUS:
        work = tmp_path_factory.mktemp(f"check-{name}")
        jobs[name] = (CORPUS_DIR / f"{name}.py", work, None)
    for name, (original, make, _, _) in NAIVE.items():
        work = tmp_path_factory.mktemp(f"naive-{name}")
        converted = work / f"{original}_naive.py"
        converted.write_text(make())
        jobs[f"naive:{name}"] = (CORPUS_DIR / f"{original}.py", work, converted)
    for name in FSDP:
        jobs[f"fsdp:{name}"] = (CORPUS_DIR / f"{name}.py", tmp_path_factory.mktemp(f"fsdp-{name}"), None, "fsdp")
    for name, (original, make, _, _) in FSDP_NAIVE.items():  # a hang: stopped after 10 s without progress
        work = tmp_path_factory.mktemp(f"fsdp-naive-{name}")
        converted = work / f"{original}_naive.py"
        converted.write_text(make())
        jobs[f"fsdp-naive:{name}"] = (CORPUS_DIR / f"{original}.py", work, converted, "fsdp", 10)
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {key: pool.submit(_check, *job) for key, job in jobs.items()}
        done = {key: future.result() for key, future in futures.items()}
    dump = os.environ.get("ACCELKIT_CHECK_DUMP")  # a file to keep every check's output in, for debugging
    if dump:
        Path(dump).write_text("\n".join(f"===== {k}\n{v.text()}" for k, v in done.items()))
    return done


@pytest.mark.parametrize("name", CORPUS)
def test_the_converted_corpus_script_passes_every_invariant_on_two_ranks(name: str,
                                                                         results: dict[str, Checked]) -> None:
    checked = results[name]
    verdicts = checked.verdicts()
    assert checked.returncode == 0, checked.text()
    assert set(verdicts) == {"ran", "wrapped", "weights", "lr", "samples", "metrics", "side effects", "no hang"}
    assert not [k for k, (status, _) in verdicts.items() if status == "FAIL"], checked.text()
    for invariant in ("ran", "wrapped", "weights", "samples", "side effects", "no hang"):
        assert verdicts[invariant][0] == "PASS", f"{invariant}: {verdicts[invariant]}\n{checked.text()}"
    assert "Check passed" in checked.stdout


def test_the_checks_compare_what_each_idiom_is_about(results: dict[str, Checked]) -> None:
    """Not vacuous passes: learning rates, metrics and samples were really compared where the idiom has them."""
    for name in ("mnist_style", "warmup_plateau", "trainer_class", "dcgan", "custom_init", "eval_metrics"):
        status, summary = results[name].verdicts()["lr"]
        assert status == "PASS" and "step(s)" in summary, (name, summary)
    for name in ("mnist_style", "eval_metrics", "warmup_plateau", "global_device"):
        status, summary = results[name].verdicts()["metrics"]
        assert status == "PASS", (name, summary, results[name].text())
    status, summary = results["caller_metrics"].verdicts()["metrics"]
    assert status == "PASS" and "9 metric(s)" in summary, results["caller_metrics"].text()
    status, summary = results["iterable_eval"].verdicts()["samples"]
    assert status == "PASS" and "IterableDataset loader #0 (training, samples compared by content): 1 epoch(s): " \
        "every sample of the one-process epoch taken, each by one rank" in summary, summary
    for name, words in (("manual_batching", "trained on different inputs at 4 of 4 steps"),
                        ("prebatched", "no DataLoader"), ("eval_metrics", "loader #2 (evaluation")):
        status, summary = results[name].verdicts()["samples"]
        assert status == "PASS" and words in summary, (name, summary)
    _, summary = results["side_effects"].verdicts()["side effects"]
    assert "model.pt" in summary and "loss.png" in summary


@pytest.mark.parametrize("name", FSDP)
def test_the_converted_ddp_script_passes_every_invariant_under_fsdp(name: str, results: dict[str, Checked]) -> None:
    checked = results[f"fsdp:{name}"]
    verdicts = checked.verdicts()
    assert checked.returncode == 0, checked.text()
    assert not [k for k, (status, _) in verdicts.items() if status != "PASS"], checked.text()
    assert "(FSDP, " in verdicts["ran"][1]
    assert verdicts["wrapped"][1].startswith("every trained module is sharded by FSDP (fully_shard)")
    # the ranks hold different shards: equal digests mean the full tensors were gathered and compared
    assert "full parameters gathered from the FSDP shards" in verdicts["weights"][1]
    assert "FSDP rehearsal" in checked.stderr and "(FSDP) as the original" in checked.stdout


@pytest.mark.parametrize("name", [*sorted(NAIVE), *(f"fsdp-{n}" for n in sorted(FSDP_NAIVE))])
def test_the_naive_conversion_fails_the_invariant_it_breaks(name: str, results: dict[str, Checked]) -> None:
    fsdp = name.startswith("fsdp-")
    checked = results[f"fsdp-naive:{name[5:]}" if fsdp else f"naive:{name}"]
    _, _, invariant, evidence = FSDP_NAIVE[name[5:]] if fsdp else NAIVE[name]
    verdicts = checked.verdicts()
    assert checked.returncode == 1, checked.text()
    assert verdicts[invariant][0] == "FAIL", f"{invariant}: {verdicts.get(invariant)}\n{checked.text()}"
    failing_block = checked.stdout[checked.stdout.index(f"FAIL  {invariant}"):]
    assert evidence in failing_block.split("\n  PASS")[0].split("\n  SKIP")[0], checked.text()
    errors = [line for line in checked.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and invariant in errors[0] and "Traceback" not in checked.stderr
