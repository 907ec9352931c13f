"""Prepare's feature pass (32 x 320 tokens, configs/smollm2) with the teacher log-sum-exp by XLA's ops ("xla")
or by the CPU kernel ("kernel"), in float32 and bf16: whole calls, the arms alternated round by round in one
process; "kernel2" is a second compiled copy of bf16 "kernel" (the A/A).

python docs/experiments/feature-lse-2026-12-04/ab_feature_lse.py [ROUNDS]"""
import statistics
import sys
import time

import jax
import numpy as np

from carryover_jax.configs import load_config
from carryover_jax.config import zlab_layer_ids
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_logsumexp
from carryover_jax.train import responses
from carryover_jax.train.gen_memory import generation_batch

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
kernel_lse = cpu_logsumexp.logsumexp
arms = {}
for dtype in ("float32", "bfloat16"):
    cfg = load_config("smollm2")
    if dtype != "float32":
        cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
    target = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    rows, _ = generation_batch(cfg.data, target.cfg, max_rows=cfg.data.max_prompts)
    layer_ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids
                      or zlab_layer_ids(target.cfg.num_layers))
    toks = jax.numpy.asarray(np.random.default_rng(0).integers(10, target.cfg.vocab_size, (rows, cfg.data.max_len)))
    for lse in ("xla", "kernel", "kernel2"):
        if lse == "kernel2" and dtype == "float32":
            continue
        # a new function per arm: jit caches traces by the function, so one shared function would trace once
        fn = jax.jit(lambda *a, **k: responses._features.__wrapped__(*a, **k),
                     static_argnames=("cfg", "layer_ids", "kv_dtype"))
        cpu_logsumexp.logsumexp = kernel_lse if lse != "xla" else (lambda x: jax.nn.logsumexp(x, axis=-1))
        call = (lambda fn=fn, target=target, toks=toks, layer_ids=layer_ids, kv=cfg.data.store_kv:
                fn(target.params, toks, cfg=target.cfg, layer_ids=layer_ids, kv_dtype=kv))
        jax.block_until_ready(call())  # traces with this arm's logsumexp, compiles, warms
        text = fn.lower(target.params, toks, cfg=target.cfg, layer_ids=layer_ids, kv_dtype=cfg.data.store_kv).as_text()
        assert (cpu_logsumexp.TARGET in text) == (lse != "xla"), lse
        arms[f"{dtype} {lse}"] = call
        print(f"{dtype} {lse}: {rows} x {cfg.data.max_len} tokens, compiled", flush=True)
cpu_logsumexp.logsumexp = kernel_lse
times = {k: [] for k in arms}
for r in range(rounds):
    for name, call in arms.items():
        t = time.perf_counter()
        jax.block_until_ready(call())
        times[name].append(time.perf_counter() - t)
    print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
med = {k: statistics.median(v) for k, v in times.items()}
print("| arm | median s | min s | max s |\n|---|---|---|---|")
for k, v in times.items():
    print(f"| {k} | {med[k]:.2f} | {min(v):.2f} | {max(v):.2f} |")
for dt in ("float32", "bfloat16"):
    print(f"{dt}: kernel / xla speedup {med[f'{dt} xla'] / med[f'{dt} kernel']:.3f}x")
print(f"bf16 / float32 speedup: xla {med['float32 xla'] / med['bfloat16 xla']:.3f}x, "
      f"kernel {med['float32 kernel'] / med['bfloat16 kernel']:.3f}x")
print(f"A/A bf16 kernel2 / kernel: {med['bfloat16 kernel2'] / med['bfloat16 kernel']:.3f}")
