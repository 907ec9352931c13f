"""Model FLOPs and bytes of the main paths, from a config and its param shapes: the work the device check's
MFU (`bench steps`) and the roofline (`bench roofline`) count.

FLOPs are 2 per multiply-add of the matrix products and attention; element-wise ops, norms, softmax and
sampling are not counted. Bytes are what a path must read at least once: the weights it uses and the
KV cache it attends to.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from carryover_jax.config import DrafterConfig, TargetConfig


@dataclasses.dataclass(frozen=True)
class Cost:
    """One call of a path: its FLOPs and the bytes it must read; `dtype` the numerics it runs in where not the
    run's (the greedy head's bf16 copy)."""

    flops: float
    bytes: float
    dtype: str | None = None

    def scaled(self, n: float) -> "Cost":
        return Cost(self.flops * n, self.bytes * n, self.dtype)


def dense_flops_per_token(params) -> int:
    """2 x the multiply-adds of every 2-D kernel (a Dense layer) under `params`."""
    return 2 * sum(x.size for x in jax.tree_util.tree_leaves(params) if getattr(x, "ndim", 0) == 2)


def tree_bytes(params) -> int:
    return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(params)))


def weight_bytes(params, cfg: TargetConfig) -> int:
    """Bytes an AR step reads from the target's weights: every parameter once, except an untied input
    embedding (a decode step reads one row of it)."""
    total = tree_bytes(params)
    if not cfg.tie_word_embeddings:
        total -= tree_bytes(params["embed_tokens"])
    return total


def head_flops_per_row(cfg: TargetConfig, vocab: int | None = None) -> int:
    return 2 * cfg.hidden_size * (vocab or cfg.vocab_size)


def _window(cfg: TargetConfig, layer: int, keys: float) -> float:
    return min(keys, cfg.sliding_window) if cfg.is_sliding(layer) else keys


def attention_flops(cfg: TargetConfig, queries: float, keys: float) -> float:
    """Scores and values of `queries` queries over `keys` visible keys each (a sliding layer sees at most its
    window): 4 x heads x head dim per (query, key) per layer."""
    return float(queries * sum(4 * cfg.num_heads * cfg.layer_head_dim(i) * _window(cfg, i, keys)
                               for i in range(cfg.num_layers)))


def kv_bytes(cfg: TargetConfig, batch: int, context: float) -> float:
    """The KV cache a step attends to: `context` slots per row, K and V (one tensor where K = V) per layer."""
    item = jnp.dtype(cfg.numerics.cache).itemsize
    return float(batch * sum((1 if cfg.layer_k_eq_v(i) else 2) * cfg.layer_kv_heads(i) * cfg.layer_head_dim(i)
                             * _window(cfg, i, context) * item for i in range(cfg.num_layers)))


def decode_cost(cfg: TargetConfig, params, *, batch: int, rows: int, context: float) -> Cost:
    """One decode call of the target: `rows` new tokens per sequence (1: an AR step; P+1: verification)
    after `context` cached ones, each through every layer and the LM head, attending to the cache and
    causally to each other. Reads the weights once and the cache."""
    t_layers = dense_flops_per_token(params["layers"])
    q = batch * rows
    flops = q * (t_layers + head_flops_per_row(cfg)) + attention_flops(cfg, q, context + (rows + 1) / 2)
    return Cost(flops, weight_bytes(params, cfg) + kv_bytes(cfg, batch, context + rows))


def greedy_decode_costs(cfg: TargetConfig, params, *, batch: int, rows: int, context: float) -> list[Cost]:
    """`decode_cost` of a greedy call as the decode loops run it: where the head's screen serves it
    (`models/greedy_head.py`: a float32 tied head, at most `MAX_ROWS` rows) the tied head is read as its bf16 copy
    once per `ROWS_A_PASS` rows, and its rows' norms, in bf16 (the few float32 rows it rescores are not counted);
    else the one float32 cost."""
    from carryover_jax.models import greedy_head

    whole = decode_cost(cfg, params, batch=batch, rows=rows, context=context)
    if not greedy_head.applies(cfg) or batch * rows > greedy_head.MAX_ROWS:
        return [whole]
    e = params["embed_tokens"]["embedding"]
    head_flops, head_bytes = batch * rows * head_flops_per_row(cfg), e.size * jnp.dtype(e.dtype).itemsize
    passes = -(-batch * rows // greedy_head.ROWS_A_PASS)
    return [Cost(whole.flops - head_flops, whole.bytes - head_bytes),
            Cost(head_flops, passes * e.size * 2 + e.shape[0] * 4, "bfloat16")]


def prefill_cost(cfg: TargetConfig, params, *, batch: int, prompt_len: int) -> Cost:
    """A prompt's forward: every token through the layers (causal attention), the LM head on the last one."""
    q = batch * prompt_len
    flops = (q * dense_flops_per_token(params["layers"]) + batch * head_flops_per_row(cfg)
             + attention_flops(cfg, q, (prompt_len + 1) / 2))
    return Cost(flops, weight_bytes(params, cfg))


def generation_costs(cfg: TargetConfig, params, *, batch: int, prompt_len: int, new_tokens: int,
                     greedy: bool = False) -> list[Cost]:
    """`generate` with every row decoding `new_tokens` tokens: the prefill (which gives the first token),
    then new_tokens - 1 AR steps (at their mean context: attention and cache reads grow linearly); `greedy`: the
    steps as `greedy_decode_costs` prices them."""
    steps = new_tokens - 1
    out = [prefill_cost(cfg, params, batch=batch, prompt_len=prompt_len)]
    if steps:
        mean_ctx = prompt_len + (steps - 1) / 2
        costs = (greedy_decode_costs(cfg, params, batch=batch, rows=1, context=mean_ctx) if greedy
                 else [decode_cost(cfg, params, batch=batch, rows=1, context=mean_ctx)])
        out += [c.scaled(steps) for c in costs]
    return out


def feature_pass_cost(cfg: TargetConfig, params, *, rows: int, seq: int) -> Cost:
    """The target feature forward of prepare (`train.responses.target_features`): `rows` sequences of
    `seq` tokens through every layer, causal attention, and the LM head at every token (its log-sum-exp);
    reads the layers' and the head's weights."""
    q = rows * seq
    flops = q * (dense_flops_per_token(params["layers"]) + head_flops_per_row(cfg)) + attention_flops(cfg, q,
                                                                                                    (seq + 1) / 2)
    head = params["embed_tokens"] if cfg.tie_word_embeddings else params["lm_head"]
    return Cost(flops, tree_bytes(params["layers"]) + tree_bytes(head))


TRAIN_FLOPS_DOC = (
    "model FLOPs (2 per multiply-add; backward = 2x forward for trained weights, 1x for frozen ones, which "
    "need only the input gradient): the target forward over the sequence (dense layers + causal attention; "
    "with stored features only DVD runs it, for the K/V its verification attends to, unless the store holds "
    "them too); the drafter over the "
    "anchors' blocks (fc and the K/V of the context rows, draft layers, attention to each block's context "
    "prefix (mean S/2) + its block), forward + backward, and its head on the P proposal rows (a draft "
    "vocabulary's own head is trained; the target's frozen head needs forward + input gradient); the "
    "target's LM head on the same rows (the aligned teacher logits; with stored features and a draft vocabulary "
    "only its draft-vocabulary columns, the store holding the log-sum-exp over the rest). DVD and control add draft 1 (drafter "
    "forward); DVD adds verification (target forward over the blocks' P proposals, attending to their prefix "
    "+ causally in the block). Element-wise ops, norms, softmax and DVD's carried rows (their K/V, and the "
    "projection module of carry_module=projection) not counted.")


def train_flops(tcfg: TargetConfig, dcfg: DrafterConfig, target_params, draft_params, *, batch: int, seq: int,
                anchors: int, mode: str = "baseline", stored_features: bool = False,
                stored_kv: bool = False) -> dict[str, float]:
    """FLOPs of one training step by part (`TRAIN_FLOPS_DOC` says what is counted); `stored_kv`: DVD reads the
    recorded sequences' K/V from the store (with stored features)."""
    t_layers = dense_flops_per_token(target_params["layers"])
    tq = batch * seq
    out = {}
    if not stored_features or (mode == "dvd" and not stored_kv):
        out["target_features"] = float(t_layers * tq + attention_flops(tcfg, tq, (seq + 1) / 2))
    blk, p = dcfg.block_size, dcfg.num_proposals
    q, r = batch * anchors * blk, batch * anchors * p  # drafter query tokens, proposal rows
    dl = draft_params["layers"]
    d_layers = dense_flops_per_token(dl)
    kv = sum(dense_flops_per_token({k: dl[i]["self_attn"][k] for k in ("k_proj", "v_proj") if k in dl[i]["self_attn"]})
             for i in dl)
    fc = dense_flops_per_token({"fc": draft_params["fc"]})
    body = d_layers * q + (fc + kv) * tq + attention_flops(dcfg.backbone, q, seq / 2 + blk)  # one forward
    d_head = head_flops_per_row(tcfg, len(dcfg.draft_vocab) or None) * r
    # a draft vocabulary's head is the drafter's own (trained); the whole vocabulary's is the target's (frozen)
    out["drafter_train"] = float(3 * body + (3 if dcfg.draft_vocab else 2) * d_head)
    # a store `prepare` wrote holds the log-sum-exp: the teacher needs the draft vocabulary's columns only
    out["target_head"] = float(head_flops_per_row(tcfg, (stored_features and len(dcfg.draft_vocab)) or None) * r)
    if mode != "baseline":
        out["draft1"] = float(body + d_head)
    if mode == "dvd":
        rows = batch * anchors * p
        out["verify"] = float(t_layers * rows + attention_flops(tcfg, rows, seq / 2 + (p + 3) / 2))
    out["total"] = float(sum(out.values()))
    return out


def train_cost(tcfg: TargetConfig, dcfg: DrafterConfig, target_params, draft_params, *, batch: int, seq: int,
               anchors: int, mode: str = "baseline", stored_features: bool = False, stored_kv: bool = False) -> Cost:
    """One training step: `train_flops`; bytes = the target's layers where the target runs (online features,
    DVD), its LM head (the embedding where tied), and the drafter's params with Adam's two moments, each
    read once."""
    f = train_flops(tcfg, dcfg, target_params, draft_params, batch=batch, seq=seq, anchors=anchors, mode=mode,
                    stored_features=stored_features, stored_kv=stored_kv)
    head = target_params["embed_tokens"] if tcfg.tie_word_embeddings else target_params["lm_head"]
    b = tree_bytes(head) + 3 * tree_bytes(draft_params)
    if "target_features" in f or "verify" in f:
        b += tree_bytes(target_params["layers"])
    return Cost(f["total"], float(b))
