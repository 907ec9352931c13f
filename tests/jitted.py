"""Jitted forwards for the tests. A Flax module's `apply` called eagerly dispatches, and on a first sight of
each shape compiles, every primitive of the forward one by one; on the tiny configs that costs several
times what compiling the whole forward once does (a Gemma chunked-prefill test: 34 s eager)."""

import functools

import jax


@functools.cache
def jit_apply(module, static_argnames=("method", "tap_layers")):
    """`module.apply` under `jax.jit`, one per module (and statics), so repeated calls reuse its programs."""
    return jax.jit(module.apply, static_argnames=static_argnames)
