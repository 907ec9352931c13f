"""Few-row products on the CPU (a decode step's projections and head), float32 or bf16 operands with float32
products and sums: the kernel of `cpu_products.cc`, an XLA FFI custom call (`cpu_kernels` builds and registers
it).

XLA CPU streams the weights of a one-row product at the memory's rate but those of a 2-8-row product ~1.5-2x
slower, so a verification of P + 1 tokens cost ~1.3 AR steps at batch 1 (and bf16 weights gained ~1.04x there).
The kernel reads every weight once for all rows, in memory order, and computes each row's sums in one order
whatever the row count: a token's products in a verification equal its products in an AR step bit for bit.
`Numerics.decode_products` picks it ("stream", the CPU default) or XLA's dot ("xla"); on a machine where it
cannot be built (no C++ compiler) "stream" falls back to XLA's dot with a one-line warning.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from carryover_jax import numerics
from carryover_jax.models import cpu_kernels

# the most lhs rows the kernel takes, per layout: 1-8 in bf16 (above, XLA's AMX / avx512_bf16 dots), and in
# float32 F32_ROWS: a Dense product's 9-24 rows by the kernel's one-pass loop, 25-64 by its tiled loop (SmolLM2's AR
# generation took 0.72x / 0.82x / 0.81x / 0.975x XLA's time at batch 16 / 24 / 32 / 64 and 1.02x at 128, alternated,
# 2 threads, 2026-12-05: docs/experiments/tiled-products-2026-12-05), and a tied head's 9-24 rows one row of e at a
# time, where x passes 26 KB (12 rows of K 576) 8 rows and the rest in turn over blocks of e (SmolLM2's head at 16
# rows: 0.56-0.61x the time of one row of e at a time at 16, A/A 1.006; 0.62-0.67x / 0.78-0.87x the time of XLA's dot
# at 16 / 24, which took 17-24 rows before: docs/experiments/screen-rows-2026-12-08)
MAX_ROWS = {"kn": 8, "nk": 8}
F32_ROWS = {"kn": 64, "nk": 24}
# bf16 w [K, N] where the kernel multiplies by avx512_bf16 pairs and the CPU has no AMX (whose XLA dots ran 2.2-3.7x
# float32's at 64-2,048 rows): a batch's decode step, tiled (SmolLM2's 30 layers' Dense products 0.63x / 0.84x XLA's
# time at 16 / 64 rows, 0.98x at 128; whole batch-64 generations 1.06x as fast: docs/experiments/bf16-pairs-2026-12-05)
BF16_PAIR_ROWS = 64
# the custom calls by (layout, operand dtype): w [K, N] ("kn"), e [N, K] ("nk": a tied head's rows); the
# names carry a version (a changed kernel gets new ones, so a cached program never calls an older kernel)
SYMBOLS = {("kn", "float32"): "CarryoverCpuProducts", ("nk", "float32"): "CarryoverCpuProductsRows",
           ("kn", "bfloat16"): "CarryoverCpuProductsBf16", ("nk", "bfloat16"): "CarryoverCpuProductsRowsBf16"}
TARGETS = {key: f"carryover_cpu_products_{key[0]}_{key[1]}_v6" for key in SYMBOLS}


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA in this process (once; a failure warns once)."""
    return cpu_kernels.register({TARGETS[key]: symbol for key, symbol in SYMBOLS.items()},
                                "numerics: decode_products 'stream' falls back to XLA's dot")


@functools.cache
def bf16_pairs() -> bool:
    """Whether the built kernel multiplies bf16 operands by avx512_bf16 pairs: w [K, N] at any number of rows, a tied
    head's e [N, K] at 1-8."""
    return available() and bool(cpu_kernels.library().carryover_cpu_products_bf16_pairs())


def most_rows(layout: str, dtype) -> int:
    """The most lhs rows the model sends the kernel for a product of this layout and operand dtype."""
    if jnp.dtype(dtype) == jnp.float32:
        return F32_ROWS[layout]
    if layout == "kn" and bf16_pairs() and "amx_bf16" not in numerics.cpu_flags():
        return BF16_PAIR_ROWS
    return MAX_ROWS[layout]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def products(x: jax.Array, w: jax.Array, layout: str = "kn") -> jax.Array:
    """x [M, K] . w -> float32 [M, N] by the kernel (CPU only) for 1 <= M <= 8, x and w both float32 or both
    bf16, w [K, N] ("kn") or [N, K] ("nk", a tied head's embedding); in float32 also 9-24 rows, and any number
    against w [K, N], as in bf16 where `bf16_pairs()` (the model sends up to `most_rows` rows). Differentiable (the
    backward pass is XLA's dots); under vmap each example is its own call."""
    if not available():
        raise RuntimeError("the CPU products kernel is unavailable on this machine (see the warning above)")
    n = w.shape[1] if layout == "kn" else w.shape[0]
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    call = jax.ffi.ffi_call(TARGETS[layout, jnp.dtype(x.dtype).name], out, vmap_method="sequential")
    return call(x, w)


def _products_fwd(x, w, layout):
    return products(x, w, layout), (x, w)


def _products_bwd(layout, res, g):
    x, w = res
    dx, dw = (g @ w.T, x.T @ g) if layout == "kn" else (g @ w, g.T @ x)
    return dx.astype(x.dtype), dw.astype(w.dtype)


products.defvjp(_products_fwd, _products_bwd)

HEAD_ARGMAX = ("CarryoverCpuHeadArgmax", "carryover_cpu_head_argmax_v1")


@functools.cache
def head_argmax_available() -> bool:
    """Whether `head_argmax` runs here: the kernel built with avx512_bf16 pairs and registered (once)."""
    return bf16_pairs() and cpu_kernels.register({HEAD_ARGMAX[1]: HEAD_ARGMAX[0]},
                                                 "the screened greedy head falls back to the float32 head")


def head_argmax(x: jax.Array, e: jax.Array, e_bf16: jax.Array, e_norms: jax.Array) -> jax.Array:
    """x [M, K] float32 against a tied head e [N, K] float32 -> int32 [M]: the first index of each row's largest
    logit, as the float32 kernel computes the logits (`products(x, e, "nk")`, bit for bit), found through the head's
    bf16 copy `e_bf16` and its rows' norms `e_norms` [N] (the kernel's docstring in `cpu_products.cc`); -1 for a row
    whose logits are not finite. CPU only (`head_argmax_available`)."""
    out = jax.ShapeDtypeStruct((x.shape[0],), jnp.int32)
    call = jax.ffi.ffi_call(HEAD_ARGMAX[1], out, vmap_method="sequential")
    return call(x, x.astype(jnp.bfloat16), e, e_bf16, e_norms)


def layout_of(lhs, rhs, dimension_numbers) -> str | None:
    """"kn" / "nk" for a `dot_general` the kernel computes: float32 or bf16 operands (both the same), a
    [.., K] lhs against a 2-D [K, N] rhs (a Dense layer's kernel) or [N, K] rhs (a tied embedding), no batch
    dimensions, 1 to `most_rows` lhs rows; else None."""
    (lc, rc), (lb, rb) = dimension_numbers
    layout = {(0,): "kn", (1,): "nk"}.get(tuple(rc))
    if (layout is None or lhs.dtype != rhs.dtype or lhs.dtype not in (jnp.float32, jnp.bfloat16) or rhs.ndim != 2
            or lhs.ndim < 1 or lb or rb or tuple(lc) != (lhs.ndim - 1,) or 0 in rhs.shape):
        return None
    return layout if 1 <= math.prod(lhs.shape[:-1]) <= most_rows(layout, lhs.dtype) else None


def dot(lhs, rhs, dimension_numbers, plain):
    """`plain(lhs, rhs)` (an XLA dot with float32 output), computed by the kernel where it applies and the
    program is lowered for CPU; every other platform (and a machine without the kernel) lowers `plain`."""
    layout = layout_of(lhs, rhs, dimension_numbers)
    if layout is None or not available():
        return plain(lhs, rhs)

    def kernel(a, b):
        out = products(a.reshape(-1, a.shape[-1]), b, layout)
        return out.reshape(*a.shape[:-1], out.shape[-1])

    return jax.lax.platform_dependent(lhs, rhs, cpu=kernel, default=plain)
