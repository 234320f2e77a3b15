"""benchmarks/convert_corpus/manifest.json: the corpus is split by repository, so the held-out figure measures
scripts from repositories the converter was never fixed on; every stand-in an entry names exists."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "benchmarks" / "convert_corpus"


def _entries() -> list[dict]:
    return json.loads((CORPUS / "manifest.json").read_text())["scripts"]


def _materialize():
    sys.path.insert(0, str(CORPUS))
    try:
        import materialize
    finally:
        sys.path.remove(str(CORPUS))
    return materialize


def test_no_repository_is_on_both_sides_of_the_split() -> None:
    sides: dict[str, set[str]] = {}
    for entry in _entries():
        assert entry["split"] in {"development", "held-out"}, entry["name"]
        sides.setdefault(entry["repo"], set()).add(entry["split"])
    assert {repo: s for repo, s in sides.items() if len(s) > 1} == {}
    held_out = [e for e in _entries() if e["split"] == "held-out"]
    assert len(held_out) >= 15 and len({e["repo"] for e in held_out}) >= 6


def test_names_are_unique_and_every_named_standin_exists() -> None:
    entries = _entries()
    assert len({e["name"] for e in entries}) == len(entries)
    stand_ins = _materialize().STAND_INS
    for entry in entries:
        assert entry["data"] is None or entry["data"] in stand_ins, entry["name"]
        for package in entry.get("standins", []):
            assert (CORPUS / "opt_in" / package / package).is_dir(), (entry["name"], package)


def test_the_mnist_idx_standin_writes_the_idx_layout_at_mnist_counts(tmp_path: Path) -> None:
    """vinhkhuc's data_util reshapes to exactly (60000, 784) after a 16-byte header: a short file would crash."""
    _materialize().STAND_INS["mnist-idx"](tmp_path, tmp_path / "_offline")
    folder = tmp_path / "datasets" / "mnist"
    for prefix, count in (("train", 60_000), ("t10k", 10_000)):
        images = np.frombuffer(gzip.decompress((folder / f"{prefix}-images-idx3-ubyte.gz").read_bytes()), np.uint8)
        labels = np.frombuffer(gzip.decompress((folder / f"{prefix}-labels-idx1-ubyte.gz").read_bytes()), np.uint8)
        assert images[16:].reshape(count, 28 * 28)[:200].any()
        assert labels[8:].shape == (count,) and labels[8:].max() < 10
