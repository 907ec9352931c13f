"""log Σ exp over the last axis of float32 logits on the CPU: the kernel of `cpu_logsumexp.cc`, an XLA FFI custom
call (`cpu_kernels` builds and registers it).

XLA CPU computes `jax.nn.logsumexp` over a [1024, 49152] block of SmolLM2's head logits in ~130 ms, nearly the
head's product itself (~140 ms in bf16): prepare's feature pass, which stores that teacher log-sum-exp, runs
1.07x faster in float32 and 1.10x in bf16 with the kernel (feature-lse-2026-12-04). The kernel reads each row
twice (its max, then the sum of exp(x - max) from cache) at ~1 ulp per exp; `logsumexp` uses it where the
program is lowered for CPU and XLA's op elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from carryover_jax.models import cpu_kernels

TARGET = "carryover_cpu_logsumexp_v1"  # versioned: a changed kernel gets a new name


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA in this process (once; a failure warns once)."""
    return cpu_kernels.register({TARGET: "CarryoverCpuLogSumExp"}, "logsumexp falls back to XLA's ops")


@jax.custom_vjp
def kernel_logsumexp(x: jax.Array) -> jax.Array:
    """log Σ exp(x) over the last axis of float32 x [..., V] -> [...] by the kernel (CPU only)."""
    if not available():
        raise RuntimeError("the CPU logsumexp kernel is unavailable on this machine (see the warning above)")
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32), vmap_method="broadcast_all")
    return call(x)


def _fwd(x):
    out = kernel_logsumexp(x)
    return out, (x, out)


def _bwd(res, g):
    x, out = res
    return (jnp.exp(x - out[..., None]) * g[..., None],)


kernel_logsumexp.defvjp(_fwd, _bwd)


def logsumexp(x: jax.Array) -> jax.Array:
    """log Σ exp(x) over the last axis: the kernel for float32 x where the program is lowered for CPU and the
    kernel is available, `jax.nn.logsumexp` otherwise (other platforms, dtypes, or no C++ compiler)."""
    if x.dtype != jnp.float32 or x.ndim < 1 or x.shape[-1] == 0 or not available():
        return jax.nn.logsumexp(x, axis=-1)
    return jax.lax.platform_dependent(x, cpu=kernel_logsumexp, default=lambda a: jax.nn.logsumexp(a, axis=-1))
