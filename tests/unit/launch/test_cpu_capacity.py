"""CPU rehearsals start real processes here: refuse what the machine cannot hold, warn far above its cores."""

from __future__ import annotations

import pytest

from accelkit.errors import AccelkitError
from accelkit.launch.cpu_capacity import RANK_BYTES, Machine, check_cpu_ranks

GIB = 2**30


def test_ranks_that_fit_on_enough_cores_pass_silently() -> None:
    assert check_cpu_ranks(8, Machine(cores=2, available_bytes=20 * GIB)) == []


def test_ranks_beyond_memory_are_refused_with_the_numbers_and_a_count_that_fits() -> None:
    machine = Machine(cores=2, available_bytes=20 * GIB)
    with pytest.raises(AccelkitError) as info:
        check_cpu_ranks(100_000, machine)
    assert "100000 CPU processes need at least" in info.value.message and "20.0 GiB free" in info.value.message
    assert f"at most {20 * GIB // RANK_BYTES} processes" in info.value.hint


def test_far_more_ranks_than_cores_warns_with_both_counts() -> None:
    (line,) = check_cpu_ranks(20, Machine(cores=2, available_bytes=20 * GIB))
    assert line.startswith("20 CPU processes on 2 cores")
