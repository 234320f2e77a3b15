"""Sizes and counts parse the usual spellings exactly and refuse everything else, naming the flag."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelkit.errors import AccelkitError
from accelkit.sizes import format_bytes, format_count, parse_bytes, parse_count


@pytest.mark.parametrize("text, expected", [
    ("80GB", 80 * 10**9), ("24GiB", 24 * 2**30), ("24 GiB", 24 * 2**30), ("1.5TB", 15 * 10**11),
    ("512MiB", 512 * 2**20), ("80gb", 80 * 10**9), ("1e3MB", 10**9), ("4096B", 4096), ("2KiB", 2048),
])
def test_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text, "--gpu-memory") == expected


@pytest.mark.parametrize("text, hint", [
    ("80G", "80GB (powers of 1000) or 80GiB"), ("80", "give a number with a unit"), ("abc", "with a unit"),
    ("-4GB", "with a unit"), ("80 GBs", "with a unit"), ("0GB", "e.g."), ("nanGB", "with a unit"),
    ("1.2.3GB", "with a unit"), ("", "with a unit"),
])
def test_bad_bytes_are_refused_with_the_fix(text: str, hint: str) -> None:
    with pytest.raises(AccelkitError) as caught:
        parse_bytes(text, "--gpu-memory")
    assert "--gpu-memory" in caught.value.message and hint in caught.value.hint


@pytest.mark.parametrize("text, expected", [
    ("7B", 7 * 10**9), ("1.3e9", 1_300_000_000), ("350M", 350_000_000), ("125K", 125_000), ("7b", 7 * 10**9),
    ("70000000000", 70 * 10**9), ("1.5T", 1_500_000_000_000), ("6.7B", 6_700_000_000),
    ("8.03B", 8_030_000_000), ("70.6B", 70_600_000_000), ("1.235e9", 1_235_000_000), ("405.85B", 405_850_000_000),
])
def test_counts(text: str, expected: int) -> None:
    assert parse_count(text, "--params") == expected


@pytest.mark.parametrize("text", ["7GB", "seven", "0", "-7B", "1.5", "7BB", "0.1K5", "1e-3"])
def test_bad_counts_are_refused(text: str) -> None:
    with pytest.raises(AccelkitError) as caught:
        parse_count(text, "--params")
    assert "--params" in caught.value.message and caught.value.hint


@given(st.integers(min_value=1, max_value=10**15))
def test_whole_counts_round_trip(n: int) -> None:
    assert parse_count(str(n), "--params") == n


def test_formatting_is_binary_and_readable() -> None:
    assert format_bytes(24 * 2**30) == "24.00 GiB"
    assert format_bytes(512) == "512 B"
    assert format_count(6_738_415_616) == "6.74B"
    assert format_count(999) == "999"


def test_one_gigabyte_means_ten_to_the_ninth_bytes_in_every_size_option() -> None:
    """`1GB` read by each command's size option (plan, merge, bench, convert, the cluster jobs) is 10^9 bytes, and
    `1GiB` 2^30: one parser (accelkit.sizes); bench's --comm-sizes alone adds nccl-tests' bare binary letters."""
    from accelkit.bench.comm import parse_message_size
    from accelkit.launch.cluster.targets.node_resources import parse_memory
    from accelkit.merge.output import parse_shard_size

    readers = {"--gpu-memory": lambda text: parse_bytes(text, "--gpu-memory"),
               "--sandbox-limit": lambda text: parse_bytes(text, "--sandbox-limit"),
               "--max-shard-size": parse_shard_size, "--comm-sizes": parse_message_size,
               "--mem-per-node": lambda text: parse_memory(text, "--mem-per-node")}
    assert {option: read("1GB") for option, read in readers.items()} == dict.fromkeys(readers, 10**9)
    assert {option: read("1GiB") for option, read in readers.items()} == dict.fromkeys(readers, 2**30)


def test_no_module_keeps_a_unit_table_of_its_own() -> None:
    """The units live in accelkit/sizes.py alone: a second table is how `GB` came to mean 2^30 in one command."""
    import re
    from pathlib import Path

    import accelkit

    root = Path(accelkit.__file__).parent
    tables = [str(path.relative_to(root)) for path in root.rglob("*.py")
              if path.name != "sizes.py" and re.search(r'"GIB"\s*:|"GB"\s*:', path.read_text(encoding="utf-8"))]
    assert tables == []
