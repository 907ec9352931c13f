"""Block drafters (DFlash, DSpark-derived Markov) with Carryover, as a pure functional linen module.

Params (names mirror the exported PyTorch checkpoints): `fc` (m·d -> d, no bias), `hidden_norm`,
`layers/<i>/...` (the same `DecoderLayer` as the target, with q/k norms), `norm`, optional `e_rej`
(the Carryover embedding, zero-initialised) and `markov_head/{markov_w1, markov_w2}`. The target's
embedding and LM head are *not* params: they arrive frozen in `frozen` (see `frozen_from_target`).

Every block query attends to a list of key/value segments: the committed-context cache (or, in
training, context rows given by a mask), the carried rejected rows (valid iff `j < rejected_count`)
and the block itself (non-causal). Context and carried rows are fused features projected by each
layer's own k/v projections; they are never transformed by the draft layers.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from carryover_jax.config import DrafterConfig
from carryover_jax.errors import ConfigError
from carryover_jax.models.cache import KVCache, write_chunk
from carryover_jax.models.layers import LiveMask, RMSNorm, dense, dtype_of, tied_logits
from carryover_jax.models.target import DecoderLayer

Array = jax.Array


class DraftLayers(nn.Module):
    """Named "layers": `layers/<i>/...`. One compact method serves both uses (static `project_only`)."""

    cfg: DrafterConfig
    remat: bool = False

    @nn.compact
    def __call__(self, h, positions, block_mask, cached=None, rows=(), *, project_only=False):
        """project_only: rows[0] = (C, positions) -> per-layer (k, v) tuples (for the context cache).
        Otherwise: block hidden states after all layers. `cached` = (ks, vs, mask) per-layer K/V;
        `rows` = ((C, positions, mask), ...) fused rows projected in every layer."""
        ks, vs = [], []
        # remat recomputes each layer's activations in the backward pass (long training sequences)
        # (block_mask, argument 4 counting self, is static there: training passes the int block size)
        layer_cls = (nn.remat(DecoderLayer, methods=["with_context"], static_argnums=(4,)) if self.remat
                     else DecoderLayer)
        for i in range(self.cfg.backbone.num_layers):
            layer = layer_cls(self.cfg.backbone, name=str(i))
            if project_only:
                k, v = layer.context_kv(*rows[0][:2])
                ks.append(k)
                vs.append(v)
                continue
            segs = [] if cached is None else [(cached[0][i], cached[1][i], cached[2])]
            for c, pos, mask in rows:
                k, v = layer.context_kv(c, pos)
                segs.append((k, v, mask))
            h = layer.with_context(h, positions, segs, block_mask)
        return (tuple(ks), tuple(vs)) if project_only else h


class MarkovHead(nn.Module):
    """DSpark's vanilla low-rank transition bias b = W2(W1[previous token])."""

    vocab_size: int
    rank: int
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, prev_tokens: Array) -> Array:
        w1 = nn.Embed(self.vocab_size, self.rank, param_dtype=self.param_dtype, name="markov_w1",
                      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "rank")))
        w2 = dense(self.vocab_size, "markov_w2", ("rank", "vocab"), use_bias=False, dtype=jnp.float32,
                   param_dtype=self.param_dtype)
        return w2(w1(prev_tokens).astype(jnp.float32)).astype(jnp.float32)


class Drafter(nn.Module):
    cfg: DrafterConfig
    remat: bool = False

    def setup(self):
        c, bc = self.cfg, self.cfg.backbone
        dt, pdt = dtype_of(bc.dtype), dtype_of(bc.param_dtype)
        self.fc = dense(bc.hidden_size, "fc", ("features", "embed"), use_bias=False, dtype=dt, param_dtype=pdt)
        self.hidden_norm = RMSNorm(bc.rms_norm_eps, dt, pdt)
        self.layers = DraftLayers(c, self.remat)
        self.norm = RMSNorm(bc.rms_norm_eps, dt, pdt)
        if c.carryover:
            self.e_rej = self.param(
                "e_rej", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (bc.hidden_size,), pdt
            )
        if c.markov_rank:
            self.markov_head = MarkovHead(bc.vocab_size, c.markov_rank, pdt)

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
        if not self.cfg.carryover:
            raise ConfigError("this drafter was built without Carryover (carryover=False)")
        if jnp.issubdtype(features.dtype, jnp.integer):
            fused = jnp.take(frozen["embed"], features, axis=0).astype(dtype_of(self.cfg.backbone.dtype))
        else:
            fused = self.fuse(features)
        return fused + self.e_rej.astype(fused.dtype)

    def project(self, rows: Array, positions: Array):
        """Fused rows -> per-layer (ks, vs), for the committed-context cache."""
        return self.layers(None, None, None, rows=((rows, positions, None),), project_only=True)

    # -- block -------------------------------------------------------------------------------------
    def block_hidden(self, tokens, positions, frozen, *, cached=None, rows=(), block_mask=None):
        """Block tokens [B, T] at positions [B, T] -> final-normed hidden [B, T, d]. `block_mask`:
        None = the block attends to all of itself; [B, T, T] bool; or an int G = T/G independent blocks
        of G slots (training: each block sees only itself, without a [T, T] mask)."""
        h = jnp.take(frozen["embed"], tokens, axis=0).astype(dtype_of(self.cfg.backbone.dtype))
        if block_mask is None:
            b, t = tokens.shape
            block_mask = jnp.ones((b, t, t), bool)
        return self.norm(self.layers(h, positions, block_mask, cached=cached, rows=rows))

    def markov_bias(self, prev_tokens: Array) -> Array:
        return self.markov_head(prev_tokens)

    def __call__(self, tokens, positions, frozen, features, feature_positions, feature_mask,
                 carried=None, carried_positions=None, carried_mask=None, block_mask=None, *,
                 return_hidden=False):
        """Cache-free forward (training, tests): backbone logits [B, T, V] of the block slots
        (or the final-normed hidden states with `return_hidden`).

        features [B, S, m·d] with feature_mask [B, T, S]; carried [B, P, m·d] (or token ids [B, P]) with
        carried_mask [B, T, P] or a `Blockwise` (training: block n sees only its own carried rows).
        """
        rows = [(self.fuse(features), feature_positions, feature_mask)]
        if carried is not None:
            rows.append((self.fuse_carried(carried, frozen), carried_positions, carried_mask))
        h = self.block_hidden(tokens, positions, frozen, rows=tuple(rows), block_mask=block_mask)
        return h if return_hidden else logits_from_hidden(h, frozen)


    def init_all(self, tokens, *args, **kw):
        """Touches every submodule so `init` creates all params."""
        out = self(tokens, *args, **kw)
        if self.cfg.markov_rank:
            out = out + self.markov_bias(tokens)
        return out


def logits_from_hidden(h: Array, frozen) -> Array:
    """Frozen target LM head; `head` None means tied to the embedding (no [V, d] transpose copy)."""
    if frozen.get("head") is None:
        return jnp.einsum("btd,vd->btv", h, frozen["embed"].astype(h.dtype), preferred_element_type=jnp.float32)
    return jnp.einsum("btd,dv->btv", h, frozen["head"].astype(h.dtype), preferred_element_type=jnp.float32)


def frozen_from_target(target_params, target_cfg) -> dict:
    """The drafter's frozen inputs: target embedding [V, d] and LM head [d, V] (None when tied)."""
    embed = target_params["embed_tokens"]["embedding"]
    head = None if target_cfg.tie_word_embeddings else target_params["lm_head"]["kernel"]
    return {"embed": embed, "head": head}


def check_pair(cfg: DrafterConfig, target_cfg) -> None:
    """One clear error when a drafter was built for a different target."""
    bc = cfg.backbone
    for what, a, b in (("hidden size", bc.hidden_size, target_cfg.hidden_size),
                       ("vocabulary", bc.vocab_size, target_cfg.vocab_size),
                       ("target layer count", cfg.num_target_layers, target_cfg.num_layers)):
        if a != b:
            raise ConfigError(f"drafter/target mismatch: the drafter expects {what} {a}, the target has {b}")


def init_drafter_params(cfg: DrafterConfig, rng: Array, *, boxed: bool = False):
    """Random init (N(0, 0.02) kernels, unit norms, zero e_rej), like DeepSpec's post_init.
    `boxed` keeps flax's logical-partitioning boxes (for sharding specs; use under eval_shape)."""
    d = cfg.hidden_size
    v = cfg.backbone.vocab_size
    frozen = {"embed": jnp.zeros((v, d)), "head": jnp.zeros((d, v))}
    t, s, p = cfg.block_size, 2, cfg.num_proposals
    args = (jnp.zeros((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32), frozen, jnp.zeros((1, s, cfg.feature_dim)),
            jnp.zeros((1, s), jnp.int32), jnp.ones((1, t, s), bool))
    kw = {}
    if cfg.carryover:
        kw = dict(carried=jnp.zeros((1, p, cfg.feature_dim)), carried_positions=jnp.zeros((1, p), jnp.int32),
                  carried_mask=jnp.ones((1, t, p), bool))

    def init(r):
        return Drafter(cfg).init(r, *args, **kw, method=Drafter.init_all)

    out = jax.jit(init)(rng)["params"]
    return out if boxed else nn.unbox(out)


# ---- decoding-time pieces (the committed-context cache and the block with carried rows) ---------------
def new_context_cache(cfg: DrafterConfig, batch: int, max_len: int) -> KVCache:
    bc = cfg.backbone
    return KVCache.zeros(num_layers=bc.num_layers, batch=batch, max_len=max_len, num_kv_heads=bc.num_kv_heads,
                         head_dim=bc.head_dim, dtype=dtype_of(bc.dtype))


def append_context(cfg: DrafterConfig, params, cache: KVCache, features: Array, count: Array) -> KVCache:
    """Project newly committed features [B, R, m·d] (first `count[b]` rows valid) into the cache at
    slots `lengths .. lengths+R-1` (= their positions); lengths += count. Only new rows are projected."""
    return append_rows(cfg, params, cache, fuse_rows(cfg, params, features), count)


def fuse_rows(cfg: DrafterConfig, params, features: Array) -> Array:
    """Target features [B, R, m·d] -> fused rows [B, R, d] (`fc` + `hidden_norm`)."""
    return Drafter(cfg).apply({"params": params}, features, method=Drafter.fuse)


def mark_carried(cfg: DrafterConfig, params, fused: Array) -> Array:
    """Fused rows -> carried rows (+ e_rej): `Drafter.fuse_carried` for rows fused already, so the
    rejected rows verification fused for the cache append are not fused by `fc` a second time."""
    if not cfg.carryover:
        raise ConfigError("this drafter was built without Carryover (carryover=False)")
    return fused + params["e_rej"].astype(fused.dtype)


def append_rows(cfg: DrafterConfig, params, cache: KVCache, rows: Array, count: Array) -> KVCache:
    """`append_context` for rows fused already ([B, R, d])."""
    r = rows.shape[1]
    positions = cache.lengths[:, None] + jnp.arange(r)[None, :]
    ks, vs = Drafter(cfg).apply({"params": params}, rows, positions, method=Drafter.project)
    return KVCache(
        k=tuple(write_chunk(buf, k, cache.lengths) for buf, k in zip(cache.k, ks)),
        v=tuple(write_chunk(buf, v, cache.lengths) for buf, v in zip(cache.v, vs)),
        lengths=cache.lengths + count.astype(jnp.int32),
    )


def block_tokens(cfg: DrafterConfig, anchor: Array) -> Array:
    """[anchor, MASK x (B-1)] for each row."""
    b = anchor.shape[0]
    masks = jnp.full((b, cfg.block_size - 1), cfg.mask_token_id, jnp.int32)
    return jnp.concatenate([anchor[:, None].astype(jnp.int32), masks], axis=1)


def proposal_slots(cfg: DrafterConfig) -> slice:
    """Which block slots carry proposals: z-lab slot k>=1 predicts its own position's token;
    DeepSpec slot k>=0 predicts the next token."""
    return slice(1, None) if cfg.layout == "zlab" else slice(0, None)


def draft_block_logits(cfg: DrafterConfig, params, frozen, cache: KVCache, anchor: Array,
                       carried: Array | None = None, rejected_count: Array | None = None, *,
                       carried_fused: bool = False):
    """One drafting round's backbone logits for the proposal slots, [B, P, V].

    The anchor sits at position `cache.lengths` (context is strictly before it; attention reads the
    cache only up to the longest row). Carried rows j sit at `anchor_pos + j` and are visible iff
    j < rejected_count; pass `carried=None` for the plain drafter. `carried` holds target features
    [B, P, m·d], or with `carried_fused` rows already fused and marked (`mark_carried`) [B, P, d].
    Shapes never depend on the counts.
    """
    m = Drafter(cfg)
    b, t = anchor.shape[0], cfg.block_size
    anchor_pos = cache.lengths
    positions = anchor_pos[:, None] + jnp.arange(t)[None, :]
    ctx_mask = LiveMask(jnp.broadcast_to(cache.lengths[:, None], (b, t)))
    rows = ()
    if carried is not None:
        p = carried.shape[1]
        cpos = anchor_pos[:, None] + jnp.arange(p)[None, :]
        cmask = jnp.arange(p)[None, :] < rejected_count[:, None]
        fused = carried if carried_fused else m.apply({"params": params}, carried, method=Drafter.fuse_carried)
        rows = ((fused, cpos, jnp.broadcast_to(cmask[:, None, :], (b, t, p))),)
    h = m.apply({"params": params}, block_tokens(cfg, anchor), positions, frozen,
                cached=(cache.k, cache.v, ctx_mask), rows=rows, method=Drafter.block_hidden)
    h = h[:, proposal_slots(cfg)]
    if frozen.get("head") is None:  # tied: the few-row vocabulary-major contraction
        return tied_logits(h, frozen["embed"])
    return logits_from_hidden(h, frozen)


def markov_bias(cfg: DrafterConfig, params, prev_tokens: Array) -> Array:
    return Drafter(cfg).apply({"params": params}, prev_tokens, method=Drafter.markov_bias)


def teacher_forced_logits(cfg: DrafterConfig, params, backbone_logits: Array, anchor: Array, targets: Array):
    """Markov-corrected logits when the previous tokens are known: proposal i's previous token is
    the anchor for i = 0, else targets[:, i-1]. (Identity for DFlash.)"""
    if not cfg.markov_rank:
        return backbone_logits
    prev = jnp.concatenate([anchor[:, None], targets[:, :-1]], axis=1)
    return backbone_logits + markov_bias(cfg, params, prev)


def sequential_proposals(cfg: DrafterConfig, params, backbone_logits: Array, anchor: Array, rng: Array,
                         temperature: Array, top_k: int = 0, top_p: float = 1.0, *, sampling: bool = True):
    """Turn backbone logits [B, P, V] into proposals [B, P] and the draft distributions q [B, P, V]
    used by lossless verification. DFlash: slots are independent. Markov: sequential over slots, each
    slot's bias from the token chosen at the previous slot (the anchor for the first).

    `sampling=False` (static: every row greedy) takes argmaxes and returns q = None: no softmax or
    random draws over the vocabulary."""
    from carryover_jax.decode.sampling import probs, sample

    b, p, _ = backbone_logits.shape
    if not sampling:
        if not cfg.markov_rank:
            return jnp.argmax(backbone_logits, -1).astype(jnp.int32), None, backbone_logits

        def greedy(prev, lg):
            lg = lg + markov_bias(cfg, params, prev[:, None])[:, 0]
            tok = jnp.argmax(lg, -1).astype(jnp.int32)
            return tok, (tok, lg)

        _, (toks, corrected) = jax.lax.scan(greedy, anchor.astype(jnp.int32), jnp.swapaxes(backbone_logits, 0, 1))
        return jnp.swapaxes(toks, 0, 1), None, jnp.swapaxes(corrected, 0, 1)
    keys = jax.random.split(rng, p)
    if not cfg.markov_rank:
        q = probs(backbone_logits, temperature[:, None], top_k, top_p)
        toks = jax.vmap(lambda k, lg: sample(k, lg, temperature, top_k, top_p), in_axes=(0, 1), out_axes=1)(
            keys, backbone_logits)
        return toks, q, backbone_logits

    def body(prev, xs):
        key, lg = xs
        lg = lg + markov_bias(cfg, params, prev[:, None])[:, 0]
        tok = sample(key, lg, temperature, top_k, top_p)
        return tok, (tok, probs(lg, temperature, top_k, top_p), lg)

    _, (toks, q, corrected) = jax.lax.scan(body, anchor.astype(jnp.int32), (keys, jnp.swapaxes(backbone_logits, 0, 1)))
    sw = functools.partial(jnp.swapaxes, axis1=0, axis2=1)
    return sw(toks), sw(q), sw(corrected)
