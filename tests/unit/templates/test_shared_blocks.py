"""The blocks every template shares (checkpoint discovery, manifest, logging window, final save) are copies of one
source, templates/minimal/train.py, marked `# >>> shared block "NAME"` ... `# <<< shared block "NAME"` (the way
transformers marks "Copied from" code). Templates stay self-contained files users own; this test fails when a copy
drifts, and checks that what the manifest block writes is what merge-ckpt verifies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import DATA, REPO_ROOT

SOURCE = REPO_ROOT / "templates" / "minimal" / "train.py"
TEMPLATES = sorted(p for p in (REPO_ROOT / "templates").glob("*/train.py"))
# Other files that carry copies of some blocks (the producer of the merge tests' Accelerate checkpoints).
PARTIAL_COPIES = [DATA / "merge" / "accelerate_save_state.py"]
START = re.compile(r'^# >>> shared block "([\w-]+)"', re.M)
REQUIRED = {"checkpoint-discovery", "manifest", "logging-window", "final-save", "preemption", "grad-compression",
            "async-checkpoint", "non-finite-guard", "resume-batch"}


def blocks(path: Path) -> dict[str, str]:
    text = path.read_text()
    found: dict[str, str] = {}
    for match in START.finditer(text):
        name = match.group(1)
        end = text.find(f'# <<< shared block "{name}"', match.end())
        assert end != -1, f"{path}: shared block {name!r} has no end marker"
        assert name not in found, f"{path}: shared block {name!r} appears twice"
        found[name] = text[match.start():end]
    return found


def test_the_source_holds_every_shared_block() -> None:
    assert set(blocks(SOURCE)) == REQUIRED


@pytest.mark.parametrize("path", TEMPLATES + PARTIAL_COPIES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_copy_equals_the_source(path: Path) -> None:
    source, copy = blocks(SOURCE), blocks(path)
    if path in TEMPLATES:
        assert set(copy) == REQUIRED, f"{path} lacks shared blocks {sorted(REQUIRED - set(copy))}"
    assert copy, f"{path} holds no shared block"
    for name, text in copy.items():
        assert text == source[name], f"{path}: shared block {name!r} differs from {SOURCE}; copy the source again"


def test_a_drifted_copy_is_caught(tmp_path: Path) -> None:
    drifted = tmp_path / "train.py"
    drifted.write_text(SOURCE.read_text().replace("digest.update(block)", "digest.update(block[:1])"))
    assert blocks(drifted)["manifest"] != blocks(SOURCE)["manifest"]


class _MainProcess:
    """What write_manifest uses of an Accelerator, for one process."""

    is_main_process = True
    num_processes = 2

    def wait_for_everyone(self) -> None:
        pass


def test_what_the_template_writes_merge_ckpt_verifies(tmp_path: Path) -> None:
    from accelkit.errors import AccelkitError
    from accelkit.merge import manifest

    namespace: dict[str, object] = {}
    code = "from __future__ import annotations\nimport hashlib, json\nfrom pathlib import Path\n"
    exec(code + blocks(SOURCE)["manifest"], namespace)  # noqa: S102 - the template's own code, as users run it
    checkpoint = tmp_path / "checkpoint-7"
    (checkpoint / "pytorch_model_fsdp_0").mkdir(parents=True)
    shard = checkpoint / "pytorch_model_fsdp_0" / "__0_0.distcp"
    shard.write_bytes(b"weights" * 1000)
    (checkpoint / "random_states_0.pkl").write_bytes(b"rng")
    namespace["write_manifest"](_MainProcess(), checkpoint, 7, "abc123")

    found = manifest.find(checkpoint / "pytorch_model_fsdp_0")
    assert found is not None and found.step == 7 and found.world_size == 2 and found.run_id == "abc123"
    assert sorted(found.files) == ["pytorch_model_fsdp_0/__0_0.distcp", "random_states_0.pkl"]
    assert not list(checkpoint.glob(".*")), "the manifest is written under a temporary name, then renamed"
    manifest.verify_manifest(found, [shard], world_size=2)
    shard.write_bytes(b"weightz" * 1000)  # bit rot: same size, other bytes
    with pytest.raises(AccelkitError, match="does not match its sha256"):
        manifest.verify_manifest(found, [shard], world_size=2)
