"""DVD's verification work: the P proposal rows against the anchor-row form decoding runs, and the recorded
sequences' K/V read from the store (`data.store_kv`) against the K/V a target pass gives."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DataConfig, DrafterSpec, LossConfig, TrainConfig
from carryover_jax.errors import CarryoverError, ConfigError
from carryover_jax.models.layers import Blockwise, Prefix
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import dvd
from carryover_jax.train.kv_rows import kv_width, unpack_kv
from carryover_jax.train.pipeline import StoreSource, make_train_iter
from carryover_jax.train.responses import target_features
from carryover_jax.train.store import ResponseStore
from tests.test_dvd import LAYERS, TCFG, _batch, _dc, _sc


def _anchor_row_verify(sc, target_params, ids, anchors, keep, proposals, *, with_hidden=False, kv=None):
    """Verification as decoding runs it: blocks [x_{s_n}, d_1..d_P] at s_n..s_n+P, each seeing the recorded
    prefix before its anchor (DVD's form until the anchor's row was dropped); the anchor's row then dropped."""
    b = ids.shape[0]
    n, p = proposals.shape[1:]
    kv = dvd.recorded_kv(sc, target_params, ids) if kv is None else kv
    first = jnp.take_along_axis(ids, anchors, axis=1)
    tokens = jnp.concatenate([first[..., None], proposals], axis=-1).reshape(b, n * (p + 1))
    positions = (anchors[..., None] + jnp.arange(p + 1)).reshape(b, n * (p + 1))
    prefix = Prefix(jnp.repeat(jnp.where(keep, anchors, 0), p + 1, axis=1).astype(jnp.int32))
    taps, last = TargetLM(sc.target).apply({"params": target_params}, tokens, positions, kv, prefix,
                                           Blockwise(n, causal=True), sc.drafter.target_layer_ids,
                                           method=TargetLM.with_context)
    feats = jnp.concatenate(taps, axis=-1).reshape(b, n, p + 1, -1)[:, :, 1:]
    return (feats, last.reshape(b, n, p + 1, -1)[:, :, 1:]) if with_hidden else feats


def _stored_batch(tp, seed=0):
    """A batch as a store prepared with stored features and float32 K/V delivers it (prepare's own pass)."""
    ids, lm = _batch(seed)
    outs = target_features(types.SimpleNamespace(params=tp, cfg=TCFG), np.asarray(ids).tolist(), LAYERS,
                           kv_dtype="float32")
    return {"input_ids": ids, "loss_mask": lm, **{k: jnp.asarray(np.stack([o[k] for o in outs])) for k in outs[0]}}


def _loss_and_grad(sc, params, tp, batch, rng):
    # a fresh jit per variant: a patched verification must not hit another variant's compiled program
    return jax.jit(jax.value_and_grad(dvd.dvd_loss, has_aux=True), static_argnums=1)(params, sc, tp, batch, rng)


@pytest.mark.parametrize("kind,layout,carry", [("dflash", "zlab", "hidden"), ("dflash", "zlab", "target_tokens"),
                                               ("markov", "deepspec", "hidden"),
                                               ("markov", "deepspec", "target_tokens")])
def test_dvd_step_equals_the_anchor_row_form_with_recomputed_or_stored_kv(kind, layout, carry, monkeypatch):
    from carryover_jax.models.drafter import init_drafter_params

    dc = _dc(kind, layout)
    sc = _sc(dc, carry=carry)
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    rng = jax.random.key(8)
    stored = _stored_batch(tp)
    recomputed = {k: v for k, v in stored.items() if k != "kv"}
    new = {"recomputed": _loss_and_grad(sc, params, tp, recomputed, rng),
           "stored": _loss_and_grad(sc, params, tp, stored, rng)}
    with monkeypatch.context() as m:
        m.setattr(dvd, "verify_blocks", _anchor_row_verify)
        (l_ref, m_ref), g_ref = _loss_and_grad(sc, params, tp, recomputed, rng)
    assert float(m_ref["draft1/accept_mean"]) < dc.num_proposals and float(m_ref["draft2/kept_ratio"]) > 0
    for name, ((loss, metrics), grads) in new.items():
        np.testing.assert_allclose(float(loss), float(l_ref), rtol=1e-5, err_msg=name)
        assert metrics.keys() == m_ref.keys()
        for k in m_ref:
            np.testing.assert_allclose(np.asarray(metrics[k]), np.asarray(m_ref[k]), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} {k}")
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), grads, g_ref)
    assert float(jnp.abs(new["stored"][1]["e_rej"]).max()) > 0  # the carried rows do reach the loss


def test_a_step_with_stored_kv_runs_no_target_pass_over_the_recorded_sequences(monkeypatch):
    from carryover_jax.models.drafter import init_drafter_params

    dc = _dc()
    sc = _sc(dc)
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    stored = _stored_batch(tp)
    passes = []
    full_pass = TargetLM.features

    def counted(self, tokens, *a, **kw):
        passes.append(tokens.shape)
        return full_pass(self, tokens, *a, **kw)

    monkeypatch.setattr(TargetLM, "features", counted)
    for batch in ({k: v for k, v in stored.items() if k != "kv"}, stored):
        jax.make_jaxpr(lambda p, b: dvd.dvd_loss(p, sc, tp, b, jax.random.key(8)))(params, batch)
    assert passes == [stored["input_ids"].shape]  # the recomputed step's K/V pass; none with stored K/V


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": " ".join(f"w{5 + i + j}" for j in range(3))},
                                        {"role": "assistant", "content": " ".join(f"w{20 + 3 * i + j}" for j in
                                                                                  range(6 + i))}]}
            for i in range(4)]
    path = tmp_path_factory.mktemp("src") / "src.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepared_kv_are_the_recorded_kv_and_reach_the_batch(tiny_llama_worded, source_file, tmp_path):
    from carryover_jax import load_target
    from carryover_jax.train.responses import prepare_responses

    target = load_target(tiny_llama_worded)
    cfg = DataConfig(source=str(source_file), store=str(tmp_path / "kv"), heldout_per_mille=0, responses="source",
                     max_new_tokens=8, min_loss_tokens=3, max_prompt_tokens=32, store_features=True,
                     feature_layer_ids=(0, 1), store_kv="float32")
    store = prepare_responses(cfg, target, progress=False)
    half = prepare_responses(dataclasses.replace(cfg, store=str(tmp_path / "bf16"), store_kv="bfloat16"), target,
                             progress=False)
    width = kv_width(target.cfg)
    assert len(store) == 4 and store.kv_dim == width and store.kv_dtype == "float32"
    for i in range(len(store)):
        rec = store.get(i, kv=True)
        assert "kv" not in store.get(i) and rec["kv"].shape == (len(rec["input_ids"]), width)
        _, _, ks, vs = TargetLM(target.cfg).apply({"params": target.params}, jnp.asarray(rec["input_ids"])[None],
                                                   (0,), method=TargetLM.features, with_kv=True)
        got_k, got_v = unpack_kv(target.cfg, jnp.asarray(rec["kv"])[None])
        for want, got in zip(ks + vs, got_k + got_v):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
        h = half.get(i, kv=True)["kv"]
        assert h.dtype.name == "bfloat16"
        np.testing.assert_allclose(h.astype(np.float32), rec["kv"], rtol=1e-2, atol=1e-2)

    batch = next(make_train_iter(dataclasses.replace(cfg, max_len=24), store, batch_size=2, seed=0,
                                 with_features=True, with_kv=True))
    assert batch["kv"].shape == (2, 24, width) and batch["kv"].dtype == np.float32
    for row in range(2):
        n = int(batch["length"][row])
        assert batch["kv"][row, :n].any() and not batch["kv"][row, n:].any()
    assert "kv" not in next(make_train_iter(cfg, store, batch_size=2, seed=0, with_features=True))

    # K/V are never added to (or dropped from) a store: the content setting differs
    with pytest.raises(CarryoverError, match=r"kv_dim: stored \d+, requested None.*data.store_kv: stored 'float32', "
                                             r"requested None"):
        prepare_responses(dataclasses.replace(cfg, store_kv=None), target, progress=False)
    plain = prepare_responses(dataclasses.replace(cfg, store=str(tmp_path / "plain"), store_kv=None), target,
                              progress=False)
    assert plain.kv_dim is None and "kv" not in plain.get(0, kv=True)
    with pytest.raises(CarryoverError, match="kv_dim: stored None, requested"):
        prepare_responses(dataclasses.replace(cfg, store=str(tmp_path / "plain")), target, progress=False)
    with pytest.raises(CarryoverError, match="holds no target K/V, data.store_kv asks for float32"):
        StoreSource(plain, max_len=24, min_loss_tokens=3, with_features=True, kv_dtype="float32")
    with pytest.raises(CarryoverError, match="holds bfloat16 K/V, data.store_kv asks for float32"):
        StoreSource(half, max_len=24, min_loss_tokens=3, with_features=True, kv_dtype="float32")
    with pytest.raises(ConfigError, match="data.store_kv needs data.store_features"):
        DataConfig(store_kv="float32")
    with pytest.raises(ConfigError, match="data.store_kv must be None, 'float32' or 'bfloat16'"):
        DataConfig(store_kv="float16", store_features=True)


def _feature_store(path, target, *, kv: bool):
    rng = np.random.default_rng(0)
    kw = dict(kv_dim=kv_width(target.cfg), kv_dtype="float32") if kv else {}
    st = ResponseStore.create_or_open(path, feature_dim=2 * target.cfg.hidden_size, hidden=target.cfg.hidden_size,
                                      meta={"feature_layer_ids": [0, 1]}, **kw)
    recs = []
    for i in range(8):
        ids = rng.integers(5, target.cfg.vocab_size, int(rng.integers(14, 24))).tolist()
        mask = np.r_[np.zeros(3, np.uint8), np.ones(len(ids) - 3, np.uint8)]
        out = target_features(target, [ids], (0, 1), kv_dtype="float32" if kv else None)[0]
        out.pop("target_lse")  # a store written before the log-sum-exp was kept: training computes the full head
        recs.append({"id": str(i), "input_ids": ids, "loss_mask": mask, **out})
    st.append(recs)
    st.commit()
    return path


def test_dvd_trains_on_stored_kv_as_on_recomputed_and_a_store_without_them_still_trains(tiny_llama, tmp_path):
    from carryover_jax import load_target
    from carryover_jax.train.loop import train

    target = load_target(tiny_llama.path, tokenizer=False)
    stores = {kv: _feature_store(tmp_path / f"store-{kv}", target, kv=kv) for kv in (True, False)}

    def cfg(out, kv):
        return TrainConfig(loss=LossConfig(mode="dvd"), target=str(tiny_llama.path), features="store",
                           data=DataConfig(store=str(stores[kv]), max_len=24, min_loss_tokens=2, store_features=True,
                                           feature_layer_ids=(0, 1), store_kv="float32" if kv else None),
                           drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                               target_layer_ids=(0, 1), mask_token_id=4),
                           out_dir=str(tmp_path / out), batch_size=8, num_anchors=4, steps=2, log_every=1,
                           save_every=100, async_checkpointing=False, lr=3e-3)

    def metrics(out):
        return [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]

    assert cfg("a", True).reads_stored_kv and not cfg("b", False).reads_stored_kv
    for kv in (True, False):
        assert train(cfg(f"run-{kv}", kv), progress=False)["finished"]
    for a, b in zip(metrics("run-True"), metrics("run-False"), strict=True):
        for k in ("loss", "draft1/tau", "off/ce_loss", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    bad = cfg("c", False)  # DVD asks for stored K/V from a store that holds none
    with pytest.raises(CarryoverError, match="holds no target K/V"):
        train(bad.replace(data=dataclasses.replace(bad.data, store_kv="float32")), progress=False)
