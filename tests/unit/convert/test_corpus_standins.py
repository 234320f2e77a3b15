"""benchmarks/convert_corpus/standins: the offline datasets the corpus runs on must not make a script hang that
real data would not (pytorch/examples siamese_network looped forever on a class with a single example)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _datasets():
    spec = importlib.util.spec_from_file_location(
        "standin_datasets", ROOT / "benchmarks" / "convert_corpus" / "standins" / "torchvision" / "datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_class_of_a_standin_split_has_several_examples_as_in_the_real_sets() -> None:
    datasets = _datasets()
    for split in (True, False):
        dataset = datasets.MNIST(train=split)
        counts = [int((dataset.targets == c).sum()) for c in range(10)]
        assert min(counts) >= len(dataset) // 10 >= 2, counts
        assert max(counts) - min(counts) <= 1, counts


def test_a_siamese_pair_drawn_from_one_class_always_finds_a_second_example() -> None:
    # siamese_network's __getitem__: draw two different indices of one class until they differ
    dataset = _datasets().MNIST(train=False)
    draw = random.Random(0)
    for c in range(10):
        members = (dataset.targets == c).nonzero().flatten().tolist()
        first = draw.randrange(len(members))
        second = next(i for i in (draw.randrange(len(members)) for _ in range(1000)) if i != first)
        assert members[first] != members[second]
