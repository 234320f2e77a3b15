"""merge-ckpt on checkpoints written by the real tools: FSDP2 + DCP, FSDP2's per-rank files (Accelerate's
`save_fsdp_model(use_dcp=False)`, verl-style model_world_size_N_rank_R.pt), DeepSpeed ZeRO-1/2/3, save_pretrained,
torch.save.

Every merged output is compared bit for bit with the full state dict the producer held.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import run_accelkit, tree_hash
from safetensors import safe_open
from safetensors.torch import load_file

# input (relative to the producers' root) -> the producer's full state dict
CASES = {
    "fsdp2-dcp": ("fsdp/dcp", "fsdp/dcp_expected.safetensors"),
    # each rank's torch.save of its FSDP2 DTensors: the same trained model as the DCP save beside it
    "fsdp2-per-rank": ("fsdp/verl", "fsdp/dcp_expected.safetensors"),
    "accelerate-per-rank": ("accelerate/per_rank", "accelerate/expected.safetensors"),  # save_fsdp_model, no DCP
    "zero1": ("ds/zero1", "ds/zero1_expected.safetensors"),
    "zero2": ("ds/zero2", "ds/zero2_expected.safetensors"),
    "zero3": ("ds/zero3/global_step2", "ds/zero3_expected.safetensors"),  # a tag folder given directly
    "hf-sharded": ("hf/hf", "hf/hf_expected.safetensors"),
    "torch-bin": ("hf/torch/pytorch_model.bin", "hf/hf_expected.safetensors"),
}


@pytest.fixture
def ckpts(merge_ckpts: Path) -> Path:
    return merge_ckpts


def load_output(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a merged output: one file, a folder with model.safetensors, or shards + index."""
    if path.is_file():
        return load_file(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_file(path / shard))
        return out
    return load_file(path / "model.safetensors")


def assert_bit_identical(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name


@pytest.mark.parametrize("case", list(CASES))
def test_merge_is_bit_identical_to_the_producers_state_dict(ckpts: Path, tmp_path: Path, case: str) -> None:
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    src, expected = (ckpts / p for p in CASES[case])
    before = tree_hash(src)
    out = tmp_path / "merged.safetensors"
    report = merge_checkpoint(MergeOptions(input=src, output=out, verify=True, progress=False))
    assert_bit_identical(load_file(out), load_file(expected))
    assert report.verified and report.tensors == 20 and report.parameters == 16_640
    assert tree_hash(src) == before, "the input was modified"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.safetensors"]  # no temp files left
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


@pytest.mark.parametrize("case", ["fsdp2-dcp", "zero2", "zero3"])
def test_the_torch_free_path_writes_the_torch_paths_bytes(ckpts: Path, tmp_path: Path, case: str) -> None:
    """FSDP2's 2-rank DCP and DeepSpeed's ZeRO-2/3 merge without torch, and the report says so (the bytes are the
    producers', test_merge_is_bit_identical_to_the_producers_state_dict; tests/unit/merge/test_light_deepspeed.py
    covers ZeRO further)."""
    import shutil

    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    src = ckpts / CASES[case][0]
    if case == "fsdp2-dcp":  # without the config.json above it, which ties the tiny Llama's weights
        src = Path(shutil.copytree(src, tmp_path / "dcp"))
    light = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "light.safetensors", progress=False))
    assert not [note for note in light.notes if note.startswith("read with torch")], light.notes
    assert light.notes[-1].startswith("read without torch"), light.notes


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_bf16_zero_checkpoint_merges_to_its_fp32_masters(ckpts: Path, tmp_path: Path, stage: int) -> None:
    """DeepSpeed trained in bf16: the output holds the fp32 master weights from the bf16_zero_pp_rank_* files (what
    DeepSpeed's own zero_to_fp32 returns), checked against the bf16 weights in the model states by a bit-exact cast;
    the frozen norm, which has no master, keeps its bf16 weights (zero_to_fp32 drops it under ZeRO-1)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    src = ckpts / "ds" / f"zero{stage}_bf16"
    assert next((src / "global_step2").glob("bf16_zero_pp_rank_0_*optim_states.pt"))
    report = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "m.safetensors", verify=True,
                                           progress=False))
    got = load_file(tmp_path / "m.safetensors")
    reference = get_fp32_state_dict_from_zero_checkpoint(str(src))
    reference.pop("lm_head.weight")  # tied to the embedding, stored once
    assert got.pop("model.norm.weight").dtype == torch.bfloat16
    reference.pop("model.norm.weight", None)
    assert_bit_identical(got, reference)
    assert {tensor.dtype for tensor in got.values()} == {torch.float32}
    assert report.notes[-1].startswith("read without torch"), report.notes
    if stage < 3:
        assert any("fp32 partitions equal the model-states weights" in check for check in report.checks)


def test_a_config_that_ties_weights_is_asked_beside_the_byte_ranges(ckpts: Path, tmp_path: Path) -> None:
    """The model class says which weights are tied (transformers, torch); the tensors are still the byte ranges
    proven without torch, read once."""
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    report = merge_checkpoint(MergeOptions(input=ckpts / "fsdp" / "dcp", output=tmp_path / "out", progress=False))
    assert report.notes[-1].startswith("read without torch"), report.notes
    assert report.dropped_aliases == {"lm_head.weight": "model.embed_tokens.weight"}


def test_per_rank_shards_of_every_placement_are_put_together(ckpts: Path, tmp_path: Path) -> None:
    """Per-rank DTensors split along columns (assembled by torch), on a 2-D mesh, replicated, and a plain buffer: the
    merge equals the tensors before they were distributed."""
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    report = merge_checkpoint(MergeOptions(input=ckpts / "fsdp" / "placements", output=tmp_path / "m.safetensors",
                                           verify=True, progress=False))
    expected = load_file(ckpts / "fsdp" / "placements_expected.safetensors")
    assert_bit_identical(load_file(tmp_path / "m.safetensors"), expected)
    assert report.world_size == 2 and report.verified
    assert "2 rank files: 5 DTensors with one mesh" in report.checks[0]


def test_accelerate_save_state_under_accelkit_launch(ckpts: Path, tmp_path: Path) -> None:
    """`accelkit launch --backend fsdp --cpu` + Accelerate's save_state; merge the save_state folder itself."""
    produced = ckpts / "accelerate"
    assert (ckpts / "accelerate.rc").read_text() == "0", (ckpts / "accelerate.log").read_text()[-4000:]
    out = tmp_path / "merged"
    proc = cli_in_process("merge-ckpt", str(produced / "ckpt"), "-o", str(out), "--verify", "-q")
    assert proc.exit_code == 0, proc.output
    assert "Accelerate save_state folder: merging pytorch_model_fsdp_0/" in proc.stdout
    assert 'nested under "model"' in proc.stdout
    assert "Verified:" in proc.stdout and "peak memory" in proc.stdout
    # Every signal around the weights was checked: the manifest, Accelerate's RNG files, the optimizer's steps.
    assert "manifest accelkit-manifest.json (run " in proc.stdout and ", step 2)" in proc.stdout
    assert "the RNG files of all 2 processes were saved at step 2" in proc.stdout
    assert "optimizer_0/ agrees with itself (optimizer step 2 in all 2 rank files)" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert_bit_identical(load_output(out), load_file(produced / "expected.safetensors"))
    assert "read with torch: a training-state folder (Accelerate's save_state" in proc.stdout  # optimizer: torch
    # The save after the first step merges too, and holds other weights: the two saves are really two steps.
    first = load_output(merge_to(produced / "ckpt-step1", out.parent / "step1"))
    assert not torch.equal(first["model.embed_tokens.weight"], load_output(out)["model.embed_tokens.weight"])


def merge_to(src: Path, out: Path) -> Path:
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    merge_checkpoint(MergeOptions(input=src, output=out, progress=False))
    return out


def cli_in_process(*args: str):
    """The CLI without a new interpreter (the subprocess path is covered by the tests using run_accelkit)."""
    from click.testing import CliRunner

    from accelkit.cli import cli

    return CliRunner().invoke(cli, list(args))


def test_detection_is_explained(ckpts: Path) -> None:
    proc = cli_in_process("merge-ckpt", str(ckpts / "ds" / "zero2"), "--inspect")
    assert proc.exit_code == 0, proc.output
    assert "DeepSpeed ZeRO-2, world size 2" in proc.stdout
    assert "tag 'global_step2' (from latest)" in proc.stdout
    assert "Parameters:  16,640" in proc.stdout  # 101*32 + 2 layers + norm: the tied lm_head counted once
    assert "lm_head.weight -> model.embed_tokens.weight" in proc.stdout


@pytest.mark.parametrize("rel", ["fsdp/dcp", "ds/zero1", "ds/zero2", "ds/zero3", "ds/zero3/global_step2",
                                 "ds/zero2_bf16", "ds/zero3_bf16"])
def test_inspect_without_torch_reports_what_the_merge_reports(ckpts: Path, tmp_path: Path, rel: str) -> None:
    """--inspect makes the checks and counts the merge makes before writing, without reading tensor data."""
    import shutil

    from accelkit.merge import MergeOptions
    from accelkit.merge.api import inspect_checkpoint, merge_checkpoint

    src = ckpts / rel
    if rel == "fsdp/dcp":  # without the config.json above it, whose model class ties weights (asked when merging)
        src = Path(shutil.copytree(src, tmp_path / "dcp"))
    light = inspect_checkpoint(src)
    merged = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "m.safetensors", progress=False))
    assert light.notes[-1].startswith("read without torch"), light.notes
    assert set(light.checks) <= set(merged.checks) and light.notes[:-1] == merged.notes[:len(light.notes) - 1]
    fields = ("format_name", "world_size", "tensors", "parameters", "bytes", "dtypes", "input_files", "input_bytes",
              "dropped_aliases")
    assert {f: getattr(light, f) for f in fields} == {f: getattr(merged, f) for f in fields}


def test_inspect_writes_nothing(ckpts: Path, tmp_path: Path) -> None:
    src = ckpts / "fsdp" / "dcp"
    before = tree_hash(ckpts / "fsdp")
    proc = run_accelkit("merge-ckpt", str(src), "--inspect", "-o", str(tmp_path / "out"), cwd=tmp_path, check=True)
    assert "torch DCP" in proc.stdout and "world size 2" in proc.stdout and "Tensors:     21" in proc.stdout
    assert "Nothing was written" in proc.stdout
    assert list(tmp_path.iterdir()) == []
    assert tree_hash(ckpts / "fsdp") == before


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dtype_casts_floating_tensors(ckpts: Path, tmp_path: Path, dtype: str, torch_dtype: torch.dtype) -> None:
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    out = tmp_path / "cast.safetensors"
    report = merge_checkpoint(MergeOptions(input=ckpts / "ds" / "zero3", output=out, dtype=dtype, verify=True,
                                           progress=False))
    expected = {k: v.to(torch_dtype) for k, v in load_file(ckpts / "ds" / "zero3_expected.safetensors").items()}
    assert_bit_identical(load_file(out), expected)
    assert report.dtypes == {str(torch_dtype).removeprefix("torch."): 20}
    assert report.bytes == 16_640 * 2


def test_sharded_output_loads_with_from_pretrained_and_gives_same_logits(ckpts: Path, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path / "merged"
    proc = run_accelkit("merge-ckpt", str(ckpts / "fsdp" / "dcp"), "-o", str(out), "--max-shard-size", "20KB",
                        check=True)
    names = sorted(p.name for p in out.iterdir())
    assert "config.json" in names and "model.safetensors.index.json" in names
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == 16_640 * 4
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once, the way transformers saves it
    assert "copied config.json" in proc.stdout

    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(ckpts / "fsdp"))).eval()
    missing, unexpected = reference.load_state_dict(load_file(ckpts / "fsdp" / "dcp_expected.safetensors"),
                                                    strict=False)
    assert missing == ["lm_head.weight"] and not unexpected
    reference.tie_weights()
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(merged(ids).logits, reference(ids).logits)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()


def test_deepspeed_folder_output_is_a_pretrained_folder(ckpts: Path, tmp_path: Path) -> None:
    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    out = tmp_path / "zero2-merged"
    report = merge_checkpoint(MergeOptions(input=ckpts / "ds" / "zero2", output=out, progress=False))
    assert report.copied == ["config.json"]  # found two folders above the tag folder
    assert report.dropped_aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    assert_bit_identical(load_output(out), load_file(ckpts / "ds" / "zero2_expected.safetensors"))


def test_force_replaces_an_existing_output_only_when_asked(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"precious")
    proc = cli_in_process("merge-ckpt", str(ckpts / "hf" / "hf"), "-o", str(out))
    assert proc.exit_code == 1 and "already exists" in proc.stderr and "--force" in proc.stderr
    assert out.read_bytes() == b"precious"
    assert cli_in_process("merge-ckpt", str(ckpts / "hf" / "hf"), "-o", str(out), "--force", "-q").exit_code == 0
    assert_bit_identical(load_file(out), load_file(ckpts / "hf" / "hf_expected.safetensors"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_verify_catches_an_output_that_differs(ckpts: Path, tmp_path: Path, monkeypatch) -> None:
    from accelkit.errors import AccelkitError
    from accelkit.merge import MergeOptions, writer
    from accelkit.merge.api import merge_checkpoint

    def flip_first_byte(self, data):
        data = bytearray(data)
        if data:
            data[0] ^= 0xFF
        self.write(memoryview(bytes(data)))

    monkeypatch.setattr(writer.SafetensorsWriter, "append", flip_first_byte)
    out = tmp_path / "bad.safetensors"
    with pytest.raises(AccelkitError, match="verification failed"):
        merge_checkpoint(MergeOptions(input=ckpts / "hf" / "hf", output=out, verify=True, progress=False))
    assert list(tmp_path.iterdir()) == []
