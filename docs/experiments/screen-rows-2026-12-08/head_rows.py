"""The screened head (`cpu_products.head_argmax`) against the float32 head's logits and argmax (`TargetLM.head`, as the
decode steps take it without the screen) at R rows of SmolLM2's states (the first 400 tokens of docs/design.md),
alternated with an A/A arm (the reference compiled again); median ms, the median per-pair ratio and its
10th-90th percentiles; the same tokens checked.

    python head_rows.py REPEATS ROWS..."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import argmax
t = load_target("smollm2"); cfg, params = t.cfg, t.params
screen = t.greedy_screen(); e = params["embed_tokens"]["embedding"]
ids = jnp.asarray(t.tokenizer(open("/work/main/docs/design.md").read())["input_ids"][:400])[None]
h = TargetLM(cfg).apply({"params": params}, ids, with_hidden=True)[3][0]
head = lambda x: TargetLM(cfg).apply({"params": params}, x, method=TargetLM.head)
arms = {"screen": jax.jit(lambda x: cp.head_argmax(x, e, screen.bits, screen.norms)),
        "full": jax.jit(lambda x: argmax(head(x[None]))[0])}
arms["full again"] = jax.jit(arms["full"].__wrapped__)  # the A/A: the same function, compiled again
reps = int(sys.argv[1])
for r in [int(a) for a in sys.argv[2:]]:
    for f in arms.values(): jax.block_until_ready(f(h[:r]))
    tt = {k: [] for k in arms}
    for rep in range(reps):
        x = h[(rep * r) % (400 - r):(rep * r) % (400 - r) + r]
        outs = {}
        for k in list(arms)[rep % 3:] + list(arms)[:rep % 3]:
            t0 = time.perf_counter()
            outs[k] = np.asarray(jax.block_until_ready(arms[k](x)))
            tt[k].append(time.perf_counter() - t0)
        assert (outs["screen"] == outs["full"]).all(), (outs, r)
    rr = np.array(tt["screen"]) / np.array(tt["full"])
    aa = np.array(tt["full again"]) / np.array(tt["full"])
    print(f"rows {r}: screen {np.median(tt['screen'])*1e3:.2f} ms, full head {np.median(tt['full'])*1e3:.2f} ms, "
          f"screen/full per pair {np.median(rr):.3f} "
          f"[{np.percentile(rr, 10):.3f}-{np.percentile(rr, 90):.3f}]; same tokens; A/A {np.median(aa):.3f} "
          f"[{np.percentile(aa, 10):.3f}-{np.percentile(aa, 90):.3f}]")
