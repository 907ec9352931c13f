"""Numerics: which dtypes and kernels a program runs with — a runtime choice per platform, never part
of a model, a checkpoint or a response store.

One frozen dataclass, `Numerics`, says it all: the dtype of the target's params, of the drafter's
params, of activations (compute), of the KV caches, the attention backend (`models/layers.py`
`attention_core`) and the LM-head implementation. Models receive it as `TargetConfig.numerics` (the
drafter's backbone carries `Numerics.drafter_view()`), set at the runtime boundary (`load_target`,
`load_drafter`, `train`, `prepare`, the CLI), and every serializer leaves it out.

A field left `None` is "the platform's default", filled by `resolve(platform)`: bfloat16 params,
activations and caches on accelerators, float32 on CPU (where a bf16 run keeps float32 caches unless
asked: `resolve`); attention "auto" on accelerators (the fused kernels where they exist and this jax
has their backend: `check_cuda_support`), "cpu" on CPU (its decode attention kernel, `models/cpu_attention.py`);
the vocabulary-major tied head on CPU only.
The platform is an argument, not only the process's default backend, so a CUDA program can be built, lowered
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
import functools
import math

from carryover_jax.errors import ConfigError

# jax is imported inside the functions that need it: the configs import this module, and the CLI's
# argument parsing and `--help` load no jax (several seconds on a loaded machine)

DTYPES = ("float32", "bfloat16", "float16")
# the attention kernels (models/layers.py `attention_core` says what each one runs)
ATTENTION_BACKENDS = ("einsum", "cpu", "xla", "cudnn", "pallas", "mosaic", "auto")
KERNEL_BACKENDS = ("pallas", "cudnn")  # the ones that run the Triton kernel (`models/kernels.py`) on cuda
# what pallas_call's GPU lowering and the kernel's compiler params import: jax 0.11 deprecated the Pallas
# Triton backend, "to be removed in a future JAX version" (docs/gpu-kernel-migration.md)
TRITON_MODULES = ("jax.experimental.pallas.triton", "jax._src.pallas.triton.pallas_call_registration")
# "plain": the LM head as one dot with the weight as rhs; "vocab_major": for the few rows of a decode
# step the tied [V, d] embedding is the dot's lhs (XLA CPU runs that ~1.3-1.5x faster at 7-16 rows)
LM_HEADS = ("plain", "vocab_major")
# the float32 / bf16 products of at most 8 rows (decode steps, verification, drafting) and float32 ones of up to
# 64 (a batch's decode step; a tied head 24; bf16 Dense ones too on a CPU with avx512_bf16 but no AMX) lowered for
# CPU: "stream" is the kernel of models/cpu_products.cc (every weight read once for all rows; a row's sums the same
# at any row count), "xla" XLA's dot; accelerators always lower XLA's dot
DECODE_PRODUCTS = ("xla", "stream")
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
    dtype: str | None = None  # activations / compute of the target (and of the drafter unless drafter_dtype)
    # the drafter's compute and context-cache dtype (None: dtype). Proposals never change what verification
    # commits, so a bf16 drafter beside a float32 target stays lossless
    drafter_dtype: str | None = None
    cache_dtype: str | None = None  # target KV cache and the drafter's context cache (None: dtype)
    attention_backend: str | None = None  # ATTENTION_BACKENDS
    lm_head: str | None = None  # LM_HEADS (a tied target head and the drafter's frozen head)
    cache_bits: bool | None = None  # a bf16 cache stored as its uint16 bits (`models/cache.py`; CPU default)
    decode_products: str | None = None  # DECODE_PRODUCTS

    def __post_init__(self):
        for name in ("param_dtype", "drafter_param_dtype", "dtype", "drafter_dtype", "cache_dtype"):
            v = getattr(self, name)
            if v is not None and v not in DTYPES:
                raise ConfigError(f"numerics.{name} must be one of {', '.join(DTYPES)}, got {v!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                              f"{self.attention_backend!r}")
        if self.cache_bits is not None and not isinstance(self.cache_bits, bool):
            raise ConfigError(f"numerics.cache_bits must be a bool, got {self.cache_bits!r}")
        if self.lm_head is not None and self.lm_head not in LM_HEADS:
            raise ConfigError(f"numerics.lm_head must be one of {', '.join(LM_HEADS)}, got {self.lm_head!r}")
        if self.decode_products is not None and self.decode_products not in DECODE_PRODUCTS:
            raise ConfigError(f"numerics.decode_products must be one of {', '.join(DECODE_PRODUCTS)}, got "
                              f"{self.decode_products!r}")

    # ---- resolution ---------------------------------------------------------------------------------
    @classmethod
    def platform_default(cls, platform: str | None = None) -> "Numerics":
        """Every field set: bfloat16 + "auto" attention on accelerators, float32 + "cpu" attention (and the
        vocabulary-major tied head) on CPU; drafter params float32 everywhere, the drafter's compute the run's."""
        p = canonical_platform(platform)
        if p == "cpu":
            return cls(param_dtype="float32", drafter_param_dtype="float32", dtype="float32", drafter_dtype="float32",
                       cache_dtype="float32", attention_backend="cpu", lm_head="vocab_major", cache_bits=True,
                       decode_products="stream")
        return cls(param_dtype="bfloat16", drafter_param_dtype="float32", dtype="bfloat16", drafter_dtype="bfloat16",
                   cache_dtype="bfloat16", attention_backend="auto", lm_head="plain", cache_bits=False,
                   decode_products="xla")

    @classmethod
    def for_platform(cls, platform: str | None = None, **overrides) -> "Numerics":
        """The resolved numerics for `platform` ("cpu", "cuda"/"gpu", "rocm", "tpu"; None = this process's
        default backend), with `overrides` (None values ignored) applied first."""
        return cls(**{k: v for k, v in overrides.items() if v is not None}).resolve(platform)

    def resolve(self, platform: str | None = None) -> "Numerics":
        """Fill the unset fields with `platform`'s defaults. An explicit `dtype` also sets the unset param
        and cache dtypes of the target (`--dtype bfloat16` on a CPU means a bf16 target), not the drafter's."""
        p = canonical_platform(platform)
        base = Numerics.platform_default(p)
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        # the cache follows a narrow compute dtype; on CPU only bf16 does (stored as bits, `cache_bits`): XLA
        # CPU has no fp16 scatter, so every write into an fp16 cache converts the whole buffer to float32
        # and back (SmolLM2 at batch 64: a step 2.2x slower than with a float32 cache)
        narrow = self.dtype or self.param_dtype
        follow = p != "cpu" or (narrow == "bfloat16" and self.cache_bits is not False)
        if self.dtype is not None:
            out["param_dtype"] = out["param_dtype"] or self.dtype
            out["cache_dtype"] = out["cache_dtype"] or (self.dtype if follow else None)
        elif self.param_dtype is not None:  # a bf16 target alone: compute (and cache) follow its params
            out["dtype"] = self.param_dtype
            out["cache_dtype"] = out["cache_dtype"] or (self.param_dtype if follow else None)
        if p == "cpu" and self.lm_head is None and (out["param_dtype"] or base.param_dtype) != "float32":
            # the vocabulary-major form pays for float32 weights only: XLA CPU's bf16 kernel streams the
            # [V, d] embedding faster as the dot's rhs (SmolLM2's head at 1-4 rows: 2.1-2.4 ms plain, 3.5-4.0
            # vocabulary-major; float32: 4.4-4.6 plain, 3.6-4.0 vocabulary-major at 2-4 rows)
            out["lm_head"] = "plain"
        out["drafter_dtype"] = out["drafter_dtype"] or out["dtype"] or base.dtype
        resolved = Numerics(**{k: (v if v is not None else getattr(base, k)) for k, v in out.items()})
        if p == "cpu":
            resolved.check_cpu_support()
        if p == "cuda":
            resolved.check_cuda_support()
        return resolved

    def check_cpu_support(self) -> None:
        """One warning line (once per process) where this CPU lacks native bf16 arithmetic: the run goes
        on, and XLA emulates bf16 dots in float32 (slower than float32 itself, same results)."""
        narrow = {getattr(self, f) for f in ("param_dtype", "drafter_param_dtype", "dtype", "drafter_dtype",
                                             "cache_dtype")}
        if "bfloat16" in narrow and not cpu_has_native_bf16():
            warn_once("numerics: this CPU has no native bf16 arithmetic (no avx512_bf16 / amx_bf16 flag): "
                      "bf16 runs emulated, slower than float32; use float32 here")

    def check_cuda_support(self) -> None:
        """Where this jax has no Pallas Triton backend: `auto` reads caches with the masked dense einsum on
        cuda (one notice line per process, `models/layers.py` `attention_core`); `pallas` / `cudnn`, which
        run the Triton kernel, are refused in one line."""
        if triton_available():
            return
        if self.attention_backend in KERNEL_BACKENDS:
            raise ConfigError(missing_triton(self.attention_backend))
        if self.attention_backend == "auto":
            warn_once(f"numerics: jax {_jax_version()} has no Pallas Triton backend; attention 'auto' on cuda "
                      "falls back to einsum (a masked dense read of the whole KV cache at every decode step)")

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
        """What a drafter's backbone layers run with: the drafter's params and compute (`drafter_dtype`; its
        context cache follows a compute dtype other than the target's), the run's attention and head. (The
        backbone is a `TargetConfig`, so the layers read `param_dtype` and `dtype`.)"""
        own = self.drafter_dtype and self.drafter_dtype != self.dtype
        return dataclasses.replace(self, param_dtype=self.drafter_param_dtype or self.param_dtype,
                                   dtype=self.drafter_dtype or self.dtype,
                                   cache_dtype=self.drafter_dtype if own else self.cache_dtype)

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

    @property
    def cache_storage(self):
        """The dtype cache buffers are allocated in: `cache`, or uint16 for a bf16 cache kept as bits."""
        import jax.numpy as jnp

        return jnp.uint16 if self.cache_bits and self.cache == jnp.bfloat16 else self.cache

    def describe(self) -> str:
        own = f" (drafter {self.drafter_dtype})" if self.drafter_dtype not in (None, self.dtype) else ""
        return (f"params {self.param_dtype} (drafter {self.drafter_param_dtype}), compute {self.dtype}{own}, "
                f"cache {self.cache_dtype}{' (as bits)' if self.cache_storage != self.cache else ''}, "
                f"attention {self.attention_backend}, lm_head {self.lm_head}, decode_products {self.decode_products}")


# CPU flags of native bf16 dots (AVX-512 BF16 on Zen 4 / Cooper Lake+, AMX on Sapphire Rapids+; Arm's
# bf16 extension)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 dots natively (Linux: /proc/cpuinfo's flags; elsewhere assumed)."""
    if cpuinfo is None and _cpuinfo() is None:
        return True  # no way to tell: no warning
    return bool(cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS))


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo (or `cpuinfo`) lists them; empty where it cannot be read."""
    flags = set()
    for line in (cpuinfo if cpuinfo is not None else _cpuinfo() or "").splitlines():
        key, _, val = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(val.split())
    return frozenset(flags)


@functools.cache
def _cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return None


@functools.cache
def triton_available() -> bool:
    """Whether this jax can lower the Triton kernel for cuda: the modules of its Pallas Triton backend import
    (a CPU-only jaxlib has them too, so a CUDA program lowered from a CPU host gets the same answer)."""
    import importlib

    try:
        for name in TRITON_MODULES:
            importlib.import_module(name)
    except ImportError:
        return False
    return True


def missing_triton(backend: str) -> str:
    """The one-line refusal of a backend that needs the Triton kernel where the Triton backend is missing."""
    return (f"attention backend {backend!r} runs the Pallas Triton kernel, and jax {_jax_version()} has no Pallas "
            "Triton backend (deprecated in jax 0.11, then removed); use 'auto' (einsum on cuda then) or 'einsum'")


def _jax_version() -> str:
    import jax

    return jax.__version__


_WARNED: set[str] = set()


def warn_once(msg: str) -> None:
    """`msg` as one "warning: ..." line on stderr, once per process."""
    import sys

    if msg not in _WARNED:
        _WARNED.add(msg)
        print(f"warning: {msg}", file=sys.stderr)


def _jnp_dtype(name: str | None):
    import jax.numpy as jnp

    return jnp.dtype(name or "float32")


# float32 everywhere, the CPU's attention and products: the reference the parity tests compare with HF (and what
# a model config holds until the runtime boundary sets the run's numerics)
REFERENCE = Numerics.platform_default("cpu")


# ---- dots ---------------------------------------------------------------------------------------------
def dot_f32(lhs, rhs, dimension_numbers, precision=None):
    """`lax.dot_general` accumulated and returned in float32, whatever the operand dtypes.

    Lowered for CPU, a bf16/fp16 dot whose lhs has a single row (an AR step at batch 1, a one-token
    drafter query) is computed on two rows (the second zero) and the first is kept: XLA CPU has no
    narrow-dtype kernel for a one-row product and would convert the whole rhs (every weight of the
    model, at every step) to float32 first; at two rows it runs the bf16 kernel. Other platforms
    lower the plain dot."""
    import jax
    import jax.numpy as jnp

    def plain(a, b):
        return jax.lax.dot_general(a, b, dimension_numbers, precision=precision, preferred_element_type=jnp.float32)

    (lc, _), (lb, _) = dimension_numbers
    free = [i for i in range(lhs.ndim) if i not in lc and i not in lb]
    if lhs.dtype == jnp.float32 or lb or math.prod(lhs.shape[i] for i in free) != 1 or not free:
        return plain(lhs, rhs)

    def two_rows(a, b):
        axis = free[0]
        pad = [(0, 0)] * a.ndim
        pad[axis] = (0, 1)
        out = plain(jnp.pad(a, pad), b)  # the lhs free dims lead the output, in order
        return jax.lax.slice_in_dim(out, 0, 1, axis=free.index(axis))

    return jax.lax.platform_dependent(lhs, rhs, cpu=two_rows, default=plain)


def argmax(x, axis: int = -1):
    """`jnp.argmax(x, axis)` as int32: the first index of the largest value.

    Lowered for CPU it is two plain reductions, the max and then the first index that holds it: XLA CPU runs
    argmax's variadic (value, index) reduce as a scalar loop, 23 ms over SmolLM2's [64, 49152] logits (every
    greedy step of a batch-64 generation) against 1.7 ms this way; 0.29 -> 0.06 ms for one row. A row holding
    a NaN gets an index in range, of a NaN or of its largest other value (XLA CPU's vectorised max does not
    always carry the NaN; reading such rows apart doubled the cost), where jnp.argmax returns the first NaN's.
    Other platforms lower `jnp.argmax`."""
    import jax
    import jax.numpy as jnp

    x = jnp.moveaxis(x, axis, -1)

    def two_pass(x):
        flat = x.reshape(-1, x.shape[-1])
        m = jnp.max(flat, axis=-1, keepdims=True)
        hit = (flat == m) | (jnp.isnan(flat) & jnp.isnan(m))
        first = jnp.min(jnp.where(hit, jnp.arange(flat.shape[-1], dtype=jnp.int32), flat.shape[-1] - 1), axis=-1)
        return first.reshape(x.shape[:-1])

    return jax.lax.platform_dependent(x, cpu=two_pass,
                                      default=lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32))


def categorical(key, logits):
    """`jax.random.categorical(key, logits, axis=-1)`, the same draws (the Gumbel-max trick with jax's own
    `gumbel` noise) with the argmax taken by `argmax` above."""
    import jax

    return argmax(jax.random.gumbel(key, logits.shape, logits.dtype) + logits)


# ---- large forwards on a CPU --------------------------------------------------------------------------
CPU_PASS_TOKENS = 1024  # token rows per pass of a large forward on CPU (`sub_batched`)


def sub_batched(fn, *args, tokens_per_row: int, max_tokens: int | None = None):
    """`fn(*args)`, where every leaf of `args` and of the result has the batch as its leading axis and `fn`
    treats the rows independently (a prefill, a cache-free forward).

    Lowered for CPU, a batch of more than `max_tokens` (default `CPU_PASS_TOKENS`) token rows runs as `lax.map`
    over equal sub-batches of at most `max_tokens` rows (of a divisor of the batch where one is at least half
    that, else the batch padded with copies of its first row to a multiple, the padding dropped after): XLA CPU's products over 8,192 rows run 1.1-1.3x slower than over 1,024-2,048,
    whose activations stay in the caches (SmolLM2's batch-64 prefill of 128-token prompts: 8.1 -> 7.4 s,
    alternated; docs/experiments/cpu-generation-2026-12-03). Results agree with the whole batch's to float
    rounding (a product's blocking changes with its row count). Other platforms lower `fn(*args)`."""
    import jax
    import jax.numpy as jnp

    b = jax.tree.leaves(args)[0].shape[0]
    max_tokens = CPU_PASS_TOKENS if max_tokens is None else max_tokens
    rows = max(1, max_tokens // max(tokens_per_row, 1))  # prompts per pass
    if b <= rows:
        return fn(*args)
    sub = max(d for d in range(1, rows + 1) if b % d == 0)
    if 2 * sub < rows:  # no divisor near the target: pad the batch to a multiple instead
        n = -(-b // rows)
        sub = -(-b // n)
    n = -(-b // sub)  # passes
    pad = n * sub - b

    def passes(*args):
        def split(x):
            if pad:
                x = jnp.concatenate([x, jnp.broadcast_to(x[:1], (pad, *x.shape[1:]))], axis=0)
            return x.reshape(n, sub, *x.shape[1:])

        out = jax.lax.map(lambda a: fn(*a), jax.tree.map(split, args))
        return jax.tree.map(lambda x: x.reshape(n * sub, *x.shape[2:])[:b], out)

    return jax.lax.platform_dependent(*args, cpu=passes, default=fn)


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
    last = ((h.ndim - 1,), (0 if not vocab_major_weight else 1,)), ((), ())
    rows = math.prod(h.shape[:-1])
    if not vocab_major_weight or impl != "vocab_major" or rows == 1 or rows > VOCAB_MAJOR_MAX_ROWS:
        return dot_f32(h, w, last)
    vt = jnp.einsum("vd,nd->vn", w, h.reshape(rows, h.shape[-1]), preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(vt).T.reshape(*h.shape[:-1], -1)
