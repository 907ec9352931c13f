"""What the eval's decode loops add to a compiled step. `python loop_probe.py DRAFTER PROMPTS_PER_DATASET MAX_NEW
REPEATS`: the first N held-out prompts of each dataset (as `carryover eval` picks them), batch 1, greedy, float32,
the drafter without carried rows (as the eval's plain arm). Per prompt, after one untimed call of each, REPEATS times
round-robin, ms per round (AR: per step) of
- `spec.while`: `speculative.generate_loop` (the eval's loop: `lax.while_loop` until done);
- `spec.fori`: the same rounds from the same prefilled state as a `fori_loop` of exactly that many rounds;
- `spec.reset`: that `fori_loop` with the lengths reset to the prompt before each round (as `bench decode
  --breakdown` times a round: every round does the first round's work);
- `ar.while` / `ar.fori`: `autoregressive.generate_loop` and a `fori_loop` of the same steps.
Prints medians over prompts and each loop / AR's while loop."""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode.generate import _stop_array, pad_batch, plan_lengths
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target
from carryover_jax.numerics import argmax

path, n, max_new, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
target = load_target("smollm2")
drafter = load_drafter(path, carryover=False, numerics=target.cfg.numerics)
tcfg, tp, dcfg, dp = target.cfg, target.params, drafter.cfg, drafter.params
items, _, _ = load_items(target, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)
sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=False)
P, stops = dcfg.num_proposals, _stop_array(list(target.stop_token_ids))
out_size = next_bucket(max_new, minimum=1)  # as the eval sizes its output buffers


@jax.jit
def spec_fori(tp, dp, s, rounds):
    return jax.lax.fori_loop(0, rounds, lambda _, st: sp._round(sc, tp, dp, st), s)


@jax.jit
def spec_reset(tp, dp, s, rounds, lens):
    def body(_, st):
        st = st.replace(target_cache=st.target_cache.with_lengths(lens), draft_cache=st.draft_cache.with_lengths(lens),
                        num_out=jnp.ones_like(st.num_out), done=jnp.zeros_like(st.done),
                        rounds=jnp.zeros_like(st.rounds))
        return sp._round(sc, tp, dp, st)
    return jax.lax.fori_loop(0, rounds, body, s)


@jax.jit
def ar_fori(tp, cache, tok, steps):
    def body(_, c):
        lg, cache = ar.step(tcfg, tp, c[0], c[1])
        return cache, argmax(lg).astype(jnp.int32)
    return jax.lax.fori_loop(0, steps, body, (cache, tok))


def run(kind, it, cache_len, bucket, rounds=None, steps=None):
    """One timed call of `kind` (setup untimed); -> (seconds, rounds or steps done)."""
    ids = jnp.asarray(pad_batch([list(it.ids)], bucket))
    lens = jnp.asarray([len(it.ids)], jnp.int32)
    if kind.startswith("spec"):
        s = sp.prefill(sc, tp, dp, ids, lens, jnp.asarray([max_new], jnp.int32), jnp.zeros((1,), jnp.float32),
                       stops, jax.random.key(0), max_len=cache_len, out_size=out_size, max_rounds=out_size)
        jax.block_until_ready(s)
        t = time.perf_counter()
        if kind == "spec.while":
            s = sp.generate_loop(sc, tp, dp, s)
        elif kind == "spec.fori":
            s = spec_fori(tp, dp, s, rounds)
        else:
            s = spec_reset(tp, dp, s, rounds, lens)
        r = int(jax.device_get(s.rounds)[0])
        return time.perf_counter() - t, rounds if kind == "spec.reset" else r  # reset zeroes the count
    cache, logits = ar.prefill(tcfg, tp, ids, lens, max_len=cache_len)
    jax.block_until_ready(logits)
    t = time.perf_counter()
    if kind == "ar.while":
        st = ar.generate_loop(tcfg, tp, cache, logits, jax.random.key(0), jnp.zeros((1,), jnp.float32),
                              jnp.asarray([max_new], jnp.int32), stops, out_size=out_size)
        k = int(jax.device_get(st.num_out)[0]) - 1
    else:
        c, tok = ar_fori(tp, cache, argmax(logits).astype(jnp.int32), steps)
        jax.device_get(tok)
        k = steps
    return time.perf_counter() - t, k


kinds = ["spec.while", "spec.fori", "spec.reset", "ar.while", "ar.fori"]
rows = []
for it in items:
    bucket, cache_len = plan_lengths([len(it.ids)], [max_new + P + 1], None, tcfg.max_position_embeddings)
    _, R = run("spec.while", it, cache_len, bucket)
    _, S = run("ar.while", it, cache_len, bucket)
    for k in kinds:  # compile / warm this shape
        run(k, it, cache_len, bucket, R, S)
    ms = {k: [] for k in kinds}
    for r in range(reps):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for k in order:
            sec, done = run(k, it, cache_len, bucket, R, S)
            assert done == (R if k.startswith("spec") else S), (k, done, R, S)
            ms[k].append(1e3 * sec / done)
    rows.append({"dataset": it.dataset, "prompt": len(it.ids), "rounds": R, "steps": S,
                 **{k: float(np.median(v)) for k, v in ms.items()}})
    print(rows[-1], flush=True)

print(f"\nmedians over {len(rows)} prompts, ms per round (AR: per step), and / AR's while-loop step")
print("| loop | ms | / ar.while |")
print("|---|---|---|")
arw = np.median([r["ar.while"] for r in rows])
for k in kinds:
    m = float(np.median([r[k] for r in rows]))
    print(f"| {k} | {m:.2f} | {m / arw:.3f} |")
print("per prompt spec.while / spec.fori:", np.round(np.median([r["spec.while"] / r["spec.fori"] for r in rows]), 3),
      " spec.fori / spec.reset:", np.round(np.median([r["spec.fori"] / r["spec.reset"] for r in rows]), 3),
      " ar.while / ar.fori:", np.round(np.median([r["ar.while"] / r["ar.fori"] for r in rows]), 3))
