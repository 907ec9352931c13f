"""AR step and verification (SmolLM2, batch 1, a random 2-layer DFlash drafter with the default recipe's shape), each
inside a compiled 32-step loop, with this checkout's cache attention kernel ("current") against another build of
`cpu_attention.cc` ("other", built as `../attention-prefetch-2026-12-05/ab_generate_builds.py`'s docstring shows),
both in one process, calls alternated; both arms must give the same states.

    python ab_steps_builds.py OTHER.so P REPS PROMPT MAX_LEN [DTYPE]

Prints ms per step and the per-pair ratio current / other for the AR step and the verification, and verify / AR."""
import ctypes, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target, init_drafter
from carryover_jax.decode import autoregressive as ar, speculative as sp
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode.sampling import argmax
from carryover_jax.models import cpu_attention as ca, cpu_kernels

so, P, REPS, prompt_len, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dtype = sys.argv[6] if len(sys.argv) > 6 else None
N = 32
lib = ctypes.cdll.LoadLibrary(str(cpu_kernels.build()) if so == "current" else so)
current = dict(ca.TARGETS)
other = {key: f"other_{name}" for key, name in current.items()}
for key, symbol in ca.SYMBOLS.items():
    jax.ffi.register_ffi_target(other[key], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
target = load_target("smollm2", dtype=dtype)
drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=P, num_layers=2,
                       draft_vocab=tuple(range(8192)))
tcfg, dcfg, tp, dp = target.cfg, drafter.cfg, target.params, drafter.params
sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=dcfg.carryover)
rng = np.random.default_rng(0)
tokens = np.zeros((1, next_bucket(prompt_len)), np.int32)
tokens[:, :prompt_len] = rng.integers(10, tcfg.vocab_size, (1, prompt_len))
tokens, lens = jnp.asarray(tokens), jnp.full((1,), prompt_len, jnp.int32)


def reset(s):
    return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                     draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                     rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))


cache, logits = ar.prefill(tcfg, tp, tokens, lens, max_len=L)
s = sp.prefill(sc, tp, dp, tokens, lens, jnp.full((1,), P + 2, jnp.int32), jnp.zeros((1,)),
               jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=L, out_size=P + 2)
toks, q, _ = sp.draft_step(sc, tp, dp, reset(s))
tok = jnp.argmax(logits, -1).astype(jnp.int32)


def ar_body(a, c):
    cache, tok = c
    lg, cache = ar.step(tcfg, a, cache.with_lengths(lens + 0), tok)
    return cache, argmax(lg).astype(jnp.int32)


def verify_body(a, st):
    return sp.verify_step(sc, a, dp, reset(st), toks, q)


def looped(body):
    return jax.jit(lambda args, carry: jax.lax.fori_loop(0, N, lambda _, c: body(args, c), carry))


comp = {}
for label, names in (("current", current), ("other", other)):
    jax.clear_caches()
    ca.TARGETS.clear(); ca.TARGETS.update(names)
    for step, body, carry in (("ar", ar_body, (cache, tok)), ("verify", verify_body, s)):
        c = looped(body).lower(tp, carry).compile()
        text, rest = c.as_text(), other if label == "current" else current
        assert any(t in text for t in names.values()) and not any(f'"{t}"' in text for t in rest.values()), label
        comp[label, step] = (c, carry)
ca.TARGETS.clear(); ca.TARGETS.update(current)
for step in ("ar", "verify"):
    a, b = (jax.tree.leaves(comp[k, step][0](tp, comp[k, step][1])) for k in ("current", "other"))
    raw = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x  # noqa: E731
    assert all(np.array_equal(np.asarray(raw(x)), np.asarray(raw(y))) for x, y in zip(a, b)), step
t = {k: [] for k in comp}
for r in range(REPS):
    for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
        f, carry = comp[k]
        s0 = time.perf_counter(); jax.block_until_ready(f(tp, carry)); t[k].append((time.perf_counter() - s0) / N)
med = {k: 1e3 * np.median(v) for k, v in t.items()}
for step in ("ar", "verify"):
    ratio = np.array(t["current", step]) / np.array(t["other", step])
    print(f"P={P} prompt {prompt_len} max_len {L} {dtype or 'float32'} {step}: current {med['current', step]:.2f} ms, "
          f"other {med['other', step]:.2f} ms; current/other per pair {np.median(ratio):.3f} "
          f"({ratio.min():.3f}-{ratio.max():.3f}, {REPS} pairs)")
for k in ("current", "other"):
    print(f"  {k}: verify / AR {med[k, 'verify'] / med[k, 'ar']:.3f}")
