"""What the A/B scripts of prefix-kernel-2026-12-06 and bf16-attention-2026-12-06 share: arms built under whatever
patch is in force when they are traced (their first call is here), timed in rotated rounds in one process
(`bench.steps.rotated_seconds`), compared by ratios of mean times with 95% intervals (`eval.paired.speed_ratio`).

- `feature_arm(**numerics)`: prepare's feature pass (configs/smollm2, its numerics changed by `numerics`: 32 random
  320-token sequences, `train.responses._features`); `feature_report` times such arms and prints every pair's speed
  ratio and the outputs' largest differences for the pairs named.
- `step_arms(label, calls, losses, **numerics)`: a baseline, DVD and control training step (a synthetic batch,
  random drafter weights, as `carryover bench roofline --rows baseline dvd control` builds them); `step_report`
  times them and prints each mode's speed ratios to the base arm, the A/A and the losses.

A script in one of those folders puts this folder on `sys.path` (its parent, or its grandparent from `tried/`)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.roofline import _drafter
from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.bench.train import step_call, synthetic_batch
from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.train import responses

MODES = ("baseline", "dvd", "control")


def _config(numerics: dict):
    cfg = load_config("smollm2")
    return cfg.replace(numerics=cfg.numerics.replace(**numerics), compute_dtype=None) if numerics else cfg


def feature_arm(**numerics):
    """-> (call, outputs): the feature pass compiled now and its outputs on the host."""
    cfg = _config(numerics)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jnp.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    f = jax.jit(lambda p, x: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids, kv_dtype=None))
    out = jax.device_get(f(t.params, toks))
    return (lambda: jax.block_until_ready(f(t.params, toks))), out


def feature_report(arms: dict, outs: dict, rounds: int, same=()):
    names = list(arms)
    secs = rotated_seconds(arms, rounds, lambda r, s: print(
        f"round {r}: " + ", ".join(f"{a} {s[a][-1]:.2f} s" for a in names), flush=True))
    for a, b in itertools.combinations(names, 2):
        ratio, lo, hi = speed_ratio(secs[a], secs[b])
        print(f"{b} / {a} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] over {rounds} rounds "
              f"(mean {np.mean(secs[a]):.2f} / {np.mean(secs[b]):.2f} s)")
    for a, b in same:
        if a in outs and b in outs:
            print(f"{a} against {b}, largest |difference| (stored dtypes):",
                  {k: float(np.max(np.abs(np.asarray(outs[a][k], np.float32) - np.asarray(outs[b][k], np.float32))))
                   for k in outs[a]})


def step_arms(label: str, calls: dict, losses: dict, again: bool = False, **numerics):
    """Adds f"{mode} {label}" (and f"{mode} {label} again", the same call: the A/A) to `calls`, each step's loss to
    `losses`; the steps are traced and run once here."""
    cfg = _config(numerics)
    target = load_target(cfg.target, numerics=cfg.run_numerics())
    d = _drafter(cfg, target)
    with_kv = synthetic_batch(cfg, target, d.cfg, stored=cfg.features == "store")
    batch = {k: v for k, v in with_kv.items() if k != "kv"}
    for mode in MODES:
        fn = step_call(cfg, target, d.cfg, d.params, with_kv if mode == "dvd" else batch, mode=mode, off_metrics=False)
        losses[f"{mode} {label}"] = float(jax.block_until_ready(fn()))
        calls[f"{mode} {label}"] = fn
        if again:
            calls[f"{mode} {label} again"] = fn


def step_report(calls: dict, losses: dict, rounds: int, base: str, new: str):
    names = list(calls)
    secs = rotated_seconds(calls, rounds, lambda r, s: print(
        f"round {r}: " + ", ".join(f"{k} {s[k][-1] * 1e3:.0f} ms" for k in names), flush=True))
    for mode in MODES:
        for b in (new, f"{new} again"):
            ratio, lo, hi = speed_ratio(secs[f"{mode} {base}"], secs[f"{mode} {b}"])
            print(f"{mode}: {b} / {base} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] (mean "
                  f"{np.mean(secs[f'{mode} {base}']) * 1e3:.0f} / {np.mean(secs[f'{mode} {b}']) * 1e3:.0f} ms)")
        ratio, lo, hi = speed_ratio(secs[f"{mode} {new}"], secs[f"{mode} {new} again"])
        print(f"{mode}: A/A {ratio:.3f} [{lo:.3f}, {hi:.3f}]; loss {base} "
              f"{losses[f'{mode} {base}']:.6f}, {new} {losses[f'{mode} {new}']:.6f}")
