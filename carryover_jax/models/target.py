"""Target LM (Llama / Qwen3 / Gemma 3 / Gemma 4 text by config switches) as a pure functional Flax linen module.

`TargetLM.apply(params, tokens, positions, cache, ...)` returns `(logits, new_cache, taps)`:
- `cache` is an explicit `KVCache` pytree (or None for a cache-free forward over a whole sequence,
  used by training to compute target features);
- `taps` is a tuple, in `tap_layers` order, of residual-stream outputs: layer id l is the output of
  decoder layer l (HF `hidden_states[l + 1]` for l < L-1; HF applies the final norm to its last
  entry, we do not), id -1 is the embedding output (Gemma: already x sqrt(d)). Drafters consume
  these as their features.

Gemma's sliding-window layers use the same cache layout (slot = position); their window is a
lower bound in their masks (`LiveMask.lower` for the cache, so a decode step reads only the
window's chunks), so rollback stays `lengths = ...` for every layer.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from carryover_jax.config import TargetConfig
from carryover_jax.errors import ConfigError
from carryover_jax.models import cpu_logsumexp
from carryover_jax.models.cache import KVCache, chunk_limit, chunk_mask, write_chunk
from carryover_jax.models.layers import (
    MLP, Attention, Blockwise, LiveMask, Prefix, RMSNorm, accumulate_f32, dtype_of, rope_inv_freq, take, tied_logits,
)

Array = jax.Array


def target_inv_freq(cfg: TargetConfig, layer: int = 0) -> tuple[float, ...]:
    """RoPE inverse frequencies of decoder layer `layer` (Gemma: sliding layers have their own base)."""
    if cfg.is_sliding(layer):
        inv = rope_inv_freq(cfg.layer_head_dim(layer), cfg.rope_local_theta)
    else:
        inv = rope_inv_freq(
            cfg.layer_head_dim(layer), cfg.rope_theta, cfg.rope_type, cfg.rope_factor, cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor, cfg.rope_original_max_position, cfg.rope_partial_factor,
        )
    return tuple(float(x) for x in inv)


def layer_type(cfg: TargetConfig, layer: int) -> str:
    return "sliding_attention" if cfg.is_sliding(layer) else "full_attention"


def window_masks(cfg: TargetConfig, full, query_slots: Array):
    """The full-attention mask, plus for a target with sliding layers the same mask cut to the
    window: {layer type: mask}. Keys are cache slots (slot = position); `query_slots` [B, T]."""
    if not any(cfg.is_sliding(i) for i in range(cfg.num_layers)):
        return full
    lower = query_slots - (cfg.sliding_window - 1)  # HF: key > query - sliding_window
    if isinstance(full, LiveMask):
        sliding = LiveMask(full.limit, full.chunk, lower=lower)
    elif isinstance(full, Prefix):
        sliding = Prefix(full.limit, lower if full.lower is None else jnp.maximum(full.lower, lower))
    else:
        sliding = full & (jnp.arange(full.shape[-1])[None, None, :] >= lower[:, :, None])
    return {"full_attention": full, "sliding_attention": sliding}


class DecoderLayer(nn.Module):
    """One decoder layer. `index` picks the layer's attention type, RoPE and shapes (Gemma); it may
    be omitted only when every layer of `cfg` is alike."""

    cfg: TargetConfig
    index: int | None = None

    def setup(self):
        c = self.cfg
        if self.index is None and not c.uniform_layers:
            raise ConfigError("a DecoderLayer of a target with per-layer attention types needs its layer index")
        i = self.index or 0
        dt, pdt = dtype_of(c.dtype), dtype_of(c.param_dtype)
        norm = dict(eps=c.rms_norm_eps, dtype=dt, param_dtype=pdt, kind=c.norm_kind)
        self.input_layernorm = RMSNorm(**norm)
        self.self_attn = Attention(
            embed_dim=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.layer_kv_heads(i),
            head_dim=c.layer_head_dim(i), inv_freq=target_inv_freq(c, i), qk_norm=c.qk_norm,
            use_bias=c.attention_bias, eps=c.rms_norm_eps, dtype=dt, param_dtype=pdt, scale=c.attention_scale,
            norm_kind=c.norm_kind, v_norm=c.v_norm, k_eq_v=c.layer_k_eq_v(i), backend=c.attention_backend,
            products=c.numerics.decode_products,
        )
        self.post_attention_layernorm = RMSNorm(**norm)
        if c.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(**norm)
            self.post_feedforward_layernorm = RMSNorm(**norm)
        if c.layer_scalar:
            self.scalar = self.param("layer_scalar", nn.with_logical_partitioning(nn.initializers.ones, (None,)),
                                     (1,), pdt)
        self.mlp = MLP(c.hidden_size, c.intermediate_size, c.hidden_act, c.mlp_bias, dt, pdt,
                       products=c.numerics.decode_products)

    def __call__(self, h, positions, mask, kv_buffers=None, write_index=None):
        """Target self-attention: the chunk's K/V (written into `kv_buffers` when caching)."""
        x = self.input_layernorm(h)
        q = self.self_attn.queries(x, positions)
        k, v = self.self_attn.keys_values(x, positions)
        if kv_buffers is not None:
            k = write_chunk(kv_buffers[0], k, write_index)
            v = write_chunk(kv_buffers[1], v, write_index)
        return self._finish(h, q, [(k, v, mask)]), (k, v)

    def with_context(self, h, positions, context_segments, block_mask):
        """Drafter block: queries from the block, keys/values from the given context segments
        (cache, carried rows, ...) followed by the block itself."""
        x = self.input_layernorm(h)
        q = self.self_attn.queries(x, positions)
        k, v = self.self_attn.keys_values(x, positions)
        return self._finish(h, q, list(context_segments) + [(k, v, block_mask)])

    def _finish(self, h, q, segments):
        a = self.self_attn.attend(q, segments)
        if self.cfg.sandwich_norms:  # Gemma: post_attention_layernorm normalises the attention output
            h = h + self.post_attention_layernorm(a)
            h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        else:
            h = h + a
            h = h + self.mlp(self.post_attention_layernorm(h))
        if self.cfg.layer_scalar:
            h = h * self.scalar.astype(h.dtype)
        return nn.with_logical_constraint(h, ("activation_batch", "activation_length", "activation_embed"))


class DecoderStack(nn.Module):
    """Named "layers" so params read `layers/<i>/self_attn/q_proj/kernel`, like HF.

    A Python loop over per-layer params, not `nn.scan`: on CPU the scanned stack decodes ~1.8x
    slower (weights are sliced out of the stacked array each step), and per-layer names keep the
    HF mapping mechanical.
    """

    cfg: TargetConfig

    @nn.compact
    def __call__(self, h, positions, mask, cache: KVCache | None, tap_layers: tuple[int, ...], context=None):
        """`mask`: one mask for every layer, or {layer type: mask} (`TargetLM.masks`). `context` =
        (ks, vs, mask): per-layer K/V the chunk also attends to (no cache then; `mask` is the chunk's
        mask over itself), e.g. DVD's recorded prefix."""
        taps = {}
        if -1 in tap_layers:
            taps[-1] = h
        new_k, new_v = [], []
        pick = lambda m, i: m[layer_type(self.cfg, i)] if isinstance(m, dict) else m  # noqa: E731
        for i in range(self.cfg.num_layers):
            layer = DecoderLayer(self.cfg, i, name=str(i))
            if context is not None:
                ks, vs, cmask = context
                h = layer.with_context(h, positions, [(ks[i], vs[i], pick(cmask, i))], pick(mask, i))
            else:
                bufs = None if cache is None else (cache.k[i], cache.v[i])
                write = None if cache is None else cache.lengths
                h, (k, v) = layer(h, positions, pick(mask, i), bufs, write)
                new_k.append(k)
                new_v.append(v)
            if i in tap_layers:
                taps[i] = h
        return h, tuple(new_k), tuple(new_v), tuple(taps[i] for i in tap_layers)


class TargetLM(nn.Module):
    cfg: TargetConfig

    def setup(self):
        c = self.cfg
        dt, pdt = dtype_of(c.dtype), dtype_of(c.param_dtype)
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, dtype=dt, param_dtype=pdt,
            embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
        )
        self.layers = DecoderStack(c)
        self.norm = RMSNorm(c.rms_norm_eps, dt, pdt, kind=c.norm_kind)
        if not c.tie_word_embeddings:  # float32 accumulation and output in any compute dtype
            self.lm_head = nn.Dense(
                c.vocab_size, use_bias=False, dtype=dt, param_dtype=pdt,
                kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "vocab")),
                dot_general=functools.partial(accumulate_f32, f32_out=True, products=c.numerics.decode_products),
            )

    def embed(self, tokens: Array) -> Array:
        h = take(self.embed_tokens.embedding, tokens).astype(dtype_of(self.cfg.dtype))
        if self.cfg.embed_scale:  # Gemma: x sqrt(d), the scale rounded to the embedding dtype first
            h = h * jnp.asarray(math.sqrt(self.cfg.hidden_size), dtype_of(self.cfg.param_dtype)).astype(h.dtype)
        return h

    def masks(self, full, query_slots: Array):
        return window_masks(self.cfg, full, query_slots)

    def features(self, tokens: Array, tap_layers: tuple[int, ...], mask: Array | None = None, *,
                 with_kv: bool = False):
        """Cache-free forward for training: (taps, final-normed last hidden [B, T, d]); no logits.
        `with_kv` also returns every layer's (k, v) — the prefix that DVD verification attends to."""
        b, t = tokens.shape
        if mask is None:  # causal as a per-query key limit: no [T, T] mask in the fused backends
            attn_mask = Prefix(jnp.broadcast_to(jnp.arange(1, t + 1, dtype=jnp.int32)[None, :], (b, t)))
        else:
            attn_mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool))[None], (b, t, t)) & mask
        positions = jnp.broadcast_to(jnp.arange(t)[None, :], (b, t))
        attn_mask = self.masks(attn_mask, positions)
        h, ks, vs, taps = self.layers(self.embed(tokens), positions, attn_mask, None, tuple(tap_layers))
        return (taps, self.norm(h), ks, vs) if with_kv else (taps, self.norm(h))

    def with_context(self, tokens: Array, positions: Array, context_kv, context_mask, block_mask,
                     tap_layers: tuple[int, ...]):
        """Cache-free forward of `tokens` [B, T] at `positions` that attends to per-layer context K/V
        (`context_kv` = (ks, vs), e.g. `features(..., with_kv=True)` of a recorded sequence; keys are
        its slots) under `context_mask` and to itself under `block_mask` (e.g. `Blockwise(N, causal=True)`
        for N verify blocks at once). Sliding layers get both masks cut to their window. Returns
        (taps, final-normed hidden [B, T, d])."""
        if self.cfg.sliding_window is not None and isinstance(block_mask, Blockwise):
            size = tokens.shape[1] // block_mask.num_blocks
            if size > self.cfg.sliding_window:  # a block's own keys are not window-masked
                raise ConfigError(f"blocks of {size} tokens exceed the target's sliding window "
                                  f"{self.cfg.sliding_window}")
        ks, vs = context_kv
        cmask = self.masks(context_mask, positions)
        h, _, _, taps = self.layers(self.embed(tokens), positions, block_mask, None, tuple(tap_layers),
                                    context=(ks, vs, cmask))
        return taps, self.norm(h)

    def head(self, h: Array) -> Array:
        """LM head on already final-normed hidden states: float32 logits accumulated in float32 in any
        compute dtype (Gemma: soft-capped), so AR's 1 row and verification's P+1 rows agree. Tied: a
        contraction with the [V, d] embedding (`Embed.attend` compiles to a transpose fused into the
        dot, slower) in the numerics' `lm_head` form."""
        if not self.cfg.tie_word_embeddings:
            logits = self.lm_head(h).astype(jnp.float32)
        else:
            logits = tied_logits(h, self.embed_tokens.embedding, self.cfg.numerics)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        cache: KVCache | None = None,
        *,
        mask: Array | None = None,
        tap_layers: tuple[int, ...] = (),
        logit_indices: Array | None = None,
        with_hidden: bool = False,
        logits: bool = True,
    ):
        """tokens [B, T] -> (logits, new_cache, taps); with `with_hidden` a fourth, the final-normed hidden
        state [B, T, d] at every chunk index (what a response store keeps beside the taps).

        With a cache, the chunk is written at slots `cache.lengths + arange(T)` and the returned
        cache has `lengths + T` (callers move `lengths` back for padding or rejected tokens).
        `positions` default to those slots. Without a cache the chunk attends causally to itself
        (and `mask` [B, T, T], if given, is and-ed in). `logit_indices` [B, K] computes logits
        only at those chunk indices (prefill needs one per row, not a [B, T, V] tensor). `logits=False` skips
        the head (the first output is None): a greedy step takes its tokens from the hidden state
        (`models/greedy_head.py`).
        """
        b, t = tokens.shape
        for l in tap_layers:
            if not -1 <= l < self.cfg.num_layers:
                raise ConfigError(f"tap layer {l} out of range [-1, {self.cfg.num_layers - 1}]")
        if cache is not None:
            slots = cache.lengths[:, None] + jnp.arange(t)[None, :]
            if mask is None:  # attention reads the cache only up to the longest live row
                attn_mask = LiveMask(chunk_limit(cache.lengths, t))
            else:
                attn_mask = chunk_mask(cache.lengths, t, cache.max_len) & mask
        else:
            slots = jnp.broadcast_to(jnp.arange(t)[None, :], (b, t))
            attn_mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool))[None], (b, t, t))
            if mask is not None:
                attn_mask = attn_mask & mask
        if positions is None:
            positions = slots
        h = self.embed(tokens)
        h, ks, vs, taps = self.layers(h, positions, self.masks(attn_mask, slots), cache, tuple(tap_layers))
        pick = (lambda x: x) if logit_indices is None else (
            lambda x: jnp.take_along_axis(x, logit_indices[:, :, None], axis=1))
        normed = self.norm(h) if with_hidden else None  # the default path norms only the picked rows
        out = None
        if logits:
            out = self.head(pick(normed) if with_hidden else self.norm(pick(h)))
        new_cache = None if cache is None else KVCache(k=ks, v=vs, lengths=cache.lengths + t)
        return (out, new_cache, taps, normed) if with_hidden else (out, new_cache, taps)


def head_columns(cfg: TargetConfig, params, ids: Array) -> Array:
    """The LM head's weights for the vocabulary ids `ids` only: [K, d] rows of a tied embedding, [d, K]
    columns of an untied head (gathered once, then used by `head_at` on any number of rows)."""
    if cfg.tie_word_embeddings:
        return take(params["embed_tokens"]["embedding"], ids, axis=0)
    return take(params["lm_head"]["kernel"], ids, axis=1)


def head_at(cfg: TargetConfig, columns: Array, h: Array) -> Array:
    """`TargetLM.head`'s logits [..., K] at the ids whose `head_columns` are given: the same products, in
    the same form and dtypes, over K vocabulary entries instead of V."""
    if cfg.tie_word_embeddings:
        logits = tied_logits(h, columns, cfg.numerics)
    else:  # nn.Dense promotes both operands to the compute dtype
        dt = dtype_of(cfg.dtype)
        logits = accumulate_f32(h.astype(dt), columns.astype(dt), (((h.ndim - 1,), (0,)), ((), ())), f32_out=True,
                                products=cfg.numerics.decode_products)
    cap = cfg.final_logit_softcapping
    return logits if cap is None else cap * jnp.tanh(logits / cap)


LSE_CHUNK = 1024  # rows of `head_logsumexp`'s [rows, V] float32 logits at once


def head_logsumexp(cfg: TargetConfig, params, h: Array, chunk: int = LSE_CHUNK) -> Array:
    """log Σ_v exp(logit_v) of `TargetLM.head` at each row of h [..., d] -> float32 [...], `chunk` rows at a
    time (a [rows, V] float32 block at once; on CPU the exp-and-sum by `cpu_logsumexp`'s kernel)."""
    rows = h.reshape(-1, h.shape[-1])
    n = rows.shape[0]
    pad = (-n) % chunk if n > chunk else 0
    blocks = jnp.pad(rows, ((0, pad), (0, 0))).reshape(-1, min(n, chunk), rows.shape[-1])

    def one(x):
        return cpu_logsumexp.logsumexp(TargetLM(cfg).apply({"params": params}, x, method=TargetLM.head))

    return jax.lax.map(one, blocks).reshape(-1)[:n].reshape(h.shape[:-1])


@functools.partial(jax.jit, static_argnames=("cfg", "batch", "seq"))
def _init(cfg: TargetConfig, rng: Array, batch: int, seq: int):
    return TargetLM(cfg).init(rng, jnp.zeros((batch, seq), jnp.int32))


def init_params(cfg: TargetConfig, rng: Array, *, batch: int = 1, seq: int = 8):
    """Random params (tests, benchmarks). Loaded checkpoints never go through init. One jitted init per
    config (a fresh `jax.jit(model.init)` per call recompiled every time)."""
    return nn.unbox(_init(cfg, rng, batch, seq))["params"]


def abstract_params(cfg: TargetConfig):
    """Shapes/dtypes of the param tree without computing anything (checkpoint shape checks)."""
    model = TargetLM(cfg)
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    boxed = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return nn.unbox(boxed)["params"]


def new_cache(cfg: TargetConfig, batch: int, max_len: int) -> KVCache:
    """Per-layer buffers (Gemma 4's global layers have their own head dim and KV heads)."""
    return KVCache.zeros(
        num_layers=cfg.num_layers, batch=batch, max_len=max_len,
        num_kv_heads=tuple(cfg.layer_kv_heads(i) for i in range(cfg.num_layers)),
        head_dim=tuple(cfg.layer_head_dim(i) for i in range(cfg.num_layers)), dtype=cfg.numerics.cache_storage,
    )
