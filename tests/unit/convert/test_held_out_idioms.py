"""Idioms the held-out split of the convert corpus (benchmarks/convert_corpus, split "held-out") met the converter
with on 2026-11-29, each in our own words: a script that only imports from torch, and draws made through functions
imported by name."""

from __future__ import annotations

import textwrap

import pytest

from accelkit.convert.codemod import convert_source

LOOP = """
model = nn.Linear(4, 2)
optimizer = optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data, batch_size=4)
for epoch in range(2):
    total = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print("epoch", epoch, "loss", total)
"""


def _converted(head: str) -> str:
    code = convert_source(textwrap.dedent(head) + LOOP, filename="train.py").code
    compile(code, "train.py", "exec")
    return code


def test_a_script_that_only_imports_from_torch_gets_the_torch_its_conversion_uses() -> None:
    """PyTorchZeroToAll's shape: `from torch import nn, optim`; the reduced metric is `torch.as_tensor(...)`, which
    stopped both ranks with NameError."""
    code = _converted("""
        from torch import nn, optim, from_numpy
        from torch.utils.data import DataLoader, TensorDataset
        import torch.nn.functional as F
        import numpy as np

        xs = np.linspace(0, 1, 64, dtype=np.float32).reshape(16, 4)
        data = TensorDataset(from_numpy(xs), from_numpy((xs.sum(1) > 2).astype(np.int64)))
    """)
    assert "torch.as_tensor(total" in code
    assert "\nimport torch\n" in code


def test_a_script_that_binds_torch_gets_no_second_import() -> None:
    code = _converted("""
        import torch as th
        from torch import nn, optim
        from torch.utils.data import DataLoader, TensorDataset
        import torch.nn.functional as F
        import torch

        data = TensorDataset(th.ones(16, 4), th.zeros(16, dtype=th.long))
    """)
    assert code.count("import torch\n") == 1


@pytest.mark.parametrize(("head", "seed"), [
    # a draw through a function imported by name: the seed goes to the module (it was `randn.manual_seed(0)`)
    ("from torch import nn, optim, randn, randint", "import torch; torch.manual_seed(0)"),
    # the module's own name, as the script spells it
    ("import torch as th\nfrom torch import nn, optim\nrandn, randint = th.randn, th.randint", None),
    # `random` taken by the function the script imported: the module comes in under another name
    ("from torch import nn, optim, randn, randint\nfrom random import random",
     "import torch; torch.manual_seed(0)"),
])
def test_an_unseeded_draw_is_seeded_on_the_library_module(head: str, seed: str | None) -> None:
    code = _converted(head + """
        from torch.utils.data import DataLoader, TensorDataset
        import torch.nn.functional as F

        data = TensorDataset(randn(16, 4), randint(0, 2, (16,)))
    """.replace("\n        ", "\n"))
    assert "randn.manual_seed" not in code and "randint.manual_seed" not in code
    if seed is not None:
        assert seed in code, code


def test_a_taken_library_name_is_not_rebound_by_the_seed() -> None:
    code = convert_source(textwrap.dedent("""
        from random import random, shuffle
        import torch
        from torch import nn

        order = list(range(16))
        shuffle(order)
        xs = torch.ones(16, 4) * random()
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            loss = model(xs[order]).pow(2).mean()
            loss.backward()
            optimizer.step()
    """), filename="train.py").code
    compile(code, "train.py", "exec")
    assert "import random as random_for_seed" in code and "random_for_seed.seed(0)" in code, code
    assert "shuffle.seed" not in code and "\nrandom.seed" not in code


EPOCHS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
xs = torch.randn(64, 4)
ys = (xs.sum(1) > 0).long()
train_loader = DataLoader(TensorDataset(xs, ys), batch_size=8, shuffle=True)
test_loader = DataLoader(TensorDataset(xs, ys), batch_size=8)
model = nn.Linear(4, 2)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    running_loss = 0.0
    for i, data in enumerate(train_loader, START):
        img, label = data
        out = model(img)
        loss = criterion(out, label)
        running_loss += loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f'Finish {epoch+1} epoch, Loss: {running_loss/i:.6f}')
    model.eval()
    eval_loss = 0.
    eval_acc = 0.
    for data in test_loader:
        img, label = data
        with torch.no_grad():
            out = model(img)
            loss = criterion(out, label)
        eval_loss += loss.item()
        _, pred = torch.max(out, 1)
        eval_acc += (pred == label).float().mean()
    print(f'Test Loss: {eval_loss/len(test_loader):.6f}, Acc: {eval_acc/len(test_loader):.6f}')
"""


def test_a_mean_of_per_batch_means_printed_after_two_loops_is_scaled_once() -> None:
    """pytorch-beginner's shape: the evaluation line comes after the training loop and after the evaluation loop;
    both loops' sums are reduced, and its `len(test_loader)` was scaled by the number of processes twice (the test
    loss printed half of the one-process value). The training loss divided by the batch counter of
    `enumerate(loader, 1)` was not scaled at all (printed twice the value)."""
    code = convert_source(EPOCHS.replace("START", "1"), filename="train.py").code
    compile(code, "train.py", "exec")
    assert "eval_loss/(len(test_loader) * accelerator.num_processes)" in code, code
    assert "eval_acc/(len(test_loader) * accelerator.num_processes)" in code
    assert code.count("accelerator.num_processes") == 3, code
    assert "running_loss/(i * accelerator.num_processes)" in code


def test_a_counter_from_zero_is_left_as_the_script_wrote_it() -> None:
    code = convert_source(EPOCHS.replace("START", "0"), filename="train.py").code
    assert "running_loss/i:" in code


def test_a_gathered_evaluation_divided_after_a_reduced_training_loop_is_left_whole() -> None:
    """The evaluation loop unpacks its batch in its header: its outputs are gathered, each pass covers every
    process's samples, and its `len(test_loader)` passes are every process's count already. Only the training
    loop's reduced sum gets a scaled divisor (the evaluation's was scaled too: half the test loss)."""
    source = EPOCHS.replace("START", "1").replace("    for data in test_loader:\n        img, label = data\n",
                                                  "    for img, label in test_loader:\n")
    code = convert_source(source, filename="train.py").code
    compile(code, "train.py", "exec")
    assert "gather_for_metrics" in code
    assert "eval_loss/len(test_loader)" in code and "eval_acc/len(test_loader)" in code, code
    assert "running_loss/(i * accelerator.num_processes)" in code
