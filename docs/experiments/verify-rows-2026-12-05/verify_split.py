"""Where a verification's extra time goes, inside a compiled 32-step loop (as `bench decode --breakdown` times it):
SmolLM2 at batch 1, a random 2-layer DFlash drafter with the default recipe's shape, 1,024-slot caches, 100-token
prompt; the arms' loops interleaved (round-robin), medians, ms per step and the ratio to the AR step.

    python verify_split.py P REPS [DTYPE]

Arms: `ar` (an AR step), `t4` (the target's pass over the P + 1 verify rows alone, its cache written, argmax),
`t4tap` (+ the drafter's feature taps), `t4d` (+ the drafter's fc, its cache append and the carried rows),
`verify` (`speculative.verify_step`: + acceptance, commit and bookkeeping), `ar_again` (an A/A of `ar`).
PROFILE=1: also the per-kernel time of `ar` and `t4` from a `jax.profiler` trace (the 241 CPU-kernel calls of a
step by position: 30 layers x (k, q, v, attention, o, gate, up, down) + the tied head)."""
import functools, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.decode import speculative as sp, drafting as D
from carryover_jax.decode.sampling import argmax
from carryover_jax.models.target import TargetLM
from batch1 import ar_body, looped, prefilled, setup

P, REPS = int(sys.argv[1]), int(sys.argv[2])
dtype = sys.argv[3] if len(sys.argv) > 3 else None
N, L, batch = 32, 1024, 1
b = setup(P, dtype)
tcfg, dcfg, tp, dp, sc, lens, reset = b.tcfg, b.dcfg, b.tp, b.dp, b.sc, b.lens, b.reset
bx = prefilled(b, L)
cache, tok, s, toks, q = bx["cache"], bx["tok"], bx["s"], bx["toks"], bx["q"]

def t4_body(a, c, tap=False):
    cache, tok = c
    chunk = jnp.concatenate([tok[:, None], toks], axis=1)
    kw = dict(tap_layers=dcfg.target_layer_ids) if tap else {}
    lg, cache, taps = TargetLM(tcfg).apply({"params": a}, chunk, cache=cache.with_lengths(lens + 0), **kw)
    t = argmax(lg).astype(jnp.int32)[:, -1]
    if tap:
        t = t + 0 * jnp.sum(jnp.concatenate(taps, -1)[:, :, :1] > 0).astype(jnp.int32)  # the taps kept live
    return cache, t
def t4d_body(a, s):
    st = reset(s)
    chunk = jnp.concatenate([st.anchor[:, None], toks], axis=1)
    lg, tcache, taps = TargetLM(tcfg).apply({"params": a}, chunk, cache=st.target_cache, tap_layers=dcfg.target_layer_ids)
    rows = D.fuse_rows(dcfg, dp, jnp.concatenate(taps, axis=-1))
    keep = jnp.full((batch,), 2, jnp.int32)
    dcache = D.append_rows(dcfg, dp, st.draft_cache, rows, keep)
    carried = D.mark_carried(dcfg, dp, rows[:, 1:])
    return st.replace(target_cache=tcache.with_lengths(st.target_cache.lengths + keep), draft_cache=dcache,
                      carried=carried.astype(st.carried.dtype), anchor=argmax(lg).astype(jnp.int32)[:, 0])
def verify_body(a, s):
    return sp.verify_step(sc, a, dp, reset(s), toks, q)
calls = {"ar": functools.partial(looped(ar_body(b), N), tp, (cache, tok)),
         "t4": functools.partial(looped(t4_body, N), tp, (cache, tok)),
         "t4tap": functools.partial(looped(functools.partial(t4_body, tap=True), N), tp, (cache, tok)),
         "t4d": functools.partial(looped(t4d_body, N), tp, s),
         "verify": functools.partial(looped(verify_body, N), tp, s),
         "ar_again": functools.partial(looped(ar_body(b), N), tp, (cache, tok))}
for k, f in calls.items():
    jax.block_until_ready(f())
times = {k: [] for k in calls}
for _ in range(REPS):
    for k, f in calls.items():
        t0 = time.perf_counter(); jax.block_until_ready(f()); times[k].append(time.perf_counter() - t0)
med = {k: 1e3 * np.median(v) / N for k, v in times.items()}
print(f"P={P} dtype={dtype or 'float32'} reps={REPS}: " + ", ".join(f"{k} {v:.2f} ms ({v / med['ar']:.3f})" for k, v in med.items()))

if os.environ.get("PROFILE"):
    import tempfile
    from carryover_jax.bench.opprofile import _events, _OP
    per = {}
    for k in ("ar", "t4"):
        d = tempfile.mkdtemp()
        jax.profiler.start_trace(d)
        for _ in range(5):
            jax.block_until_ready(calls[k]())
        jax.profiler.stop_trace()
        ev = sorted((s0, e, n) for n, s0, e in _events(d) if _OP.match(n))
        ff = np.array([(e - s0) / 1e6 for s0, e, n in ev if n.startswith("ffi_call")])
        ff = np.median(ff[: len(ff) // (5 * N) * 5 * N].reshape(5 * N, -1), axis=0)
        other = sum((e - s0) / 1e6 for s0, e, n in ev if not n.startswith("ffi_call")) / (5 * N)
        per[k] = (ff[:240].reshape(30, 8).sum(0), ff[240], other)
    print("| step | k | q | v | attention | o | gate | up | down | head | other ops |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k, (layers, head, other) in per.items():
        print(f"| {k} | " + " | ".join(f"{x:.3f}" for x in layers) + f" | {head:.3f} | {other:.3f} |")
