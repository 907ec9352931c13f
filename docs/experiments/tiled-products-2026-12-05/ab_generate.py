"""AR generation's decode loop (SmolLM2, greedy, 64 new tokens after a batch of random prompts) with float32 Dense
products of 9+ rows by the products kernel's tiled loop ("tiled", `cpu_products.TILED_ROWS` = 1,024) against XLA's
dot ("xla", TILED_ROWS = 8: the program before the tiled loop), both compiled ahead of time in one process, calls
alternated, and a second "tiled" program as an A/A.

    python ab_generate.py REPS BxPROMPTxMAX_LEN[,...]

Each arm's compiled loop is checked for the kernel calls it should (and should not) make. Prints tokens per second
of the decode loop (the prefill is shared and untimed), the per-pair time ratios, and how many generated tokens the
two numerics share (the products' sums differ in order, so a near-tie may flip a greedy token)."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar
from carryover_jax.models import cpu_products as cp
from carryover_jax.numerics import Numerics

REPS, specs = int(sys.argv[1]), sys.argv[2]
NEW = 64
assert cp.available()
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="float32"))
cfg, params = target.cfg, target.params
print(cfg.numerics.describe(), flush=True)
tiled = cp.TILED_ROWS
for spec in specs.split(","):
    b, plen, max_len = map(int, spec.split("x"))
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(100, 40000, (b, plen)), jnp.int32)
    lens = jnp.asarray(rng.integers(plen // 2, plen + 1, (b,)), jnp.int32)  # rows of different lengths
    cache, logits = ar.prefill(cfg, params, toks, lens, max_len=max_len)
    args = lambda: (jax.tree.map(jnp.copy, cache), logits, jax.random.key(0), jnp.zeros((b,)),  # noqa: E731
                    jnp.full((b,), NEW, jnp.int32), jnp.full((8,), -1, jnp.int32))
    comp = {}
    for label, rows in (("tiled", tiled), ("xla", 8), ("tiled_again", tiled)):
        jax.clear_caches()
        cp.TILED_ROWS = rows
        comp[label] = ar.generate_loop.lower(cfg, params, *args(), out_size=NEW).compile()
        calls = comp[label].as_text().count(f'"{cp.TARGETS["kn", "float32"]}"')
        assert (calls > 0) == (rows > b >= 9 or rows >= b > 8), (label, calls)
    cp.TILED_ROWS = tiled
    outs = {k: np.asarray(c(params, *args()).out) for k, c in comp.items()}
    assert np.array_equal(outs["tiled"], outs["tiled_again"])
    same = float(np.mean(outs["tiled"] == outs["xla"]))
    t = {k: [] for k in comp}
    for r in range(REPS):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            a = args(); jax.block_until_ready(a)
            s = time.perf_counter(); jax.block_until_ready(comp[k](params, *a).out); t[k].append(time.perf_counter() - s)
    ratio = np.array(t["tiled"]) / np.array(t["xla"])
    aa = np.array(t["tiled_again"]) / np.array(t["tiled"])
    print(f"batch {b}, prompts {plen // 2}-{plen}, max_len {max_len}, float32: "
          + ", ".join(f"{k} {b * NEW / np.median(v):.1f} tok/s" for k, v in t.items())
          + f"; tiled/xla time per pair median {np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f}),"
          f" A/A {np.median(aa):.3f} ({aa.min():.3f}-{aa.max():.3f}), {REPS} pairs; tokens equal: {same:.1%}",
          flush=True)
