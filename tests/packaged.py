"""Packaged targets (SmolLM2, Gemma 3 270M) converted once per machine, one test process at a time: under
pytest-xdist several workers can reach a fresh cache together, and each would convert (and replace) the
same cache folder while another one reads it."""

import fcntl

from carryover_jax.weights.registry import cache_dir, resolve_target


def resolve_packaged(alias: str):
    """`resolve_target(alias)` holding a lock file in the cache, so one process converts and the others wait
    for the finished folder (then find it converted and only read it)."""
    lock = cache_dir() / f".{alias}.test-lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            return resolve_target(alias)
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
