"""Training steps with the draft log-probabilities by `jax.nn.log_softmax` ("xla") or by x - the CPU logsumexp
kernel ("kernel"): the roofline's training shapes (`configs/smollm2`: 4 x 320 tokens, 64 anchors, stored features,
the default DFlash drafter with its 8,192-token draft vocabulary, or with KIND markov the Markov head over all
49,152 ids), float32; whole steps, the arms alternated call by call in one process, "kernel2" a second compiled
copy of "kernel" (the A/A).

git apply docs/experiments/feature-lse-2026-12-04/tried/log_softmax.patch   # the tried change
python docs/experiments/feature-lse-2026-12-04/tried/ab_train_log_softmax.py MODE[,MODE] STEPS [KIND]"""
import dataclasses
import statistics
import sys
import time

import jax

from carryover_jax.bench import roofline
from carryover_jax.bench.train import synthetic_batch
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_logsumexp
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

modes, steps = sys.argv[1].split(","), int(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "dflash"
cfg = load_config("smollm2")
if kind != "dflash":
    cfg = cfg.replace(drafter=dataclasses.replace(cfg.drafter, kind=kind, draft_vocab_size=0))
target = load_target(cfg.target, numerics=cfg.run_numerics())
d = roofline._drafter(cfg, target)
with_kv = synthetic_batch(cfg, target, d.cfg, stored=cfg.features == "store")
batch = {k: v for k, v in with_kv.items() if k != "kv"}
kernel = cpu_logsumexp.log_softmax
arms = {}
for mode in modes:
    c = cfg.with_loss(mode=mode, off_metrics=False)
    sc, opt = step_config(c, target.cfg, d.cfg), make_optimizer(c, 10)
    state = init_state(d.params, opt, 0)
    b = with_kv if mode == "dvd" else batch
    for arm in ("xla", "kernel", "kernel2"):
        # a new function per arm: jit keeps one trace per function
        step = jax.jit(lambda *a: train_step(*a), static_argnums=(0, 1))
        cpu_logsumexp.log_softmax = kernel if arm != "xla" else (lambda x: jax.nn.log_softmax(x, axis=-1))
        call = lambda step=step, sc=sc, opt=opt, state=state, b=b: step(sc, opt, state, target.params, b)[1]["loss"]
        jax.block_until_ready(call())  # traces with this arm's log_softmax, compiles
        text = step.lower(sc, opt, state, target.params, b).as_text()
        assert (cpu_logsumexp.TARGET in text) == (arm != "xla"), arm
        arms[f"{kind} {mode} {arm}"] = call
cpu_logsumexp.log_softmax = kernel
losses = {k: float(f()) for k, f in arms.items()}
times = {k: [] for k in arms}
for _ in range(steps):
    for k, f in arms.items():
        t = time.perf_counter()
        jax.block_until_ready(f())
        times[k].append(time.perf_counter() - t)
print("| arm | loss | median ms | min-max ms |\n|---|---|---|---|")
for k, v in times.items():
    print(f"| {k} | {losses[k]:.6f} | {statistics.median(v) * 1e3:.1f} | {min(v) * 1e3:.1f}-{max(v) * 1e3:.1f} |")
for mode in modes:
    med = {a: statistics.median(times[f"{kind} {mode} {a}"]) for a in ("xla", "kernel", "kernel2")}
    print(f"{kind} {mode}: kernel / xla speedup {med['xla'] / med['kernel']:.3f}x, A/A kernel2 / kernel "
          f"{med['kernel2'] / med['kernel']:.3f}")
