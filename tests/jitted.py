"""Jitted forwards for the tests. A Flax module's `apply` called eagerly dispatches, and on a first sight of
each shape compiles, every primitive of the forward one by one; on the tiny configs that costs several
times what compiling the whole forward once does (a Gemma chunked-prefill test: 34 s eager)."""

import functools

import jax


@functools.cache
def jit_apply(module, static_argnames=("method", "tap_layers")):
    """`module.apply` under `jax.jit`, one per module (and statics), so repeated calls reuse its programs."""
    return jax.jit(module.apply, static_argnames=static_argnames)


def count_splits(monkeypatch, max_tokens: int) -> list:
    """Set `numerics.CPU_PASS_TOKENS` to `max_tokens` and record the batch of every `numerics.sub_batched` call that
    splits it from now on; jit caches are cleared, so the programs are traced again under the new limit instead of
    reused (a test whose list stays empty did not exercise the split)."""
    from carryover_jax import numerics

    monkeypatch.setattr(numerics, "CPU_PASS_TOKENS", max_tokens)
    split, inner = [], numerics.sub_batched

    def spy(fn, *args, tokens_per_row, max_tokens=None):
        b = jax.tree.leaves(args)[0].shape[0]
        limit = numerics.CPU_PASS_TOKENS if max_tokens is None else max_tokens
        if b > max(1, limit // max(tokens_per_row, 1)):  # more prompts than one pass holds
            split.append(b)
        return inner(fn, *args, tokens_per_row=tokens_per_row, max_tokens=max_tokens)

    monkeypatch.setattr(numerics, "sub_batched", spy)
    jax.clear_caches()
    return split
