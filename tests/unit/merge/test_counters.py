"""The cross-check of a folder's step counters (accelkit.merge.counters): what agrees, what is refused, and that
counters of unknown meaning (several optimizers) are never judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.errors import AccelkitError
from accelkit.merge.counters import Counted, FolderCounters, cross_check

MANIFEST = Path("ckpt/accelkit-manifest.json")
OPTIMIZER = Path("ckpt/optimizer_0/__0_0.distcp")


def folder(taken=(), applied=(), **kwargs) -> FolderCounters:
    return FolderCounters(taken=[Counted(v, f, w) for v, f, w in taken],
                          applied=[Counted(v, f, "optimizer step", owner=o) for v, f, o in applied], **kwargs)


def test_one_save_agrees() -> None:
    line = cross_check(folder([(10, MANIFEST, "step")], [(10, OPTIMIZER, "optimizer_0")]))
    assert line == ("step counters agree across the folder: optimizer step 10 against step 10 in "
                    "accelkit-manifest.json")


def test_optimizer_of_another_step_names_both_files() -> None:
    with pytest.raises(AccelkitError, match=r"optimizer_0/__0_0.distcp holds optimizer step 20, "
                                            r"ckpt/accelkit-manifest.json step 10: the files come from different"):
        cross_check(folder([(10, MANIFEST, "step")], [(20, OPTIMIZER, "optimizer_0")]))


def test_taken_counters_must_be_equal() -> None:
    ds = Path("ckpt/pytorch_model/global_step20/mp_rank_00_model_states.pt")
    with pytest.raises(AccelkitError, match=r"accelkit-manifest.json holds step 10, .*mp_rank_00_model_states.pt "
                                            r"global_steps 20"):
        cross_check(folder([(10, MANIFEST, "step"), (20, ds, "global_steps")]))


def test_a_loss_scaler_may_skip_updates_but_never_add_them() -> None:
    scaler = Path("ckpt/scaler.pt")
    assert cross_check(folder([(10, MANIFEST, "step")], [(8, OPTIMIZER, "optimizer_0")], scaler=scaler))
    with pytest.raises(AccelkitError, match="never add them"):
        cross_check(folder([(10, MANIFEST, "step")], [(12, OPTIMIZER, "optimizer_0")], scaler=scaler))
    with pytest.raises(AccelkitError, match="different saves"):  # no scaler: no update is ever skipped
        cross_check(folder([(10, MANIFEST, "step")], [(8, OPTIMIZER, "optimizer_0")]))


def test_deepspeed_skipped_steps_are_exact() -> None:
    model = Path("ckpt/global_step10/mp_rank_00_model_states.pt")
    skipped = {"deepspeed": Counted(2, model, "skipped_steps")}
    assert cross_check(folder([(10, model, "global_steps")], [(8, OPTIMIZER, "deepspeed")], skipped=skipped))
    with pytest.raises(AccelkitError, match=r"optimizer step 9, .* global_steps 10 and skipped_steps 2"):
        cross_check(folder([(10, model, "global_steps")], [(9, OPTIMIZER, "deepspeed")], skipped=skipped))


def test_several_optimizers_are_not_judged() -> None:
    """A GAN's discriminator steps more often than its generator: which counts what is the script's business."""
    other = Path("ckpt/optimizer_1/__0_0.distcp")
    assert cross_check(folder([(10, MANIFEST, "step")], [(50, OPTIMIZER, "optimizer_0"),
                                                        (10, other, "optimizer_1")])) is None


def test_scheduler_learning_rate_must_be_the_optimizers() -> None:
    sched = Path("ckpt/scheduler.bin")
    same = folder(optimizer_lrs=[("optimizer_0", OPTIMIZER, [1e-3, 2e-3])], scheduler_lrs=[(sched, [1e-3, 2e-3])])
    assert "learning rate 0.001, 0.002" in cross_check(same)
    other = folder(optimizer_lrs=[("optimizer_0", OPTIMIZER, [1e-3])], scheduler_lrs=[(sched, [5e-4])])
    with pytest.raises(AccelkitError, match=r"scheduler.bin last set the learning rate to 0.0005, but "
                                            r".*__0_0.distcp holds 0.001"):
        cross_check(other)


def test_nothing_to_compare() -> None:
    assert cross_check(folder([(10, MANIFEST, "step")])) is None
    assert cross_check(FolderCounters()) is None
