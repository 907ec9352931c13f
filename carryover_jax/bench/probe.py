"""The budgeted pipeline's first seconds: time regeneration, each training mode and eval decoding on the
run's own shapes, so `carryover_jax/budget.py` can size the stages for the device it finds.

Every rate is measured on a second call after a first (compiling) one; the difference is the compile time
the plan charges each stage. Training steps run on a synthetic batch of the config's shape (random tokens,
the loss mask on the last three quarters), like `carryover bench train --mode dvd`; eval decoding uses the
freshly built (untrained) drafter, whose τ ≈ 1 makes the per-token cost an upper bound of a trained one's.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.budget import Rates
from carryover_jax.config import TrainConfig
from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.train.gen_memory import generation_batch
from carryover_jax.train.loop import build_drafter
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step


def _twice(fn):
    """(first call seconds, second call seconds) with the results ready."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    t1 = time.perf_counter()
    jax.block_until_ready(fn())
    return t1 - t0, time.perf_counter() - t1


def _step_times(cfg: TrainConfig, target, dcfg, params, rng, steps: int) -> tuple[dict[str, float], float]:
    b, s = cfg.batch_size, cfg.data.max_len
    batch = {"input_ids": jnp.asarray(rng.integers(10, target.cfg.vocab_size, (b, s)), jnp.int32),
             "loss_mask": jnp.asarray(np.r_[np.zeros(s // 4), np.ones(s - s // 4)][None].repeat(b, 0), jnp.int32)}
    step = jax.jit(train_step, static_argnums=(0, 1))
    out, compile_s = {}, 0.0
    for mode in ("baseline", "dvd", "control"):
        # the DVD step is timed without the carried-withheld diagnostic forward: it is not training compute
        c = cfg.replace(steps=max(steps, 2), epochs=None).with_loss(mode=mode, off_metrics=False)
        sc = step_config(c, target.cfg, dcfg)
        opt = make_optimizer(c, 10)
        state = init_state(params, opt, 0)
        first, _ = _twice(lambda: step(sc, opt, state, target.params, batch)[1]["loss"])
        times = []
        for _ in range(steps):
            times.append(_twice(lambda: step(sc, opt, state, target.params, batch)[1]["loss"])[1])
        out[mode] = float(np.median(times))
        compile_s = max(compile_s, first - out[mode])
    return out, compile_s


def probe_rates(cfg: TrainConfig, target, *, eval_passes: float, gen_new_tokens: int = 32, train_steps: int = 3,
                eval_new_tokens: int = 16, seed: int = 0) -> tuple[Rates, float]:
    """(measured Rates, seconds the probe took). `eval_passes`: decoding passes the eval makes over each
    prompt (arms x temperatures x seeds, plus AR, timing repeats and throughput batches)."""
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    d = cfg.data
    vocab = target.cfg.vocab_size
    plen = max(1, d.max_prompt_tokens // 2)
    rows, _ = generation_batch(d, target.cfg)  # the batch prepare replays
    prompts = rng.integers(10, vocab, (rows, plen)).tolist()
    first_gen, gen_s = _twice(lambda: [r.token_ids for r in generate(
        target, prompts, max_new_tokens=gen_new_tokens, stop_token_ids=[], chat=False)])
    gen_tps = rows * gen_new_tokens / gen_s

    dcfg, params = build_drafter(cfg, target)
    steps, train_compile = _step_times(cfg, target, dcfg, params, rng, train_steps)

    one = [rng.integers(10, vocab, plen).tolist()]
    first_spec, spec_s = _twice(lambda: speculative_generate(
        target, (dcfg, params), one, max_new_tokens=eval_new_tokens, stop_token_ids=[], chat=False)[1]["rounds"])
    compile_s = max(first_gen - gen_s, train_compile, first_spec - spec_s)
    rates = Rates(gen_tokens_per_s=gen_tps, baseline_step_s=steps["baseline"], dvd_step_s=steps["dvd"],
                  control_step_s=steps["control"], eval_token_s=eval_passes * spec_s / eval_new_tokens,
                  compile_s=compile_s)
    return rates, time.perf_counter() - t_start
