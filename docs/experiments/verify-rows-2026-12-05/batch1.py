"""What the batch-1 step scripts here (and `../attention-split-2026-12-05/ab_steps_builds.py`) share: SmolLM2 with a
random 2-layer DFlash drafter of the default recipe's shape (8,192-token draft vocabulary), one random prompt, and
every timed step reset to the same round from that prompt, as `bench decode --breakdown` does."""
import types

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.loading import init_drafter, load_target


def setup(P: int, dtype=None, prompt_len: int = 100):
    """-> namespace: tcfg, dcfg, tp, dp, sc, tokens, lens, prompt_len, reset (a state back to the prompt)."""
    target = load_target("smollm2", dtype=dtype)
    drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=P, num_layers=2,
                           draft_vocab=tuple(range(8192)))
    tcfg, dcfg = target.cfg, drafter.cfg
    rng = np.random.default_rng(0)
    tokens = np.zeros((1, next_bucket(prompt_len)), np.int32)
    tokens[:, :prompt_len] = rng.integers(10, tcfg.vocab_size, (1, prompt_len))
    lens = jnp.full((1,), prompt_len, jnp.int32)

    def reset(s):
        return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                         draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                         rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))

    return types.SimpleNamespace(tcfg=tcfg, dcfg=dcfg, tp=target.params, dp=drafter.params,
                                 sc=sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=dcfg.carryover),
                                 tokens=jnp.asarray(tokens), lens=lens, prompt_len=prompt_len, reset=reset)


def prefilled(b, max_len: int) -> dict:
    """The prompt prefilled for AR ("cache", "tok") and for speculative decoding ("s"), and one round's drafts
    ("toks", "q"): room for one round's tokens, which is all a reset step needs."""
    n = b.dcfg.num_proposals + 2
    cache, logits = ar.prefill(b.tcfg, b.tp, b.tokens, b.lens, max_len=max_len)
    s = sp.prefill(b.sc, b.tp, b.dp, b.tokens, b.lens, jnp.full((1,), n, jnp.int32), jnp.zeros((1,)),
                   jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=max_len, out_size=n)
    toks, q, _ = sp.draft_step(b.sc, b.tp, b.dp, b.reset(s))
    return {"cache": cache, "tok": jnp.argmax(logits, -1).astype(jnp.int32), "s": s, "toks": toks, "q": q}


def ar_body(b):
    """A greedy AR step as a loop body over (cache, token), the cache reset to the prompt each time."""
    from carryover_jax.decode.sampling import argmax

    def body(params, c):
        cache, tok = c
        logits, cache = ar.step(b.tcfg, params, cache.with_lengths(b.lens + 0), tok)
        return cache, argmax(logits).astype(jnp.int32)

    return body


def looped(body, steps: int = 32):
    """`steps` calls of body(args, carry) in one compiled `fori_loop`, as the decode loops run them."""
    return jax.jit(lambda args, carry: jax.lax.fori_loop(0, steps, lambda _, c: body(args, c), carry))


def target_rows_body(b, toks, taps: bool = False):
    """The target's pass over P + 1 verify rows (the anchor, then `toks`) as a loop body over (cache, token), the
    cache reset to the prompt each time; `taps`: with the drafter's tapped layers (their sum folded into the token
    so nothing is dropped)."""
    from carryover_jax.decode.sampling import argmax
    from carryover_jax.models.target import TargetLM

    def body(params, c):
        cache, tok = c
        chunk = jnp.concatenate([tok[:, None], toks], axis=1)
        lg, cache, t = TargetLM(b.tcfg).apply({"params": params}, chunk, cache=cache.with_lengths(b.lens + 0),
                                              tap_layers=b.dcfg.target_layer_ids if taps else ())
        out = argmax(lg).astype(jnp.int32)[:, -1]
        return cache, out + (jnp.concatenate(t, -1).sum().astype(jnp.int32) * 0 if taps else 0)

    return body


def ar_and_rows_calls(b, bx: dict, steps: int = 32) -> dict:
    """{"ar": a batch-1 AR step, "t4": the target's pass over the P + 1 verify rows}, each `steps` of them in one
    compiled loop, as argument-free calls (`bx` from `prefilled`)."""
    import functools

    carry = (bx["cache"], bx["tok"])
    return {"ar": functools.partial(looped(ar_body(b), steps), b.tp, carry),
            "t4": functools.partial(looped(target_rows_body(b, bx["toks"]), steps), b.tp, carry)}
