"""Where a request's time goes in `carryover eval`'s batch-1 path: prefill and decode loop, AR and speculative,
with the cache length each planned. `python split_probe.py DRAFTER PROMPTS_PER_DATASET MAX_NEW REPEATS`: the first
N held-out prompts of each dataset (as the eval picks them), each decoded by AR and by the drafter REPEATS times,
alternated, after one untimed call per compiled shape; per dataset the medians over prompts of AR's prefill and
decode (ms a token) and the drafter's prefill and decode (ms a round), and round / AR step from the decode loops
alone."""
import sys
import numpy as np
from carryover_jax.decode.generate import generate, plan_lengths, speculative_generate
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target

path, n, max_new, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
target = load_target("smollm2")
drafter = load_drafter(path, carryover=False)
items, _, _ = load_items(target, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)
P = drafter.cfg.num_proposals
rows = {}
for it in items:
    ids = [list(it.ids)]
    ar_call = lambda: generate(target, ids, max_new_tokens=max_new, chat=False)[0].stats
    sp_call = lambda: speculative_generate(target, drafter, ids, carryover=False, max_new_tokens=max_new, chat=False)
    ar_call(), sp_call()                                          # compile (or reuse) this prompt's shapes
    a, s = [], []
    for r in range(reps):
        for m in ((0, 1) if r % 2 == 0 else (1, 0)):
            if m == 0:
                a.append(ar_call())
            else:
                _, st = sp_call()
                s.append(st)
    new = s[0]["new_tokens"]                      # AR's count too: at T = 0 both make the same tokens
    ar_cache = plan_lengths([len(it.ids)], [max_new], None, target.cfg.max_position_embeddings)
    sp_cache = plan_lengths([len(it.ids)], [max_new + P + 1], None, target.cfg.max_position_embeddings)
    rows.setdefault(it.dataset, []).append(dict(
        prompt=len(it.ids), ar_pre=np.median([x["prefill_s"] for x in a]) * 1e3,
        ar_tok=np.median([x["decode_s"] for x in a]) * 1e3 / new,
        sp_pre=np.median([x["prefill_s"] for x in s]) * 1e3,
        sp_round=np.median([x["decode_s"] for x in s]) * 1e3 / s[0]["rounds"],
        caches=f"{ar_cache[1]}/{sp_cache[1]}"))
print("| dataset | prompts | prompt tokens | AR prefill, ms | AR decode, ms a token | drafter prefill, ms | "
      "drafter decode, ms a round | round / AR token (decode loops) | caches AR / drafter (most common) |")
print("|---|---|---|---|---|---|---|---|---|")
for ds, rs in list(rows.items()) + [("all", [r for v in rows.values() for r in v])]:
    med = lambda k: float(np.median([r[k] for r in rs]))
    caches = max({r["caches"] for r in rs}, key=[r["caches"] for r in rs].count)
    print(f"| {ds} | {len(rs)} | {med('prompt'):.0f} | {med('ar_pre'):.0f} | {med('ar_tok'):.2f} | "
          f"{med('sp_pre'):.0f} | "
          f"{med('sp_round'):.2f} | {med('sp_round') / med('ar_tok'):.3f} | {caches} |")
