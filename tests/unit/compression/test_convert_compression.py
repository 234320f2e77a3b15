"""`accelkit convert --grad-compression` writes the DistributedDataParallelKwargs line Accelerate takes (issue 35)."""

from __future__ import annotations

import re

import pytest

from accelkit.convert.codemod import ConvertOptions, convert_source

SCRIPT = """import torch
from torch import nn

model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize(("spec", "hook"), [("fp16", "FP16"), ("bf16", "BF16"),
                                            ("powersgd:rank=4,start=0", "POWER_SGD")])
def test_the_handler_line_is_written_and_builds(spec: str, hook: str) -> None:
    code = convert_source(SCRIPT, ConvertOptions(grad_compression=spec)).code
    assert "from accelerate import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs" in code
    match = re.search(r"kwargs_handlers=\[(DistributedDataParallelKwargs\(.*\))\]\)", code)
    assert match is not None, code
    import accelerate

    handler = eval(match.group(1), vars(accelerate))  # the expression as written builds Accelerate's handler
    assert handler.comm_hook is accelerate.DDPCommunicationHookType[hook]
    if hook == "POWER_SGD":
        assert handler.comm_state_option["matrix_approximation_rank"] == 4
        assert handler.comm_state_option["start_powerSGD_iter"] == 0


def test_no_compression_writes_no_handler() -> None:
    for spec in (None, "none"):
        assert "kwargs_handlers" not in convert_source(SCRIPT, ConvertOptions(grad_compression=spec)).code
