"""Numeric bounds of config fields and CLI options, and the one place that checks them.

A value outside its bound is one `ConfigError` naming the field (configs) or an argparse error naming
the option (CLI), never a run that does nothing (`steps=-1`) or a traceback deep in the model
(`--layers 0`). Upper bounds catch typos: sizes above `SIZE_MAX` are past any memory a step has, counts
and token ids above `INT32_MAX` overflow the int32 arrays that carry them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from carryover_jax.errors import ConfigError

INT32_MAX = 2 ** 31 - 1
SIZE_MAX = 2 ** 20  # batch rows, sequence lengths, layers, widths
SEED_MAX = 2 ** 32 - 1  # jax.random.key takes a uint32-range seed on every backend


@dataclasses.dataclass(frozen=True)
class Bound:
    """An allowed range: integer or real, `low <= v <= high` (`low` / `high` excluded when `open_low` /
    `open_high`), plus `None` when `optional` and the listed `extra` values (MeshConfig's -1)."""

    low: float
    high: float
    integer: bool = True
    open_low: bool = False
    open_high: bool = False
    optional: bool = False
    extra: tuple = ()

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        lo = "(" if self.open_low else "["
        hi = "inf" if math.isinf(self.high) else f"{self.high:g}" if not self.integer else f"{int(self.high)}"
        low = f"{self.low:g}" if not self.integer else f"{int(self.low)}"
        text = f"{kind} in {lo}{low}, {hi}{')' if self.open_high else ']'}"
        if self.extra:
            text += " or " + " or ".join(str(x) for x in self.extra)
        return text + (" or None" if self.optional else "")

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if isinstance(v, bool):
            return False
        if self.integer:
            if not isinstance(v, (int, np.integer)):
                return False
        elif not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(float(v)):
            return False
        if v in self.extra:
            return True
        above = v > self.low if self.open_low else v >= self.low
        return above and (v < self.high if self.open_high else v <= self.high)


def count(low: int = 1, high: int = INT32_MAX, **kw) -> Bound:
    return Bound(low, high, **kw)


def size(low: int = 1, high: int = SIZE_MAX, **kw) -> Bound:
    return Bound(low, high, **kw)


def real(low: float = 0.0, high: float = 1e6, **kw) -> Bound:
    return Bound(low, high, integer=False, **kw)


def positive(high: float = 1e6, **kw) -> Bound:
    return Bound(0.0, high, integer=False, open_low=True, **kw)


SEED = Bound(0, SEED_MAX)


def check(name: str, v: Any, bound: Bound) -> None:
    """One value within its bound (a library argument), else one `ConfigError` naming it."""
    if not bound.ok(v):
        raise ConfigError(f"{name} must be {bound.describe()}, got {v!r}")


def check_fields(obj, bounds: Mapping[str, Bound], prefix: str = "") -> None:
    """Every field of `obj` named in `bounds` within its bound; the first that is not raises."""
    for name, b in bounds.items():
        check(prefix + name, getattr(obj, name), b)


def check_ids(name: str, ids, low: int = 0, high: int = INT32_MAX) -> None:
    """A sequence of integer ids, each in [low, high]."""
    for i in ids or ():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not low <= i <= high:
            raise ConfigError(f"{name} must hold integers in [{low}, {high}], got {list(ids)!r}")


# ---- argparse: numeric options ----------------------------------------------------------------------
def arg(bound: Bound):
    """An argparse `type=` for a numeric option: parses and checks it, so `--layers 0` is refused with
    one usage error naming the option before the command loads anything."""
    parse = int if bound.integer else float

    def convert(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {bound.describe()}, got {text!r}") from None
        if not bound.ok(v):
            raise argparse.ArgumentTypeError(f"must be {bound.describe()}, got {text}")
        return v

    convert.__name__ = "integer" if bound.integer else "number"  # argparse names the type in its messages
    return convert
