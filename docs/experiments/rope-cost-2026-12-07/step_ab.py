"""What the exact float32 RoPE (`layers.apply_rope(exact="float32")`, the CPU default since 2026-12-07) costs
SmolLM2's batch-1 target passes against HF's form (`exact=None`), in one process: `python step_ab.py LIVE ROUNDS
OUT.json`. Four programs, each the target's forward (float32, the CPU defaults) over a cache holding LIVE prompt
tokens, compiled with the RoPE form patched in at trace time: a 1-token AR step and a 4-row verification block
(P = 3), under each form. Timed by `bench.steps.rotated_seconds` (order rotated each round); prints each program's
median and exact ÷ HF with the project's paired bootstrap over rounds."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode import autoregressive
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.models import layers
from carryover_jax.models.target import TargetLM

live, rounds, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
t = load_target("smollm2", tokenizer=False)
cfg, params = t.cfg, t.params
prompt = jnp.asarray(np.random.default_rng(0).integers(100, 20000, (1, live)), jnp.int32)
cache, _ = autoregressive.prefill(cfg, params, prompt, jnp.array([live], jnp.int32), max_len=256)
exact_rope = layers.apply_rope


def forward(params, cache, toks):
    return TargetLM(cfg).apply({"params": params}, toks, cache=cache)[0]


def program(form, rows):
    toks = jnp.full((1, rows), 7, jnp.int32)
    layers.apply_rope = exact_rope if form == "exact" else (lambda x, pos, inv, exact=None: exact_rope(x, pos, inv))
    try:
        fn = jax.jit(forward).lower(params, cache, toks).compile()
    finally:
        layers.apply_rope = exact_rope
    return lambda: fn(params, cache, toks)


calls = {f"{form}_{rows}": program(form, rows) for form in ("exact", "hf") for rows in (1, 4)}
for c in calls.values():
    jax.block_until_ready(c())
secs = rotated_seconds(calls, rounds)
res = {}
for rows in (1, 4):
    ex, hf = secs[f"exact_{rows}"], secs[f"hf_{rows}"]
    ratio, lo, hi = speed_ratio(ex, hf)
    res[rows] = {"exact_ms": 1e3 * float(np.median(ex)), "hf_ms": 1e3 * float(np.median(hf)), "exact_over_hf": ratio,
                 "ci95": [lo, hi]}
    print(f"rows {rows}: exact {res[rows]['exact_ms']:.2f} ms, HF {res[rows]['hf_ms']:.2f} ms, exact / HF "
          f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]", flush=True)
with open(out, "w") as f:
    json.dump({"live": live, "rounds": rounds, "results": res, "seconds": secs}, f, indent=1)
