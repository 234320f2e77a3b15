"""nccl-tests conventions for collective bandwidth, and the communication time predicted from it."""

from __future__ import annotations

import pytest

from accelkit.bench.comm import (
    CommRow,
    algbw_gbs,
    bus_factor,
    busbw_gbs,
    comm_volume_factor,
    fit_size,
    nearest_all_reduce,
    parse_message_size,
    predicted_comm_seconds,
    rows_from_ranks,
    size_range,
)
from accelkit.errors import AccelkitError


def test_bus_bandwidth_factors_are_the_nccl_tests_ones() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("all_reduce", 2) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bus_factor("broadcast", 2)


def test_algbw_and_busbw() -> None:
    # 1 GB all-reduced in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s (a typical NVLink figure).
    assert algbw_gbs(10**9, 0.01) == pytest.approx(100.0)
    assert busbw_gbs("all_reduce", 10**9, 0.01, 8) == pytest.approx(175.0)


def test_predicted_all_reduce_time_is_the_ring_formula() -> None:
    # D = 400 MB of fp32 gradients on 8 ranks at busbw 100 GB/s: 2 x 7/8 x 0.4 GB / 100 GB/s = 7 ms.
    assert predicted_comm_seconds(400 * 10**6, 100.0, comm_volume_factor("ddp", 8)) == pytest.approx(0.007)
    # The prediction is the inverse of the measurement: the time of a D-byte all-reduce that measured busbw B.
    seconds = 0.0123
    busbw = busbw_gbs("all_reduce", 2**24, seconds, 4)
    assert predicted_comm_seconds(2**24, busbw, comm_volume_factor("ddp", 4)) == pytest.approx(seconds)


def test_sharded_backends_move_half_again_as_much() -> None:
    assert comm_volume_factor("fsdp", 4) == pytest.approx(1.5 * comm_volume_factor("ddp", 4))
    assert comm_volume_factor("deepspeed", 4, zero_stage=3) == pytest.approx(3 * 3 / 4)
    assert comm_volume_factor("deepspeed", 4, zero_stage=2) == comm_volume_factor("ddp", 4)


def test_rows_average_the_time_across_ranks() -> None:
    timing = [{"op": "all_gather", "size_bytes": 4096, "count": 1024, "dtype": "float32"}]
    ranks = [{"world_size": 2, "timings": [{**timing[0], "seconds": s}]} for s in (0.001, 0.003)]
    (row,) = rows_from_ranks(ranks)
    assert row.time_us == pytest.approx(2000.0)
    assert row.algbw_gbs == pytest.approx(4096 / 0.002 / 1e9)
    assert row.busbw_gbs == pytest.approx(row.algbw_gbs * 0.5)


def test_nearest_all_reduce_caps_at_the_ddp_bucket() -> None:
    rows = [CommRow("all_reduce", 2, size, size // 4, "float32", 1.0, 1.0, float(i + 1))
            for i, size in enumerate([2**12, 2**20, 2**24, 2**28])]
    rows.append(CommRow("all_gather", 2, 2**14, 1, "float32", 1.0, 1.0, 99.0))
    assert nearest_all_reduce(rows, 5000).size_bytes == 2**12
    assert nearest_all_reduce(rows, 2**21).size_bytes == 2**20
    assert nearest_all_reduce(rows, 10 * 2**30).size_bytes == 2**24  # buckets of 25 MiB, not the whole model
    assert nearest_all_reduce(rows[-1:], 4096) is None


def test_sizes() -> None:
    size = parse_message_size
    assert size("4096") == 4096 and size("64K") == 65536 and size("16MiB") == 2**24
    assert size("1g") == 2**30  # a bare letter is binary, as in nccl-tests' -b/-e
    # GB means 10^9 bytes here as in plan and merge (it was 2^30 in bench only); GiB is 2^30 everywhere
    assert size("1GB") == 10**9 and size("1GiB") == 2**30 and size("1.5M") == 3 * 2**19
    for bad in ("", "12X", "-1K", "1 MX"):
        with pytest.raises(AccelkitError, match="--comm-sizes .* is not a size"):
            parse_message_size(bad)
    assert size_range(4096, 2**16) == [4096, 2**14, 2**16]
    with pytest.raises(ValueError):
        size_range(10, 1)
    assert fit_size(1000, 3) == 996 and fit_size(4, 8) == 32
