"""`prepare_responses`: regenerate the assistant turns of a prompt source with the target itself and
append them, token by token as generated, to a `ResponseStore` (optionally with target features).

A drafter must learn the target's own distribution, so each conversation is replayed turn by turn:
the target answers user turn k given the system turn, user turns 1..k and its own earlier replies
(the source's assistant turns are dropped). One record per prompt (`sources.turn_prompts`: a conversation's
first user turn, or with `prompt_turns` a later one, whose earlier turns stay the source's) holds the whole
replayed sequence, built incrementally: the first prompt is `Target.encode(conversation.prompt)`; each generated
reply is appended verbatim (loss mask 1, stop token included); the chat-template text between a reply
and the next generation prompt is rendered, tokenized separately (no special tokens) and appended with
loss mask 0. A greedy record is therefore exactly the target's greedy continuation of its prefix.

Pod scale: the generation batch is sized from a memory budget (`train/gen_memory.py`), and `prepare`
may run as N independent processes (one per host or per device, no collective): shard s takes the
planned conversations whose plan index is s mod N and writes its own store,
`<store>/shard-0000s-of-0000N/`. Every record keeps its plan index, so training reads the shards as one
store in plan order (`store.open_store`) and, with greedy replies (which do not depend on how
conversations are batched), gets exactly the batches of a 1-process store of the same prompts.
Sampled replies (temperature > 0) draw per generation batch, so they depend on the batching (the
shard count, the generation batch), as they always did.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import sys
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax import numerics
from carryover_jax.config import DataConfig, TargetConfig
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode.generate import generate, pad_batch
from carryover_jax.errors import CarryoverError, ConfigError
from carryover_jax.io import exclusive
from carryover_jax.models.target import TargetLM
from carryover_jax.train.gen_memory import FEATURE_BUCKET, generation_batch, records_features
from carryover_jax.train.kv_rows import kv_width, pack_kv
from carryover_jax.train.code_prompts import SOURCE as CODE_SOURCE
from carryover_jax.train.sources import BUILTIN_SOURCES, Conversation, conversations, iter_source
from carryover_jax.train.store import ResponseStore, shard_path

# Stands in for a reply while rendering the template text that follows it. Not a special token and
# free of whitespace, so templates copy it verbatim (one that rewrites assistant content is refused).
SENTINEL = "CARRYOVERxREPLYx7f3a9c"
SORT_WINDOW = 8  # batches whose conversations are sorted by prompt length together
# DataConfig fields that change what a store contains; a store reopened with other values is refused.
# (max_prompts may grow between runs to extend a store; gen_batch_size / gen_memory_gb only group the work.)
CONTENT_FIELDS = ("source", "split", "heldout_per_mille", "prompt_turns", "responses", "max_turns",
                  "max_prompt_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "store_features",
                  "feature_layer_ids", "store_kv", "min_loss_tokens")


def store_meta(cfg: DataConfig, target) -> dict[str, Any]:
    """What a store's records depend on: the target (name, architecture, stop tokens), its chat template,
    the feature layers and the content-defining data settings. Numerics dtypes are not included."""
    tcfg = {k: v for k, v in dataclasses.asdict(target.cfg).items()
            if k not in ("numerics", "dtype", "param_dtype", "attention_backend")}
    template = getattr(target.tokenizer, "chat_template", None) or ""
    return {
        "target": target.path.name if target.path is not None else None,
        "target_config": tcfg,
        "stop_token_ids": list(target.stop_token_ids),
        "chat_template_sha1": hashlib.sha1(template.encode("utf-8")).hexdigest(),
        "feature_layer_ids": list(cfg.feature_layer_ids) if cfg.store_features else [],
        "data": {k: getattr(cfg, k) for k in CONTENT_FIELDS},
    }


def target_config_defaults() -> dict[str, Any]:
    """TargetConfig's field defaults: what a store written before a field existed implicitly used."""
    return {f.name: f.default for f in dataclasses.fields(TargetConfig)
            if f.default is not dataclasses.MISSING and f.name != "numerics"}


def _check(cfg: DataConfig, target) -> None:
    tok = target.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise CarryoverError("prepare_responses needs the target's tokenizer with a chat template")
    if cfg.responses not in ("regenerate", "source"):
        raise ConfigError(f"data.responses must be 'regenerate' or 'source', got {cfg.responses!r}")
    if cfg.max_turns < 1 or cfg.max_new_tokens < 1 or cfg.gen_batch_size < 1:
        raise ConfigError("max_turns, max_new_tokens and gen_batch_size must be >= 1")
    if cfg.source == CODE_SOURCE and (cfg.responses != "regenerate" or cfg.prompt_turns != "first"):
        # one user turn and no reply: anything else would prepare an empty store without a word
        raise ConfigError(f"data.source={CODE_SOURCE} holds one-turn prompts without replies: it needs "
                          "data.responses=regenerate and data.prompt_turns=first")
    limit = target.cfg.max_position_embeddings
    if cfg.max_prompt_tokens + cfg.max_new_tokens > limit:
        raise ConfigError(
            f"max_prompt_tokens + max_new_tokens = {cfg.max_prompt_tokens + cfg.max_new_tokens} exceeds the "
            f"target's {limit} positions"
        )
    if cfg.store_features:
        ids = list(cfg.feature_layer_ids)
        last = target.cfg.num_layers - 1
        if not ids or ids != sorted(set(ids)) or ids[0] < -1 or ids[-1] >= last:
            raise ConfigError(
                f"feature_layer_ids must be non-empty, strictly increasing and in [-1, {last - 1}], got {ids}"
            )
    if cfg.source not in BUILTIN_SOURCES:  # a prompt file read through once: a bad line deep in it fails now
        for _ in iter_source(cfg.source):
            pass


# ---- the plan: which conversations, in which batches -------------------------------------------------
class Plan:
    """The conversations of the split whose first prompt fits, numbered in source order (the plan
    index), the first `max_prompts` of them: (index, conversation, first prompt ids). Shard `shard`
    of `num_shards` gets the indices congruent to it, so shards are disjoint and together the
    1-process plan (every shard still reads and encodes the whole source to number it). Deterministic,
    so a resumed run sees the same batches; `size` is the whole plan's length once iterated."""

    def __init__(self, cfg: DataConfig, target, shard: int = 0, num_shards: int = 1):
        self.cfg, self.target, self.shard, self.num_shards = cfg, target, shard, num_shards
        self.size: int | None = None

    def __iter__(self) -> Iterator[tuple[int, Conversation, list[int]]]:
        cfg, n = self.cfg, 0
        for conv in conversations(cfg):
            if cfg.max_prompts is not None and n >= cfg.max_prompts:
                break
            ids = self.target.encode(conv.prompt)
            if len(ids) > cfg.max_prompt_tokens:
                continue
            if n % self.num_shards == self.shard:
                yield n, conv, ids
            n += 1
        self.size = n


def _batches(items, size: int, window: int = SORT_WINDOW) -> Iterator[list]:
    """Batches of `size` plan items; within each run of `window` batches the conversations are sorted
    by prompt length, so a batch's rows pad to similar lengths (the prefill and the feature pass pad
    every row to the batch's longest). Deterministic, so a resumed run sees the same batches."""
    items = iter(items)
    while chunk := list(itertools.islice(items, size * window)):
        chunk.sort(key=lambda item: len(item[2]))
        for i in range(0, len(chunk), size):
            yield chunk[i: i + size]


# ---- replaying one batch of conversations ------------------------------------------------------------
@dataclasses.dataclass
class _Replay:
    id: str
    users: list[str]
    history: list[dict[str, str]]  # system + user turns + regenerated replies so far (text)
    ids: list[int]
    mask: list[int]
    last_reply: list[int] = dataclasses.field(default_factory=list)
    active: bool = True
    features: dict[str, np.ndarray] | None = None  # of ids, as the last generation recorded them


def turn_separator(tokenizer, history: list[dict[str, str]], next_user: str, stop_text: str | None) -> str:
    """Template text between the end of the last reply in `history` and the next generation prompt.

    Rendered with a sentinel in place of that reply, so the text does not depend on how (or whether)
    the template re-renders earlier turns. `stop_text` (the reply's stop token, already in the
    sequence) is removed from its start."""
    msgs = history[:-1] + [{"role": "assistant", "content": SENTINEL}, {"role": "user", "content": next_user}]
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    if text.count(SENTINEL) != 1:
        raise CarryoverError("the chat template does not render assistant replies verbatim; "
                             "multi-turn records cannot be built (use max_turns=1)")
    tail = text.split(SENTINEL, 1)[1]
    if stop_text and tail.startswith(stop_text):
        tail = tail[len(stop_text):]
    return tail


def _seed(cfg: DataConfig, batch_index: int, turn: int) -> int:
    return int(np.random.SeedSequence([cfg.seed, batch_index, turn]).generate_state(1)[0])


def _replay_batch(cfg: DataConfig, target, batch: list[tuple[Conversation, list[int]]], batch_index: int,
                  features: tuple[int, ...] | None = None):
    """Regenerated records; with `features` (layer ids) each also holds its target features, from the passes of
    its last turn's generation (whose prompt is every earlier token of the record)."""
    tok, stops = target.tokenizer, set(target.stop_token_ids)
    states = [
        _Replay(conv.id, conv.user_turns, conv.prompt, list(ids), [0] * len(ids))
        for conv, ids in batch
    ]
    for turn in range(cfg.max_turns):
        live = []
        for s in states:
            if not s.active or turn >= len(s.users):
                continue
            if turn:
                stop = s.last_reply[-1] if s.last_reply and s.last_reply[-1] in stops else None
                stop_text = tok.decode([stop], skip_special_tokens=False) if stop is not None else None
                text = turn_separator(tok, s.history, s.users[turn], stop_text)
                sep = tok(text, add_special_tokens=False)["input_ids"]
                if len(s.ids) + len(sep) > cfg.max_prompt_tokens:
                    s.active = False  # keep the turns so far; the next prompt would be too long
                    continue
                s.ids += sep
                s.mask += [0] * len(sep)
                s.history.append({"role": "user", "content": s.users[turn]})
            live.append(s)
        if not live:
            break
        outs = generate(
            target, [s.ids for s in live], max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
            top_k=cfg.top_k, top_p=cfg.top_p, seed=_seed(cfg, batch_index, turn), chat=False, features=features,
        )
        for s, g in zip(live, outs):
            s.ids += g.token_ids
            s.mask += [1] * len(g.token_ids)
            s.last_reply = g.token_ids
            s.features = g.features
            body = g.token_ids[:-1] if g.stop_reason == "stop_token" else g.token_ids
            s.history.append({"role": "assistant", "content": tok.decode(body, skip_special_tokens=True)})
    records = [{"id": s.id, "input_ids": s.ids, "loss_mask": s.mask, **(s.features or {})}
               for s in states if sum(s.mask) >= cfg.min_loss_tokens]
    skipped = [s.id for s in states if sum(s.mask) < cfg.min_loss_tokens]
    return records, skipped


def _source_batch(cfg: DataConfig, target, batch: list[tuple[Conversation, list[int]]], batch_index: int):
    """`responses="source"`: the dataset's own assistant replies, verbatim — each (its first
    `max_new_tokens` tokens, ended by the target's stop token when it fits) with loss mask 1, every
    prompt and user turn between them with loss mask 0, built like a regenerated record (the first
    prompt through the chat template, then `turn_separator` text before each later reply). Up to
    `max_turns` user -> assistant exchanges; a conversation stops early where its turns stop
    alternating (two user or two assistant turns in a row) or the next prompt would pass
    `max_prompt_tokens`."""
    tok, stop = target.tokenizer, list(target.stop_token_ids)[:1]
    stop_text = tok.decode(stop, skip_special_tokens=False) if stop else None
    records, skipped = [], []
    for conv, ids in batch:
        history = conv.prompt  # the encoded prompt `ids`
        start = len(history)
        seq, mask, turns, ended = list(ids), [0] * len(ids), 0, False
        for m in conv.messages[start:]:
            if turns >= cfg.max_turns and m["role"] == "user":
                break
            if m["role"] == "assistant" and history[-1]["role"] == "user":
                body = tok(m["content"], add_special_tokens=False)["input_ids"]
                ended = len(body) < cfg.max_new_tokens
                body = body + stop if ended else body[: cfg.max_new_tokens]
                seq += body
                mask += [1] * len(body)
                history.append(m)
                turns += 1
            elif m["role"] == "user" and history[-1]["role"] == "assistant":
                sep = tok(turn_separator(tok, history, m["content"], stop_text if ended and stop else None),
                          add_special_tokens=False)["input_ids"]
                if len(seq) + len(sep) > cfg.max_prompt_tokens:
                    break  # keep the turns so far; the next prompt would be too long
                seq += sep
                mask += [0] * len(sep)
                history.append(m)
            else:
                break
        if history[-1]["role"] == "user" and turns:  # the last user turn has no reply: drop its prompt
            keep = len(mask) - _trailing_zeros(mask)
            seq, mask = seq[:keep], mask[:keep]
        if sum(mask) < cfg.min_loss_tokens:
            skipped.append(conv.id)
            continue
        records.append({"id": conv.id, "input_ids": seq, "loss_mask": mask})
    return records, skipped


def _trailing_zeros(mask: list[int]) -> int:
    n = 0
    while n < len(mask) and mask[-1 - n] == 0:
        n += 1
    return n


# ---- target features ---------------------------------------------------------------------------------
# token rows per pass of the feature forward on CPU (`numerics.sub_batched`; the head's log-sum-exp runs over all
# rows after it, in its own chunks): SmolLM2's 32 x 320 tokens in passes of 8 sequences ran 1.12x as fast as in one
# pass, float32 and bf16 (docs/experiments/prefix-kernel-2026-12-06)
FEATURE_PASS_TOKENS = 2560


@functools.partial(jax.jit, static_argnames=("cfg", "layer_ids", "kv_dtype"))
def _features(params, tokens, *, cfg: TargetConfig, layer_ids: tuple[int, ...], kv_dtype: str | None):
    """`TargetLM.features` (the one the training step runs online), concatenated and stored as bfloat16, the
    log-sum-exp of the target's logits at the stored (bf16) last hidden state as float32; with `kv_dtype`,
    every layer's K/V too, as rows (`kv_rows.pack_kv`) in that dtype."""
    forward = lambda x: TargetLM(cfg).apply({"params": params}, x, layer_ids, method=TargetLM.features,  # noqa: E731
                                            with_kv=True)
    taps, last, ks, vs = numerics.sub_batched(forward, tokens, tokens_per_row=tokens.shape[1],
                                              max_tokens=FEATURE_PASS_TOKENS)
    # the log-sum-exp from the rounded state: the logits training computes from the store's last_hidden normalise
    # to 1 (the same values generation records, `autoregressive.recorded`)
    rec = ar.recorded(cfg, params, taps, last)
    out = {"features": rec.features, "last_hidden": rec.last_hidden, "target_lse": rec.target_lse[..., None]}
    if kv_dtype is not None:
        out["kv"] = pack_kv(ks, vs).astype(kv_dtype)
    return out


def target_features(target, sequences: list[list[int]], layer_ids: tuple[int, ...], *, batch_rows: int | None = None,
                    kv_dtype: str | None = None) -> list[dict[str, np.ndarray]]:
    """Per sequence, what a response store keeps of the target beside the tokens: "features" [S, len(layer_ids)
    * d] and "last_hidden" [S, d] as bfloat16, "target_lse" [S, 1] float32 (the log-sum-exp of the LM head
    at that last hidden state: with it, training computes the target's probabilities at a draft vocabulary
    from those K columns of the head alone), and with `kv_dtype` its K/V rows "kv" [S, kv_width] in that dtype.

    Sequences are right-padded (causal attention: padding never reaches real positions) to a multiple of
    `FEATURE_BUCKET` tokens and to `batch_rows` rows (a power-of-two bucket wasted up to half of the pass: 320
    tokens ran as 512). Prepare runs it where generation does not record the features itself
    (`gen_memory.records_features`: the dataset's own replies, or K/V rows asked for)."""
    if not sequences:
        return []
    rows = max(batch_rows or len(sequences), len(sequences))
    length = -(-max(map(len, sequences)) // FEATURE_BUCKET) * FEATURE_BUCKET
    padded = pad_batch(sequences + [[0]] * (rows - len(sequences)), length)
    out = jax.device_get(_features(target.params, jnp.asarray(padded), cfg=target.cfg, layer_ids=tuple(layer_ids),
                                   kv_dtype=kv_dtype))
    return [{k: np.asarray(x[i, : len(s)]) for k, x in out.items()} for i, s in enumerate(sequences)]


# ---- the driver --------------------------------------------------------------------------------------
def prepare_responses(cfg: DataConfig, target, *, progress: bool = True, stop_after_batches: int | None = None,
                      shard: int = 0, num_shards: int = 1) -> ResponseStore:
    """Fill (or resume) the response store `cfg.store` — with `num_shards` > 1, its shard `shard`,
    `<store>/shard-IIIII-of-NNNNN/` — with target-regenerated conversations.

    Batches of planned conversations (`gen_memory.generation_batch`: gen_batch_size or what fits the
    memory budget) are replayed together and committed one by one; conversations already committed
    (as records or as dropped) are skipped, so an interrupted run resumed with the same settings ends
    with exactly the store of an uninterrupted one, which is then marked complete. `stop_after_batches`
    stops after that many newly processed batches (tests of resumption). One process fills a store (or a
    shard) at a time: a second is refused while the first runs."""
    _check(cfg, target)
    folder = shard_path(cfg.store, shard, num_shards)  # a wrong layout is refused before any work
    with exclusive(folder, "prepare"):  # one writer per store (per shard of a sharded one)
        return _fill(cfg, target, folder, progress=progress, stop_after_batches=stop_after_batches, shard=shard,
                     num_shards=num_shards)


def _fill(cfg: DataConfig, target, folder: Path, *, progress: bool, stop_after_batches: int | None, shard: int,
          num_shards: int) -> ResponseStore:
    from tqdm.auto import tqdm

    planned = None if cfg.max_prompts is None else len(range(shard, cfg.max_prompts, num_shards))
    size, why = generation_batch(cfg, target.cfg, max_rows=planned)
    print(f"prepare: generation batch {size} ({why})", file=sys.stderr)
    d = target.cfg.hidden_size
    feats = cfg.store_features
    meta = store_meta(cfg, target)
    if num_shards > 1:
        meta["shard"] = {"index": shard, "count": num_shards}
    store = ResponseStore.create_or_open(
        folder, feature_dim=len(cfg.feature_layer_ids) * d if feats else None, hidden=d if feats else None,
        kv_dim=kv_width(target.cfg) if cfg.store_kv else None, kv_dtype=cfg.store_kv, target_lse=feats, meta=meta,
        meta_defaults={"target_config": target_config_defaults(),
                       "data": {"responses": "regenerate", "store_kv": None, "prompt_turns": "first"}},
        indexed=True,
    )
    done = store.done_ids()
    # Generation records its own features (the passes that generate a reply compute them: a second forward over
    # every record was ~40% of a bf16 prepare), except where `records_features` says the pass must run.
    recorded = tuple(cfg.feature_layer_ids) if records_features(cfg) else None
    processed, finished = 0, True
    plan = Plan(cfg, target, shard, num_shards)
    bar = tqdm(total=planned, unit="conv", desc="responses", disable=not progress)
    try:
        for index, batch in enumerate(_batches(plan, size)):
            todo = [(conv, ids) for _, conv, ids in batch if conv.id not in done]
            if todo:
                if cfg.responses == "source":
                    records, skipped = _source_batch(cfg, target, todo, index)
                else:
                    records, skipped = _replay_batch(cfg, target, todo, index, features=recorded)
                plan_index = {conv.id: i for i, conv, _ in batch}
                for r in records:
                    r["index"] = plan_index[r["id"]]
                if feats and not recorded:
                    outs = target_features(target, [r["input_ids"] for r in records], cfg.feature_layer_ids,
                                           batch_rows=size, kv_dtype=cfg.store_kv)
                    for r, out in zip(records, outs):
                        r.update(out)
                if not store.has("target_lse"):  # a store from before the log-sum-exp was kept
                    for r in records:
                        r.pop("target_lse", None)
                store.append(records, skipped=skipped)
                store.commit()
                processed += 1
            bar.update(len(batch))
            bar.set_postfix(records=len(store), tokens=store.num_tokens)
            if stop_after_batches is not None and processed >= stop_after_batches:
                finished = False
                break
    finally:
        bar.close()
    if finished:
        store.mark_complete({"plan_size": plan.size, "max_prompts": cfg.max_prompts,
                             "shard": {"index": shard, "count": num_shards}})
    return store
