"""RoPE's cos and sin computed once a forward (memoised while tracing) against once a layer for q and once for k (the
model's `layers.apply_rope`), in the target's batch-1 AR step and its pass over P + 1 verify rows, compiled 32-step
loops in rotated rounds with an A/A; both must give the same tokens.

    python rope_once.py P ROUNDS [DTYPE]"""
import functools, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "verify-rows-2026-12-05"))
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.models import layers
from batch1 import ar_and_rows_calls, ar_body, looped, prefilled, setup, target_rows_body
P = int(sys.argv[1]); R = int(sys.argv[2]); dtype = sys.argv[3] if len(sys.argv) > 3 else None
N, L = 32, 1024
b = setup(P, dtype); bx = prefilled(b, L)
cache, tok, toks = bx["cache"], bx["tok"], bx["toks"]
calls = ar_and_rows_calls(b, bx, N)
for f in calls.values(): jax.block_until_ready(f())
memo = {}
def once(x, positions, inv):
    key = (id(positions), inv.tobytes())
    if key not in memo:
        freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv)[None, None, :]
        emb = jnp.concatenate([freqs, freqs], axis=-1)
        memo[key] = (positions, jnp.cos(emb), jnp.sin(emb))
    _, c, s = memo[key]
    cos = c[:, :, None, :].astype(x.dtype); sin = s[:, :, None, :].astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
layers.apply_rope = once
def ar_body2(a, c):
    memo.clear(); return ar_body(b)(a, c)
def t4_body2(a, c):
    memo.clear(); return target_rows_body(b, toks)(a, c)
calls["ar once"] = functools.partial(looped(ar_body2, N), b.tp, (cache, tok))
calls["t4 once"] = functools.partial(looped(t4_body2, N), b.tp, (cache, tok))
outs = {k: np.asarray(jax.block_until_ready(f())[1]) for k, f in calls.items()}
assert (outs["t4"] == outs["t4 once"]).all() and (outs["ar"] == outs["ar once"]).all()
calls["ar again"] = calls["ar"]
secs = rotated_seconds(calls, R)
for k in calls:
    base = "t4" if k.startswith("t4") else "ar"
    r = speed_ratio(secs[k], secs[base])
    print(f"{k:9s} {1e3*np.median(secs[k])/N:7.2f} ms  / {base} {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]")
