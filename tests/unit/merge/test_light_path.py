"""The torch-free merge path: its restricted unpicklers never run pickled code, and its output is the torch path's,
byte for byte, on DCP checkpoints torch writes (one-process saves here; FSDP2 on 2 ranks in
tests/integration/test_merge.py)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_merge_synthetic import dcp_save, tiny_state, tree

from accelkit.errors import AccelkitError
from accelkit.merge import light_pickle, stream
from accelkit.merge.api import MergeOptions, merge_checkpoint


class _Payload:
    """Unpickling this runs exec(code): what a crafted checkpoint would try."""

    def __init__(self, marker: Path) -> None:
        self.code = f"open({str(marker)!r}, 'w').write('ran')"

    def __reduce__(self):
        return exec, (self.code,)


@pytest.mark.parametrize("load", [light_pickle.load_metadata, light_pickle.load_archive_pickle],
                         ids=["metadata", "archive"])
def test_a_reduce_payload_is_refused_and_never_runs(tmp_path: Path, load) -> None:
    marker = tmp_path / "marker"
    for payload in (_Payload(marker), {"state_dict_metadata": [_Payload(marker)]}):
        with pytest.raises(light_pickle.Refused, match=r"\.exec "):
            load(pickle.dumps(payload, protocol=2))
    assert not marker.exists()


def test_only_listed_names_are_built(tmp_path: Path) -> None:
    """A torch name the readers do not list (here a parameter, and os.system under a torch-looking module) is
    refused, never imported."""
    param = pickle.dumps(torch.nn.Parameter(torch.ones(2)))
    with pytest.raises(light_pickle.Refused, match="_rebuild_parameter"):
        light_pickle.load_archive_pickle(param)
    crafted = b"\x80\x02ctorch.distributed.checkpoint.metadata\nsystem\nq\x00."
    with pytest.raises(light_pickle.Refused):
        light_pickle.load_metadata(crafted)


def _merge_both(src: Path, tmp_path: Path, **options) -> tuple[bytes, bytes, list[str]]:
    light = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "light.safetensors", progress=False,
                                  **options))
    merge_checkpoint(MergeOptions(input=_torch_saved(src), output=tmp_path / "torch.safetensors", progress=False,
                                  **options))
    return ((tmp_path / "light.safetensors").read_bytes(), (tmp_path / "torch.safetensors").read_bytes(),
            light.notes)


def _torch_saved(src: Path) -> Path:
    """The DCP folder loaded by torch's own DCP loader and saved as one torch.save file beside it: the reference the
    byte ranges are compared with (read by the torch-file reader)."""
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = src.parent / "reference.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(src, out)
    return out


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested-under-model"])
def test_light_path_writes_the_torch_paths_bytes(tmp_path: Path, nested: bool) -> None:
    state = tiny_state()
    state["bf16"] = torch.randn(5, 3).to(torch.bfloat16)
    state["scalar"] = torch.tensor(3.5)
    state["empty"] = torch.empty(0, 4)
    src = dcp_save({"model": state} if nested else state, tmp_path / "dcp")
    before = tree(src)
    light, heavy, notes = _merge_both(src, tmp_path)
    assert light == heavy
    assert any(note.startswith("read without torch") for note in notes), notes
    assert tree(src) == before


def test_folder_output_with_side_files_matches_too(tmp_path: Path) -> None:
    src = dcp_save(tiny_state(), tmp_path / "run" / "dcp")
    (tmp_path / "run" / "config.json").write_text('{"model_type": "llama", "tie_word_embeddings": false}')
    light = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "a", progress=False))
    merge_checkpoint(MergeOptions(input=_torch_saved(src), output=tmp_path / "b", progress=False))
    assert "read without torch" in " ".join(light.notes)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_verify_catches_a_write_that_went_wrong(tmp_path: Path, monkeypatch) -> None:
    """--verify re-reads the output and compares it with the input: same bytes as the torch path when the writes
    are right, and a refusal (nothing left behind) when they are not."""
    src = dcp_save(tiny_state(), tmp_path / "dcp")
    light, heavy, notes = _merge_both(src, tmp_path, verify=True)
    assert light == heavy and "read with torch" not in " ".join(notes)

    def write_zeros(out, view) -> None:
        out.write(memoryview(bytes(len(view))))

    monkeypatch.setattr(stream, "_write_window", write_zeros)
    out = tmp_path / "bad" / "merged.safetensors"
    with pytest.raises(AccelkitError, match="verification failed"):
        merge_checkpoint(MergeOptions(input=src, output=out, verify=True, progress=False))
    assert not out.parent.exists()


def test_an_output_short_of_bytes_is_never_committed(tmp_path: Path, monkeypatch) -> None:
    """Both paths write through one SafetensorsWriter, which checks on close that every planned byte came: a window
    that never reaches the file fails the merge (without --verify) and leaves nothing behind."""
    src = dcp_save(tiny_state(), tmp_path / "dcp")
    written = []

    def drop_the_first(out, view) -> None:
        if written:
            out.write(view)
        written.append(len(view))

    monkeypatch.setattr(stream, "_write_window", drop_the_first)
    out = tmp_path / "short" / "merged.safetensors"
    with pytest.raises(RuntimeError, match="bytes of tensor data were never written"):
        merge_checkpoint(MergeOptions(input=src, output=out, progress=False))
    assert len(written) > 1 and not out.parent.exists()


@pytest.mark.parametrize("options", [{"dtype": "bf16"}, {"max_shard_size": "1KB"}], ids=["cast", "shards"])
def test_casts_and_shards_go_on_from_the_byte_ranges(tmp_path: Path, options: dict) -> None:
    """A cast or shards need no other reader: the byte ranges proven without torch are written (torch casting them
    where asked), the bytes torch's own DCP loader gives."""
    src = dcp_save(tiny_state(), tmp_path / "dcp")
    name = "merged" if "max_shard_size" in options else "merged.safetensors"
    merge_checkpoint(MergeOptions(input=_torch_saved(src), output=tmp_path / "alone" / name, progress=False,
                                  **options))
    report = merge_checkpoint(MergeOptions(input=src, output=tmp_path / name, progress=False, **options))
    assert report.notes[-1].startswith("read without torch")
    assert [*tree(tmp_path / name).values()] == [*tree(tmp_path / "alone" / name).values()]


def test_non_finite_values_are_refused_or_written_without_going_to_torch(tmp_path: Path) -> None:
    """Found while copying, non-finite values end the merge there (nothing left behind) or, with --allow-nonfinite,
    are written as they are: the merge never starts again in the torch path."""
    state = tiny_state()
    state["norm.weight"][3] = float("nan")
    src = dcp_save(state, tmp_path / "dcp")
    told: list[str] = []
    with pytest.raises(AccelkitError, match=r"tensor 'norm.weight' holds 1 non-finite values"):
        merge_checkpoint(MergeOptions(input=src, output=tmp_path / "out.safetensors", progress=False,
                                      notify=told.append))
    assert len([m for m in told if m.startswith("merging")]) == 1, told
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp"]
    light, heavy, notes = _merge_both(src, tmp_path, allow_nonfinite=True)
    assert light == heavy
    assert "read with torch" not in " ".join(notes) and notes[-2].startswith("1 tensors hold non-finite values")


def test_both_paths_count_the_same_non_finite_values(tmp_path: Path) -> None:
    """A refusal counts the values of the 16 MiB piece where the first were found, in windows of 2 MiB or whole:
    two NaNs in two windows of the first piece are 2, a third in the next piece is not counted."""
    big = torch.ones(5 * 1024 * 1024)  # 20 MiB of fp32: pieces of 16 and 4 MiB
    for at in (1, 3 * 1024 * 1024 // 4 + 5, 4 * 1024 * 1024 + 7):
        big[at] = float("inf")
    src = dcp_save({"big": big}, tmp_path / "dcp")
    said = []
    for merged in (src, _torch_saved(src)):  # the record ranges, and the torch file's
        with pytest.raises(AccelkitError) as refused:
            merge_checkpoint(MergeOptions(input=merged, output=tmp_path / "out.safetensors", progress=False))
        said.append(refused.value.message)
    assert said[0] == said[1] == "tensor 'big' holds 2 non-finite values (NaN or inf): the checkpoint is corrupt " \
                                 "(a flipped bit) or the run diverged", said


def test_a_corrupt_record_fails_with_the_torch_paths_message(tmp_path: Path) -> None:
    src = dcp_save({"w": torch.ones(64, 64)}, tmp_path / "dcp")
    shard = next(src.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    at = data.index(torch.ones(1).numpy().tobytes() * 16)  # inside the tensor's bytes
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(AccelkitError, match="CRC-32 of its record"):
        merge_checkpoint(MergeOptions(input=src, output=tmp_path / "out.safetensors", progress=False))
    assert not (tmp_path / "out.safetensors").exists()


def test_the_cli_merges_dcp_without_importing_torch(tmp_path: Path) -> None:
    src = dcp_save(tiny_state(), tmp_path / "dcp")
    code = ("import sys; from accelkit.cli import main; sys.argv = ['accelkit', 'merge-ckpt', sys.argv[1], '-o', "
            "sys.argv[2], '-q']\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "out.safetensors")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "read without torch" in proc.stdout


def test_items_only_torch_reads_are_materialised_by_torch_bit_for_bit(tmp_path: Path) -> None:
    """The one DCP reader hands to torch only what it cannot read as byte ranges: a strided item (assembled as DCP
    does), a float8 item and a Parameter (pickles the light unpicklers do not build); the rest stay byte ranges."""
    from safetensors.torch import load_file

    state = {"strided": torch.randn(4, 3).t(), "f8": torch.randn(5, 2).to(torch.float8_e4m3fn),
             "param": torch.nn.Parameter(torch.randn(3)), "plain": torch.randn(6, 2).to(torch.bfloat16)}
    src = dcp_save(state, tmp_path / "dcp")
    report = merge_checkpoint(MergeOptions(input=src, output=tmp_path / "out.safetensors", verify=True,
                                           progress=False))
    got = load_file(tmp_path / "out.safetensors")
    for name, tensor in state.items():
        want = tensor.detach().contiguous()
        assert got[name].dtype == want.dtype and torch.equal(got[name].view(torch.uint8), want.view(torch.uint8))
    assert report.notes[-1].startswith("read with torch where no byte range covers a tensor"), report.notes
