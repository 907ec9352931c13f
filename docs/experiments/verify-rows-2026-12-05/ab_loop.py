"""AR step, verification and round at batch 1 on SmolLM2, each timed inside a compiled 32-step loop (as
`bench decode --breakdown` and `bench roofline` time them), this checkout's CPU products kernel ("current")
against another build of `cpu_products.cc` ("other"), both compiled in one process and their calls alternated.

    python ab_loop.py OTHER.so P REPS [DTYPE]

OTHER.so: a library built from another `cpu_products.cc`, e.g. the one before 2026-12-05 (063a36b):
    git show 063a36b:carryover_jax/models/cpu_products.cc > /tmp/old/cpu_products.cc
    g++ -O3 -std=c++17 -shared -fPIC -march=native -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \\
        -I carryover_jax/models /tmp/old/cpu_products.cc -o /tmp/old.so
registered under its own target names; `current` as OTHER.so is an A/A (this build against itself under a
second set of names). OTHER_NK_ROWS=4: the other arm sends a tied head of more rows to XLA's dot (the kernel's
limit before 2026-12-05). P: proposals of a random 2-layer DFlash drafter with an 8,192-token draft vocabulary
(the default recipe's shape). Both arms must give the same outputs; each arm's compiled programs are checked for
the kernel names they call."""
import ctypes, functools, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.bench.decode import _in_loop_ms, LOOP_STEPS
from carryover_jax.models import cpu_kernels, cpu_products as cp
from batch1 import prefilled, setup

so, P, REPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dtype = sys.argv[4] if len(sys.argv) > 4 else None
assert cp.available()
lib = ctypes.cdll.LoadLibrary(str(cpu_kernels.build()) if so == "current" else so)
current = dict(cp.TARGETS)
other = {key: f"other_{name}" for key, name in current.items()}
for key, symbol in cp.SYMBOLS.items():
    jax.ffi.register_ffi_target(other[key], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
max_rows = {"current": dict(cp.MAX_ROWS),
            "other": {**cp.MAX_ROWS, "nk": int(os.environ.get("OTHER_NK_ROWS", cp.MAX_ROWS["nk"]))}}

b = setup(P, dtype)
tcfg, tp, dp, sc, lens, reset, prompt_len, L = b.tcfg, b.tp, b.dp, b.sc, b.lens, b.reset, b.prompt_len, 1024


def arm(names, rows):
    """The three looped programs, traced afresh with `names` as the products kernel's targets."""
    jax.clear_caches()
    cp.TARGETS.clear(); cp.TARGETS.update(names)
    cp.MAX_ROWS.clear(); cp.MAX_ROWS.update(rows)
    bx = prefilled(b, L)
    captured = {}
    real_jit = jax.jit

    def spy(f, *a, **k):  # keep _in_loop_ms's jitted loops to time them here, alternated with the other arm's
        j = real_jit(f, *a, **k)
        captured[len(captured)] = j
        return j

    jax.jit = spy
    try:  # one untimed pass compiles them (repeats=1)
        _in_loop_ms(sc, tp, dp, {L: bx}, lens, reset, 1, False)
    finally:
        jax.jit = real_jit
    return bx, captured


progs = {}
for label, names in (("current", current), ("other", other)):
    bx, jits = arm(names, max_rows[label])
    args = {"ar": (tp, (bx["cache"], bx["tok"])), "verify": ((tp, dp, bx["toks"], bx["q"]), bx["s"]),
            "round": ((tp, dp), bx["s"])}
    # compiled ahead of time: the next arm's jax.clear_caches() must not send these calls back to tracing (with
    # the other arm's kernel names)
    compiled = {k: j.lower(*args[k]).compile() for k, j in zip(("ar", "verify", "round"), (jits[0], jits[1], jits[2]))}
    hlo = "".join(c.as_text() for c in compiled.values())
    rest = other if label == "current" else current
    assert any(t in hlo for t in names.values()) and not any(f'"{t}"' in hlo for t in rest.values()), label
    for k, c in compiled.items():
        progs[(label, k)] = functools.partial(c, *args[k])
cp.TARGETS.clear(); cp.TARGETS.update(current)
cp.MAX_ROWS.clear(); cp.MAX_ROWS.update(max_rows["current"])
def host(tree):  # every array leaf, PRNG keys as their data
    return [np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(tree)]


outs = {k: host(jax.block_until_ready(f())) for k, f in progs.items()}
for k in ("ar", "verify", "round"):
    same = all(np.array_equal(a, b) for a, b in zip(outs[("current", k)], outs[("other", k)]))
    print(f"{k}: current and other outputs {'identical' if same else 'DIFFER'}", flush=True)
ts = {k: [] for k in progs}
keys = list(progs)
for i in range(REPS):
    for k in (keys if i % 2 == 0 else keys[::-1]):
        t = time.perf_counter(); jax.block_until_ready(progs[k]()); ts[k].append(time.perf_counter() - t)
ms = {k: 1e3 * float(np.median(v)) / LOOP_STEPS for k, v in ts.items()}
print(f"P={P} ({P + 1} verify rows), batch 1, cache {L}, prompt {prompt_len}, {tcfg.numerics.dtype}, "
      f"{REPS} alternated calls of {LOOP_STEPS}-step loops; other: {so}"
      f" (tied head up to {max_rows['other']['nk']} rows); ms per step (medians):")
for label in ("current", "other"):
    a = ms[(label, "ar")]
    print(f"  {label:9s} AR {a:6.2f}  verify {ms[(label, 'verify')]:6.2f}  round {ms[(label, 'round')]:6.2f}"
          f"  verify/AR {ms[(label, 'verify')] / a:.3f}  round/AR {ms[(label, 'round')] / a:.3f}")
for k in ("ar", "verify", "round"):
    r = np.array(ts[("current", k)]) / np.array(ts[("other", k)])
    print(f"  {k} current/other per pair: median {np.median(r):.3f}, range {r.min():.3f}-{r.max():.3f}")
