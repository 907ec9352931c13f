"""Offline τ of a drafter with its draft vocabulary extended, per rollout, by the prompt's own tokens outside it (up
to M of them): the extra rows are the target head's rows of those tokens (the rows the draft head starts from), so
the drafter can propose an identifier or a name the reply copies from the prompt. Greedy (T = 0), DFlash drafters;
the same held-out rollouts as `carryover eval --offline` (its rollout cache), each drafter with and without the
extension, paired per rollout. Verification is untouched, so decoding with the extension stays lossless; this only
asks whether it would raise τ before the engine grows it.

    [PROMPTS=400] python prompt_vocab.py ROLLOUT_CACHE M LABEL=DRAFTER [LABEL=DRAFTER ...]

The unextended arm is checked against the eval's own `offline.acceptance` on every batch (the same 0/1 per slot).
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.eval import offline as O
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.eval.run import load_items
from carryover_jax.numerics import argmax
from carryover_jax.loading import load_drafter, load_target
from carryover_jax.models.drafter import (Drafter, cap_logits, draft_index_table, frozen_from_target, frozen_head,
                                          in_head_dtype)
from carryover_jax.train import anchors as A
from carryover_jax.train.losses import chunked_rows, proposal_hidden

DATASETS = ["sharegpt", "humaneval", "mtbench"]
BATCH = 16


def prompt_extra(ids, lm, table, m: int):
    """[B, M] the prompt's distinct tokens outside the draft vocabulary (ascending ids, the first M), -1 after."""
    v = table.shape[0]
    prompt = jnp.cumsum(lm, axis=1) == 0  # positions before the first generated token
    cand = jnp.where(prompt & (table[ids] < 0), ids, v)
    s = jnp.sort(cand, axis=1)
    first = (s < v) & (s != jnp.pad(s[:, :-1], ((0, 0), (1, 0)), constant_values=-1))
    slot = jnp.where(first, jnp.cumsum(first, axis=1) - 1, m)
    rows = jnp.arange(s.shape[0])[:, None]
    return jnp.full((s.shape[0], m), -1, jnp.int32).at[rows, slot].set(s.astype(jnp.int32), mode="drop")


@functools.partial(jax.jit, static_argnames=("oc", "m"))
def acceptance(oc, m: int, target_params, draft_params, feats, ids, lm, anchors, keep):
    """[B, N, P] 0/1: greedy proposals over the draft vocabulary plus each row's prompt extension equal the labels."""
    dc = oc.drafter
    frozen = frozen_from_target(target_params, oc.target)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, jnp.sum(keep, axis=1))
    h = proposal_hidden(draft_params, dc, frozen, feats, blk)  # [B, N, P, d]
    b, n, p, d = h.shape
    # the draft logits [B, N, P, K] in the chunks `train.dvd.draft_proposals` takes (the same bits as the eval's)
    z = chunked_rows(lambda hc: Drafter(dc).apply({"params": draft_params}, hc, frozen, method=Drafter.logits),
                     (h.reshape(b * n, p, d),), max(1, oc.loss.chunk_rows // p)).reshape(b, n, p, -1)
    vocab = jnp.asarray(np.asarray(dc.draft_vocab, np.int32))
    if m:
        table = jnp.asarray(draft_index_table(dc.draft_vocab, oc.target.vocab_size))
        extra = prompt_extra(ids, lm, table, m)  # [B, M]
        head = frozen_head(frozen)
        rows = head[jnp.maximum(extra, 0)] if frozen.get("head") is None else head[:, jnp.maximum(extra, 0)].T
        ze = cap_logits(jnp.einsum("bnpd,bmd->bnpm", in_head_dtype(h, frozen), rows,
                                   preferred_element_type=jnp.float32), frozen)
        ze = jnp.where(extra[:, None, None, :] >= 0, ze, -jnp.inf)
        idx = argmax(jnp.concatenate([z, ze], axis=-1))
        k = z.shape[-1]
        ext = jnp.take_along_axis(extra, jnp.clip(idx - k, 0, m - 1).reshape(idx.shape[0], -1), axis=1)
        tok = jnp.where(idx < k, vocab[jnp.minimum(idx, k - 1)], ext.reshape(idx.shape))
    else:
        tok = vocab[argmax(z)]
    return ((tok == blk.labels) & blk.eval_mask).astype(jnp.float32)


def main(cache: str, m: str, *arms: str) -> None:
    m = int(m)
    target = load_target("smollm2", dtype="bfloat16")
    items, _, _ = load_items(target, DATASETS, prompts_per_dataset=int(os.environ.get("PROMPTS", 400)),
                             max_prompt_tokens=512, system=None, heldout_per_mille=None, chat=True)
    rolls = O.record_rollouts(target, items, max_new_tokens=64, temperatures=(0.0,), seeds=1, cache=cache,
                              batch_size=BATCH)
    drafters = [(a.partition("=")[0], load_drafter(a.partition("=")[2], carryover=False, target=target)) for a in arms]
    for name, d in drafters:
        if d.cfg.markov_rank or not d.cfg.draft_vocab:
            sys.exit(f"{name}: a DFlash drafter with a draft vocabulary is needed (Markov heads draft sequentially)")
    tau = {(name, ext): {} for name, _ in drafters for ext in (0, m)}
    for i in range(0, len(rolls), BATCH):
        chunk = rolls[i:i + BATCH]
        lens = [len(r["prompt_ids"]) + len(r["tokens"]) for r in chunk]
        s, n = O._bucket(max(lens) + 1, 64), O._bucket(max(max(len(r["tokens"]) - 1 for r in chunk), 1), 16)
        ids, lm = np.zeros((BATCH, s), np.int32), np.zeros((BATCH, s), np.int32)
        anchors, keep = np.zeros((BATCH, n), np.int32), np.zeros((BATCH, n), bool)
        for j, r in enumerate(chunk):
            L, G = len(r["prompt_ids"]), len(r["tokens"])
            ids[j, :L + G] = r["prompt_ids"] + r["tokens"]
            lm[j, L:L + G] = 1
            anchors[j, :G - 1] = np.arange(L, L + G - 1)
            keep[j, :G - 1] = True
        for name, d in drafters:
            oc = O.OfflineConfig(target=target.cfg, drafter=d.cfg, sampling=False, top_k=0, top_p=1.0, loss_chunk=1024)
            feats, _, _ = O.target_pass(target.cfg, tuple(d.cfg.target_layer_ids), False, 0, 1.0, 1024, target.params,
                                        ids, jnp.float32(0.0))
            ref = np.asarray(O.acceptance(oc, target.params, d.params, feats, None, ids, lm, anchors, keep,
                                          jnp.float32(0.0)))
            for ext in (0, m):
                acc = np.asarray(acceptance(oc, ext, target.params, d.params, feats, ids, lm, anchors, keep))
                if ext == 0 and not np.array_equal(acc, ref):
                    sys.exit(f"batch {i}: the unextended arm differs from offline.acceptance")
                for j, r in enumerate(chunk):
                    G = len(r["tokens"])
                    tau[(name, ext)][(r["dataset"], r["prompt"])] = (G - 1, len(O.greedy_rounds(acc[j], G)))
        print(f"scored {i + len(chunk)}/{len(rolls)}", file=sys.stderr)
    print(f"| drafter | dataset | rollouts | τ | τ with the prompt's tokens (M = {m}) | gain [95%] | resolved |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in drafters:
        base, ext = tau[(name, 0)], tau[(name, m)]
        for ds in DATASETS + ["all"]:
            keys = sorted(k for k in base if ds == "all" or k[0] == ds)
            ta, ra = [ext[k][0] / ext[k][1] for k in keys], [ext[k][1] for k in keys]
            tb, rb = [base[k][0] / base[k][1] for k in keys], [base[k][1] for k in keys]
            r = paired_bootstrap(ta, tb, wa=ra, wb=rb)
            lo, hi = r["gain_pct_ci"] or (float("nan"), float("nan"))
            ratio = lambda t, w: sum(x * y for x, y in zip(t, w)) / sum(w)
            print(f"| {name} | {ds} | {len(keys)} | {ratio(tb, rb):.3f} | {ratio(ta, ra):.3f} | "
                  f"{r['gain_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%] | {r['resolved']} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
