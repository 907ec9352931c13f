"""Block drafters (DFlash, DSpark-derived Markov) with Carryover, as a pure functional linen module.

Params (names mirror the exported PyTorch checkpoints): `fc` (m·d -> d, no bias), `hidden_norm`,
`layers/<i>/...` (the same `DecoderLayer` as the target, with q/k norms), `norm`, optional `e_rej`
(the Carryover embedding, zero-initialised), with `carry_module="projection"` also
`carry_proj/{gate_proj, up_proj, down_proj}` (`CarryProjection`), and `markov_head/{markov_w1, markov_w2}`. The target's
embedding and LM head are *not* params: they arrive frozen in `frozen` (see `frozen_from_target`).

Every block query attends to a list of key/value segments: the committed-context cache (or, in
training, context rows given by a mask), the carried rejected rows (`carried_segment_mask`)
and the block itself (non-causal). Context and carried rows are fused features projected by each
layer's own k/v projections; they are never transformed by the draft layers.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.config import DrafterConfig
from carryover_jax.errors import ConfigError
from carryover_jax.models.layers import Blockwise, RMSNorm, dense, dtype_of, take
from carryover_jax.models.target import DecoderLayer
from carryover_jax.numerics import lm_head_logits

Array = jax.Array


class DraftLayers(nn.Module):
    """Named "layers": `layers/<i>/...`. One compact method serves both uses (static `project_only`)."""

    cfg: DrafterConfig
    remat: bool = False

    @nn.compact
    def __call__(self, h, positions, block_mask, cached=None, rows=(), *, project_only=False):
        """project_only: rows[0] = (C, positions) -> per-layer (k, v) tuples (for the context cache).
        Otherwise: block hidden states after all layers. `cached` = (ks, vs, mask) per-layer K/V;
        `rows` = ((C, positions, mask), ...) fused rows projected in every layer by its own k/v
        projections, as they are (no input_layernorm: they are fused features, not residual states)."""
        ks, vs = [], []
        # remat recomputes each layer's activations in the backward pass (long training sequences)
        # (block_mask, argument 4 counting self, is static there: training passes the int block size)
        layer_cls = (nn.remat(DecoderLayer, methods=["with_context"], static_argnums=(4,)) if self.remat
                     else DecoderLayer)
        for i in range(self.cfg.backbone.num_layers):
            layer = layer_cls(self.cfg.backbone, name=str(i))
            if project_only:
                k, v = layer.self_attn.keys_values(*rows[0][:2])
                ks.append(k)
                vs.append(v)
                continue
            segs = [] if cached is None else [(cached[0][i], cached[1][i], cached[2])]
            for c, pos, mask in rows:
                k, v = layer.self_attn.keys_values(c, pos)
                segs.append((k, v, mask))
            h = layer.with_context(h, positions, segs, block_mask)
        return (tuple(ks), tuple(vs)) if project_only else h


class MarkovHead(nn.Module):
    """DSpark's vanilla low-rank transition bias b = W2(W1[previous token]). The previous token is a target
    id (the anchor can be any token); the bias is over the draft vocabulary (`out_size`, the whole vocabulary
    without one), so with a draft vocabulary W2 is [rank, K] and a slot's bias reads K·rank weights, not V·rank."""

    vocab_size: int
    rank: int
    out_size: int
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, prev_tokens: Array) -> Array:
        w1 = nn.Embed(self.vocab_size, self.rank, param_dtype=self.param_dtype, name="markov_w1",
                      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "rank")))
        w2 = dense(self.out_size, "markov_w2", ("rank", "vocab"), use_bias=False, dtype=jnp.float32,
                   param_dtype=self.param_dtype)
        return w2(w1(prev_tokens).astype(jnp.float32)).astype(jnp.float32)


class CarryProjection(nn.Module):
    """The projection-module interface for carried rows (the Carryover paper's appendix ablation): a
    residual SwiGLU module on the fused rows, `x + down(silu(gate(x)) * up(x))`, d -> d -> d (3 d^2
    params: 19.7M at Qwen3-4B's d = 2560, the size the paper reports). `down_proj` starts at zero, so a
    fresh or continued drafter starts exactly at the embedding form and training moves it; gate/up start
    random so down_proj's first gradient is non-zero."""

    hidden_size: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kw = dict(use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
        gate = dense(self.hidden_size, "gate_proj", ("embed", "mlp"), **kw)(x)
        up = dense(self.hidden_size, "up_proj", ("embed", "mlp"), **kw)(x)
        down = dense(self.hidden_size, "down_proj", ("mlp", "embed"), kernel_init=nn.initializers.zeros, **kw)
        return x + down(jax.nn.silu(gate) * up)


class Drafter(nn.Module):
    cfg: DrafterConfig
    remat: bool = False

    def setup(self):
        c, bc = self.cfg, self.cfg.backbone
        dt, pdt = dtype_of(bc.dtype), dtype_of(bc.param_dtype)
        products = bc.numerics.decode_products
        self.fc = dense(bc.hidden_size, "fc", ("features", "embed"), use_bias=False, dtype=dt, param_dtype=pdt,
                        products=products)
        self.hidden_norm = RMSNorm(bc.rms_norm_eps, dt, pdt, kind=bc.norm_kind)
        self.layers = DraftLayers(c, self.remat)
        self.norm = RMSNorm(bc.rms_norm_eps, dt, pdt, kind=bc.norm_kind)
        if c.carryover:
            self.e_rej = self.param(
                "e_rej", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (bc.hidden_size,), pdt
            )
        if c.carry_module == "projection":
            self.carry_proj = CarryProjection(bc.hidden_size, dt, pdt)
        if c.markov_rank:
            self.markov_head = MarkovHead(bc.vocab_size, c.markov_rank, c.draft_vocab_size, pdt)
        if c.draft_vocab:
            self.lm_head = dense(len(c.draft_vocab), "lm_head", ("embed", "vocab"), use_bias=False, dtype=jnp.float32,
                                 param_dtype=pdt, products=products)

    # -- context rows -------------------------------------------------------------------------------
    def fuse(self, features: Array) -> Array:
        """Target features [B, R, m·d] -> context rows [B, R, d]."""
        if features.shape[-1] != self.cfg.feature_dim:
            raise ConfigError(
                f"target features have width {features.shape[-1]}, the drafter expects "
                f"{self.cfg.feature_dim} = {len(self.cfg.target_layer_ids)} layers x {self.cfg.hidden_size}"
            )
        return self.hidden_norm(self.fc(features))

    def fuse_carried(self, features: Array, frozen=None) -> Array:
        """Rejected verify features -> carried rows: fused like context, marked with e_rej. Token ids
        [B, R] (the interface ablation of DVD training) are embedded by the frozen target embedding
        instead of `fc`."""
        if jnp.issubdtype(features.dtype, jnp.integer):
            fused = self.embed(frozen, features)
        else:
            fused = self.fuse(features)
        return self.mark_carried(fused)

    def mark_carried(self, fused: Array) -> Array:
        """Fused rows [B, R, d] -> carried rows: + e_rej, the one learned "this row was rejected" mark
        (after `carry_proj` with `carry_module="projection"`)."""
        if not self.cfg.carryover:
            raise ConfigError("this drafter was built without Carryover (carryover=False)")
        if self.cfg.carry_module == "projection":
            fused = self.carry_proj(fused).astype(fused.dtype)
        return fused + self.e_rej.astype(fused.dtype)

    def project(self, rows: Array, positions: Array):
        """Fused rows -> per-layer (ks, vs), for the committed-context cache."""
        return self.layers(None, None, None, rows=((rows, positions, None),), project_only=True)

    # -- block -------------------------------------------------------------------------------------
    def block_hidden(self, tokens, positions, frozen, *, cached=None, rows=(), block_mask=None):
        """Block tokens [B, T] at positions [B, T] -> final-normed hidden [B, T, d]. `block_mask`:
        None = the block attends to all of itself; [B, T, T] bool; or an int G = T/G independent blocks
        of G slots (training: each block sees only itself, without a [T, T] mask)."""
        h = self.embed(frozen, tokens)
        if block_mask is None:
            b, t = tokens.shape
            block_mask = jnp.ones((b, t, t), bool)
        return self.norm(self.layers(h, positions, block_mask, cached=cached, rows=rows))

    def embed(self, frozen, tokens: Array) -> Array:
        """The frozen target embedding of token ids (Gemma: x sqrt(d), the scale in the embedding dtype)."""
        bc = self.cfg.backbone
        e = take(frozen["embed"], tokens)
        if bc.embed_scale:
            e = e * jnp.asarray(bc.hidden_size ** 0.5, e.dtype)
        return e.astype(bc.numerics.compute)

    def markov_bias(self, prev_tokens: Array) -> Array:
        return self.markov_head(prev_tokens)

    def logits(self, h: Array, frozen) -> Array:
        """Final-normed hidden [..., d] -> float32 draft logits over the draft vocabulary: the
        drafter's own `lm_head` when it has a draft vocabulary, else the target's frozen head."""
        if self.cfg.draft_vocab:
            return cap_logits(self.lm_head(h.astype(jnp.float32)), frozen)
        return logits_from_hidden(h, frozen)

    def __call__(self, tokens, positions, frozen, features, feature_positions, feature_mask,
                 carried=None, carried_positions=None, carried_valid=None, block_mask=None, *,
                 return_hidden=False):
        """Cache-free forward (training, tests): backbone logits [B, T, V] of the block slots
        (or the final-normed hidden states with `return_hidden`).

        features [B, S, m·d] with feature_mask [B, T, S]; carried [B, R, m·d] (or token ids [B, R]) with
        carried_valid [B, R] (see `carried_segment_mask`).
        """
        rows = [(self.fuse(features), feature_positions, feature_mask)]
        if carried is not None:
            mask = carried_segment_mask(carried_valid, tokens.shape[1], block_mask)
            rows.append((self.fuse_carried(carried, frozen), carried_positions, mask))
        h = self.block_hidden(tokens, positions, frozen, rows=tuple(rows), block_mask=block_mask)
        return h if return_hidden else self.logits(h, frozen)

    def init_all(self, tokens, *args, **kw):
        """Touches every submodule so `init` creates all params."""
        out = self(tokens, *args, **kw)
        if self.cfg.markov_rank:
            out = out + self.markov_bias(tokens)
        return out


def carried_segment_mask(carried_valid: Array, num_queries: int, block_mask=None) -> Blockwise:
    """Which carried rows a block sees, the same in training and decoding: the rows are split evenly
    among the blocks (one block when decoding; N when training, `block_mask` = the int block size)
    and block n sees its own rows where `carried_valid` [B, R] holds — when decoding, rows
    j < rejected_count of the previous round."""
    n = num_queries // block_mask if isinstance(block_mask, int) else 1
    return Blockwise(n, key_valid=carried_valid)


def to_target_ids(cfg: DrafterConfig, draft_ids: Array) -> Array:
    """Indices into the draft vocabulary -> target token ids (identity without one)."""
    if not cfg.draft_vocab:
        return draft_ids
    return jnp.asarray(np.asarray(cfg.draft_vocab, np.int32))[draft_ids]


@functools.lru_cache(maxsize=8)
def draft_index_table(draft_vocab: tuple[int, ...], vocab_size: int) -> np.ndarray:
    """[V] int32: each target id's index in the draft vocabulary, -1 outside it."""
    table = np.full(vocab_size, -1, np.int32)
    table[np.asarray(draft_vocab)] = np.arange(len(draft_vocab), dtype=np.int32)
    return table


def to_target_probs(cfg: DrafterConfig, q: Array) -> Array:
    """A distribution over the draft vocabulary [..., K] -> the same over the target's [..., V]
    (zero outside the draft vocabulary): what lossless verification divides by."""
    if not cfg.draft_vocab:
        return q
    full = jnp.zeros(q.shape[:-1] + (cfg.backbone.vocab_size,), q.dtype)
    return full.at[..., np.asarray(cfg.draft_vocab)].set(q)


def with_draft_head(cfg: DrafterConfig, params, frozen) -> dict:
    """Params whose `lm_head` starts as the target head's rows of the draft vocabulary (EAGLE-3)."""
    if not cfg.draft_vocab:
        return params
    ids = np.asarray(cfg.draft_vocab)
    rows = frozen["embed"][ids].T if frozen.get("head") is None else frozen["head"][:, ids]
    kernel = params["lm_head"]["kernel"]
    return {**params, "lm_head": {"kernel": jnp.asarray(rows, kernel.dtype)}}


def frozen_head(frozen) -> Array:
    """The target's LM head weight the drafter reads: the tied [V, d] embedding or the [d, V] head."""
    return frozen["embed"] if frozen.get("head") is None else frozen["head"]


def in_head_dtype(h: Array, frozen) -> Array:
    """h cast to the frozen head's dtype: the drafter reads the target's head as the target does (a bf16
    target: bf16 h x bf16 head, float32 sums), so no call converts the [V, d] head itself (a float32 drafter
    on a bf16 target widened SmolLM2's 28M-weight head to float32 at every separately dispatched call and
    every training step)."""
    return h.astype(frozen_head(frozen).dtype)


def logits_from_hidden(h: Array, frozen) -> Array:
    """Frozen target LM head; `head` None means tied to the embedding (no [V, d] transpose copy), h in the
    head's dtype (`in_head_dtype`), float32 logits. Soft-capped like the target's logits (Gemma); a Markov
    bias is added after this."""
    tied = frozen.get("head") is None
    z = lm_head_logits(in_head_dtype(h, frozen), frozen_head(frozen), vocab_major_weight=tied)
    return cap_logits(z, frozen)


def cap_logits(z: Array, frozen) -> Array:
    """cap * tanh(z / cap) with the target's `final_logit_softcapping` (Gemma), else z."""
    cap = frozen.get("softcap")
    return z if cap is None else cap * jnp.tanh(z / cap)


def frozen_from_target(target_params, target_cfg) -> dict:
    """The drafter's frozen inputs: target embedding [V, d], LM head [d, V] (None when tied) and the
    target's logit soft-cap (None unless Gemma)."""
    embed = target_params["embed_tokens"]["embedding"]
    head = None if target_cfg.tie_word_embeddings else target_params["lm_head"]["kernel"]
    return {"embed": embed, "head": head, "softcap": target_cfg.final_logit_softcapping}


def check_pair(cfg: DrafterConfig, target_cfg) -> None:
    """One clear error when a drafter was built for a different target."""
    bc = cfg.backbone
    for what, a, b in (("hidden size", bc.hidden_size, target_cfg.hidden_size),
                       ("vocabulary", bc.vocab_size, target_cfg.vocab_size),
                       ("target layer count", cfg.num_target_layers, target_cfg.num_layers)):
        if a != b:
            raise ConfigError(f"drafter/target mismatch: the drafter expects {what} {a}, the target has {b}")


def init_drafter_params(cfg: DrafterConfig, rng: Array, *, boxed: bool = False):
    """Random init (N(0, 0.02) kernels, unit norms, zero e_rej and carry_proj.down_proj), like DeepSpec's post_init.
    `boxed` keeps flax's logical-partitioning boxes (for sharding specs; use under eval_shape)."""
    out = _init_drafter(cfg, rng)
    return out if boxed else nn.unbox(out)


@functools.partial(jax.jit, static_argnames=("cfg",))  # one compile per config, not one per call
def _init_drafter(cfg: DrafterConfig, rng: Array):
    d = cfg.hidden_size
    v = cfg.backbone.vocab_size
    frozen = {"embed": jnp.zeros((v, d)), "head": jnp.zeros((d, v))}
    t, s, p = cfg.block_size, 2, cfg.num_proposals
    args = (jnp.zeros((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32), frozen, jnp.zeros((1, s, cfg.feature_dim)),
            jnp.zeros((1, s), jnp.int32), jnp.ones((1, t, s), bool))
    kw = {}
    if cfg.carryover:
        kw = dict(carried=jnp.zeros((1, p, cfg.feature_dim)), carried_positions=jnp.zeros((1, p), jnp.int32),
                  carried_valid=jnp.ones((1, p), bool))

    return Drafter(cfg).init(rng, *args, **kw, method=Drafter.init_all)["params"]


def init_carry_projection(cfg: DrafterConfig, rng: Array):
    """Fresh `carry_proj` params (down_proj zero: carried rows as the embedding form makes them), for a
    drafter continued with `carry_module="projection"` from a checkpoint without the module."""
    bc = cfg.backbone
    m = CarryProjection(bc.hidden_size, dtype_of(bc.dtype), dtype_of(bc.param_dtype))
    return nn.unbox(jax.jit(m.init)(rng, jnp.zeros((1, 1, bc.hidden_size), dtype_of(bc.dtype)))["params"])


def proposal_slots(cfg: DrafterConfig) -> slice:
    """Which block slots carry proposals: z-lab slot k>=1 predicts its own position's token;
    DeepSpec slot k>=0 predicts the next token."""
    return slice(1, None) if cfg.layout == "zlab" else slice(0, None)
