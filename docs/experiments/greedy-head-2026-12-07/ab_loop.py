"""The AR step and the verification of P + 1 tokens at batch 1, each in a compiled loop of 32 (as the decode loops run
them), with the head's screen and with the float32 head, arms rotated round by round in one process.

python ab_loop.py ROUNDS [P ...]   (TARGET=gemma3-270m: that target instead of SmolLM2)

SmolLM2 float32 (the CPU default), a 100-token prompt, max_len 256, an untrained drafter per P (the verification's
work does not depend on its proposals). `speed_ratio` (`eval.paired`): the mean time of the full-head arm over the
screen arm's, with its 95% paired-bootstrap interval over the rounds, and the A/A (the same full-head program
timed as a second arm); verify ÷ AR within each arm as well.
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import init_drafter, load_target

STEPS = 32
rounds = int(sys.argv[1])
proposals = [int(p) for p in sys.argv[2:]] or [3, 7]
target = load_target(os.environ.get("TARGET", "smollm2"))
cfg, tp = target.cfg, target.params
screen = target.greedy_screen()
assert screen is not None
rng = np.random.default_rng(0)
tokens = jnp.asarray(rng.integers(10, cfg.vocab_size, (1, 128)), jnp.int32)
lens = jnp.full((1,), 100, jnp.int32)
cache, logits = ar.prefill(cfg, tp, tokens, lens, max_len=256)
tok = jnp.argmax(logits, -1).astype(jnp.int32)


def looped(body):
    return jax.jit(lambda args, carry: jax.lax.fori_loop(0, STEPS, lambda _, c: body(args, c), carry))


def ar_body(args, c):
    params, scr = args
    tok, cache = ar.greedy_step(cfg, params, c[0].with_lengths(lens + 0), c[1], scr)
    return cache, tok


ar_loop = looped(ar_body)
calls = {"ar screen": lambda: ar_loop((tp, screen), (cache, tok)),
         "ar full": lambda: ar_loop((tp, None), (cache, tok)),
         "ar full again": lambda: ar_loop((tp, None), (cache, tok))}
for p in proposals:
    d = init_drafter(target, seed=0, num_proposals=p)
    sc = sp.SpecConfig(target=cfg, drafter=d.cfg, attend_carried=False)
    n = p + 2
    s = sp.prefill(sc, tp, d.params, tokens, lens, jnp.full((1,), n, jnp.int32), jnp.zeros((1,)),
                   jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=256, out_size=n)
    toks, q, s = sp.draft_step(sc, tp, d.params, s)

    def reset(s):
        return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                         draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                         rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))

    def verify_body(args, st, sc=sc, reset=reset):
        params, dparams, toks, q, scr = args
        return sp.verify_step(sc, params, dparams, reset(st), toks, q, screen=scr)

    v = looped(verify_body)
    calls[f"verify{p + 1} screen"] = (lambda v=v, d=d, toks=toks, q=q, s=s: v((tp, d.params, toks, q, screen), s))
    calls[f"verify{p + 1} full"] = (lambda v=v, d=d, toks=toks, q=q, s=s: v((tp, d.params, toks, q, None), s))
for f in calls.values():
    jax.block_until_ready(f())
print(f"# TARGET={os.environ.get('TARGET', 'smollm2')} python ab_loop.py {' '.join(sys.argv[1:])}; "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
      f"{rounds} rotated rounds of {STEPS} steps a call")
secs = rotated_seconds(calls, rounds)


def fmt(r):
    return f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"


print("| path | full head ms | screen ms | full ÷ screen (time), 95% interval | A/A |")
print("|---|---|---|---|---|")
for name in ["ar"] + [f"verify{p + 1}" for p in proposals]:
    ms = {a: 1e3 * np.median(secs[f"{name} {a}"]) / STEPS for a in ("full", "screen")}
    aa = fmt(speed_ratio(secs["ar full again"], secs["ar full"])) if name == "ar" else ""
    print(f"| {name} | {ms['full']:.2f} | {ms['screen']:.2f} | "
          f"{fmt(speed_ratio(secs[f'{name} full'], secs[f'{name} screen']))} | {aa} |")
print("\n| verify ÷ AR | full head | screen |\n|---|---|---|")
for p in proposals:
    print(f"| P = {p} | {fmt(speed_ratio(secs[f'verify{p + 1} full'], secs['ar full']))} | "
          f"{fmt(speed_ratio(secs[f'verify{p + 1} screen'], secs['ar screen']))} |")
