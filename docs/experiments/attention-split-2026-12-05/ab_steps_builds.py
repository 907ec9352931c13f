"""AR step and verification (SmolLM2, batch 1, a random 2-layer DFlash drafter with the default recipe's shape), each
inside a compiled 32-step loop, with this checkout's cache attention kernel ("current") against another build of
`cpu_attention.cc` ("other", built as `../attention-prefetch-2026-12-05/ab_generate_builds.py`'s docstring shows),
both in one process, calls alternated; both arms must give the same states.

    python ab_steps_builds.py OTHER.so P REPS PROMPT MAX_LEN [DTYPE]

Prints ms per step and the per-pair ratio current / other for the AR step and the verification, and verify / AR."""
import ctypes, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.decode import speculative as sp
from carryover_jax.models import cpu_attention as ca, cpu_kernels

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verify-rows-2026-12-05"))
from batch1 import ar_body, looped, prefilled, setup  # noqa: E402

so, P, REPS, prompt_len, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dtype = sys.argv[6] if len(sys.argv) > 6 else None
N = 32
lib = ctypes.cdll.LoadLibrary(str(cpu_kernels.build()) if so == "current" else so)
current = dict(ca.TARGETS)
other = {key: f"other_{name}" for key, name in current.items()}
for key, symbol in ca.SYMBOLS.items():
    jax.ffi.register_ffi_target(other[key], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
b = setup(P, dtype, prompt_len)
tcfg, dp, sc, lens, reset, tp = b.tcfg, b.dp, b.sc, b.lens, b.reset, b.tp
bx = prefilled(b, L)
cache, tok, s, toks, q = bx["cache"], bx["tok"], bx["s"], bx["toks"], bx["q"]


def verify_body(a, st):
    return sp.verify_step(sc, a, dp, reset(st), toks, q)


comp = {}
for label, names in (("current", current), ("other", other)):
    jax.clear_caches()
    ca.TARGETS.clear(); ca.TARGETS.update(names)
    for step, body, carry in (("ar", ar_body(b), (cache, tok)), ("verify", verify_body, s)):
        c = looped(body, N).lower(tp, carry).compile()
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
