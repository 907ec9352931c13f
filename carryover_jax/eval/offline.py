"""`carryover eval --offline`: exact expected decoding rounds on shared target rollouts, no decoding.

For a drafter that decodes without carried rows, a round's proposals depend only on the committed
tokens before its anchor. So on one recorded target rollout (prompt + the target's own output
y_1..y_G, the AR pass of the eval, recorded once into a rollout cache) the proposals of *every*
possible round start come out of one teacher-forced drafter pass — training's `proposal_hidden` over
blocks anchored at every generated position (`train/anchors.py`, `train/dvd.py` draft 1) — and the
rounds follow without running the engine (Zhao & Cai, "Training Parallel Speculative Draft Models by
Directly Minimizing Expected Decoding Rounds"):

- a round starts with c tokens committed (c = 1 after the prefill's first token); its anchor y_c sits at
  position L + c − 1 (L = prompt length) and slot k proposes y_{c+k};
- A[c, k] = the acceptance of slot k given slots < k were accepted. T = 0: 1 iff the greedy proposal
  equals y_{c+k}. T > 0: min(1, q(y_{c+k}) / p(y_{c+k})), q the draft and p the target distribution after
  the same temperature/top-k/top-p processing, on the realized rollout token (its expectation over
  y ~ p is Σ_v min(p, q), the rejection sampler's acceptance probability; the Markov head's previous
  token is the rollout's). Slots past y_G are 0;
- occupancy: ω[1] = 1; a round started at c stays alive through slot k with probability
  ω[c]·Π_{j<=k} A[c, j]; a rejection at slot k starts the next round at c + k (the correction token is
  y_{c+k}), P accepted slots at c + P + 1 (the bonus token); a start c >= G ends the sequence;
- expected rounds R = Σ_{c<G} ω[c]; τ = (G − 1) / R, the tokens the rounds generate per round (the
  eval's `tau_committed`; the first token is the prefill's). At T = 0 every A is 0 or 1, R is the integer
  round count of greedy speculative decoding on that rollout, and `accepted` is its per-round list
  (the last round cut to the tokens left, as the engine commits it).

Carryover arms (their proposals depend on the previous round's rejected verify states, which differ with
every path through the rollout) are decoded on the same rollouts instead: `replay.py`, exact round counts
at T = 0 and a seeded draw of the engine's rounds given the rollout at T > 0.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from carryover_jax import bounds as B
from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig
from carryover_jax.decode.generate import generate
from carryover_jax.decode.sampling import probs
from carryover_jax.errors import CarryoverError
from carryover_jax.eval.paired import check_resolvable, compare_tau
from carryover_jax.eval.replay import replay_rollouts
from carryover_jax.eval.settings import BOUNDS
from carryover_jax.models.drafter import Drafter, draft_index_table, frozen_from_target
from carryover_jax.models.target import TargetLM
from carryover_jax.train import anchors as A
from carryover_jax.train.dvd import draft_proposals
from carryover_jax.train.losses import chunked_rows, proposal_hidden

# ---- rollouts: the target's own outputs, recorded once ----------------------------------------------------
def rollout_key(target_id: str, prompt_ids: Sequence[int], *, max_new_tokens: int, temperature: float, seed: int,
                top_k: int, top_p: float, stop_token_ids: Sequence[int]) -> str:
    blob = json.dumps([target_id, list(prompt_ids), max_new_tokens, float(temperature), seed, top_k, float(top_p),
                       sorted(stop_token_ids)])
    return hashlib.sha1(blob.encode()).hexdigest()


class RolloutCache:
    """`<folder>/rollouts.jsonl`: one line per recorded rollout {"key", "tokens"}; appended as they are
    recorded, so a killed recording keeps what it finished (a half-written last line is ignored)."""

    def __init__(self, folder: str | Path | None):
        self.file = None if folder is None else Path(folder) / "rollouts.jsonl"
        self.rows: dict[str, list[int]] = {}
        if self.file is not None and self.file.is_file():
            for line in self.file.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.rows[r["key"]] = [int(t) for t in r["tokens"]]
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue

    def add(self, key: str, tokens: list[int]) -> None:
        self.rows[key] = tokens
        if self.file is not None:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            with self.file.open("a") as f:
                f.write(json.dumps({"key": key, "tokens": tokens}) + "\n")


def record_rollouts(target, items, *, max_new_tokens: int, temperatures: Sequence[float], seeds: int,
                    stop_token_ids=None, top_k: int = 0, top_p: float = 1.0, max_len: int | None = None,
                    cache: str | Path | None = None, batch_size: int = 8, progress: bool = True) -> list[dict]:
    """AR rollouts of every item at every temperature (one pass at T = 0, `seeds` passes at T > 0), taken
    from the cache when recorded before, else generated `batch_size` prompts at a time (rows of a batch are
    independent: greedy rollouts equal batch-1 decoding) and appended to it. Prompts go by length, so a batch
    pads little and the batches of one prompt bucket share one compiled program; the last batch is filled up
    with copies of its last prompt (their rollouts are dropped) instead of compiling a smaller batch."""
    stops = list(target.stop_token_ids if stop_token_ids is None else stop_token_ids)
    tid = f"{getattr(target, 'path', None)}|{target.cfg.dtype}"
    store = RolloutCache(cache)
    want = []
    for T in temperatures:
        for s in (range(seeds) if T > 0 else [0]):
            for it in items:
                key = rollout_key(tid, it.ids, max_new_tokens=max_new_tokens, temperature=T, seed=s, top_k=top_k,
                                  top_p=top_p, stop_token_ids=stops)
                want.append((float(T), s, it, key))
    todo = [w for w in want if w[3] not in store.rows]
    bar = tqdm(total=len(todo), desc="offline: recording rollouts", disable=not progress or not todo)
    for T in sorted({w[0] for w in todo}):
        for s in sorted({w[1] for w in todo if w[0] == T}):
            group = sorted((w for w in todo if w[0] == T and w[1] == s), key=lambda w: len(w[2].ids))
            for i in range(0, len(group), batch_size):
                chunk = group[i:i + batch_size]
                fill = [chunk[-1]] * (batch_size - len(chunk)) if len(group) > batch_size else []
                res = generate(target, [list(w[2].ids) for w in chunk + fill], max_new_tokens=max_new_tokens,
                               temperature=T, seed=s * 100_003 + i, chat=False, stop_token_ids=stops,
                               top_k=top_k, top_p=top_p, max_len=max_len)
                for w, r in zip(chunk, res):
                    store.add(w[3], list(r.token_ids))
                bar.update(len(chunk))
    bar.close()
    return [{"dataset": it.dataset, "prompt": it.id, "temperature": T, "seed": s, "prompt_ids": list(it.ids),
             "tokens": store.rows[key]} for T, s, it, key in want]


# ---- the teacher-forced pass ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OfflineConfig:
    """Static settings of one scoring call (hashable: a jit static argument). `drafter` and `loss` are what
    training's `draft_proposals` reads from its StepConfig."""

    target: TargetConfig
    drafter: DrafterConfig
    sampling: bool = False
    top_k: int = 0
    top_p: float = 1.0
    loss_chunk: int = 1024  # rows of vocabulary-sized logits at a time

    @property
    def loss(self) -> LossConfig:
        return LossConfig(chunk_rows=self.loss_chunk)


@functools.partial(jax.jit, static_argnames=("tc", "layer_ids", "sampling", "top_k", "top_p", "chunk"))
def target_pass(tc: TargetConfig, layer_ids: tuple[int, ...], sampling: bool, top_k: int, top_p: float, chunk: int,
                target_params, ids, temperature):
    """The frozen target over the rollouts ids [B, S]: the drafter's features [B, S, m·d] and, when
    sampling, p_y [B, S] = p(ids[:, j] | ids[:, < j]) after the sampling processing (0 at j = 0) and the
    final-normed hidden states [B, S, d] (the Carryover replay's residuals, `replay.py`)."""
    taps, last = TargetLM(tc).apply({"params": target_params}, ids, layer_ids, method=TargetLM.features)
    feats = jnp.concatenate(taps, axis=-1)
    if not sampling:
        return feats, None, None
    b, s = ids.shape

    def p_of(h, y):
        z = TargetLM(tc).apply({"params": target_params}, h, method=TargetLM.head)
        pr = probs(z, jnp.full(z.shape[:-1], temperature), top_k, top_p)
        return jnp.take_along_axis(pr, y[:, None], axis=-1)[:, 0]

    py = chunked_rows(p_of, (last[:, :-1].reshape(b * (s - 1), -1), ids[:, 1:].reshape(-1)), chunk)
    return feats, jnp.pad(py.reshape(b, s - 1), ((0, 0), (1, 0))), last


@functools.partial(jax.jit, static_argnames=("oc",))
def acceptance(oc: OfflineConfig, target_params, draft_params, feats, py, ids, lm, anchors, keep, temperature):
    """A [B, N, P]: per-slot acceptance of the block anchored at anchors[b, n] given the slots before it
    were accepted (module docstring); 0 past the rollout and in unused slots."""
    dc = oc.drafter
    frozen = frozen_from_target(target_params, oc.target)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, jnp.sum(keep, axis=1))
    if not oc.sampling:  # training's draft 1: greedy proposals at every anchor, Markov head sequential
        proposals = draft_proposals(oc, draft_params, frozen, feats, blk)
        return ((proposals == blk.labels) & blk.eval_mask).astype(jnp.float32)
    b, n, p = blk.labels.shape
    h = proposal_hidden(draft_params, dc, frozen, feats, blk).reshape(b * n * p, -1)
    labels = blk.labels.reshape(-1)
    # the Markov head's previous token: the anchor for slot 1, then the rollout's (accepted) tokens
    prev = jnp.concatenate([blk.tokens.reshape(b, n, -1)[:, :, :1], blk.labels[..., :-1]], axis=-1).reshape(-1)
    table = jnp.asarray(draft_index_table(dc.draft_vocab, oc.target.vocab_size)) if dc.draft_vocab else None

    def q_of(hc, lc, pc):
        z = Drafter(dc).apply({"params": draft_params}, hc, frozen, method=Drafter.logits)
        if dc.markov_rank:
            z = z + Drafter(dc).apply({"params": draft_params}, pc, method=Drafter.markov_bias)
        q = probs(z, jnp.full(z.shape[:-1], temperature), oc.top_k, oc.top_p)
        idx = lc if table is None else table[lc]  # outside a draft vocabulary q is 0
        return jnp.where(idx >= 0, jnp.take_along_axis(q, jnp.maximum(idx, 0)[:, None], axis=-1)[:, 0], 0.0)

    qy = chunked_rows(q_of, (h, labels, prev), max(1, oc.loss_chunk)).reshape(b, n, p)
    s = ids.shape[1]
    pyl = jnp.take_along_axis(py, jnp.minimum(blk.label_idx, s - 1).reshape(b, n * p), axis=1).reshape(b, n, p)
    acc = jnp.minimum(1.0, qy / jnp.maximum(pyl, jnp.finfo(jnp.float32).tiny))
    return jnp.where(blk.eval_mask, acc, 0.0)


# ---- rounds from the acceptances (host) -----------------------------------------------------------------
def greedy_rounds(acc: np.ndarray, num_tokens: int) -> list[int]:
    """T = 0: the engine's per-round accepted counts on a rollout of G = num_tokens tokens; acc [>= G-1, P]
    holds 0/1 per (round start c = 1.., slot). The last round is cut to the tokens left."""
    lengths = np.cumprod(np.asarray(acc) > 0.5, axis=1).sum(axis=1)
    c, out = 1, []
    while c < num_tokens:
        n = min(int(lengths[c - 1]) + 1, num_tokens - c)
        out.append(n - 1)
        c += n
    return out


def expected_rounds(acc: np.ndarray, num_tokens: int) -> float:
    """E[rounds] on a rollout of G = num_tokens tokens from per-(start, slot) acceptances acc [>= G-1, P]
    by the occupancy recursion (module docstring)."""
    g = num_tokens
    if g <= 1:
        return 0.0
    acc = np.asarray(acc, np.float64)[: g - 1]
    p = acc.shape[1]
    omega = np.zeros(g + p + 2)
    omega[1] = 1.0
    for c in range(1, g):
        alive = omega[c]
        if alive == 0.0:
            continue
        for k in range(1, p + 1):
            if c + k > g:
                break
            a = acc[c - 1, k - 1]
            omega[c + k] += alive * (1.0 - a)  # rejected at slot k: the correction y_{c+k} ends the round
            alive *= a
        omega[c + p + 1] += alive  # all P accepted: the bonus token
    return float(omega[1:g].sum())


def _bucket(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


def score_rollouts(target, drafters, rollouts: list[dict], *, top_k: int = 0, top_p: float = 1.0,
                   batch_size: int = 8, loss_chunk: int = 1024, progress: bool = True) -> list[dict]:
    """One record per (arm, rollout) (`metrics`-style log entries with expected rounds; Carryover arms: the
    replayed rounds, `replay.py`): the target pass runs once per batch of rollouts and is shared by every arm
    tapping the same layers."""
    log: list[dict] = []
    groups: dict[float, list[dict]] = {}
    for r in rollouts:
        groups.setdefault(float(r["temperature"]), []).append(r)
    bar = tqdm(total=len(rollouts), desc="offline: scoring", unit="rollout", disable=not progress)
    for T, rows in groups.items():
        sampling = T > 0
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            b = batch_size if len(rows) > batch_size else len(chunk)  # one batch shape per bucket
            lens = [len(r["prompt_ids"]) + len(r["tokens"]) for r in chunk]
            s = _bucket(max(lens) + 1, 64)
            n = _bucket(max(max(len(r["tokens"]) - 1 for r in chunk), 1), 16)
            ids = np.zeros((b, s), np.int32)
            lm = np.zeros((b, s), np.int32)
            anchors = np.zeros((b, n), np.int32)
            keep = np.zeros((b, n), bool)
            for j, r in enumerate(chunk):
                L, G = len(r["prompt_ids"]), len(r["tokens"])
                ids[j, :L + G] = r["prompt_ids"] + r["tokens"]
                lm[j, L:L + G] = 1
                anchors[j, :G - 1] = np.arange(L, L + G - 1)  # start c = 1..G-1: anchor y_c at L + c - 1
                keep[j, :G - 1] = True
            feats_by_layers: dict = {}
            for e, d in drafters:
                dc = d.cfg
                layers = tuple(dc.target_layer_ids)
                if layers not in feats_by_layers:
                    feats_by_layers[layers] = target_pass(target.cfg, layers, sampling, top_k, top_p, loss_chunk,
                                                          target.params, ids, jnp.float32(T))
                feats, py, last = feats_by_layers[layers]
                if e.carryover:
                    replayed = replay_rollouts(target, d, e, chunk, temperature=T, top_k=top_k, top_p=top_p,
                                               p_roll=py, h_roll=last, batch=b)
                    for r, a in zip(chunk, replayed):
                        log.append({"mode": e.label, "dataset": r["dataset"], "prompt": r["prompt"], "temperature": T,
                                    "seed": r["seed"], "new_tokens": len(r["tokens"]), "rounds": len(a), "accepted": a})
                    continue
                oc = OfflineConfig(target=target.cfg, drafter=dc, sampling=sampling, top_k=top_k, top_p=top_p,
                                   loss_chunk=loss_chunk)
                acc = np.asarray(acceptance(oc, target.params, d.params, feats, py, ids, lm, anchors, keep,
                                            jnp.float32(T)))
                for j, r in enumerate(chunk):
                    G = len(r["tokens"])
                    rec = {"mode": e.label, "dataset": r["dataset"], "prompt": r["prompt"], "temperature": T,
                           "seed": r["seed"], "new_tokens": G}
                    if sampling:
                        rec.update(rounds=expected_rounds(acc[j], G), accepted=None)
                    else:
                        a = greedy_rounds(acc[j], G)
                        rec.update(rounds=len(a), accepted=a)
                    log.append(rec)
            bar.update(len(chunk))
    bar.close()
    return log


# ---- summary and report ---------------------------------------------------------------------------------
def _tau(recs) -> float:
    rounds = sum(r["rounds"] for r in recs)
    return sum(r["new_tokens"] - 1 for r in recs) / rounds if rounds else float("nan")


def summarize_offline(log: list[dict], labels: Sequence[str]) -> dict[str, Any]:
    """Per temperature: τ per dataset and over the mix (micro: Σ(G − 1) / Σ rounds) for every arm, the
    per-prompt τ and rounds, and the paired comparison (paired.py: the micro τ, a ratio of sums) of every pair
    of arms."""
    out: dict[str, Any] = {"temperatures": {}}
    datasets = list(dict.fromkeys(r["dataset"] for r in log))
    for T in sorted({r["temperature"] for r in log}):
        recs = [r for r in log if r["temperature"] == T]
        seeds = sorted({r["seed"] for r in recs})
        prompts = list(dict.fromkeys((r["dataset"], r["prompt"]) for r in recs))
        by = {(r["mode"], r["dataset"], r["prompt"], r["seed"]): r for r in recs}

        def column(lab, key):
            rows = [[by.get((lab, ds, pid, s)) for ds, pid in prompts] for s in seeds]
            return [[None if r is None or not r["rounds"] else key(r) for r in row] for row in rows]

        values = {lab: {"tau": column(lab, lambda r: (r["new_tokens"] - 1) / r["rounds"]),
                        "rounds": column(lab, lambda r: r["rounds"])} for lab in labels}
        cells: dict[str, Any] = {}
        for ds in datasets + ["all"]:
            cell = {}
            for lab in labels:
                sel = [r for r in recs if r["mode"] == lab and (ds == "all" or r["dataset"] == ds)]
                if sel:
                    cell[lab] = {"tau": _tau(sel), "rounds": sum(r["rounds"] for r in sel),
                                 "tokens": sum(r["new_tokens"] - 1 for r in sel), "rollouts": len(sel)}
            cells[ds] = cell
        pairs = []
        for j, la in enumerate(labels):
            for lb in labels[:j]:
                pc = {}
                for ds in datasets + ["all"]:
                    cols = [i for i, (d, _) in enumerate(prompts) if ds == "all" or d == ds]

                    def pick(lab, key):
                        return [[row[i] for i in cols] for row in values[lab][key]]

                    pc[ds] = {"tau": compare_tau(pick(la, "tau"), pick(lb, "tau"), pick(la, "rounds"),
                                                 pick(lb, "rounds"))}
                pairs.append({"label": la, "vs": lb, "datasets": pc})
        out["temperatures"][f"{float(T):g}"] = {
            "seeds": seeds, "datasets": cells,
            "paired": {"prompts": [list(p) for p in prompts], "seeds": seeds, "values": values, "pairs": pairs}}
    return out


def evaluate_offline(target, drafters, *, datasets: Sequence[str] = ("humaneval", "mtbench", "sharegpt"),
                     prompts_per_dataset: int = 100, max_prompt_tokens: int = 512, system: str | None = None,
                     heldout_per_mille: int | None = None, chat: bool = True, max_new_tokens: int = 128,
                     temperatures: Sequence[float] = (0.0,), seeds: int = 1, max_len: int | None = None,
                     top_k: int = 0, top_p: float = 1.0, mask_token_id: int | None = None, dtype: str | None = None,
                     rollouts: str | Path | None = None, batch_size: int = 8, out: str | Path | None = None,
                     progress: bool = True, log: Callable[[str], None] | None = None,
                     min_prompts: int | None = None) -> dict[str, Any]:
    """`carryover eval --offline` as one call: load and check the arms, read the
    prompts as `evaluate` does, record (or reuse from the `rollouts` cache folder) the target's rollouts,
    score every arm on them, and write `out` (results.json, report.md). Returns the result dict."""
    from carryover_jax.eval.run import _device, drafter_info, load_entries, load_items, parse_drafter_spec, \
        write_outputs

    entries = [parse_drafter_spec(d) if isinstance(d, str) else d for d in drafters]
    B.check("seeds", seeds, BOUNDS["seeds"])
    loaded = load_entries(target, entries, mask_token_id, dtype=dtype)
    items, skipped, heldout_per_mille = load_items(target, datasets, prompts_per_dataset=prompts_per_dataset,
                                                   max_prompt_tokens=max_prompt_tokens, system=system,
                                                   heldout_per_mille=heldout_per_mille, chat=chat, log=log)
    if not items:
        raise CarryoverError("no prompts")
    if min_prompts:  # an A/B that could resolve nothing: refused before any rollout is recorded
        check_resolvable(len(items), "eval --offline: the prompts that fit")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rolls = record_rollouts(target, items, max_new_tokens=max_new_tokens, temperatures=temperatures, seeds=seeds,
                            top_k=top_k, top_p=top_p, max_len=max_len, cache=rollouts, batch_size=batch_size,
                            progress=progress)
    records = score_rollouts(target, loaded, rolls, top_k=top_k, top_p=top_p, batch_size=batch_size,
                             progress=progress)
    infos = [drafter_info(e, d) for e, d in loaded]
    result = {
        "version": 1, "offline": True, "started": started, "target": str(getattr(target, "path", None)),
        "config": {"max_new_tokens": max_new_tokens, "temperatures": [float(t) for t in temperatures], "seeds": seeds,
                   "top_k": top_k, "top_p": top_p, "max_prompt_tokens": max_prompt_tokens, "chat": chat,
                   "system": system, "heldout_per_mille": heldout_per_mille, "skipped_long_prompts": skipped,
                   "rollout_cache": None if rollouts is None else str(rollouts),
                   "datasets": {ds: sum(1 for it in items if it.dataset == ds)
                                for ds in dict.fromkeys(it.dataset for it in items)}},
        "device": _device(), "drafters": infos, "log": records,
        "rollouts": [{k: r[k] for k in ("dataset", "prompt", "temperature", "seed")} | {"new_tokens": len(r["tokens"])}
                     for r in rolls],
    }
    result["summary"] = summarize_offline(records, [i["label"] for i in infos])
    if out is not None:
        write_outputs(result, out)
    return result
