"""The hint for a GPU backend on a machine without GPUs counts its CPU processes in words that read right."""

from __future__ import annotations

import pytest

from accelkit.configs import ConfigOptions, resolve_config
from accelkit.errors import AccelkitError
from accelkit.launch.build_plan import check_gpus


@pytest.mark.parametrize("processes, words", [(1, "on 1 CPU process "), (2, "on 2 CPU processes ")])
def test_the_rehearsal_hint_counts_processes(processes: int, words: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without GPUs
    with pytest.raises(AccelkitError) as caught:
        check_gpus(resolve_config(ConfigOptions(backend="fsdp", num_processes=processes)))
    assert words in caught.value.hint
