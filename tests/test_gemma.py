"""Gemma 3 and Gemma 4 text targets against transformers (tiny random models, several layers with
sliding and global attention, a window shorter than the sequences)."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from carryover_jax import ConfigError, generate, load_target
from carryover_jax.models.target import new_cache
from tests.hf_models import hf_forward, hf_greedy
from tests.jitted import jit_apply

ATOL = 1e-4
WINDOW = 5
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def _common(**kw):
    out = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=5, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=WINDOW, layer_types=TYPES,
               tie_word_embeddings=True, attn_implementation="eager")
    out.update(kw)
    return out


def gemma3_config(**kw):
    return transformers.Gemma3TextConfig(**_common(
        query_pre_attn_scalar=24, final_logit_softcapping=5.0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}, **kw))


def gemma4_config(**kw):
    kw = {**dict(global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                 hidden_size_per_layer_input=0, final_logit_softcapping=5.0,
                 rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                     "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}), **kw}
    return transformers.Gemma4TextConfig(**_common(**kw))


def _save(model, path, seed):
    torch.manual_seed(seed)
    model = model.float().eval()
    with torch.no_grad():  # norms start at 0 (Gemma 3) or 1 (Gemma 4), layer scalars at 1: perturb them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_gemma3")
    return path, _save(transformers.Gemma3ForCausalLM(gemma3_config()), path, 0)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("tiny_gemma4")
    return path, _save(transformers.Gemma4ForCausalLM(gemma4_config()), path, 1)


@pytest.fixture(scope="module", params=["gemma3", "gemma4"])
def gemma(request):
    return request.getfixturevalue(request.param)


def _ids(rng, b, t):
    return rng.integers(3, 97, size=(b, t)).astype(np.int32)


def _full(target, ids):
    return np.asarray(jit_apply(target.model)({"params": target.params}, jnp.asarray(ids))[0])


def test_config_switches(gemma3, gemma4):
    c3 = load_target(gemma3[0], tokenizer=False).cfg
    assert (c3.family, c3.norm_kind, c3.sliding_window, c3.final_logit_softcapping) == ("gemma3", "gemma", WINDOW, 5.0)
    assert c3.attention_scale == pytest.approx(24 ** -0.5) and c3.rope_local_theta == 100.0
    c4 = load_target(gemma4[0], tokenizer=False).cfg
    assert (c4.family, c4.global_head_dim, c4.num_global_kv_heads, c4.attention_k_eq_v) == ("gemma4", 32, 1, True)
    assert [c4.layer_head_dim(i) for i in range(5)] == [16, 16, 32, 16, 32]
    assert [c4.layer_kv_heads(i) for i in range(5)] == [2, 2, 1, 2, 1]


def test_logits_and_taps_match_transformers(gemma):
    path, hf = gemma
    target = load_target(path, tokenizer=False)
    ids = _ids(np.random.default_rng(0), 2, 13)  # longer than the window
    ref_logits, ref_hidden = hf_forward(hf, ids)
    tap_ids = (-1, 0, 1, 2, 3)
    logits, _, taps = jit_apply(target.model)({"params": target.params}, jnp.asarray(ids), tap_layers=tap_ids)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=ATOL, rtol=1e-4)
    for lid, tap in zip(tap_ids, taps):
        np.testing.assert_allclose(np.asarray(tap), ref_hidden[lid + 1], atol=ATOL, rtol=1e-4)


def test_greedy_generation_matches_transformers(gemma):
    path, hf = gemma
    target = load_target(path, tokenizer=False)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (3, 11, 7)]
    out = generate(target, prompts, max_new_tokens=16, stop_token_ids=[])  # one padded batch
    for p, r in zip(prompts, out):
        assert r.token_ids == hf_greedy(hf, p, 16, eos=None)


def test_prefill_then_chunks_equals_full_forward(gemma):
    target = load_target(gemma[0], tokenizer=False)
    m, p = jit_apply(target.model), {"params": target.params}
    ids = _ids(np.random.default_rng(2), 2, 17)
    full = _full(target, ids)
    cache = new_cache(target.cfg, 2, 32)
    pieces = []
    for lo, hi in [(0, 6), (6, 7), (7, 12), (12, 13), (13, 17)]:  # prefill, AR step, verify-sized chunks
        logits, cache, _ = m(p, jnp.asarray(ids[:, lo:hi]), cache=cache)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=ATOL, rtol=1e-4)


def test_rollback_across_the_window_equals_fresh_run(gemma):
    """A rejected block longer than the window is written, rolled back (one row keeps part of it,
    one none), and the continuation equals a fresh forward: the rejected K/V that the window
    would have pushed out of a ring buffer must not be seen, the committed ones must."""
    target = load_target(gemma[0], tokenizer=False)
    m, p = jit_apply(target.model), {"params": target.params}
    rng = np.random.default_rng(3)
    ids, rejected, cont = _ids(rng, 2, 6), _ids(rng, 2, WINDOW + 3), _ids(rng, 2, 4)
    cache = new_cache(target.cfg, 2, 32)
    _, cache, _ = m(p, jnp.asarray(ids), cache=cache)
    _, cache, _ = m(p, jnp.asarray(rejected), cache=cache)
    keep = np.array([2, 0])
    cache = cache.with_lengths(jnp.asarray(6 + keep))
    logits, cache, _ = m(p, jnp.asarray(cont), cache=cache)
    for row in range(2):
        seq = np.concatenate([ids[row], rejected[row, : keep[row]], cont[row]])[None]
        np.testing.assert_allclose(np.asarray(logits)[row], _full(target, seq)[0, -4:], atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("chunk", [4, 8, 64])
def test_live_mask_window_equals_dense(chunk):
    """A `LiveMask` with a lower bound (sliding layers: chunks below the window are skipped) equals
    the dense windowed mask."""
    from carryover_jax.models.layers import LiveMask, attention_core

    rng = np.random.default_rng(6)
    b, t, h, hkv, d, s = 3, 4, 4, 2, 8, 37
    q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, hkv, s, d)), jnp.float32) for _ in range(2))
    limit = jnp.asarray([[1, 2, 3, 4], [20, 21, 22, 23], [34, 35, 36, 37]], jnp.int32)
    lower = jnp.maximum(limit - 9, 0)
    slots = jnp.arange(s)[None, None, :]
    dense = (slots < limit[:, :, None]) & (slots >= lower[:, :, None])
    want = attention_core(q, [(k, v, dense)], 0.3)
    got = attention_core(q, [(k, v, LiveMask(limit, chunk, lower=lower))], 0.3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("field,value", [("hidden_size_per_layer_input", 8), ("num_kv_shared_layers", 2),
                                         ("enable_moe_block", True), ("use_double_wide_mlp", True)])
def test_unsupported_gemma4_fields_are_refused_by_name(gemma4, tmp_path, field, value):
    import json
    import shutil

    for f in ("config.json", "model.safetensors"):
        shutil.copy(gemma4[0] / f, tmp_path / f)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"unsupported Gemma 4 field {field}") as e:
        load_target(tmp_path, tokenizer=False)
    assert "\n" not in str(e.value)


def test_multimodal_checkpoint_loads_its_text_model(gemma4, tmp_path):
    """A ...ForConditionalGeneration folder (text model under `model.language_model.`, its config in
    `text_config`) loads the same text target."""
    import json

    from safetensors.numpy import load_file, save_file

    cfg = json.loads((gemma4[0] / "config.json").read_text())
    mm = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": cfg}
    (tmp_path / "config.json").write_text(json.dumps(mm))
    tensors = load_file(gemma4[0] / "model.safetensors")
    save_file({k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()},
              tmp_path / "model.safetensors")
    a, b = load_target(gemma4[0], tokenizer=False), load_target(tmp_path, tokenizer=False)
    assert a.cfg == b.cfg
    ids = _ids(np.random.default_rng(7), 1, 9)
    np.testing.assert_array_equal(_full(a, ids), _full(b, ids))


# ---- drafters on Gemma targets ---------------------------------------------------------------------
def test_gemma_drafter_backbone_uses_the_global_layer_geometry(gemma4):
    from carryover_jax.config import DrafterConfig

    t = load_target(gemma4[0], tokenizer=False).cfg
    d = DrafterConfig.for_target(t, kind="markov", layout="deepspec", num_proposals=4, num_layers=2,
                                 target_layer_ids=(0, 2))
    bc = d.backbone
    assert d.mask_token_id == 4 and bc.layer_types == () and not bc.is_sliding(0)
    assert (bc.layer_head_dim(0), bc.layer_kv_heads(0), bc.layer_k_eq_v(0)) == (32, 1, True)
    assert (bc.attention_scale, bc.rope_type, bc.rope_partial_factor, bc.final_logit_softcapping) == (
        1.0, "proportional", 0.25, 5.0)
    assert bc.sandwich_norms and bc.embed_scale and bc.v_norm and bc.layer_scalar and bc.norm_kind == "gemma4"


@pytest.mark.parametrize("kind,layout,carryover", [("dflash", "zlab", True), ("markov", "deepspec", False),
                                                   pytest.param("dflash", "zlab", False, marks=pytest.mark.heavy),
                                                   pytest.param("markov", "deepspec", True, marks=pytest.mark.heavy)])
def test_greedy_speculative_on_gemma_equals_ar(gemma, kind, layout, carryover):
    """Lossless on a sliding-window target: rounds roll the target cache back across the window."""
    import jax

    from carryover_jax.config import DrafterConfig
    from carryover_jax.decode.generate import speculative_generate
    from carryover_jax.models.drafter import init_drafter_params

    target = load_target(gemma[0], tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=4, num_layers=1,
                                   target_layer_ids=(0, 2), markov_rank=8 if kind == "markov" else None)
    drafter = (cfg, init_drafter_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (4, 13, 7)]
    ref = generate(target, prompts, max_new_tokens=[17, 6, 21], stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=[17, 6, 21], stop_token_ids=[],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert stats["rounds"] > 0


def test_baseline_training_on_a_gemma_target_learns(gemma4):
    """Online target features (sliding-window masks in the cache-free forward) -> a Gemma drafter
    (soft-capped logits) that learns a deterministic toy sequence."""
    import jax

    from carryover_jax.config import DrafterConfig, DrafterSpec, LossConfig, TrainConfig
    from carryover_jax.models.drafter import init_drafter_params
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    target = load_target(gemma4[0], tokenizer=False)
    dc = DrafterConfig.for_target(target.cfg, kind="markov", layout="deepspec", num_proposals=3, num_layers=1,
                                  target_layer_ids=(0, 2), markov_rank=8)
    cfg = TrainConfig(drafter=DrafterSpec(kind="markov"), num_anchors=4, lr=3e-2, steps=60, warmup_ratio=0.05,
                      loss=LossConfig(ce_weight=1.0, l1_weight=0.0))
    sc = step_config(cfg, target.cfg, dc)
    opt = make_optimizer(cfg, cfg.steps)
    state = init_state(init_drafter_params(sc.drafter, jax.random.key(1)), opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    rng = np.random.default_rng(8)
    losses = []
    for _ in range(cfg.steps):  # x_{t+1} = x_t + 1: predictable from the anchor alone
        ids = ((rng.integers(3, 90, (4, 1)) + np.arange(16)[None]) % 97).astype(np.int32)
        batch = {"input_ids": jnp.asarray(ids), "loss_mask": jnp.ones_like(jnp.asarray(ids))}
        state, m = step(sc, opt, state, target.params, batch)
        losses.append(float(m["loss"]))
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])


def test_dvd_verification_on_gemma_equals_sequential_forwards(gemma):
    """DVD's parallel verification (all blocks at once against the recorded sequence's K/V) applies
    each sliding layer's window: equal to one cache-free forward per block."""
    import jax

    from carryover_jax.config import DrafterConfig, LossConfig, TrainConfig
    from carryover_jax.train import anchors as A
    from carryover_jax.train import dvd
    from carryover_jax.train.step import step_config

    target = load_target(gemma[0], tokenizer=False)
    layers = (-1, 0, 2, 3)
    dc = DrafterConfig.for_target(target.cfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                  target_layer_ids=layers)
    sc = step_config(TrainConfig(loss=LossConfig(mode="dvd"), num_anchors=4), target.cfg, dc)
    rng = np.random.default_rng(9)
    ids = jnp.asarray(_ids(rng, 2, 20))
    lm = jnp.ones_like(ids)
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(3), lm, 4)
    props = jnp.asarray(_ids(rng, 2, 4 * 3).reshape(2, 4, 3))
    feats = np.asarray(jax.jit(dvd.verify_blocks, static_argnums=0)(sc, target.params, ids, anchors, keep, props))
    checked = 0
    for i in range(2):
        for n in range(4):
            if not keep[i, n]:
                continue
            s_n = int(anchors[i, n])
            seq = np.concatenate([np.asarray(ids[i, :s_n + 1]), np.asarray(props[i, n])])
            seq = np.pad(seq, (0, 24 - len(seq)), constant_values=5)[None]  # causal: the padding is unseen
            _, _, taps = jit_apply(target.model)({"params": target.params}, jnp.asarray(seq), tap_layers=layers)
            ref = np.concatenate([np.asarray(t) for t in taps], -1)[0, s_n + 1:s_n + 4]  # the P proposals' rows
            np.testing.assert_allclose(feats[i, n], ref, atol=ATOL, rtol=1e-4)
            checked += s_n + 4 > WINDOW  # blocks whose queries reach past the window
    assert checked >= 3


@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_gemma4_drafter_deepspec_export_round_trip(gemma4, tmp_path, kind):
    """DeepSpec's Gemma4DSparkModel layout: the target's text config with full-attention layers; the
    import rebuilds the same drafter (config and every tensor, e_rej included)."""
    import json

    import jax

    from carryover_jax.config import DrafterConfig
    from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
    from carryover_jax.weights.drafter_formats import export_drafter, load_drafter

    target = load_target(gemma4[0], tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec", num_proposals=4, num_layers=2,
                                   target_layer_ids=(0, 2), markov_rank=8 if kind == "markov" else None)
    params = init_drafter_params(cfg, jax.random.key(3))
    params["e_rej"] = params["e_rej"] + 0.5
    out = export_drafter(cfg, params, tmp_path / "d", "deepspec", frozen=frozen_from_target(target.params, target.cfg),
                         dtype=None)
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["Gemma4DSparkModel"] and hf["layer_types"] == ["full_attention"] * 2
    assert (hf["global_head_dim"], hf["num_global_key_value_heads"], hf["attention_k_eq_v"]) == (32, 1, True)
    assert hf["rope_parameters"]["full_attention"]["rope_type"] == "proportional" and hf["mask_token_id"] == 4
    cfg2, params2 = load_drafter(out)
    assert cfg2 == cfg
    flat = jax.tree_util.tree_leaves_with_path(params)
    flat2 = dict(jax.tree_util.tree_leaves_with_path(params2))
    assert len(flat) == len(flat2)
    for path, leaf in flat:
        np.testing.assert_array_equal(np.asarray(flat2[path]), np.asarray(leaf))
    with pytest.raises(ConfigError, match="z-lab format holds Qwen3-style drafters"):
        export_drafter(cfg.replace(kind="dflash", layout="zlab", markov_rank=0), params, tmp_path / "z", "zlab")


def _deepspec_gemma4_reference(folder, tokens, positions, features, feature_positions):
    """A PyTorch forward of an exported Gemma4DSparkModel folder, written from DeepSpec's
    `deepspec/modeling/dspark/gemma4/modeling.py` on transformers' own Gemma 4 building blocks
    (scaled embedding, Gemma4RMSNorm, Gemma4TextMLP, the full-attention rotary embedding):
    context C = hidden_norm(fc(features)); each layer: q = q_norm(q_proj(x)), k = k_norm(k_proj([C; x])),
    v = v_norm(k_proj or v_proj([C; x])), RoPE at [context positions; block positions], attention scale 1,
    non-causal over [C; block]; sandwich norms; x layer_scalar; logits = cap * tanh(lm_head(norm(h)) / cap)."""
    import json

    from safetensors.torch import load_file
    from transformers.models.gemma4 import modeling_gemma4 as G

    hf = json.loads((folder / "config.json").read_text())
    cfg = transformers.Gemma4TextConfig(**{k: v for k, v in hf.items() if k != "architectures"})
    w = load_file(str(folder / "model.safetensors"))
    d, eps = cfg.hidden_size, cfg.rms_norm_eps

    def norm(x, name=None):
        n = G.Gemma4RMSNorm(x.shape[-1], eps=eps, with_scale=name is not None)
        if name is not None:
            n.weight.data.copy_(w[name])
        return n(x)

    def lin(x, name):
        return x @ w[name].T

    rope = G.Gemma4TextRotaryEmbedding(cfg)
    hd, nh = hf["global_head_dim"], cfg.num_attention_heads
    nkv = hf["num_global_key_value_heads"] if cfg.attention_k_eq_v else cfg.num_key_value_heads
    with torch.no_grad():
        x = torch.as_tensor(tokens)
        h = w["embed_tokens.weight"][x] * torch.tensor(d ** 0.5).to(w["embed_tokens.weight"].dtype)
        c = norm(lin(torch.as_tensor(features), "fc.weight"), "hidden_norm.weight")
        b, t, s = h.shape[0], h.shape[1], c.shape[1]
        pos = torch.cat([torch.as_tensor(feature_positions), torch.as_tensor(positions)], 1)
        cos, sin = rope(h, pos, "full_attention")
        for i in range(cfg.num_hidden_layers):
            p = f"layers.{i}."
            a = norm(h, p + "input_layernorm.weight")
            q = norm(lin(a, p + "self_attn.q_proj.weight").view(b, t, nh, hd), p + "self_attn.q_norm.weight")
            both = torch.cat([c, a], 1)
            k = lin(both, p + "self_attn.k_proj.weight")
            v = k if cfg.attention_k_eq_v else lin(both, p + "self_attn.v_proj.weight")
            k = norm(k.view(b, s + t, nkv, hd), p + "self_attn.k_norm.weight")
            v = norm(v.view(b, s + t, nkv, hd))
            q = G.apply_rotary_pos_emb(q.transpose(1, 2), cos[:, -t:], sin[:, -t:], unsqueeze_dim=1)
            k = G.apply_rotary_pos_emb(k.transpose(1, 2), cos, sin, unsqueeze_dim=1)
            v = v.transpose(1, 2)
            k, v = (z.repeat_interleave(nh // nkv, dim=1) for z in (k, v))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
            o = lin(o.transpose(1, 2).reshape(b, t, nh * hd), p + "self_attn.o_proj.weight")
            h = h + norm(o, p + "post_attention_layernorm.weight")
            mlp = G.Gemma4TextMLP(cfg, i)
            for n_ in ("gate_proj", "up_proj", "down_proj"):
                getattr(mlp, n_).weight.data.copy_(w[p + f"mlp.{n_}.weight"])
            h = h + norm(mlp(norm(h, p + "pre_feedforward_layernorm.weight")), p + "post_feedforward_layernorm.weight")
            h = h * w[p + "layer_scalar"]
        z = lin(norm(h, "norm.weight"), "lm_head.weight")
        cap = cfg.final_logit_softcapping
        return (cap * torch.tanh(z / cap)).numpy()


def test_gemma4_drafter_equals_a_deepspec_style_pytorch_forward(gemma4, tmp_path):
    """The JAX drafter forward on a Gemma 4 target == the exported DeepSpec checkpoint run by a PyTorch
    reference on transformers' Gemma 4 modules (scaled anchor/MASK embeddings, global geometry, K=V,
    v_norm, proportional RoPE, sandwich norms, layer scalar, soft-capped logits)."""
    import jax

    from carryover_jax.config import DrafterConfig
    from carryover_jax.models.drafter import Drafter, frozen_from_target, init_drafter_params
    from carryover_jax.weights.drafter_formats import export_drafter

    target = load_target(gemma4[0], tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="deepspec", num_proposals=4, num_layers=2,
                                   target_layer_ids=(0, 2), carryover=False)
    params = init_drafter_params(cfg, jax.random.key(5))
    rng = np.random.default_rng(10)  # norms start at 1 and the layer scalars at 1: perturb every leaf
    params = jax.tree_util.tree_map(lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32), params)
    frozen = frozen_from_target(target.params, target.cfg)
    out = export_drafter(cfg, params, tmp_path / "d", "deepspec", frozen=frozen, dtype=None)
    s, t = 6, cfg.block_size
    features = rng.standard_normal((1, s, cfg.feature_dim)).astype(np.float32)
    fpos = np.arange(s)[None].astype(np.int32)
    tokens = np.array([[17] + [cfg.mask_token_id] * (t - 1)], np.int32)
    pos = (s + np.arange(t))[None].astype(np.int32)
    ours = jit_apply(Drafter(cfg))({"params": params}, jnp.asarray(tokens), jnp.asarray(pos), frozen, jnp.asarray(features),
                              jnp.asarray(fpos), jnp.ones((1, t, s), bool))
    ref = _deepspec_gemma4_reference(out, tokens, pos, features, fpos)
    np.testing.assert_allclose(np.asarray(ours), ref, atol=ATOL, rtol=1e-4)
