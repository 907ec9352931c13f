"""Prompt and output length buckets: a jitted step compiles once per bucket, not once per length."""

from __future__ import annotations

import math


def next_bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= n (and >= minimum): prompt buckets that bound recompiles."""
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
