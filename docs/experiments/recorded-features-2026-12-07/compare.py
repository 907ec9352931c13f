"""Two stores of the same prompts, record by record: the same ids, tokens and loss masks, and how far apart their
stored features, last hidden states and log-sum-exps are (max |a - b| over all tokens, and the share of bfloat16
values that differ). Usage: python compare.py STORE_A STORE_B"""
import sys

import numpy as np

from carryover_jax.train.store import ResponseStore

a, b = ResponseStore(sys.argv[1]), ResponseStore(sys.argv[2])
ia, ib = a.ids(), b.ids()
assert sorted(ia) == sorted(ib), "the stores hold other conversations"
where = {cid: i for i, cid in enumerate(ib)}
same_tokens = diff = 0
worst = {}
changed = {}
sizes = {}
lse_diffs = []
for i, cid in enumerate(ia):
    ra, rb = a[i], b[where[cid]]
    if not (np.array_equal(ra["input_ids"], rb["input_ids"]) and np.array_equal(ra["loss_mask"], rb["loss_mask"])):
        diff += 1
        continue
    same_tokens += 1
    for k in ("features", "last_hidden", "target_lse"):
        x, y = ra[k].astype(np.float32), rb[k].astype(np.float32)
        d = np.abs(x - y)
        worst[k] = max(worst.get(k, 0.0), float(d.max()))
        rel = d / np.maximum(np.abs(x), 1e-3)
        worst[k + " rel (median)"] = max(worst.get(k + " rel (median)", 0.0), float(np.median(rel)))
        changed[k] = changed.get(k, 0) + int((x != y).sum())
        sizes[k] = sizes.get(k, 0) + x.size
        if k == "target_lse":
            lse_diffs.append(d.ravel())
print(f"{len(ia)} records: {same_tokens} with the same tokens and loss mask, {diff} with other tokens")
for k in ("features", "last_hidden", "target_lse"):
    print(f"{k}: max |a - b| {worst[k]:.4g}, largest per-record median relative difference "
          f"{worst[k + ' rel (median)']:.3g}, values that differ {changed[k] / sizes[k]:.1%} of {sizes[k]:,}")
if lse_diffs:
    d = np.concatenate(lse_diffs)
    q = np.percentile(d, [50, 99, 99.9])
    print(f"target_lse |a - b| over {d.size:,} positions: median {q[0]:.2g}, 99th percentile {q[1]:.2g}, "
          f"99.9th {q[2]:.2g}, above 0.01 at {int((d > 0.01).sum())}")
