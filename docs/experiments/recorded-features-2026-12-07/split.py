"""Time prepare batches (the code before recorded features): the generation that writes the replies against the
feature pass over the finished records, recipe numerics (--dtype bfloat16), batches 100-103 of the ShareGPT plan.
Usage: python split.py (from the repo root, in a checkout of the commit before recorded features)"""
import time, argparse, jax
from carryover_jax.config import apply_overrides
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.numerics import Numerics
from carryover_jax.train import responses as R
cfg = apply_overrides(load_config("smollm2"), ["data.max_prompts=18432", "data.store_kv=None"])
spec = Numerics.from_args(argparse.Namespace(dtype="bfloat16"))
cfg = cfg.replace(numerics=cfg.numerics.replace(**{k: v for k, v in vars(spec).items() if v is not None}), compute_dtype=None)
num = cfg.run_numerics(prepare=True); print(num.describe())
target = load_target(cfg.target, numerics=num)
plan = R.Plan(cfg.data, target, 0, 1)
size = 32
batches = R._batches(plan, size)
for i, batch in enumerate(batches):
    if i < 100: continue   # past the held store's first batches (and away from the window's shortest prompts)
    todo = [(c, ids) for _, c, ids in batch]
    t0 = time.perf_counter(); recs, sk = R._replay_batch(cfg.data, target, todo, i); t1 = time.perf_counter()
    outs = R.target_features(target, [r["input_ids"] for r in recs], cfg.data.feature_layer_ids, batch_rows=size)
    t2 = time.perf_counter()
    L = [len(r["input_ids"]) for r in recs]; G = [sum(r["loss_mask"]) for r in recs]
    print(f"batch {i}: gen {t1-t0:.1f}s feat {t2-t1:.1f}s  rows {len(recs)} maxlen {max(L)} mean gen {sum(G)/len(G):.0f} max prompt {max(l-g for l,g in zip(L,G))}", flush=True)
    if i >= 103: break
