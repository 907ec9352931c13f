"""Prompt and output length buckets: a jitted step compiles once per bucket, not once per length."""

from __future__ import annotations

import math


def next_bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= n (and >= minimum): cache and output buckets that bound recompiles."""
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def prompt_bucket(n: int, minimum: int = 16, per_octave: int = 4) -> int:
    """A prompt's padded length: `per_octave` buckets between consecutive powers of two past `minimum` (multiples
    of 16 up to 128, of 32 up to 256, ...), so past 4 x minimum tokens padding adds under 1/per_octave of the
    prompt. A prefill is matmul bound (batch 1 included: every prompt token a row), its time the padded length's: a
    power-of-two bucket padded a 68-token prompt to 128 rows, ~1.45x the time of 80 (SmolLM2, float32 CPU)."""
    top = next_bucket(n, minimum)
    if top <= minimum:
        return top
    step = max(minimum, top // 2 // per_octave)
    return -(-n // step) * step
