"""The share of the held-out rollouts' tokens inside each drafter's draft vocabulary (a token outside it is one the
drafter never proposes), per eval set and over the three. Usage, from the repo root after ab.sh:
python docs/experiments/sampled-replies-2026-12-07/coverage.py NAME=DRAFTER_DIR ...   (rollouts of runs/selfab)"""
import json
import sys

import numpy as np

from carryover_jax import load_target
from carryover_jax.eval.datasets import iter_dataset
from carryover_jax.eval.offline import rollout_key

ROLLOUTS = "runs/selfab/rollouts/rollouts.jsonl"  # recorded by the bf16 offline eval, 64 new tokens, T = 0
target = load_target("smollm2")
rows = {r["key"]: r["tokens"] for r in map(json.loads, open(ROLLOUTS))}
tid, stops = f"{target.path}|bfloat16", list(target.stop_token_ids)
held = {}
for ds in ("sharegpt", "humaneval", "mtbench"):
    toks = []
    for it in list(iter_dataset(ds))[:400]:
        key = rollout_key(tid, target.encode(list(it.messages)), max_new_tokens=64, temperature=0.0, seed=0, top_k=0,
                          top_p=1.0, stop_token_ids=stops)
        toks += rows.get(key, [])
    held[ds] = np.array(toks)
held["all"] = np.concatenate(list(held.values()))
print("| drafter | " + " | ".join(f"{ds} ({len(t)} tokens)" for ds, t in held.items()) + " |")
print("|---|" + "---|" * len(held))
for spec in sys.argv[1:]:
    name, _, path = spec.partition("=")
    vocab = np.zeros(target.cfg.vocab_size, bool)
    vocab[json.load(open(f"{path}/drafter_config.json"))["draft_vocab"]] = True
    print(f"| {name} | " + " | ".join(f"{vocab[t].mean():.2%}" for t in held.values()) + " |")
