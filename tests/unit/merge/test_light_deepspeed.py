"""The one DeepSpeed ZeRO reader (merge/deepspeed.py): on checkpoints DeepSpeed writes (ZeRO-1/2/3 on 2 ranks, AdamW
state, a frozen parameter, a tied head: the `merge_ckpts` producers) it writes the fp32 masters DeepSpeed's own
zero_to_fp32 returns, a damaged checkpoint is refused with its one message, a crafted pickle's payload never runs,
and the CLI merges ZeRO without importing torch. The first tests need no checkpoint and stay in the fast loop.
"""

from __future__ import annotations

import io
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelkit.errors import AccelkitError
from accelkit.merge import deepspeed, light_pickle
from accelkit.merge.api import MergeOptions, merge_checkpoint

OPTIM = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"


class _Payload:
    """Unpickling this runs exec(code): what a crafted checkpoint would try."""

    def __init__(self, marker: Path) -> None:
        self.code = f"open({str(marker)!r}, 'w').write('ran')"

    def __reduce__(self):
        return exec, (self.code,)


def test_the_fp32_samples_are_cast_as_torch_casts() -> None:
    """The module-weights check compares a cast fp32 master element with the saved weight, bit for bit: the cast
    must round as torch's `.to` does (nearest even, overflow to inf, subnormals), for bf16 and fp16."""
    torch.manual_seed(0)
    values = torch.cat([torch.randn(2000) * 10.0 ** torch.randint(-8, 8, (2000,)),
                        torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e-8, 6e-8, 3.4e38, -3.4e38,
                                      float("inf"), float("-inf"), 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8])])
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        for value in values:
            want = value.to(dtype).reshape(1).view(torch.uint8).numpy().tobytes()
            got = deepspeed._cast(struct.pack("<f", value.item()), "float32", name)
            assert got == want, (name, value.item())


def test_the_deepspeed_unpickler_builds_only_what_it_lists(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(light_pickle.Refused, match=r"\.exec "):
        light_pickle.load_deepspeed_pickle(pickle.dumps({"optimizer_state_dict": _Payload(marker)}, protocol=2))
    assert not marker.exists()
    buffer = io.BytesIO()
    torch.save({"p": torch.nn.Parameter(torch.ones(2))}, buffer)
    with pytest.raises(light_pickle.Refused, match="_rebuild_parameter"):
        light_pickle.load_deepspeed_pickle(_pickle_of(buffer.getvalue()))
    crafted = b"\x80\x02cdeepspeed.runtime.zero.config\nsystem\nq\x00."  # a DeepSpeed module, an unlisted name
    with pytest.raises(light_pickle.Refused):
        light_pickle.load_deepspeed_pickle(crafted)


def _pickle_of(archive: bytes) -> bytes:
    import zipfile

    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


# -- on checkpoints DeepSpeed writes (slow: making them starts 2-rank jobs once per session) -----------------------

@pytest.mark.parametrize("rel,tag", [("ds/zero1", None), ("ds/zero2", None), ("ds/zero3", None),
                                     ("ds/zero3/global_step2", None), ("ds/zero2", "global_step1"),
                                     ("ds/zero1_bf16", None), ("ds/zero2_bf16", None), ("ds/zero3_bf16", None)],
                         ids=["zero1", "zero2", "zero3", "zero3-tag-folder", "zero2-tag-step1", "zero1-bf16",
                              "zero2-bf16", "zero3-bf16"])
def test_the_reader_writes_deepspeeds_own_fp32_weights(merge_ckpts: Path, tmp_path: Path, rel: str,
                                                       tag: str | None) -> None:
    """Every tensor DeepSpeed's zero_to_fp32 returns in the dtype it is written in is written bit for bit (the
    frozen bf16 norm keeps its bf16 weights here); the tied head is stored once; no torch reads the bytes."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    src = merge_ckpts / rel
    report = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "m.safetensors", progress=False, tag=tag))
    assert report.notes[-1].startswith("read without torch"), report.notes
    assert report.dropped_aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    got = load_file(tmp_path / "m.safetensors")
    folder, step = (src.parent, src.name) if rel.endswith("global_step2") else (src, tag)
    reference = get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=step)
    same = [name for name, tensor in got.items() if name in reference and reference[name].dtype == tensor.dtype]
    assert len(same) >= len(got) - 1, sorted(set(got) - set(same))
    for name in same:
        assert torch.equal(got[name].view(torch.uint8), reference[name].contiguous().view(torch.uint8)), name


def _flip_partition(tag: Path, ckpts: Path) -> None:
    from accelkit.merge.torch_files import open_archive

    file = tag / OPTIM.format(0)
    archive = open_archive(file)
    state = archive.obj["optimizer_state_dict"]
    flat = (state.get("single_partition_of_fp32_groups") or state.get("fp32_flat_groups"))[0]
    record, offset = archive.locate(flat)
    with open(file, "r+b") as handle:
        handle.seek(record.offset + offset + flat.numel() * 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))


def _truncate(tag: Path, ckpts: Path) -> None:
    file = tag / OPTIM.format(1)
    file.write_bytes(file.read_bytes()[:5000])


def _rank_file_of_step1(tag: Path, ckpts: Path) -> None:
    shutil.copy(tag.parent / "global_step1" / OPTIM.format(1), tag / OPTIM.format(1))


def _zero3_rank_files_of_step1(tag: Path, ckpts: Path) -> None:
    for kind in ("model", "optim"):
        name = f"zero_pp_rank_1_mp_rank_00_{kind}_states.pt"
        shutil.copy(tag.parent / "global_step1" / name, tag / name)


def _rank_file_of_another_run(tag: Path, ckpts: Path) -> None:
    shutil.copy(ckpts / "ds" / "zero2_other" / "global_step2" / OPTIM.format(1), tag / OPTIM.format(1))


def _tag_of_another_step(tag: Path, ckpts: Path) -> None:
    shutil.rmtree(tag)
    (tag.parent / "global_step1").rename(tag)


def _missing_model_states(tag: Path, ckpts: Path) -> None:
    (tag / "mp_rank_00_model_states.pt").unlink()


def _stray_rank(tag: Path, ckpts: Path) -> None:
    for kind in ("optim", "model"):
        name = f"zero_pp_rank_{{}}_mp_rank_00_{kind}_states.pt"
        shutil.copy(tag / name.format(1), tag / name.format(2))


DAMAGE = {
    "flipped-byte-zero2": ("zero2", _flip_partition, "is corrupt: the CRC-32"),
    "flipped-byte-zero3": ("zero3", _flip_partition, "is corrupt: the CRC-32"),
    "truncated": ("zero3", _truncate, "truncated or corrupt"),
    "optimizer-of-another-step": ("zero2", _rank_file_of_step1, "holds optimizer step 1"),
    "zero3-rank-of-another-step": ("zero3", _zero3_rank_files_of_step1, "was saved at step 1"),
    "rank-of-another-run": ("zero2", _rank_file_of_another_run, "does not hold the weights"),
    "tag-of-another-step": ("zero1", _tag_of_another_step, "comes from another step"),
    "missing-model-states": ("zero2", _missing_model_states, "checkpoint file is missing"),
    "stray-rank": ("zero3", _stray_rank, "different world sizes"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_with_its_message(merge_ckpts: Path, tmp_path: Path, case: str) -> None:
    name, damage, expected = DAMAGE[case]
    src = tmp_path / "in" / name
    shutil.copytree(merge_ckpts / "ds" / name, src)
    damage(src / "global_step2", merge_ckpts)
    out = tmp_path / "out" / "merged.safetensors"
    with pytest.raises(AccelkitError) as caught:
        merge_checkpoint(MergeOptions(input=src, output=out, progress=False))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert expected in caught.value.message


def test_a_crafted_optimizer_file_never_runs_its_payload(merge_ckpts: Path, tmp_path: Path) -> None:
    src = tmp_path / "in" / "zero2"
    shutil.copytree(merge_ckpts / "ds" / "zero2", src)
    marker = tmp_path / "marker"
    crafted = src / "global_step2" / OPTIM.format(1)
    torch.save({"optimizer_state_dict": {"zero_stage": _Payload(marker), "partition_count": 2}}, crafted)
    with pytest.raises(light_pickle.Refused, match=r"\.exec "):
        light_pickle.load_deepspeed_pickle(_pickle_of(crafted.read_bytes()))
    with pytest.raises(AccelkitError, match="outside the safe allowlist"):
        merge_checkpoint(MergeOptions(input=src, output=tmp_path / "out.safetensors", progress=False))
    assert not marker.exists()


_WITHOUT_TORCH = ("import sys; from accelkit.cli import main; sys.argv = ['accelkit', 'merge-ckpt', *sys.argv[1:]]"
                  "\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
                  "assert 'torch' not in sys.modules, 'torch was imported'")


@pytest.mark.parametrize("stage", [2, 3])
def test_the_cli_merges_zero_without_importing_torch(merge_ckpts: Path, tmp_path: Path, stage: int) -> None:
    out = tmp_path / "out.safetensors"
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(merge_ckpts / "ds" / f"zero{stage}"), "-o",
                           str(out), "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "read without torch" in proc.stdout
    merge_checkpoint(MergeOptions(input=merge_ckpts / "ds" / f"zero{stage}", output=tmp_path / "in.safetensors",
                                  progress=False))
    assert out.read_bytes() == (tmp_path / "in.safetensors").read_bytes()


def test_the_cli_inspects_zero_without_importing_torch(merge_ckpts: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, str(merge_ckpts / "ds" / "zero3"), "--inspect"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "read without torch" in proc.stdout and "Nothing was written (--inspect)." in proc.stdout
