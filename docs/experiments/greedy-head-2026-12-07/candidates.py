"""How many ids the screen's bound leaves at SmolLM2's real hidden states, and the kernel's token against the float32
head's argmax at each of them.

python candidates.py FILE ...   (texts: the first 400 tokens of each, teacher-forced; final-normed states)
TARGET=gemma3-270m python candidates.py FILE ...   (that target instead of SmolLM2)
"""
import os
import sys

import jax.numpy as jnp
import numpy as np

from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import argmax

t = load_target(os.environ.get("TARGET", "smollm2"))
cfg, params = t.cfg, t.params
screen = t.greedy_screen()
e = params["embed_tokens"]["embedding"]
states = []
for path in sys.argv[1:]:
    ids = jnp.asarray(t.tokenizer(open(path).read())["input_ids"][:400])[None]
    states.append(TargetLM(cfg).apply({"params": params}, ids, with_hidden=True)[3][0])
h = jnp.concatenate(states)
k = h.shape[-1]
u = 2.0 ** -24
gamma = (k + 1) * u / (1 - (k + 1) * u)
c = (2.0 ** -7 + 2.0 ** -16 + 2.1 * gamma) * 1.001  # the kernel's constant (cpu_products.cc, HeadArgmax)
approx = jnp.einsum("nd,vd->nv", h.astype(jnp.bfloat16), screen.bits, preferred_element_type=jnp.float32)
exact = h @ e.T
norm = jnp.linalg.norm(h, axis=-1, keepdims=True)
bound = c * norm * screen.norms + norm * jnp.max(screen.norms) * 1e-6
count = np.asarray(jnp.sum(approx + bound >= jnp.max(approx - bound, axis=-1, keepdims=True), axis=-1))
seen = np.asarray(jnp.max(jnp.abs(approx - exact) / (norm * screen.norms), axis=-1))
tokens = np.concatenate([np.asarray(cp.head_argmax(h[i:i + 8], e, screen.bits, screen.norms))
                         for i in range(0, h.shape[0], 8)])
full = np.concatenate([np.asarray(argmax(cp.products(h[i:i + 8], e, "nk"))) for i in range(0, h.shape[0], 8)])
print(f"{h.shape[0]} states of {len(sys.argv) - 1} texts; bound constant c = {c:.6f}")
print(f"candidates a row: median {np.median(count):.0f}, 90th percentile {np.percentile(count, 90):.0f}, "
      f"99th {np.percentile(count, 99):.0f}, max {count.max()} (of {e.shape[0]})")
print(f"largest |a - y| / (|x| |e_n|) seen: {seen.max():.5f} (the bound's c: {c:.5f})")
print(f"kernel token == float32 head's argmax: {int((tokens == full).sum())} of {len(full)}")
