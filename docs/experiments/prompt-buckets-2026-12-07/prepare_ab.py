"""Prompt buckets in prepare's regeneration: `generate` as prepare calls it (bf16 target, batches of 32 prompts of at
most 192 tokens sorted by length within a window of 8 batches, 128 new tokens, greedy, the store's feature layers
recorded), each batch with the power-of-two bucket and with `prompt_bucket`, in one process:
`python prepare_ab.py N_BATCHES OUT.json` (`python prepare_ab.py --report OUT.json`: the tables again). Prompts: the
ShareGPT held-out prompts with the chat template (as the eval picks them; prepare's own are the training split's).
Per batch: each arm's prefill compiled first (untimed; and the decode loop once for every cache size), then one timed
call of each, the order alternated by batch; both arms' tokens must be equal. Prints each arm's prefill, whole-call
time and batch tokens per second, and new / old over the batches with the project's paired bootstrap."""
import json
import sys

import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import generate as gen
from carryover_jax.decode.buckets import next_bucket, prompt_bucket
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_target

BATCH, MAX_NEW, LAYERS = 32, 128, (1, 8, 14, 20, 27)
BUCKETS = {"old": next_bucket, "new": prompt_bucket}


def call(target, loops, arm, batch, timed):
    gen.prompt_bucket = BUCKETS[arm]  # what plan_lengths pads a prompt to
    lens = [len(p) for p in batch]
    bucket, cache_len = gen.plan_lengths(lens, [MAX_NEW] * len(batch), None, target.cfg.max_position_embeddings)
    if not timed:  # compile this arm's prefill (and the loop for a new cache size) outside the timing
        ar.prefill(target.cfg, target.params, jnp.asarray(gen.pad_batch(batch, bucket)), jnp.asarray(lens, jnp.int32),
                   max_len=cache_len, record=LAYERS)[1].block_until_ready()
        if cache_len not in loops:
            gen.generate(target, batch, max_new_tokens=MAX_NEW, chat=False, features=LAYERS)
            loops.add(cache_len)
        return bucket
    g = gen.generate(target, batch, max_new_tokens=MAX_NEW, chat=False, features=LAYERS)
    assert not g[0].stats["includes_compile"]
    return [r.token_ids for r in g], g[0].stats


def measure(n_batches, out):
    target = load_target("smollm2", dtype="bfloat16")
    items, _, _ = load_items(target, ["sharegpt"], prompts_per_dataset=BATCH * n_batches, max_prompt_tokens=192,
                             system=None, heldout_per_mille=None, chat=True)
    prompts = sorted((list(it.ids) for it in items), key=len)
    rows, loops = [], set()
    for b in range(len(prompts) // BATCH):
        batch = prompts[b * BATCH:(b + 1) * BATCH]
        row = {"batch": b, "longest": len(batch[-1]), "bucket": {a: call(target, loops, a, batch, False)
                                                                 for a in BUCKETS}}
        toks = {}
        for a in (["old", "new"] if b % 2 == 0 else ["new", "old"]):
            toks[a], st = call(target, loops, a, batch, True)
            row[a] = {k: st[k] for k in ("prefill_s", "time_s", "batch_tokens_per_s")}
        assert toks["old"] == toks["new"], b
        rows.append(row)
        print(b + 1, row, flush=True)
    json.dump({"batch": BATCH, "max_new_tokens": MAX_NEW, "rows": rows}, open(out, "w"), indent=1)
    return rows


rows = json.load(open(sys.argv[2]))["rows"] if sys.argv[1] == "--report" else measure(int(sys.argv[1]), sys.argv[2])


def ci(key):
    """Σ new / Σ old over batches with its 95% interval."""
    x = np.array([r["new"][key] / r["old"][key] for r in rows])
    w = np.array([r["old"][key] for r in rows])
    b = paired_bootstrap(x, np.ones_like(x), wa=w, wb=w)
    if b["gain_pct_ci"] is None:  # too few batches for an interval
        return f"{1 + b['gain_pct'] / 100:.3f}"
    lo, hi = (1 + g / 100 for g in b["gain_pct_ci"])
    return f"{1 + b['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]"


print("\n| batch | longest prompt | bucket old / new | prefill s old / new | call s old / new | tokens/s old / new |")
print("|---|---|---|---|---|---|")
for r in rows:
    o, n = r["old"], r["new"]
    print(f"| {r['batch'] + 1} | {r['longest']} | {r['bucket']['old']} / {r['bucket']['new']} | "
          f"{o['prefill_s']:.2f} / {n['prefill_s']:.2f} | {o['time_s']:.2f} / {n['time_s']:.2f} | "
          f"{o['batch_tokens_per_s']:.0f} / {n['batch_tokens_per_s']:.0f} |")
print(f"\nnew / old over {len(rows)} batches: prefill {ci('prefill_s')}, call {ci('time_s')}")
