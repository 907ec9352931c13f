"""The projection-module interface for carried rows (`carry_module="projection"`, the paper's appendix
ablation): a learned residual module maps the fused carried rows before the draft layers' k/v projections.
Against independent references: the drafter without carried rows, the embedding form, AR decoding, the
exact target distribution, the engine's own rounds, the PyTorch reference and the DVD control step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from carryover_jax import ConfigError, generate, load_target
from carryover_jax.config import DrafterConfig, DrafterSpec, TrainConfig, apply_overrides
from carryover_jax.decode.drafting import draft_block_logits, mark_carried
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import init_carry_projection, init_drafter_params
from carryover_jax.weights.drafter_formats import export_drafter, load_drafter, save_drafter
from tests.drafter_fixtures import VARIANTS, tiny_drafter, tiny_frozen
from tests.test_drafter import B, _decode_setup, _inputs, _jax_logits, _torch_logits


def _with_module(cfg, params, *, scale=0.5, seed=3):
    """The drafter with the projection module; `scale` > 0 makes down_proj non-zero (a trained-looking module)."""
    pc = cfg.replace(carry_module="projection")
    module = init_carry_projection(pc, jax.random.key(seed))
    if scale:
        rng = np.random.default_rng(seed)
        down = module["down_proj"]["kernel"]
        module["down_proj"]["kernel"] = jnp.asarray(scale * rng.standard_normal(down.shape), down.dtype)
    return pc, {**params, "carry_proj": module}


@pytest.mark.parametrize("variant", ["dflash-zlab", "markov-deepspec"])
def test_zero_count_is_the_drafter_without_carried_rows_and_padding_is_hidden(variant):
    cfg, params = _with_module(*tiny_drafter(*VARIANTS[variant]))
    frozen = tiny_frozen()
    x = _inputs(cfg)
    cache = _decode_setup(cfg, params, frozen, x)
    anchor, carried = jnp.asarray(x["anchor"]), np.array(x["carried"])
    base = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor))
    zero = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor, jnp.asarray(carried),
                                         jnp.zeros((B,), jnp.int32)))
    np.testing.assert_array_equal(base, zero)
    # rows at or past the rejected count never matter, however large the module makes them
    count = jnp.asarray(x["count"])
    a = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor, jnp.asarray(carried), count))
    garbage = carried.copy()
    for b in range(B):
        garbage[b, x["count"][b]:] = 1e4 * np.random.default_rng(b).standard_normal(garbage[b, x["count"][b]:].shape)
    np.testing.assert_array_equal(a, np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor,
                                                                   jnp.asarray(garbage), count)))
    # the valid rows do pass the module: not the embedding form's logits
    emb_cfg = cfg.replace(carry_module="embedding")
    emb_params = {k: v for k, v in params.items() if k != "carry_proj"}
    e = np.asarray(draft_block_logits(emb_cfg, emb_params, frozen, cache, anchor, jnp.asarray(carried), count))
    assert np.max(np.abs(a - base)) > 1e-3 and np.max(np.abs(a - e)) > 1e-4


def test_a_zero_module_is_exactly_the_embedding_form(tmp_path):
    """A fresh module (down_proj zero), and one that `init_from` adds to a checkpoint without it, give the
    embedding form's carried rows and logits bit for bit (a non-zero e_rej: the module keeps it)."""
    cfg, params = tiny_drafter("dflash", "zlab")
    frozen = tiny_frozen()
    x = _inputs(cfg)
    want = _jax_logits(cfg, params, frozen, x, True)
    fresh = init_drafter_params(cfg.replace(carry_module="projection"), jax.random.key(0))
    assert not np.any(np.asarray(fresh["carry_proj"]["down_proj"]["kernel"]))
    assert np.any(np.asarray(fresh["carry_proj"]["gate_proj"]["kernel"]))  # so down_proj's gradient is not zero
    pc, pp = _with_module(cfg, params, scale=0)
    np.testing.assert_array_equal(_jax_logits(pc, pp, frozen, x, True), want)
    save_drafter(cfg, params, tmp_path / "emb")
    cfg2, params2 = load_drafter(tmp_path / "emb", carry_module="projection")
    assert cfg2 == pc and "carry_proj" in params2
    np.testing.assert_array_equal(_jax_logits(cfg2, params2, frozen, x, True), want)
    fused = jnp.asarray(np.random.default_rng(0).standard_normal((B, 3, cfg.hidden_size)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(mark_carried(cfg2, params2, fused)),
                                  np.asarray(mark_carried(cfg, params, fused)))


@pytest.mark.parametrize("kind,layout", [("dflash", "zlab"), ("markov", "deepspec")])
def test_greedy_speculative_equals_ar(tiny_llama, kind, layout):
    target = load_target(tiny_llama.path, tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=4, num_layers=1, mask_token_id=4,
                                   target_layer_ids=(0, 1), markov_rank=8 if kind == "markov" else None,
                                   carry_module="projection")
    cfg, params = _with_module(cfg, init_drafter_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (4, 13, 7)]
    ref = generate(target, prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[])
    out, stats = speculative_generate(target, (cfg, params), prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[],
                                      carryover=True)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    committed = sum(len(r.token_ids) - 1 for r in ref)
    assert stats["tau"] == pytest.approx(committed / stats["rounds"], abs=1e-4)


def _strong_projection_drafter(target, kind):
    """A random drafter on the vocabulary-8 target whose drafts are peaked and move with its carried rows,
    through a large projection module (e_rej zero: the module alone marks the rows)."""
    kw = dict(markov_rank=4) if kind == "markov" else dict(draft_vocab=tuple(range(8)))
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), carry_module="projection", **kw)
    params = init_drafter_params(cfg, jax.random.key(2))
    rng = np.random.default_rng(7)
    params["carry_proj"] = jax.tree.map(lambda x: 3 * rng.standard_normal(x.shape).astype(np.float32),
                                        params["carry_proj"])
    if kind == "markov":
        params["markov_head"] = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                                             params["markov_head"])
        params["norm"] = jax.tree.map(lambda x: 10 * x, params["norm"])
    else:
        params["lm_head"] = jax.tree.map(lambda x: 10 * x, params["lm_head"])
    return cfg, params


def test_sampling_is_lossless(tmp_path_factory):
    """T = 1: the first three tokens of speculative decoding with the projection drafter follow the exact
    target distribution (chi-square, fixed seed), as for the embedding form (tests/test_carry_interfaces.py)."""
    from tests.lossless import sampled_pvalue, tiny_sampling_target

    target = tiny_sampling_target(tmp_path_factory.mktemp("v8proj"))
    pvalue, stats = sampled_pvalue(target, _strong_projection_drafter(target, "dflash"), carryover=True)
    assert pvalue > 1e-3 and stats["tau"] > 1.05


def test_offline_replay_equals_the_engine_round_for_round(tmp_path_factory):
    """`carryover eval --offline` scores a projection drafter's Carryover arm by the engine's own rounds at
    T = 0 (eval/replay.py decodes through the engine, so the module is applied where the engine applies it)."""
    from carryover_jax.eval.offline import score_rollouts
    from carryover_jax.eval.run import DrafterEntry
    from carryover_jax.loading import DraftModel
    from tests.lossless import tiny_sampling_target
    from tests.test_offline_eval import _engine_commits

    target = tiny_sampling_target(tmp_path_factory.mktemp("v8projreplay"))
    drafter = DraftModel(*_strong_projection_drafter(target, "dflash"))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 8, size=n).tolist() for n in rng.integers(3, 9, 24)]
    spec, stats = speculative_generate(target, drafter, prompts, max_new_tokens=20, stop_token_ids=[], carryover=True)
    ar = generate(target, prompts, max_new_tokens=20, stop_token_ids=[])
    assert [g.token_ids for g in spec] == [r.token_ids for r in ar]
    rollouts = [{"dataset": "d", "prompt": str(i), "temperature": 0.0, "seed": 0, "prompt_ids": p,
                 "tokens": list(g.token_ids)} for i, (p, g) in enumerate(zip(prompts, spec))]
    arms = [(DrafterEntry("c", "-", carryover=True), drafter), (DrafterEntry("x", "-"), drafter)]
    log = score_rollouts(target, arms, rollouts, batch_size=8, progress=False)
    counts = set()
    for rec, g in zip([r for r in log if r["mode"] == "c"], spec):
        eng = g.stats["accepted_per_round"]
        assert rec["accepted"] == _engine_commits(eng, len(g.token_ids))
        counts |= {3 - a for a in eng[:-1]}
    assert counts == {0, 1, 2, 3} and stats["tau"] > 1.05  # every carried count was replayed
    by_arm = {lab: [r["accepted"] for r in log if r["mode"] == lab] for lab in ("c", "x")}
    assert by_arm["c"] != by_arm["x"]  # the module's carried rows changed some rounds


@pytest.mark.parametrize("fmt", ["native", "zlab", "deepspec"])
def test_save_load_and_exports_keep_the_module(fmt, tmp_path):
    kind, layout = {"native": ("markov", "zlab"), "zlab": ("dflash", "zlab"), "deepspec": ("markov", "deepspec")}[fmt]
    cfg, params = _with_module(*tiny_drafter(kind, layout))
    frozen = tiny_frozen()
    if fmt == "native":
        folder = save_drafter(cfg, params, tmp_path / "d")
    else:
        folder = export_drafter(cfg, params, tmp_path / "d", fmt, frozen=frozen, dtype=None)
    cfg2, params2 = load_drafter(folder)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)
    cfg3, params3 = load_drafter(folder, carryover=False)  # Carryover off drops the module with e_rej
    assert (cfg3.carryover, cfg3.carry_module) == (False, "embedding") and "carry_proj" not in params3
    if fmt == "native":
        return
    # the PyTorch reference (cache-free) and the PyTorch loop's carried rows agree with the JAX drafter
    x = _inputs(cfg)
    theirs, _ = _torch_logits(folder, frozen, x, True)
    np.testing.assert_allclose(_jax_logits(cfg, params, frozen, x, True), theirs, atol=1e-4, rtol=1e-4)
    from carryover_jax.export.torch_drafter import TorchDrafter

    d = TorchDrafter(folder, embed=torch.tensor(np.asarray(frozen["embed"])),
                     head=torch.tensor(np.asarray(frozen["head"]).T))
    fused = np.random.default_rng(0).standard_normal((1, 3, cfg.hidden_size)).astype(np.float32)
    np.testing.assert_allclose(d.mark_carried(torch.tensor(fused)).numpy(),
                               np.asarray(mark_carried(cfg, params, jnp.asarray(fused))), atol=1e-5, rtol=1e-5)


def test_dvd_gradient_reaches_the_module_and_the_control_never_does():
    from tests.test_dvd import TCFG, _batch, _dc, _sc
    from carryover_jax.models.target import init_params
    from carryover_jax.train import dvd

    tp = init_params(TCFG, jax.random.key(0))
    ids, lm = _batch(3)
    batch = {"input_ids": ids, "loss_mask": lm}
    for scale in (0, 0.5):  # a fresh module (down_proj zero) and a trained-looking one
        dc, params = _with_module(_dc(), init_drafter_params(_dc(), jax.random.key(1)), scale=scale)
        grads = {mode: jax.jit(jax.grad(lambda pr, sc=_sc(dc, mode=mode): dvd.dvd_loss(pr, sc, tp, batch,
                                                                                        jax.random.key(6))[0]))(params)
                 for mode in ("dvd", "control")}
        g = grads["dvd"]["carry_proj"]
        assert float(jnp.abs(g["down_proj"]["kernel"]).max()) > 1e-6
        if scale:  # gate/up learn once down_proj is non-zero
            assert min(float(jnp.abs(g[k]["kernel"]).max()) for k in ("gate_proj", "up_proj")) > 1e-6
        assert all(float(jnp.abs(v).max()) == 0.0 for v in jax.tree_util.tree_leaves(grads["control"]["carry_proj"]))


def test_a_dvd_continuation_adds_the_module_and_starts_at_the_embedding_form(tiny_llama, tmp_path):
    """`carryover train --set drafter.carry_module=projection --set init_from=BASELINE --set loss.mode=dvd`:
    the baseline gains a zero module, so step 1's loss is the embedding-form continuation's exactly, and the
    written drafter holds a trained module."""
    import json

    from carryover_jax.config import DataConfig, LossConfig
    from carryover_jax.loading import init_drafter
    from carryover_jax.train.loop import train
    from tests.synthetic import synthetic_store

    target = load_target(tiny_llama.path, tokenizer=False)
    base = init_drafter(target, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                        target_layer_ids=(0, 1), mask_token_id=4, seed=2)
    save_drafter(base.cfg, base.params, tmp_path / "base")
    store = synthetic_store(tmp_path / "store")
    common = TrainConfig(loss=LossConfig(mode="dvd"), target=str(tiny_llama.path), init_from=str(tmp_path / "base"),
                         data=DataConfig(store=str(store), max_len=32, min_loss_tokens=2), drafter=DrafterSpec(),
                         batch_size=8, num_anchors=4, steps=2, log_every=1, async_checkpointing=False, lr=3e-3)
    runs = {}
    for name, sets in (("emb", []), ("proj", ["drafter.carry_module=projection"])):
        cfg = apply_overrides(common, [f"out_dir={tmp_path / name}", *sets])
        assert train(cfg, progress=False)["finished"]
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        runs[name] = {r["step"]: r for r in map(json.loads, lines)}
    assert runs["proj"][1]["loss"] == runs["emb"][1]["loss"]
    cfg, params = load_drafter(tmp_path / "proj" / "drafter")
    assert cfg.carry_module == "projection" and float(jnp.abs(params["carry_proj"]["down_proj"]["kernel"]).max()) > 0
    cfg_e, _ = load_drafter(tmp_path / "emb" / "drafter")
    assert cfg_e.carry_module == "embedding"
    # continuing the projection drafter keeps its module unless told otherwise
    cfg_c, params_c = load_drafter(tmp_path / "proj" / "drafter", carry_module=None)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["carry_proj"], params_c["carry_proj"])


def test_bad_carry_module_is_one_line(tmp_path):
    cfg, params = tiny_drafter()
    one_line = "^unknown (drafter.)?carry_module 'mlp'; supported: embedding, projection$"
    for make in (lambda: cfg.replace(carry_module="mlp"), lambda: DrafterSpec(carry_module="mlp"),
                 lambda: apply_overrides(TrainConfig(), ["drafter.carry_module=mlp"])):
        with pytest.raises(ConfigError, match=one_line):
            make()
    with pytest.raises(ConfigError, match="needs drafter.carryover=true"):
        apply_overrides(TrainConfig(), ["drafter.carry_module=projection", "drafter.carryover=false"])
    save_drafter(cfg, params, tmp_path / "d")
    with pytest.raises(ConfigError, match="unknown carry_module 'mlp'"):
        load_drafter(tmp_path / "d", carry_module="mlp")
    import json

    from carryover_jax import CheckpointError
    from carryover_jax.export.torch_drafter import read_spec

    pc, pp = _with_module(cfg, params)
    folder = export_drafter(pc, pp, tmp_path / "x", "zlab", dtype=None)
    hf = json.loads((folder / "config.json").read_text())
    hf["carryover"]["module"] = "mlp"
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="unknown carried-row module 'mlp'"):
        read_spec(folder)
    with pytest.raises(CheckpointError, match="unknown carry_module 'mlp'"):
        load_drafter(folder)
