"""How far each store's bfloat16 features are from the float32 target's: the same records' sequences through the
feature pass of a float32 target (`target_features`, float32 params, compute and products, then rounded to
bfloat16 as a store keeps them), and per store the relative RMS distance of its features, last hidden states and
log-sum-exps from those (over the first N records both stores hold with the same tokens).
Usage: python f32_distance.py STORE_A STORE_B [N]"""
import sys

import numpy as np
from carryover_jax.configs import load_config

from carryover_jax.config import apply_overrides
from carryover_jax.loading import load_target
from carryover_jax.train.responses import target_features
from carryover_jax.train.store import ResponseStore

a, b = ResponseStore(sys.argv[1]), ResponseStore(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 32
cfg = apply_overrides(load_config("smollm2"), [])
target = load_target(cfg.target)  # float32 on CPU
where = {cid: i for i, cid in enumerate(b.ids())}
pairs = []
for i, cid in enumerate(a.ids()):
    ra, rb = a[i], b[where[cid]]
    if np.array_equal(ra["input_ids"], rb["input_ids"]):
        pairs.append((ra, rb))
    if len(pairs) == n:
        break
sums = {}
for j in range(0, len(pairs), 8):
    chunk = pairs[j:j + 8]
    refs = target_features(target, [ra["input_ids"].tolist() for ra, _ in chunk], tuple(cfg.data.feature_layer_ids))
    for (ra, rb), ref in zip(chunk, refs):
        for k in ("features", "last_hidden", "target_lse"):
            r = ref[k].astype(np.float64)
            for name, rec in (("A", ra), ("B", rb)):
                e = sums.setdefault((k, name), [0.0, 0.0])
                e[0] += float(((rec[k].astype(np.float64) - r) ** 2).sum())
                e[1] += float((r ** 2).sum())
print(f"{len(pairs)} records with the same tokens in both stores; relative RMS distance from the float32 target's")
for k in ("features", "last_hidden", "target_lse"):
    da, db = (np.sqrt(sums[k, s][0] / sums[k, s][1]) for s in "AB")
    print(f"{k}: A {da:.4g}  B {db:.4g}  (B / A {db / da:.3f})")
