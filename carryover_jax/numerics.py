"""Numerics: which dtypes and kernels a program runs with — a runtime choice per platform, never part
of a model, a checkpoint or a response store.

One frozen dataclass, `Numerics`, says it all: the dtype of the target's params, of the drafter's
params, of activations (compute), of the KV caches, the attention backend (`models/layers.py`
`attention_core`) and the LM-head implementation. Models receive it as `TargetConfig.numerics` (the
drafter's backbone carries `Numerics.drafter_view()`), set at the runtime boundary (`load_target`,
`load_drafter`, `train`, `prepare`, the CLI), and every serializer leaves it out.

A field left `None` is "the platform's default", filled by `resolve(platform)`: bfloat16 params,
activations and caches on accelerators, float32 on CPU; attention "auto" on accelerators (the fused
kernels where they exist), "einsum" on CPU; the vocabulary-major tied head on CPU only. The platform is
an argument, not only the process's default backend, so a CUDA program can be built, lowered
(`lower(lowering_platforms=("cuda",))`) and inspected from a CPU machine. The drafter's params default
to float32 everywhere: training keeps them as the float32 master copy, and a 5-layer drafter is small
next to the target; its dots run in the compute dtype. Whatever the dtypes, every LM head
accumulates and returns float32 logits (`lm_head_logits`): AR (1 row) and verification (P+1 rows) then
agree on the same logits, and the teacher distribution of KL/L1 is not rounded to bfloat16.

This module imports only the errors at import time, so the configs (`config/`) and the layers can both use it (no
import circle).
"""

from __future__ import annotations

import dataclasses
import math

from carryover_jax.errors import ConfigError

# jax is imported inside the functions that need it: the configs import this module, and the CLI's
# argument parsing and `--help` load no jax (several seconds on a loaded machine)

DTYPES = ("float32", "bfloat16", "float16")
# the attention kernels (models/layers.py `attention_core` says what each one runs)
ATTENTION_BACKENDS = ("einsum", "xla", "cudnn", "pallas", "mosaic", "auto")
# "plain": the LM head as one dot with the weight as rhs; "vocab_major": for the few rows of a decode
# step the tied [V, d] embedding is the dot's lhs (XLA CPU runs that ~1.3-1.5x faster at 7-16 rows)
LM_HEADS = ("plain", "vocab_major")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
_PLATFORM_ALIASES = {"gpu": "cuda"}
VOCAB_MAJOR_MAX_ROWS = 64  # above this (training's many rows) the vocabulary-major form does not pay


def canonical_platform(platform: str | None = None) -> str:
    """"cpu" | "cuda" | "rocm" | "tpu" for a platform name ("gpu" = "cuda"); None = the process's default
    backend (for a GPU, the platform of its first device)."""
    if platform is None:
        import jax

        platform = jax.default_backend()
        if platform == "gpu":
            platform = jax.devices()[0].platform
    p = _PLATFORM_ALIASES.get(str(platform).lower(), str(platform).lower())
    if p not in PLATFORMS:
        raise ConfigError(f"unknown platform {platform!r}; one of {', '.join(PLATFORMS)} (or gpu)")
    return p


@dataclasses.dataclass(frozen=True, kw_only=True)
class Numerics:
    """The dtypes and kernels of one run. `None` = the platform's default (see `resolve`)."""

    param_dtype: str | None = None  # target params (a checkpoint of any float dtype is cast to it)
    drafter_param_dtype: str | None = None  # drafter params (training: the master copy)
    dtype: str | None = None  # activations / compute of target and drafter
    cache_dtype: str | None = None  # target KV cache and the drafter's context cache (None: dtype)
    attention_backend: str | None = None  # ATTENTION_BACKENDS
    lm_head: str | None = None  # LM_HEADS (a tied target head and the drafter's frozen head)

    def __post_init__(self):
        for name in ("param_dtype", "drafter_param_dtype", "dtype", "cache_dtype"):
            v = getattr(self, name)
            if v is not None and v not in DTYPES:
                raise ConfigError(f"numerics.{name} must be one of {', '.join(DTYPES)}, got {v!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                              f"{self.attention_backend!r}")
        if self.lm_head is not None and self.lm_head not in LM_HEADS:
            raise ConfigError(f"numerics.lm_head must be one of {', '.join(LM_HEADS)}, got {self.lm_head!r}")

    # ---- resolution ---------------------------------------------------------------------------------
    @classmethod
    def platform_default(cls, platform: str | None = None) -> "Numerics":
        """Every field set: bfloat16 + "auto" attention on accelerators, float32 + "einsum" (and the
        vocabulary-major tied head) on CPU; drafter params float32 everywhere."""
        p = canonical_platform(platform)
        if p == "cpu":
            return cls(param_dtype="float32", drafter_param_dtype="float32", dtype="float32", cache_dtype="float32",
                       attention_backend="einsum", lm_head="vocab_major")
        return cls(param_dtype="bfloat16", drafter_param_dtype="float32", dtype="bfloat16", cache_dtype="bfloat16",
                   attention_backend="auto", lm_head="plain")

    @classmethod
    def for_platform(cls, platform: str | None = None, **overrides) -> "Numerics":
        """The resolved numerics for `platform` ("cpu", "cuda"/"gpu", "rocm", "tpu"; None = this process's
        default backend), with `overrides` (None values ignored) applied first."""
        return cls(**{k: v for k, v in overrides.items() if v is not None}).resolve(platform)

    def resolve(self, platform: str | None = None) -> "Numerics":
        """Fill the unset fields with `platform`'s defaults. An explicit `dtype` also sets the unset param
        and cache dtypes of the target (`--dtype bfloat16` on a CPU means a bf16 target), not the drafter's."""
        base = Numerics.platform_default(platform)
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.dtype is not None:
            out["param_dtype"] = out["param_dtype"] or self.dtype
            out["cache_dtype"] = out["cache_dtype"] or self.dtype
        elif self.param_dtype is not None:  # a bf16 target alone: compute and cache follow its params
            out["dtype"] = self.param_dtype
            out["cache_dtype"] = out["cache_dtype"] or self.param_dtype
        return Numerics(**{k: (v if v is not None else getattr(base, k)) for k, v in out.items()})

    def over(self, base: "Numerics | None") -> "Numerics":
        """These fields where set, `base`'s elsewhere (e.g. prepare's `data.numerics` over the run's)."""
        if base is None:
            return self
        return Numerics(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                           else getattr(base, f.name) for f in dataclasses.fields(self)})

    @property
    def is_resolved(self) -> bool:
        return all(getattr(self, f.name) is not None for f in dataclasses.fields(self))

    def replace(self, **kw) -> "Numerics":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_args(cls, args) -> "Numerics":
        """The CLI's numerics flags (`--dtype`, `--param-dtype`, ..., `--attention-backend`, `--lm-head`:
        attributes named like the fields, None = unset) -> an unresolved spec."""
        return cls(**{f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)})

    def drafter_view(self) -> "Numerics":
        """What a drafter's backbone layers run with: the drafter's params, the run's compute, caches,
        attention and head. (The backbone is a `TargetConfig`, so the layers read `param_dtype`.)"""
        return dataclasses.replace(self, param_dtype=self.drafter_param_dtype or self.param_dtype)

    # ---- what the layers read -------------------------------------------------------------------------
    @property
    def compute(self):
        return _jnp_dtype(self.dtype)

    @property
    def params(self):
        return _jnp_dtype(self.param_dtype)

    @property
    def cache(self):
        return _jnp_dtype(self.cache_dtype or self.dtype)

    def describe(self) -> str:
        return (f"params {self.param_dtype} (drafter {self.drafter_param_dtype}), compute {self.dtype}, "
                f"cache {self.cache_dtype}, attention {self.attention_backend}, lm_head {self.lm_head}")


def _jnp_dtype(name: str | None):
    import jax.numpy as jnp

    return jnp.dtype(name or "float32")


# float32 everywhere, einsum attention: the reference the parity tests compare with HF (and what a
# model config holds until the runtime boundary sets the run's numerics)
REFERENCE = Numerics.platform_default("cpu")


# ---- LM heads -----------------------------------------------------------------------------------------
def lm_head_logits(h, weight, *, vocab_major_weight: bool, impl: str = "plain"):
    """h [..., d] against an LM head -> float32 logits [..., V], accumulated in float32 whatever the
    dtypes of h and the weight (bf16 runs: the logits are not rounded to bf16).

    `weight` is [V, d] (`vocab_major_weight`: a tied embedding) or [d, V] (an untied head kernel).
    impl "vocab_major" (a CPU choice) puts a [V, d] weight on the dot's lhs for the few rows of a decode
    step ([V, d] x [d, rows], then a small [V, rows] transpose; the barrier keeps XLA from folding the
    transpose back into the dot); 1 row or many rows (training) use the plain contraction."""
    import jax
    import jax.numpy as jnp

    w = weight.astype(h.dtype)
    if not vocab_major_weight:
        return jnp.einsum("...d,dv->...v", h, w, preferred_element_type=jnp.float32)
    rows = math.prod(h.shape[:-1])
    if impl != "vocab_major" or rows == 1 or rows > VOCAB_MAJOR_MAX_ROWS:
        return jnp.einsum("...d,vd->...v", h, w, preferred_element_type=jnp.float32)
    vt = jnp.einsum("vd,nd->vn", w, h.reshape(rows, h.shape[-1]), preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(vt).T.reshape(*h.shape[:-1], -1)
