"""merge-ckpt on bad inputs: one clear error, a non-zero exit, no output or temp file left, the input untouched.

Each test damages a copy of a checkpoint made by the real producers (see test_merge.py).
"""

from __future__ import annotations

import errno
import resource
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import run_accelkit, tree_hash


@pytest.fixture
def ckpts(merge_ckpts: Path) -> Path:
    return merge_ckpts


def copy_in(ckpts: Path, rel: str, tmp_path: Path) -> Path:
    src, dst = ckpts / rel, tmp_path / "in" / Path(rel).name
    dst.parent.mkdir()
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)
    return dst


def merge_fails(tmp_path: Path, src: Path, *extra: str, match: str, out: Path | None = None) -> str:
    """Run merge-ckpt in-process; assert a one-line error matching `match`, exit 1, nothing written, input intact."""
    from accelkit.cli import cli

    before = tree_hash(src)
    out = out or tmp_path / "merged.safetensors"
    listing = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(cli, ["merge-ckpt", str(src), "-o", str(out), "-q", *extra])
    assert result.exit_code == 1, (result.output, result.exception)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and match in errors[0], result.stderr
    assert "Hint:" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == listing, "output or temp files left behind"
    assert tree_hash(src) == before, "the input was modified"
    return errors[0]


def _last_chunk(dcp_dir: Path, file_name: str):
    from torch.distributed.checkpoint import FileSystemReader

    infos = [i for i in FileSystemReader(str(dcp_dir)).read_metadata().storage_data.values()
             if i.relative_path == file_name]
    return max(infos, key=lambda i: i.offset)


def test_dcp_missing_shard(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    (src / "__1_0.distcp").unlink()
    merge_fails(tmp_path, src, match="__1_0.distcp named in .metadata is missing")


def test_dcp_truncated_shard(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    data = (src / "__0_0.distcp").read_bytes()
    (src / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    merge_fails(tmp_path, src, match="is truncated")


def test_dcp_corrupt_shard_found_mid_merge_leaves_nothing(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    chunk = _last_chunk(src, "__1_0.distcp")  # read last: earlier tensors are already written when it fails
    with open(src / "__1_0.distcp", "r+b") as f:
        f.seek(chunk.offset)
        f.write(b"\0" * min(64, chunk.length))
    merge_fails(tmp_path, src, "--verify", match="a shard is corrupt")


def test_dcp_shards_from_another_world_size(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    shutil.copy(src / "__1_0.distcp", src / "__2_0.distcp")  # left over from a 3-rank save
    merge_fails(tmp_path, src, match="different world size")


def test_dcp_corrupt_metadata(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    (src / ".metadata").write_bytes((src / ".metadata").read_bytes()[:100])
    merge_fails(tmp_path, src, match="truncated or corrupt")


def test_deepspeed_missing_rank(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    (src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    merge_fails(tmp_path, src, match="different world sizes")


def test_deepspeed_truncated_partition(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    file = src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    file.write_bytes(file.read_bytes()[:5000])
    merge_fails(tmp_path, src, match="truncated or corrupt")


def test_deepspeed_shards_from_different_world_sizes(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    tag = src / "global_step2"
    for kind in ("optim", "model"):  # a rank-2 file left over from a 3-rank run
        name = f"zero_pp_rank_{{}}_mp_rank_00_{kind}_states.pt"
        shutil.copy(tag / name.format(1), tag / name.format(2))
    merge_fails(tmp_path, src, match="different world sizes")


def test_deepspeed_missing_rank_in_the_middle(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    tag = src / "global_step2"
    shutil.copy(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt", tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    merge_fails(tmp_path, src, match="rank 1 is missing")


def test_hf_missing_and_truncated_shards(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "hf/hf", tmp_path)
    shards = sorted(src.glob("model-*.safetensors"))
    saved = shards[1].read_bytes()
    shards[1].unlink()
    merge_fails(tmp_path, src, match="is missing")
    shards[1].write_bytes(saved[: len(saved) - 100])
    merge_fails(tmp_path, src, match="truncated or corrupt")


def test_pickle_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    src = tmp_path / "in" / "model.pt"
    torch.save({"w": torch.zeros(3), "hook": shutil.rmtree}, src)  # a callable: must never be unpickled
    merge_fails(tmp_path, src, match="outside the safe allowlist")


def test_output_inside_the_input(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    merge_fails(tmp_path, src, match="is inside the input", out=src / "merged.safetensors")


def test_input_inside_the_output_even_with_force(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "hf/hf", tmp_path)
    merge_fails(tmp_path, src, "--force", match="is inside the output", out=tmp_path / "in")


def test_unknown_layout_and_missing_input(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("not a checkpoint")
    error = merge_fails(tmp_path, tmp_path / "in", match="not a checkpoint layout merge-ckpt knows")
    assert "notes.txt" in error
    merge_fails(tmp_path, tmp_path / "nope", match="does not exist")


def test_full_disk_leaves_nothing(ckpts: Path, tmp_path: Path, monkeypatch) -> None:
    from accelkit.errors import AccelkitError
    from accelkit.merge import MergeOptions, merge_checkpoint, writer

    calls = []

    def no_space(self, name, tensor):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, tensor)

    real = writer.SafetensorsWriter.write
    monkeypatch.setattr(writer.SafetensorsWriter, "write", no_space)
    out = tmp_path / "merged"
    with pytest.raises(AccelkitError, match="disk full"):
        merge_checkpoint(MergeOptions(input=ckpts / "ds" / "zero1", output=out, max_shard_size="20KB",
                                      progress=False))
    assert list(tmp_path.iterdir()) == []


def test_keyboard_interrupt_leaves_nothing(ckpts: Path, tmp_path: Path, monkeypatch) -> None:
    from accelkit.merge import MergeOptions, merge_checkpoint, writer

    def interrupted(self, name, tensor):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer.SafetensorsWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        merge_checkpoint(MergeOptions(input=ckpts / "hf" / "hf", output=tmp_path / "sub" / "m.safetensors",
                                      progress=False))
    assert list(tmp_path.iterdir()) == []  # the folder created for the output is gone too


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))


def test_a_real_write_failure_from_the_os(ckpts: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG) halfway through the 66 KB output."""
    import subprocess

    before = tree_hash(ckpts / "hf" / "hf")
    proc = subprocess.run([sys.executable, "-m", "accelkit", "merge-ckpt", str(ckpts / "hf" / "hf"), "-o",
                           str(tmp_path / "m.safetensors"), "-q"], capture_output=True, text=True,
                          preexec_fn=_limit_file_size, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "exceeds the file-size limit" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
    assert tree_hash(ckpts / "hf" / "hf") == before


def test_cli_error_is_one_line_with_a_hint(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    (src / "global_step2" / "mp_rank_00_model_states.pt").unlink()
    proc = run_accelkit("merge-ckpt", str(src), "-o", str(tmp_path / "m.safetensors"))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("Error: checkpoint file is missing") and lines[1].strip().startswith("Hint:")
    assert len(lines) == 2
    assert not (tmp_path / "m.safetensors").exists()
