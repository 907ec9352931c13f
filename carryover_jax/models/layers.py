"""The one set of layers shared by the target LMs and the drafters.

Conventions that must match HF PyTorch exactly: RMSNorm in float32 then cast; RoPE with the
"rotate_half" (split halves) layout; softmax in float32; Dense kernels stored `[in, out]`
(the HF weight transposed) under HF's module names.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax import numerics
from carryover_jax.numerics import ATTENTION_BACKENDS, KERNEL_BACKENDS
from carryover_jax.errors import ConfigError
from carryover_jax.models.kernels import NEG_INF, prefix_attention
from carryover_jax.models import cpu_attention, cpu_products, tpu_attention
from carryover_jax.models.cache import BITS, values
from carryover_jax.numerics import dot_f32, lm_head_logits

Array = jax.Array


def tied_logits(h: Array, embedding: Array, numerics) -> Array:
    """h [..., d] against a tied [V, d] embedding -> float32 logits [..., V], accumulated in float32, in the
    run's `Numerics` forms: `lm_head` ("vocab_major": XLA's CPU form for the few rows of a decode step; see
    `numerics.lm_head_logits`), and `decode_products` ("stream": `cpu_products`' kernel at 1-8 rows)."""
    plain = functools.partial(lm_head_logits, vocab_major_weight=True, impl=numerics.lm_head)
    if numerics.decode_products != "stream":
        return plain(h, embedding)
    return cpu_products.dot(h, embedding.astype(h.dtype), (((h.ndim - 1,), (1,)), ((), ())), plain)


def take(table: Array, ids: Array, axis: int = 0) -> Array:
    """`jnp.take` of a weight table's rows (or columns); a 16-bit float table is gathered as its bits. XLA CPU has
    no bf16 gather: it widens the table to float32 around the gather, and inside a decode loop it hoists that
    widening out of the loop, so every call copied SmolLM2's whole embedding to float32 (113 MB, ~33 ms) to read
    one row a step. As bits the hoisted copy is half that (XLA CPU copies even a same-width bitcast). Out-of-range
    ids give NaN, as `jnp.take`'s default does."""
    if jnp.dtype(table.dtype).itemsize != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        return jnp.take(table, ids, axis=axis)
    bits = jax.lax.bitcast_convert_type(table, jnp.uint16)
    return jax.lax.bitcast_convert_type(jnp.take(bits, ids, axis=axis), table.dtype)


def dtype_of(name: str):
    return jnp.dtype(name)


def accumulate_f32(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *, f32_out=False,
                   products: str = "xla", **kw):
    """`lax.dot_general` that accumulates in float32 and returns the operands' dtype. A bf16 x bf16 -> bf16
    dot has no XLA CPU kernel: the compiler converts both operands to float32 first (every weight of a bf16
    model copied to float32 at every step, slower than float32 weights), while bf16 x bf16 -> f32 runs
    natively (~2x float32's rate where the CPU has avx512_bf16 / AMX; one-row products: `dot_f32`). On
    GPUs the gemm accumulates in float32 either way: the rounding is the same. `f32_out` keeps the float32
    result (an LM head's logits). `products` is the run's `Numerics.decode_products` ("stream": a float32
    or bf16 product of 1-8 rows, or more up to `cpu_products.most_rows`, lowered for CPU runs
    `cpu_products`' kernel)."""
    del preferred_element_type, kw
    plain = functools.partial(dot_f32, dimension_numbers=dimension_numbers, precision=precision)
    out = cpu_products.dot(lhs, rhs, dimension_numbers, plain) if products == "stream" else plain(lhs, rhs)
    return out if f32_out else out.astype(jnp.result_type(lhs.dtype, rhs.dtype))


def dense(features: int, name: str, logical: tuple[str, str], *, use_bias: bool, dtype, param_dtype,
          kernel_init=nn.initializers.normal(0.02), f32_out: bool = False, products: str = "xla") -> nn.Dense:
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        dot_general=functools.partial(accumulate_f32, f32_out=f32_out, products=products),
        kernel_init=nn.with_logical_partitioning(kernel_init, logical),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, logical[1:]),
        name=name,
    )


NORM_KINDS = ("llama", "gemma", "gemma4")


def _normalize(x: Array, eps: float) -> Array:
    """x * rsqrt(mean(x^2) + eps) in float32."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
    """RMSNorm over the last axis, normalised in float32. `kind` fixes where the weight applies:
    "llama" `w * y` in the activation dtype; "gemma" (Gemma 2/3) `y * (1 + w)` in float32, the
    weight stored as an offset from 1 (initialised 0); "gemma4" `y * w` in float32. (Gemma 4's weightless v_norm is
    `_normalize`, in `Attention`.)"""

    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    logical: str = "norm"
    kind: str = "llama"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        y = _normalize(x, self.eps)
        init = nn.initializers.zeros if self.kind == "gemma" else nn.initializers.ones
        w = self.param(
            "weight", nn.with_logical_partitioning(init, (self.logical,)), (x.shape[-1],), self.param_dtype,
        )
        if self.kind == "gemma":
            return (y * (1.0 + w.astype(jnp.float32))).astype(self.dtype)
        if self.kind == "gemma4":
            return (y * w.astype(jnp.float32)).astype(self.dtype)
        return (w.astype(self.dtype) * y.astype(self.dtype)).astype(self.dtype)


# ---- RoPE --------------------------------------------------------------------------------------
def rope_inv_freq(head_dim: int, theta: float, rope_type: str = "default", factor: float = 1.0,
                  low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                  original_max_position: int = 8192, partial_factor: float = 1.0) -> np.ndarray:
    """Inverse frequencies [head_dim/2] (static; float32 exponents, like HF's `torch.arange(...).float()`).
    "proportional" (Gemma 4 global layers): the first int(partial_factor * head_dim / 2) frequencies
    with the exponent over the full head_dim, the rest 0 (those dims are not rotated), all / factor."""
    if rope_type == "proportional":
        n_rot = int(partial_factor * head_dim // 2)
        rot = 1.0 / (theta ** (np.arange(0, 2 * n_rot, 2, dtype=np.int64).astype(np.float32) / head_dim))
        inv = np.concatenate([rot, np.zeros(head_dim // 2 - n_rot, np.float32)]) / factor
        return inv.astype(np.float32)
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    if rope_type == "linear":
        inv = inv / factor
    elif rope_type == "llama3":
        low_wl = original_max_position / low_freq_factor
        high_wl = original_max_position / high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


@jax.custom_jvp
def bf16_values(x: Array) -> Array:
    """float32 x rounded to the nearest bf16 value (ties to even), still float32, by integer ops: XLA may drop a
    float32 -> bf16 -> float32 convert pair (excess precision) in one program and keep it in another. Differentiated
    as a convert is (the tangent passes through): the integer ops alone would give every input a zero gradient."""
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    u = (u + jnp.uint32(0x7FFF) + ((u >> 16) & 1)) & jnp.uint32(0xFFFF0000)
    return jnp.where(jnp.isnan(x), x, jax.lax.bitcast_convert_type(u, jnp.float32))


bf16_values.defjvp(lambda primals, tangents: (bf16_values(*primals), tangents[0]))


def _halves(x: Array) -> tuple[Array, Array]:
    """float32 x as hi + lo, hi its sign, exponent and top 12 bits of mantissa, lo the rest: a product of two such
    halves is exact in float32. hi is a bit mask (no gradient), lo = x - hi carries x's."""
    hi = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFF000),
                                      jnp.float32)
    return hi, x - hi


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray, exact: str | None = None) -> Array:
    """x: [B, T, H, D]; positions: [B, T] int. HF rotate_half layout. XLA CPU contracts `x * cos + rotated * sin`
    into an FMA in some fusions and not others (an AR step's program did, a verification's did not), so with inexact
    float32 products the two round a query differently. `exact` (x float32) makes every product exact, and so the
    sum the same either way: "bfloat16" takes x, cos and sin as bf16 values and rounds the sum to one; "float32"
    splits each factor into 12-bit halves and sums their exact products in a fixed order."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, D]
    cos = jnp.cos(emb)[:, :, None, :].astype(x.dtype)
    sin = jnp.sin(emb)[:, :, None, :].astype(x.dtype)
    if exact == "bfloat16":
        x, cos, sin = bf16_values(x), bf16_values(cos), bf16_values(sin)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    if exact == "float32":
        (xh, xl), (ch, cl), (rh, rl), (sh, sl) = (_halves(a) for a in (x, cos, rotated, sin))
        return (xh * ch + rh * sh) + (xh * cl + xl * ch + rh * sl + rl * sh) + (xl * cl + rl * sl)
    out = x * cos + rotated * sin
    return bf16_values(out) if exact == "bfloat16" else out


# ---- attention core ----------------------------------------------------------------------------
LIVE_CHUNK = 128  # cache slots per chunk of a live-length (`LiveMask`) segment (CPU: 128 beat 256 by 1.15x and 64
# by 1.05x in batch-64 generation, docs/benchmarks.md#where-a-steps-time-goes)


@flax.struct.dataclass
class LiveMask:
    """Mask of a cache segment: query t of row b sees slots s < limit[b, t] (slot = position) and,
    with `lower` (sliding-window layers), s >= lower[b, t].

    Attention over such a segment reads only the used part of the cache, so a step costs what that
    part costs, not what `max_len` costs; shapes (and the compiled step) stay fixed. How depends on
    the backend and the lowering platform (`attention_core`): on CPU (einsum) fixed chunks of `chunk`
    slots up to the longest live row (a `fori_loop` with a traced trip count); on GPU (pallas) the
    fused kernel's key tiles up to each row's own length. Decoding only: the CPU loop is not
    reverse-differentiable."""

    limit: Array  # [B, T] int
    chunk: int = flax.struct.field(pytree_node=False, default=LIVE_CHUNK)
    lower: Array | None = None  # [B, T] int; chunks wholly below min(lower) are never read


@flax.struct.dataclass
class Prefix:
    """A per-query key range, differentiable (training): query t of row b sees keys
    lower[b, t] <= s < limit[b, t] (`lower` None = 0). Training's drafter context mask (block n sees
    context positions < its anchor: `limit` = the anchor repeated over the block's T queries, 0 for
    unused anchor slots), DVD verification's recorded prefix, a causal prefix (limit = position + 1),
    per-row lengths (limit constant over t). The einsum and xla backends materialise it as a dense
    [B, T, S] mask; the pallas backend computes it inside the kernel from the two [B, T] vectors, and so does
    the CPU kernel under "cpu" (forward only: the backward is einsum's)."""

    limit: Array  # [B, T] int
    lower: Array | None = None  # [B, T] int

    def dense(self, num_keys: int) -> Array:
        slots = jnp.arange(num_keys)[None, None, :]
        m = slots < self.limit[:, :, None]
        return m if self.lower is None else m & (slots >= self.lower[:, :, None])


# Attention backends (ATTENTION_BACKENDS). What each one runs depends on the platform the program is
# LOWERED for (`jax.lax.platform_dependent`), never on the process's default backend, so a CUDA
# program built on a CPU host (`lower(lowering_platforms=("cuda",))`) is the one a GPU would run.
# - "einsum": the reference (every mask). `LiveMask` cache segments: on CPU a loop over 128-slot
#   chunks up to the longest live row (a traced trip count: CPU decode cost follows the live length);
#   on accelerators one masked read of the whole buffer (a data-dependent loop there costs a
#   device-to-host handshake per iteration).
# - "cpu" (the CPU default): einsum, except `LiveMask` and `Prefix` segments lowered for CPU, which run the CPU
#   kernel (`cpu_attention.live_attention`: each row's own slots read once; a query's result the same at any query
#   count), where it is built and takes the head dim; a `Prefix` segment's backward is einsum's (training); einsum's
#   masked read where lowered for other platforms.
# - "xla" / "cudnn": an attention of one dense or `Prefix` segment (the target's cache-free forward:
#   training features) in one jax.nn.dot_product_attention call (implementation "xla", or "cudnn" for
#   bf16/fp16 when this process runs on a GPU: jax's cuDNN path needs cuDNN present at trace time);
#   several segments are merged here, and dot_product_attention's lse output has no gradient, so then
#   "xla" is einsum and "cudnn" is "pallas" (below).
# - "pallas": `Prefix` segments through the fused kernel (`kernels.prefix_attention`: Triton where
#   lowered for cuda, the interpreter on CPU), the rest einsum; `LiveMask` segments (decode's cache
#   reads) through the same kernel, forward only, the query heads of a K/V head folded into its query
#   axis and the keys split over programs (flash decoding), each batch row reading its own live
#   length. (The shipped `gpu/decode_attention` takes one query per row, seq-major K/V and one length
#   per row; `tpu/ragged_paged_attention` a paged cache: neither fits the head-major slot = position
#   cache with T queries per row.) Refused on TPU (the kernel is Triton-style, untested on Mosaic).
# - "mosaic": `LiveMask` segments through the TPU kernel (`tpu_attention.live_attention`: Mosaic where
#   this process runs on a TPU, TPU interpret mode where it runs on a CPU), the rest einsum. Refused on
#   GPUs. (Which of the two follows the process, not the lowering platform: the interpreter's ordered
#   callbacks inside a `platform_dependent` branch break the lowering of the other branch on jax 0.10.2.)
# - "auto": "pallas" where lowered for cuda, "mosaic" (always compiled) for tpu, "cpu" on every other
#   platform (CPU; ROCm reads caches like einsum) — the default of `numerics` on accelerators. Never
#   refuses a shape: where the Mosaic kernel has no tile that fits VMEM, auto's tpu branch is einsum
#   (every branch is traced on every platform, so a refusal there would fail a GPU's program too). Where
#   this jax has no Pallas Triton backend (`numerics.triton_available`), auto's cuda branch is "einsum"
#   too: the masked dense read.
# `Blockwise` segments (block-diagonal, [T, S/N] scores: small) are einsum in every backend.
# KERNEL_BACKENDS (numerics): the ones that run `kernels.prefix_attention`.
_MOSAIC_COMPILED = "mosaic (compiled)"  # auto's TPU branch: never the interpreter


def resolve_backend(name: str) -> str:
    """Check a backend name; refuse the Triton kernel where this process runs on a TPU, or on a GPU whose jax
    has no Pallas Triton backend, and the Mosaic one on a GPU. (A program lowered for the other platform
    from another host fails at lowering instead: neither kernel has a branch for the other's platform.)"""
    if name not in ATTENTION_BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; one of {', '.join(ATTENTION_BACKENDS)}")
    if name in KERNEL_BACKENDS and jax.default_backend() == "gpu" and not numerics.triton_available():
        raise ConfigError(numerics.missing_triton(name))
    if name in KERNEL_BACKENDS and jax.default_backend() == "tpu":
        raise ConfigError(f"attention backend {name!r} runs a Triton-style Pallas kernel that is untested on TPU "
                          "(Mosaic); use 'auto', 'mosaic' or 'einsum' there")
    if name == "mosaic" and jax.default_backend() == "gpu":
        raise ConfigError("attention backend 'mosaic' runs the TPU (Mosaic) kernel; use 'auto', 'pallas' or 'einsum' "
                          "on a GPU")
    return name


def attention_core(q: Array, segments, scale: float, backend: str = "einsum") -> Array:
    """Grouped-query attention over one or more key/value segments with explicit masks.

    q: [B, T, H, D]; segments: sequence of (k [B, Hkv, S_i, D], v [B, Hkv, S_i, D], mask), keys and
    values head-major like the KV cache, so the score and value contractions read them without
    transposes. mask: bool [B, T, S_i] (True = may attend); a `LiveMask` (cache segments: read up to
    the longest live row); a `Blockwise`: block-diagonal (computed per block, [T, S/N] scores instead
    of a [T, S] mask); or an int G, shorthand for `Blockwise(T // G)` with keys aligned to the
    queries — training's N blocks of a sequence. Returns [B, T, H, D].

    Segments are merged flash-style (per-segment max, sum and output, rescaled to the joint max)
    instead of concatenating K/V: the drafter attends over [context cache ; carried ; block] without
    copying the cache each round, and a fully masked segment contributes an exact 0.0, so carried
    rows with `rejected_count == 0` reproduce the baseline drafter bit for bit. Masked keys get
    probability 0 (not exp(-inf)), so rows with no visible key return zeros instead of NaN.
    """
    backend = resolve_backend(backend)
    if backend == "auto":  # all traced; only the lowering platform's branch is lowered
        cuda = "pallas" if numerics.triton_available() else "einsum"
        return jax.lax.platform_dependent(cuda=lambda: _attention(q, segments, scale, cuda),
                                          tpu=lambda: _attention(q, segments, scale, _MOSAIC_COMPILED),
                                          default=lambda: _attention(q, segments, scale, "cpu"))
    return _attention(q, segments, scale, backend)


def _attention(q: Array, segments, scale: float, backend: str) -> Array:
    b, t, h, d = q.shape
    if backend in ("xla", "cudnn") and len(segments) == 1 and not isinstance(segments[0][2],
                                                                           (int, Blockwise, LiveMask)):
        k0, v0, m0 = segments[0]
        return _dpa_single(q, values(k0), values(v0), m0, scale, backend)
    hkv = segments[0][0].shape[1]
    qg = jnp.transpose(q.reshape(b, t, hkv, h // hkv, d), (0, 2, 3, 1, 4))  # [B, Hkv, G, T, D]
    parts = []
    for k, v, mask in segments:
        if not (isinstance(mask, LiveMask) and backend not in (*KERNEL_BACKENDS, "mosaic", _MOSAIC_COMPILED)):
            k, v = values(k), values(v)  # bits storage: only `_live_part` (the CPU loop) reads the bits
        if isinstance(mask, int):
            mask = Blockwise(t // mask)
        if isinstance(mask, Blockwise):
            parts.append(_blockwise_part(qg, k, v, mask, scale))
        elif isinstance(mask, LiveMask) and backend in KERNEL_BACKENDS:
            parts.append(_pallas_live_part(qg, k, v, mask, scale))
        elif isinstance(mask, LiveMask) and (backend == "mosaic" or backend == _MOSAIC_COMPILED and tpu_attention.fits(
                d, k.shape[2], t * (h // hkv), jnp.dtype(k.dtype).itemsize)):
            parts.append(tpu_attention.live_part(qg, k, v, mask.limit, mask.lower, scale,
                                                 interpret=False if backend == _MOSAIC_COMPILED else None))
        elif isinstance(mask, LiveMask):
            parts.append(_live_part(qg, k, v, mask, scale, kernel=backend == "cpu"))
        elif isinstance(mask, Prefix) and backend in KERNEL_BACKENDS:
            parts.append(_pallas_part(qg, k, v, mask, scale))
        elif isinstance(mask, Prefix) and backend == "cpu" and cpu_attention.applies(d, k.dtype):
            parts.append(_prefix_cpu_part(qg, k, v, mask, scale))
        else:
            dense_mask = mask.dense(k.shape[2]) if isinstance(mask, Prefix) else mask
            parts.append(_dense_part(qg, k, v, dense_mask[:, None, None, :, :], scale))
    mx = parts[0][0]
    for m_i, _, _ in parts[1:]:
        mx = jnp.maximum(mx, m_i)
    denom, out = 0.0, 0.0
    for m_i, l_i, o_i in parts:
        w = jnp.exp(m_i - mx)
        denom = denom + l_i * w
        out = out + o_i * w
    out = out / jnp.maximum(denom, 1e-30)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, d).astype(q.dtype)


def _dense_part(qg: Array, k: Array, v: Array, m5: Array, scale: float, keys_lhs: bool = False):
    """(max, sum, unnormalised out) of one segment; qg [B, Hkv, G, T, D], k/v [B, Hkv, S, D],
    m5 broadcastable to [B, Hkv, G, T, S]. `keys_lhs` (CPU decode): the scores as keys x queries, the
    cache slice the dot's row-major lhs, instead of queries x keys^T, which XLA CPU runs by first copying
    the keys transposed (SmolLM2 at batch 64: a decode step 12% faster); the small [S, G*T] result is
    transposed after (the barrier keeps XLA from folding the transpose back into the dot)."""
    if keys_lhs:
        st = jnp.einsum("bksd,bkgtd->bksgt", k, qg, preferred_element_type=jnp.float32)
        s = jnp.transpose(jax.lax.optimization_barrier(st), (0, 1, 3, 4, 2)) * scale
    else:
        s = jnp.einsum("bkgtd,bksd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(m5, s, NEG_INF)
    mx = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(m5, jnp.exp(s - mx), 0.0)
    o = jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return mx, jnp.sum(p, axis=-1, keepdims=True), o


def _pallas_part(qg: Array, k: Array, v: Array, mask: Prefix, scale: float):
    """A `Prefix` segment through the fused kernel: (lse, 0/1, normalised out) merge like (max, sum,
    out) — w = exp(lse - max) rescales the normalised output by its softmax mass; a query with no
    visible key has lse NEG_INF, sum 0 and out 0 (an exact 0 contribution)."""
    b, hkv, g, t, d = qg.shape
    out, lse = prefix_attention(qg.reshape(b, hkv * g, t, d), k, v, mask.limit, mask.lower, scale=scale)
    lse = lse.reshape(b, hkv, g, t, 1)
    seen = lse > NEG_INF / 2
    # the `where`s stop the merge's 0 * inf cotangents of empty rows (denominator 0) at the kernel
    return (jnp.where(seen, lse, NEG_INF), seen.astype(jnp.float32),
            jnp.where(seen, out.reshape(b, hkv, g, t, d), 0.0))


def _prefix_cpu_part(qg: Array, k: Array, v: Array, mask: Prefix, scale: float):
    """A `Prefix` segment, backend "cpu": lowered for CPU, the forward by the CPU attention kernel where it is built
    (each query reads its own key range: a causal forward computes half the scores einsum does, and no [T, S] mask),
    the backward einsum's; elsewhere einsum's dense part."""
    dense = lambda: _dense_part(qg, k, v, mask.dense(k.shape[2])[:, None, None], scale)  # noqa: E731
    if not cpu_attention.available():
        return dense()
    lower = jnp.zeros_like(mask.limit) if mask.lower is None else mask.lower
    return jax.lax.platform_dependent(cpu=lambda: _prefix_kernel(qg, k, v, mask.limit, lower, scale), default=dense)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _prefix_kernel(qg, k, v, limit, lower, scale):
    return cpu_attention.prefix_attention(qg, k, v, limit, lower, scale)


def _prefix_kernel_fwd(qg, k, v, limit, lower, scale):
    return _prefix_kernel(qg, k, v, limit, lower, scale), (qg, k, v, limit, lower)


def _prefix_kernel_bwd(scale, res, cts):
    """Training's gradients through einsum's part (the kernel is forward only): the same function, its products
    summed in another order."""
    qg, k, v, limit, lower = res
    m5 = Prefix(limit, lower).dense(k.shape[2])[:, None, None]
    _, vjp = jax.vjp(lambda q_, k_, v_: _dense_part(q_, k_, v_, m5, scale), qg, k, v)
    return (*vjp(cts), None, None)


_prefix_kernel.defvjp(_prefix_kernel_fwd, _prefix_kernel_bwd)


def _dpa_single(q: Array, k: Array, v: Array, mask, scale: float, backend: str) -> Array:
    """The whole attention of one dense / `Prefix` segment in one jax.nn.dot_product_attention call
    (backend "cudnn": cuDNN flash attention for bf16/fp16 when this process runs on a GPU — jax's
    cuDNN path queries cuDNN while tracing, so it cannot follow the lowering platform — else XLA);
    queries with no visible key return 0. (Several segments are not merged through it: its lse
    output has no gradient.)"""
    dense_mask = mask.dense(k.shape[2]) if isinstance(mask, Prefix) else mask
    cudnn = backend == "cudnn" and jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
    impl = "cudnn" if cudnn else "xla"
    out = jax.nn.dot_product_attention(q, jnp.swapaxes(k, 1, 2).astype(q.dtype), jnp.swapaxes(v, 1, 2).astype(q.dtype),
                                       mask=dense_mask[:, None], scale=scale, implementation=impl)
    return jnp.where(jnp.any(dense_mask, axis=-1)[:, :, None, None], out, 0.0).astype(q.dtype)


def _pallas_live_part(qg: Array, k: Array, v: Array, mask: LiveMask, scale: float):
    """A decode-time cache segment through the same kernel, flash-decoding style: the G query heads of a
    K/V head are folded into its query axis (G*T rows, one program per row and K/V head reads the
    K/V head once), and each program reads key tiles only up to its row's live length (and from its
    window's first tile): per-row lengths, not the batch's longest. At batch 1 (B x Hkv programs: 8 at
    Qwen3-4B shapes) the keys are split over more programs and their partial softmaxes merged
    (`kernels.key_splits`), so the read fills the GPU. Forward only (decoding)."""
    b, hkv, g, t, d = qg.shape
    rep = lambda x: None if x is None else jnp.tile(x, (1, g))  # noqa: E731  [B, T] -> [B, G*T], g-major
    out, lse = prefix_attention(qg.reshape(b, hkv, g * t, d), k, v, rep(mask.limit), rep(mask.lower), scale=scale)
    lse = lse.reshape(b, hkv, g, t, 1)
    seen = lse > NEG_INF / 2
    return (jnp.where(seen, lse, NEG_INF), seen.astype(jnp.float32),
            jnp.where(seen, out.reshape(b, hkv, g, t, d), 0.0))


def _live_part(qg: Array, k: Array, v: Array, mask: LiveMask, scale: float, kernel: bool = False):
    """A cache segment. Lowered for CPU: with `kernel` (backend "cpu"), the CPU kernel where it is built and
    takes this head dim (`cpu_attention`); else chunks [i*C, (i+1)*C) for min(lower) // C <= i <
    ceil(max(limit) / C), merged online like the segments are (a loop with a traced trip count, so a
    step costs the live part of the cache; the last chunk of a buffer that C does not divide is read at
    S - C, in bounds, with the slots already seen masked out). Lowered for an accelerator: one masked
    read of the whole buffer, no data-dependent loop (each iteration would cost a device-to-host
    handshake on a GPU; the fused kernel of the pallas backend is what reads only the live part there)."""
    if kernel and cpu_attention.applies(qg.shape[-1], k.dtype) and cpu_attention.available():
        cpu = lambda: cpu_attention.live_attention(qg, k, v, mask.limit, mask.lower, scale)  # noqa: E731
    else:
        cpu = lambda: _live_loop(qg, k, v, mask, scale)  # noqa: E731
    return jax.lax.platform_dependent(cpu=cpu, default=lambda: _live_dense(qg, values(k), values(v), mask, scale))


def _live_dense(qg: Array, k: Array, v: Array, mask: LiveMask, scale: float):
    slots = jnp.arange(k.shape[2])
    m5 = slots < mask.limit[:, None, None, :, None]
    if mask.lower is not None:
        m5 = m5 & (slots >= mask.lower[:, None, None, :, None])
    return _dense_part(qg, k, v, m5, scale)


def _chunk_f32(x: Array, start, c: int) -> Array:
    """Slots [start, start + c) of a cache [B, Hkv, S, D] in float32. A bf16 cache enters the CPU loop as
    its uint16 bits (`cache.BITS`) and each chunk is widened by a shift: XLA CPU otherwise converts a bf16
    array carried by a while loop to float32 whole, before the loop (the whole cache, every step), and its
    bf16 products with G*T (3-12) columns run at ~2 GB/s."""
    xc = jax.lax.dynamic_slice_in_dim(x, start, c, axis=2)
    if xc.dtype == BITS:
        return jax.lax.bitcast_convert_type(xc.astype(jnp.uint32) << 16, jnp.float32)
    return xc.astype(jnp.float32)


def _live_loop(qg: Array, k: Array, v: Array, mask: LiveMask, scale: float):
    b, hkv, g, t, d = qg.shape
    s_len = k.shape[2]
    c = min(mask.chunk, s_len)
    n = jnp.minimum((jnp.max(mask.limit) + c - 1) // c, -(-s_len // c))
    limit = mask.limit[:, None, None, :, None]  # [B, 1, 1, T, 1]
    lower = None if mask.lower is None else mask.lower[:, None, None, :, None]
    first = 0 if mask.lower is None else jnp.clip(jnp.min(mask.lower), 0, s_len - 1) // c
    qg = qg.astype(jnp.float32)
    k, v = (jax.lax.bitcast_convert_type(x, BITS) if x.dtype == jnp.bfloat16 else x for x in (k, v))

    def body(i, carry):
        m_acc, l_acc, o_acc = carry
        lo = i * c
        start = jnp.minimum(lo, s_len - c)
        slots = start + jnp.arange(c)
        kc, vc = _chunk_f32(k, start, c), _chunk_f32(v, start, c)
        m5 = (slots >= lo) & (slots < limit)
        if lower is not None:
            m5 = m5 & (slots >= lower)
        m_c, l_c, o_c = _dense_part(qg, kc, vc, m5, scale, keys_lhs=True)
        m_new = jnp.maximum(m_acc, m_c)
        a, w = jnp.exp(m_acc - m_new), jnp.exp(m_c - m_new)
        return m_new, l_acc * a + l_c * w, o_acc * a + o_c * w

    init = (jnp.full((b, hkv, g, t, 1), NEG_INF, jnp.float32), jnp.zeros((b, hkv, g, t, 1), jnp.float32),
            jnp.zeros((b, hkv, g, t, d), jnp.float32))
    return jax.lax.fori_loop(first, n, body, init)


@flax.struct.dataclass
class Blockwise:
    """A block-diagonal segment mask that never exists as a dense [T, S] array: queries and keys are
    split into `num_blocks` equal consecutive groups and query group n sees only key group n.
    `causal` (equal group sizes): query i of a group sees keys 0..i of its group (target verification
    of N draft blocks at once). `key_valid` [B, S]: only these keys are visible (carried rows of
    each block, valid below its rejected count)."""

    num_blocks: int = flax.struct.field(pytree_node=False)
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    key_valid: Array | None = None


def _blockwise_part(qg: Array, k: Array, v: Array, spec: Blockwise, scale: float):
    """Per-group attention of a block-diagonal segment; returns (max, sum, out) shaped like the
    dense path's so the segments merge unchanged. qg [B, Hkv, G, T, D], k/v [B, Hkv, S, D]."""
    b, hkv, g, t, d = qg.shape
    n = spec.num_blocks
    gq, gk = t // n, k.shape[2] // n
    # block-major operands (training's fresh K/V, not a cache): XLA CPU's plain batched dot has no
    # bf16 x bf16 -> f32 kernel, and this form keeps bf16 training compiling as before
    qb = jnp.transpose(qg, (0, 3, 1, 2, 4)).reshape(b, n, gq, hkv, g, d)
    kb = jnp.swapaxes(k, 1, 2).reshape(b, n, gk, hkv, d)
    vb = jnp.swapaxes(v, 1, 2).reshape(b, n, gk, hkv, d)
    s = jnp.einsum("bntkgd,bnskd->bkgnts", qb, kb, preferred_element_type=jnp.float32) * scale
    mask = None
    if spec.causal:
        mask = jnp.tril(jnp.ones((gq, gk), bool))[None, None, None, None]
    if spec.key_valid is not None:
        kv = spec.key_valid.reshape(b, n, gk)[:, None, None, :, None, :]
        mask = kv if mask is None else mask & kv
    if mask is None:
        mx = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - mx)
    else:
        s = jnp.where(mask, s, NEG_INF)
        mx = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.where(mask, jnp.exp(s - mx), 0.0)
    o = jnp.einsum("bkgnts,bnskd->bkgntd", p.astype(v.dtype), vb, preferred_element_type=jnp.float32)
    flat = lambda x: x.reshape(b, hkv, g, t, x.shape[-1])  # noqa: E731
    return flat(mx), flat(jnp.sum(p, axis=-1, keepdims=True)), flat(o)


class Attention(nn.Module):
    """Projections + q/k(/v) norms + RoPE; keys/values may come from elsewhere (caches, carried rows).

    Split into `queries`, `keys_values` and `attend` so the drafter can project K/V of context,
    carried and block rows with the same weights and attend over their concatenation.
    Gemma switches: `scale` (None: head_dim ** -0.5), `norm_kind` of the q/k norms, `v_norm` (a
    weightless RMSNorm on V), `k_eq_v` (no v_proj: V is the K projection before its norm and RoPE).
    """

    embed_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    inv_freq: tuple[float, ...]
    qk_norm: bool = False
    use_bias: bool = False
    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    scale: float | None = None
    norm_kind: str = "llama"
    v_norm: bool = False
    k_eq_v: bool = False
    backend: str = "einsum"  # attention_core's backend (ATTENTION_BACKENDS)
    products: str = "xla"  # Numerics.decode_products

    def setup(self):
        kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype, products=self.products)
        hd = self.head_dim
        # q and k keep the products' float32 accumulators for RoPE (`_rope`)
        self.q_proj = dense(self.num_heads * hd, "q_proj", ("embed", "heads"), f32_out=True, **kw)
        self.k_proj = dense(self.num_kv_heads * hd, "k_proj", ("embed", "kv_heads"), f32_out=True, **kw)
        if not self.k_eq_v:
            self.v_proj = dense(self.num_kv_heads * hd, "v_proj", ("embed", "kv_heads"), **kw)
        self.o_proj = dense(self.embed_dim, "o_proj", ("heads", "embed"), **kw)
        nkw = dict(eps=self.eps, dtype=self.dtype, param_dtype=self.param_dtype, logical="head_dim",
                   kind=self.norm_kind)
        if self.qk_norm:
            self.q_norm = RMSNorm(**nkw, name="q_norm")
            self.k_norm = RMSNorm(**nkw, name="k_norm")

    def queries(self, x: Array, positions: Array) -> Array:
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q.astype(self.dtype))
        return self._rope(q, positions)

    def _rope(self, x: Array, positions: Array) -> Array:
        """RoPE of a projection's float32 accumulator (or a normed head), in the compute dtype. On CPU with exact
        products (`apply_rope`'s `exact`: a query's rounding the same in a verification as in an AR step); in bf16
        in float32 on the bf16 values, rounded once: XLA CPU runs bf16 elementwise ops as float32 ones rounding
        after each, and a bf16 RoPE fused with the head-major transpose took ~10x a float32 one (a bf16 SmolLM2
        prefill runs 1.12x as fast). Elsewhere as HF does, in the compute dtype (a GPU fuses it)."""
        inv = np.asarray(self.inv_freq, np.float32)
        if jnp.dtype(self.dtype) == jnp.float32:
            return jax.lax.platform_dependent(cpu=lambda: apply_rope(x, positions, inv, exact="float32"),
                                              default=lambda: apply_rope(x, positions, inv))
        exact = "bfloat16" if jnp.dtype(self.dtype) == jnp.bfloat16 else None
        return jax.lax.platform_dependent(
            cpu=lambda: apply_rope(x.astype(jnp.float32), positions, inv, exact=exact).astype(self.dtype),
            default=lambda: apply_rope(x.astype(self.dtype), positions, inv))

    def keys_values(self, x: Array, positions: Array) -> tuple[Array, Array]:
        """Head-major k, v [B, Hkv, T, D] (the KV cache layout)."""
        b, t, _ = x.shape
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        narrow = k.astype(self.dtype)
        v = narrow if self.k_eq_v else self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            k = self.k_norm(narrow)
        if self.v_norm:  # weightless: no submodule, no param
            v = _normalize(v, self.eps).astype(self.dtype)
        k = self._rope(k, positions)
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def attend(self, q: Array, segments) -> Array:
        """segments: (k, v, mask) triples, see `attention_core`."""
        b, t = q.shape[:2]
        scale = 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale
        out = attention_core(q, segments, scale, self.backend)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))


_ACTS: dict[str, Callable[[Array], Array]] = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
}


class MLP(nn.Module):
    hidden_size: int
    intermediate_size: int
    act: str = "silu"
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    products: str = "xla"  # Numerics.decode_products

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype, products=self.products)
        gate = dense(self.intermediate_size, "gate_proj", ("embed", "mlp"), f32_out=True, **kw)(x)
        up = dense(self.intermediate_size, "up_proj", ("embed", "mlp"), f32_out=True, **kw)(x)
        act = lambda g, u: (_ACTS[self.act](g) * u).astype(self.dtype)  # noqa: E731
        narrow = lambda: act(gate.astype(self.dtype), up.astype(self.dtype))  # noqa: E731
        if jnp.dtype(self.dtype) == jnp.float32:
            h = act(gate, up)
        else:  # on CPU the activation in float32 on the products' accumulators, rounded once: XLA CPU runs
            # bf16 elementwise ops as float32 ones rounding after each op (a bf16 SmolLM2 prefill: 10% of its
            # time); elsewhere in the compute dtype, as HF does (a GPU fuses it; float32 would double the
            # saved activations of training)
            h = jax.lax.platform_dependent(cpu=lambda: act(gate, up), default=narrow)
        return dense(self.hidden_size, "down_proj", ("mlp", "embed"), **kw)(h)
