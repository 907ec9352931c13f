"""The greedy token of a float32 target without its whole float32 LM head, on a CPU with avx512_bf16.

At batch 1 the tied head is a fifth of SmolLM2's weights (49,152 x 576 float32, 113 MB), and an AR step or a
verification reads all of it to take one argmax a row. Its bf16 copy is half the bytes at twice the arithmetic, and
its logits lie within a bound of the float32 ones that the rounding fixes (`cpu_products.cc`, `HeadArgmax`): only the
few ids the bound cannot rule out (a median of 5 of 49,152 at SmolLM2's states) get their float32 logits, by the
float32 head's own operations. The token is the float32 head's argmax, bit for bit (ties to the first id), so a
greedy AR step, a verification and the full head agree, and T = 0 decoding stays lossless.

`HeadScreen` (the bf16 copy and the rows' norms) is built once per params (`Target.greedy_screen`) and passed to
the decode loops; `None` where it does not apply: a bf16 target, an untied or soft-capped head, another platform,
a CPU without avx512_bf16, or more than `MAX_ROWS` rows a step (those take the argmax of the full head).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from carryover_jax.config import TargetConfig
from carryover_jax.models import cpu_products
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import argmax

Array = jax.Array

# rows of x the kernel takes to one stream of the bf16 copy (`cpu_products.cc`, kMaxRows)
ROWS_A_PASS = 8
# rows of a step the screen serves, a stream of the copy for every 8: at SmolLM2's states its greedy tokens took
# 0.49-0.69x the float32 head's time at 1-128 rows, A/A 0.96-1.01 (the float32 head above 8 rows is bound by its
# arithmetic, and above 24 leaves the products kernel for XLA's dot; alternated, 2 cores of an AMD EPYC Zen 4,
# 2026-12-08, docs/experiments/screen-rows-2026-12-08); more rows take the full head
MAX_ROWS = 128


@flax.struct.dataclass
class HeadScreen:
    bits: Array  # [V, d] the tied embedding rounded to bf16
    norms: Array  # [V] float32 norms of its float32 rows


def applies(cfg: TargetConfig) -> bool:
    """Whether a target of this config gets a screen: float32 params and compute, a tied head without soft-capping,
    the CPU's decode products ("stream") and the kernel built with avx512_bf16 pairs."""
    n = cfg.numerics
    return (cfg.tie_word_embeddings and cfg.final_logit_softcapping is None and n.decode_products == "stream"
            and n.param_dtype == "float32" and n.dtype == "float32" and cpu_products.head_argmax_available())


@jax.jit
def _build(embedding: Array) -> HeadScreen:
    return HeadScreen(embedding.astype(jnp.bfloat16), jnp.sqrt(jnp.sum(embedding * embedding, axis=-1)))


def head_screen(cfg: TargetConfig, params) -> HeadScreen | None:
    """The screen of this target's head (None where it does not apply: `applies`)."""
    return _build(params["embed_tokens"]["embedding"]) if applies(cfg) else None


def greedy_tokens(cfg: TargetConfig, params, screen: HeadScreen | None, h: Array) -> Array:
    """h [..., d] final-normed hidden states -> int32 [...]: `argmax(TargetLM.head(h))`, through `screen` where given
    and the rows are at most `MAX_ROWS` (a row the kernel cannot screen, non-finite, takes the full head's)."""
    def full(x):
        return argmax(TargetLM(cfg).apply({"params": params}, x, method=TargetLM.head))

    flat = h.reshape(-1, h.shape[-1])
    if screen is None or flat.shape[0] > MAX_ROWS:
        return full(h)
    embedding = params["embed_tokens"]["embedding"]

    def cpu(x):
        tok = cpu_products.head_argmax(x, embedding, screen.bits, screen.norms)
        return jax.lax.cond(jnp.any(tok < 0), full, lambda _: tok, x)

    return jax.lax.platform_dependent(flat, cpu=cpu, default=full).reshape(h.shape[:-1])
