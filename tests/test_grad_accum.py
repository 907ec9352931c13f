"""Gradient accumulation (`grad_accum_steps`, optax.MultiSteps): k micro-steps equal one step on the whole
batch, every row gets the undivided step's random draws, and an accumulating run resumes exactly."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DataConfig, DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.models.target import init_params
from carryover_jax.train import anchors as A
from carryover_jax.train.dvd import rollout
from carryover_jax.train.losses import target_features
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step
from tests.synthetic import synthetic_store
from tests.test_train_loop import _cfg as loop_cfg

TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True)
DC = DrafterConfig.for_target(TCFG, kind="markov", layout="deepspec", num_proposals=4, num_layers=1, mask_token_id=0,
                              target_layer_ids=(0, 2), markov_rank=8)


def _batch(rng, b, s, mask_start=None):
    ids = rng.integers(1, 32, (b, s)).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    for i in range(b):
        lm[i, mask_start if mask_start is not None else rng.integers(2, 8):] = 1
    return {"input_ids": ids, "loss_mask": lm}


def _rows(batch, m, b):
    return {k: v[m * b:(m + 1) * b] for k, v in batch.items()}


def test_accumulated_micro_steps_equal_one_step_on_the_whole_batch(k=4):
    """Two optimizer steps of 8 sequences, undivided vs as k micro-steps each: the same params (float32,
    atol 1e-6 on params that move by ~lr = 1e-2 per step), the same loss and gradient norm (rtol 1e-5).
    The loss is normalised per micro-batch (MultiSteps averages the micro-steps' gradients), so the two are
    the same step when the micro-batches carry the same supervised weight: here every row has the same
    loss mask and all its anchor candidates are drawn. Adam's eps is raised to 1e-4 so that update/gradient
    is smooth where a gradient entry is near 0 (at eps 1e-8 a float32 summation-order difference flips sign(g))."""
    rng = np.random.default_rng(0)
    batches = [_batch(rng, 8, 16, mask_start=3) for _ in range(2)]
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(DC, jax.random.key(1))
    step = jax.jit(train_step, static_argnums=(0, 1))
    out = {}
    for accum in (1, k):
        cfg = TrainConfig(batch_size=8, num_anchors=16, steps=2, lr=1e-2, warmup_ratio=0.5, eps=1e-4,
                          grad_accum_steps=accum)
        sc, opt = step_config(cfg, TCFG, DC), make_optimizer(cfg, cfg.steps)
        state, hist = init_state(params, opt, 3), []
        for bt in batches:
            micro = []
            for m in range(accum):
                state, metrics = step(sc, opt, state, tp, _rows(bt, m, 8 // accum))
                micro.append(jax.device_get(metrics))
            hist.append(micro)
        out[accum] = state, hist
    (full, fh), (acc, ah) = out[1], out[k]
    assert int(acc.step) == int(full.step) == 2  # optimizer steps, not micro-steps
    np.testing.assert_array_equal(np.asarray(acc.rng), np.asarray(full.rng))
    for f, a in zip(fh, ah):
        np.testing.assert_allclose(np.mean([m["loss"] for m in a]), f[0]["loss"], rtol=1e-5)
        np.testing.assert_allclose(a[-1]["grad_norm"], f[0]["grad_norm"], rtol=1e-5)
    moved = jax.tree_util.tree_map(lambda a, b: float(np.max(np.abs(a - b))), full.params, params)
    assert max(jax.tree_util.tree_leaves(moved)) > 1e-2  # the comparison is not between two unmoved states
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6),
                           acc.params, full.params)


def test_micro_batches_get_the_whole_batchs_anchors():
    """A micro-batch's rows get the anchors those rows get in the undivided batch (random masks; the
    micro-batch index traced, as in the step)."""
    rng = np.random.default_rng(1)
    lm = jnp.asarray(_batch(rng, 8, 24)["loss_mask"])
    key = jax.random.key(5)
    want = A.sample_anchors(key, lm, 5)
    sample = jax.jit(lambda m, rows: A.sample_anchors(key, rows, 5, (m, 4)))
    got = [sample(m, lm[2 * m:2 * m + 2]) for m in range(4)]
    for w, g in zip(want, zip(*got)):
        np.testing.assert_array_equal(np.asarray(w), np.concatenate([np.asarray(x) for x in g]))


def test_micro_batches_get_the_whole_batchs_dvd_draws():
    """DVD on a recording sampled at T > 0: draft 1's coupled draws of a micro-batch's rows are those rows'
    draws in the undivided batch, so every row accepts the same counts."""
    cfg = TrainConfig(loss=LossConfig(mode="dvd"), batch_size=8, num_anchors=4, data=DataConfig(temperature=0.8))
    sc = step_config(cfg, TCFG, DC)
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(DC, jax.random.key(1))
    batch = {k: jnp.asarray(v) for k, v in _batch(np.random.default_rng(2), 8, 20).items()}
    frozen = frozen_from_target(tp, sc.target)
    key = jax.random.key(9)

    @functools.partial(jax.jit, static_argnums=2)
    def accepted(bt, m, count):
        feats, last = target_features(sc, tp, bt["input_ids"])
        return rollout(sc, params, tp, frozen, bt, feats, last, key, carried=True, part=(m, count)).accepted

    want = np.asarray(accepted(batch, 0, 1))
    got = np.concatenate([np.asarray(accepted(_rows(batch, m, 4), m, 2)) for m in range(2)])
    assert want.sum() > 0  # some proposals are accepted: the draws matter
    np.testing.assert_array_equal(got, want)


def test_batch_size_must_split_into_micro_steps():
    with pytest.raises(ConfigError, match="batch_size 12 is not a multiple of grad_accum_steps 8"):
        TrainConfig(batch_size=12, grad_accum_steps=8)


# ---- the loop: data order and exact resume ------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic_store(tmp_path_factory.mktemp("store") / "responses", n=40)


def _cfg(tiny_llama, store, out, **kw):
    """test_train_loop's run, 16 sequences per optimizer step in 2 micro-steps."""
    return loop_cfg(tiny_llama, store, out, **{"batch_size": 16, "grad_accum_steps": 2, "steps": 4, **kw})


def _metrics(out):
    return {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def test_accumulating_run_sees_the_same_batches_and_resumes_exactly(tiny_llama, store, tmp_path, compile_cache):
    """An accumulating run reads the batches of the same run without accumulation (one optimizer step's
    micro-batches are its rows in order), logs and checkpoints per optimizer step, and a run stopped after
    step 3 (checkpoint at 2) and resumed equals the uninterrupted one."""
    from carryover_jax.train.loop import train

    seen = {}
    plain = {}
    train(_cfg(tiny_llama, store, tmp_path / "plain", grad_accum_steps=1, steps=2), progress=False,
          on_batch=lambda s, b: plain.setdefault(s, b))
    full = train(_cfg(tiny_llama, store, tmp_path / "a"), progress=False, on_batch=lambda s, b: seen.setdefault(s, b))
    assert full["finished"]
    for s in (1, 2):
        for key in ("input_ids", "loss_mask"):
            np.testing.assert_array_equal(seen[s][key], plain[s][key])
    want = _metrics(tmp_path / "a")
    assert sorted(want) == list(range(1, 5))
    saved = {int(p.name) for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.isdigit()}
    assert {2, 4} <= saved and max(saved) == 4  # numbered by optimizer step (orbax also keeps its first save)

    part = train(_cfg(tiny_llama, store, tmp_path / "b"), progress=False, stop_at_step=3)
    assert not part["finished"]
    train(_cfg(tiny_llama, store, tmp_path / "b"), progress=False)  # resumes from the step-2 checkpoint
    got = _metrics(tmp_path / "b")
    assert sorted(got) == list(range(1, 5))
    for s in range(1, 5):
        for key in ("loss", "grad_norm", "lr"):
            assert got[s][key] == pytest.approx(want[s][key], rel=1e-5, abs=1e-6), (s, key)


def test_micro_batch_must_split_over_the_mesh(tiny_llama, store, tmp_path):
    from carryover_jax.train.loop import train

    with pytest.raises(ConfigError, match=r"batch_size / grad_accum_steps = 4 sequences do not split over the "
                                          r"mesh's data x fsdp = 8 devices"):
        train(_cfg(tiny_llama, store, tmp_path / "c", batch_size=16, grad_accum_steps=4), progress=False)
