"""The target's pass over P + 1 verify rows ("t4": logits and argmax only; "t4taps": with the drafter's tapped layers)
and the whole verification step ("verify": + acceptance, the drafter's context update, the carried rows) against a
batch-1 AR step, each in a compiled 32-step loop, timed in rotated rounds with a second AR arm (the A/A): ms per step
(median) and each arm's mean time over AR's with a 95% interval.

    python target_pass.py P ROUNDS"""
import functools, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verify-rows-2026-12-05"))
import jax, numpy as np
from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode import speculative as sp
from carryover_jax.eval.paired import speed_ratio
from batch1 import ar_body, looped, prefilled, setup, target_rows_body

P, R = int(sys.argv[1]), int(sys.argv[2])
N, L = 32, 1024
b = setup(P); bx = prefilled(b, L)
cache, tok, toks, q, s = bx["cache"], bx["tok"], bx["toks"], bx["q"], bx["s"]


calls = {"ar": functools.partial(looped(ar_body(b), N), b.tp, (cache, tok)),
         "t4": functools.partial(looped(target_rows_body(b, toks), N), b.tp, (cache, tok)),
         "t4taps": functools.partial(looped(target_rows_body(b, toks, taps=True), N), b.tp, (cache, tok)),
         "verify": functools.partial(looped(lambda a, s: sp.verify_step(b.sc, a[0], a[1], b.reset(s), toks, q), N),
                                     (b.tp, b.dp), s)}
calls["ar again"] = calls["ar"]
for f in calls.values():
    jax.block_until_ready(f())
secs = rotated_seconds(calls, R)
for k in calls:
    r = speed_ratio(secs[k], secs["ar"])
    print(f"{k:8s} {1e3 * np.median(secs[k]) / N:7.2f} ms  / AR {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]")
