"""The cache attention kernel with bf16 rows read as even/odd halves (`attention_pairs.patch`, tried and not kept)
against the kernel as committed, in one process: a batch-64 SmolLM2 decode step's 30 layers of cache reads (3 K/V
heads, 3 query heads each, D 64, bf16 caches as bits, 256-slot buffers, rows live 130-230 slots), calls alternated
pair by pair.

    git show 031bdd3:carryover_jax/models/cpu_attention.cc > /tmp/oldattn/cpu_attention.cc
    git show 031bdd3:carryover_jax/models/cpu_common.h > /tmp/oldattn/cpu_common.h
    g++ -O3 -std=c++17 -shared -fPIC -march=native -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
        -I /tmp/oldattn /tmp/oldattn/cpu_attention.cc -o /tmp/oldattn/old.so
    git apply docs/experiments/roofline-2026-12-04/tried/attention_pairs.patch   # "new"
    OLD_SO=/tmp/oldattn/old.so python ab_attention_pairs.py {bits|float32} PAIRS [AA]

The earlier build is registered under its own target names; AA times it against itself (the A/A check)."""
import ctypes
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.models import cpu_attention as ca
from carryover_jax.models.cache import BITS

lib = ctypes.cdll.LoadLibrary(os.environ["OLD_SO"])
for name, sym in (("bits", "CarryoverCpuAttentionBits"), ("float32", "CarryoverCpuAttention")):
    jax.ffi.register_ffi_target(f"old_attention_{name}", jax.ffi.pycapsule(getattr(lib, sym)), platform="cpu")
assert ca.available()
kind, pairs = sys.argv[1], int(sys.argv[2])
new_target = ca.TARGETS["uint16" if kind == "bits" else "float32"]
rng = np.random.default_rng(0)
b, hkv, r, s, d, layers = 64, 3, 3, 256, 64, 30
q = jnp.asarray(rng.normal(size=(b, hkv, r, d)), jnp.float32)


def cache():
    x = jnp.asarray(rng.normal(size=(b, hkv, s, d)), jnp.float32)
    return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), BITS) if kind == "bits" else x


kv = [(cache(), cache()) for _ in range(layers)]
limit = jnp.asarray(rng.integers(130, 231, size=(b, 1)), jnp.int32)
lower = jnp.zeros((b, 1), jnp.int32)


def chain(target):
    outs = (jax.ShapeDtypeStruct((b, hkv, r), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((b, hkv, r, d), jnp.float32),)
    call = jax.ffi.ffi_call(target, outs, vmap_method="sequential")

    def f(q, kv):
        res = []
        for k, v in kv:
            res.append(call(q, k, v, limit, lower, scale=np.float32(0.125)))
        return res
    return jax.jit(f)


old = chain(f"old_attention_{kind}")
new = chain(f"old_attention_{kind}") if "AA" in sys.argv else chain(new_target)
for (m0, l0, o0), (m1, l1, o1) in zip(old(q, kv), new(q, kv)):  # the same attention to float32 rounding
    np.testing.assert_allclose(np.asarray(m1), np.asarray(m0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(o1) / np.asarray(l1)[..., None], np.asarray(o0) / np.asarray(l0)[..., None],
                               rtol=1e-4, atol=1e-5)
ts = {"old": [], "new": []}
for i in range(pairs):
    for name, f in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
        t = time.perf_counter()
        jax.block_until_ready(f(q, kv))
        ts[name].append(time.perf_counter() - t)
ratio = [a / b for a, b in zip(ts["new"], ts["old"])]
print(f"{kind}{' A/A' if 'AA' in sys.argv else ''}: 30 layers' cache reads, old median {np.median(ts['old']) * 1e3:.2f} ms,"
      f" new {np.median(ts['new']) * 1e3:.2f} ms, new/old median {np.median(ratio):.3f} "
      f"(range {min(ratio):.3f}-{max(ratio):.3f}, {pairs} pairs)")
