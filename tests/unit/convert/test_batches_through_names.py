"""Issue #41: hand-made batches whose loop bound or whose data are reached through a name (the false refusals left
on the held-out split): `n = len(X)` then `range(0, n, bs)`, and `data, target = train_x, train_y` fed whole. The
data are sharded as in the inline form; a name that does not follow the data is still refused, with its line."""

from __future__ import annotations

import textwrap

import pytest

from accelkit.convert.codemod import convert_source

HEAD = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(64, 3)
{between}
Y = torch.randn(64, 1)
bs = 16
net = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(3):
{epoch}
    for i in range({bounds}):
{batch}
        optimizer.zero_grad()
        loss = F.mse_loss(net(xb), yb)
        loss.backward()
        optimizer.step()
    print("LOSS", loss.item())
"""
SHARD = "X, Y = X[shard], Y[shard]"


def _convert(between: str = "", epoch: str = "", bounds: str = "0, n, bs",
             batch: str = "xb, yb = X[i:i + bs], Y[i:i + bs]"):
    indent = textwrap.indent
    source = HEAD.format(between=between, epoch=indent(textwrap.dedent(epoch), " " * 4) or "    pass",
                         bounds=bounds, batch=indent(textwrap.dedent(batch), " " * 8))
    result = convert_source(source, filename="train.py")
    compile(result.code, "train.py", "exec")
    return source, result


@pytest.mark.parametrize(("epoch", "bounds", "batch"), [
    # the epoch's sample count in a name, the batch's end in another (`end = min(i + bs, n)`)
    ("n = X.shape[0]", "0, n, bs", "end = min(i + bs, n)\nxb, yb = X[i:end], Y[i:end]"),
    # a count of steps computed from the data through two names
    ("n = len(X)\nsteps = n // bs", "steps", "start = i * bs\nxb, yb = X[start:start + bs], Y[start:start + bs]"),
    # a shuffled order over the named length, cut into index batches (`idx = perm[i:i + bs]`, `X[idx]`)
    ("n = X.size(0)\nperm = torch.randperm(n)", "0, n, bs", "idx = perm[i:i + bs]\nxb, yb = X[idx], Y[idx]"),
])
def test_a_loop_bounded_through_a_local_of_the_data_is_sharded(epoch: str, bounds: str, batch: str) -> None:
    source, result = _convert(epoch=epoch, bounds=bounds, batch=batch)
    assert not result.report.problems, result.report.problems
    assert result.code.count(SHARD) == 1
    # sharded right after the data, before the loop computes its bound from them
    assert result.code.index(SHARD) < result.code.index(epoch.splitlines()[0])


def test_a_bound_computed_before_the_data_are_all_bound_is_refused_with_its_line() -> None:
    # `n = len(X)` before `Y = ...`: the shard goes after Y, so n would still count all 64 samples
    source, result = _convert(between="n = len(X)")
    assert [p.line for p in result.report.problems] == [14]
    assert "takes its bounds from `n = len(X)` (line 7), computed before the data it cuts are all bound" \
        in result.report.problems[0].what
    assert "shard" not in result.code


@pytest.mark.parametrize(("between", "epoch"), [
    ("n = 64", ""),  # a constant: the loop would run past each process's share
    ("", "n = len(X)\nif epoch == 2:\n    n = 32"),  # also bound to a constant
])
def test_a_name_that_does_not_follow_the_data_is_still_refused(between: str, epoch: str) -> None:
    source, result = _convert(between=between, epoch=epoch)
    assert [p.line for p in result.report.problems] == [14 if between else 16]
    assert "with bounds that do not follow the data's length" in result.report.problems[0].what
    assert "shard" not in result.code


def test_an_index_order_of_a_fixed_length_is_still_refused() -> None:
    source, result = _convert(epoch="perm = torch.randperm(64)", bounds="0, len(X), bs",
                              batch="idx = perm[i:i + bs]\nxb, yb = X[idx], Y[idx]")
    assert len(result.report.problems) == 1
    assert "indexes its batches by `perm` (`torch.randperm(64)`, line 13)" in result.report.problems[0].what


def test_two_loops_over_the_same_data_shard_it_once() -> None:
    source = HEAD.format(between="", epoch="    pass", bounds="0, len(X), bs",
                         batch="        xb, yb = X[i:i + bs], Y[i:i + bs]")
    source += "for i in range(0, len(X), bs):\n    loss = F.mse_loss(net(X[i:i + bs]), Y[i:i + bs])\n" \
              "    loss.backward()\n    optimizer.step()\n"
    result = convert_source(source, filename="train.py")
    assert not result.report.problems
    assert result.code.count(SHARD) == 1  # twice, each process kept a quarter of the samples on 2 processes


FULL = """
import torch
from torch.autograd import Variable

torch.manual_seed(0)
train_x = torch.randn(64, 3)
train_y = torch.randn(64, 1)
net = torch.nn.Linear(3, 1)
criterion = torch.nn.MSELoss()
{body}
"""


@pytest.mark.parametrize(("body", "shard"), [
    # the alias bound at every step, in the loop
    ("""
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(10):
    data, target = train_x, train_y
    optimizer.zero_grad()
    loss = criterion(net(data), target)
    loss.backward()
    optimizer.step()
""", "train_x, train_y = train_x[shard], train_y[shard]"),
    # in a training function, a dtype-keeping alias (`.float()`) beside a global read as it is
    ("""
def fit(net, steps):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    inputs = train_x.float()
    for step in range(steps):
        optimizer.zero_grad()
        loss = criterion(net(inputs), train_y)
        loss.backward()
        optimizer.step()


fit(net, 10)
""", "train_x, train_y = train_x[shard], train_y[shard]"),
    # in the loop through another local of the loop (`batch = inputs`), the alias of the alias
    ("""
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(10):
    inputs = Variable(train_x.to("cpu"))
    batch = inputs
    optimizer.zero_grad()
    loss = criterion(net(batch), train_y)
    loss.backward()
    optimizer.step()
""", "train_x, train_y = train_x[shard], train_y[shard]"),
])
def test_a_full_batch_reached_through_an_alias_shards_the_aliased_tensors(body: str, shard: str) -> None:
    result = convert_source(FULL.format(body=body), filename="train.py")
    assert not result.report.problems, result.report.problems
    assert result.code.count(shard) == 1
    # at module level, right after the data: the function's and the loop's aliases read the shard
    assert result.code.index(shard) < result.code.index("net = torch.nn.Linear")


def test_a_local_that_is_not_an_alias_beside_a_global_is_refused_with_its_line() -> None:
    # sharding `inputs` (a local) and `train_y` (a global) together in `fit` would make train_y local there: the
    # conversion crashed with UnboundLocalError
    result = convert_source(FULL.format(body="""
def fit(net, steps):
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    inputs = torch.cat([train_x, train_x])[::2]
    for step in range(steps):
        optimizer.zero_grad()
        loss = criterion(net(inputs), train_y)
        loss.backward()
        optimizer.step()


fit(net, 10)
"""), filename="train.py")
    assert [p.line for p in result.report.problems] == [14]
    assert "trains on `inputs`, a local of `fit`, and on `train_y`, a global it reads" \
        in result.report.problems[0].what
    assert "shard" not in result.code


def test_an_alias_that_is_also_bound_otherwise_in_the_loop_is_no_alias() -> None:
    # `data` is the whole set on some steps and a random half on others: not known to be the data
    result = convert_source(FULL.format(body="""
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(10):
    data, target = train_x, train_y
    if step % 2:
        data, target = make_half(train_x, train_y)
    optimizer.zero_grad()
    loss = criterion(net(data), target)
    loss.backward()
    optimizer.step()
"""), filename="train.py")
    assert len(result.report.problems) == 1
    assert "whose source could not be found" in result.report.problems[0].what


LSTM = """
import torch

torch.manual_seed(0)
trX = torch.randn(5, 64, 3)  # (time, samples, features), the layout nn.LSTM takes by default
trY = torch.randint(0, 2, (64,))
lstm, head = torch.nn.LSTM(3, 8), torch.nn.Linear(8, 2)
model = torch.nn.ModuleDict({{"lstm": lstm, "head": head}})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch_size = 16
train_size = {length}
num_batches = train_size // batch_size
for epoch in range(2):
    for k in range(num_batches):
        start, end = k * batch_size, (k + 1) * batch_size
        optimizer.zero_grad()
        out, _ = model["lstm"](trX[:, start:end, :])
        loss = torch.nn.functional.cross_entropy(model["head"](out[-1]), trY[start:end])
        loss.backward()
        optimizer.step()
"""


def test_batch_second_data_cut_beside_its_labels_is_sharded_along_the_samples() -> None:
    # the same window of trX along dimension 1 and of trY along dimension 0: dimension 1 holds the samples
    result = convert_source(LSTM.format(length="len(trY)"), filename="train.py")
    assert not result.report.problems, result.report.problems
    assert "trX, trY = trX[:, shard], trY[shard]" in result.code
    assert "len(trY) - len(trY) % accelerator.num_processes" in result.code


def test_batch_second_data_bounded_by_its_time_steps_is_still_refused() -> None:
    # `len(trX)` counts the 5 time steps, not the samples: the bound does not follow the samples' shard
    result = convert_source(LSTM.format(length="len(trX)"), filename="train.py")
    assert [p.line for p in result.report.problems] == [14]
    assert "cuts its batches along a later dimension (`trX[:, start:end, :]`)" in result.report.problems[0].what
    assert "shard" not in result.code
