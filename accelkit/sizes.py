"""Byte sizes and counts, one meaning in every command: parsing (`80GB`, `24GiB`, `7B`, `1.3e9`) and printing.

Units are never guessed: `GB` is 10^9 bytes and `GiB` is 2^30 (a "24 GB" GPU has 24 GiB of memory, so
`--gpu-memory 24GiB` is its exact size), in plan, merge, bench, convert and the cluster options alike; a bare `80G`
is refused instead of being read one way or the other. Two options keep their field's own convention on top of
that: a bare number of bytes where the peer tool takes one (`merge --max-shard-size 4096`, as transformers'
`max_shard_size`), and the one-letter binary suffixes of nccl-tests' `-b/-e` (`bench --comm-sizes 64K:16M`: K is
2^10). Sizes are printed in powers of 1024 (`22.35 GiB`), as GPU memory is sold and reported.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from accelkit.errors import AccelkitError

# Up to exabytes: a size too large for the machine is read, then refused by the command's ceiling ("more than any
# GPU holds"), never called "not a size".
BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50, "EIB": 2**60}
_LETTERS = ("K", "M", "G", "T", "P", "E")  # a unit letter alone: refused, or binary where asked
COUNT_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
_NUMBER = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
_SIZE_RE = re.compile(rf"{_NUMBER}\s*([A-Za-z]*)")
_COUNT_RE = re.compile(rf"{_NUMBER}\s*([KkMmBbTt]?)")


def parse_bytes(text: str, option: str, *, bare_number: bool = False, binary_letters: bool = False) -> int:
    """`80GB` -> 80_000_000_000, `24GiB` -> 25_769_803_776. `option` names the flag in errors. With `bare_number`
    a number without a unit is bytes; with `binary_letters` `64K`/`16M`/`1G` are powers of 1024 (nccl-tests)."""
    match = _SIZE_RE.fullmatch(text.strip())
    unit = match.group(2).upper() if match else ""
    scale = BYTE_UNITS.get(unit)
    if match and binary_letters and unit in _LETTERS:
        scale = 2 ** (10 * (_LETTERS.index(unit) + 1))
    elif match and bare_number and unit == "":
        scale = 1
    if scale is None:
        if match and unit in _LETTERS:
            hint = f"write {match.group(1)}{unit}B (powers of 1000) or {match.group(1)}{unit}iB (powers of 1024)"
        else:
            hint = ("give a number with a unit: B, KB, MB, GB, TB, PB (powers of 1000) or KiB, MiB, GiB, TiB, PiB "
                    "(of 1024)")
        raise AccelkitError(f"{option} {text!r} is not a size", hint=hint)
    value = float(match.group(1)) * scale
    if not math.isfinite(value) or value < 1:
        raise AccelkitError(f"{option} {text!r} must be at least one byte", hint=f"e.g. {option} 80GB")
    return int(value)


def parse_count(text: str, option: str) -> int:
    """`7B` -> 7_000_000_000, `1.3e9` -> 1_300_000_000, `350M`, `125K`; a whole positive number."""
    match = _COUNT_RE.fullmatch(text.strip())
    if not match:
        raise AccelkitError(f"{option} {text!r} is not a count",
                            hint=f"give a number, optionally with K, M, B or T: e.g. {option} 7B or {option} 1.3e9")
    # Decimal, not float: 8.03 x 10^9 is 8_030_000_000 exactly (in binary floating point it is not whole)
    value = Decimal(match.group(1)) * COUNT_SUFFIXES[match.group(2).upper()]
    if value < 1 or value != value.to_integral_value():
        raise AccelkitError(f"{option} {text!r} must be a whole number of at least 1", hint=f"e.g. {option} 7B")
    return int(value)


def format_bytes(n: float) -> str:
    """Bytes for people, in powers of 1024 as GPU memory is sold and reported: `22.35 GiB`, `512.0 MiB`."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n} B"  # not reached


def format_count(n: int) -> str:
    """`6738415616` -> `6.74B`; small counts stay whole."""
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)
