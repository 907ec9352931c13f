"""Counting XLA compilations: `jax.monitoring` reports every backend compile with the jitted function's
name, so a test can assert an absolute number of compiles from a known (cleared) state instead of
comparing two calls (which misses a recompile inside the first)."""

from __future__ import annotations

import collections
import contextlib

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch


@contextlib.contextmanager
def counting_compiles():
    """Clears jax's caches, then yields a Counter of backend compiles per function name
    (`jit_<name>`) made inside the block. The persistent compilation cache (tests/conftest.py) is off inside:
    a program loaded from it is no backend compile, so it would not be counted."""
    jax.clear_caches()
    counts: collections.Counter = collections.Counter()

    def listener(event, duration, **kw):
        if event == BACKEND_COMPILE_EVENT:
            counts[str(kw.get("fun_name", ""))] += 1

    persistent = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        jax.config.update("jax_enable_compilation_cache", persistent)


def compiles_of(counts, fn_name: str) -> int:
    """Compiles of the jitted function named `fn_name` (the Python function's __name__)."""
    return sum(n for name, n in counts.items() if name in (f"jit_{fn_name}", f"jit({fn_name})", fn_name))
