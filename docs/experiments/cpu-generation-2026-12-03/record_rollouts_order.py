# Measured at commit d8a00f4 (record_rollouts kept the items' order then; since, it sorts them itself, so "unsorted"
# reproduces only on that commit).
import sys, time, json
from carryover_jax.loading import load_target
from carryover_jax.eval.run import load_items
from carryover_jax.eval.offline import record_rollouts
import numpy as np
variant, n = sys.argv[1], int(sys.argv[2])
t = load_target("smollm2")
items, _, _ = load_items(t, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=400, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)
items = items[:: max(1, len(items) // n)][:n]
lens = [len(i.ids) for i in items]
if variant == "sorted":
    items = sorted(items, key=lambda i: len(i.ids))
s = time.perf_counter()
rec = record_rollouts(t, items, max_new_tokens=64, temperatures=[0.0], seeds=1, batch_size=16, progress=False)
el = time.perf_counter() - s
print(json.dumps({"variant": variant, "items": len(items), "total_items": None, "mean_len": float(np.mean(lens)),
                  "max_len": max(lens), "seconds": round(el, 1), "tokens": sum(len(r["tokens"]) for r in rec)}))
