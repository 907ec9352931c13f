"""Drafters: PyTorch-reference parity of exports, Carryover invariants, Markov head, context cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from carryover_jax import CheckpointError, ConfigError
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.drafting import (
    append_rows, block_tokens, draft_block_logits, fuse_rows, new_context_cache, sequential_proposals,
    teacher_forced_logits,
)
from carryover_jax.models.drafter import Drafter
from carryover_jax.weights.drafter_formats import export_drafter, load_drafter, save_drafter
from carryover_jax.export import torch_reference as ref
from tests.drafter_fixtures import TINY_TARGET, VARIANTS, tiny_drafter, tiny_frozen
from tests.jitted import jit_apply

B, S = 2, 9


def append_context(cfg, params, cache, features, count):
    """Committed target features into the drafter cache, as the engine does it (prefill, verify_step)."""
    return append_rows(cfg, params, cache, fuse_rows(cfg, params, features), count)


def _inputs(cfg, seed=0):
    rng = np.random.default_rng(seed)
    p, t = cfg.num_proposals, cfg.block_size
    feats = rng.standard_normal((B, S, cfg.feature_dim)).astype(np.float32)
    ctx_len = np.array([S, 6])  # row 1 sees fewer context rows
    anchor_pos = ctx_len
    anchor = rng.integers(6, 97, size=B).astype(np.int32)
    carried = rng.standard_normal((B, p, cfg.feature_dim)).astype(np.float32)
    count = np.array([p - 1, 2])
    return dict(feats=feats, ctx_len=ctx_len, anchor=anchor, anchor_pos=anchor_pos, carried=carried, count=count,
                positions=anchor_pos[:, None] + np.arange(t)[None], tokens=np.asarray(block_tokens(cfg, jnp.asarray(anchor))),
                cpos=anchor_pos[:, None] + np.arange(p)[None])


def _jax_logits(cfg, params, frozen, x, with_carried):
    t, p = cfg.block_size, cfg.num_proposals
    fmask = np.broadcast_to((np.arange(S)[None] < x["ctx_len"][:, None])[:, None], (B, t, S))
    kw = {}
    if with_carried:
        kw = dict(carried=jnp.asarray(x["carried"]), carried_positions=jnp.asarray(x["cpos"]),
                  carried_valid=jnp.asarray(np.arange(p)[None] < x["count"][:, None]))
    return np.asarray(jit_apply(Drafter(cfg))(
        {"params": params}, jnp.asarray(x["tokens"]), jnp.asarray(x["positions"]), frozen, jnp.asarray(x["feats"]),
        jnp.broadcast_to(jnp.arange(S)[None], (B, S)), jnp.asarray(fmask), **kw))


def _torch_logits(folder, frozen, x, with_carried):
    config, weights = ref.load_checkpoint(folder)
    kw = {}
    if with_carried:
        kw = dict(carried_features=torch.tensor(x["carried"]), carried_positions=torch.tensor(x["cpos"]),
                  rejected_count=torch.tensor(x["count"]))
    return ref.drafter_logits(
        weights, config, torch.tensor(np.asarray(frozen["embed"])), torch.tensor(np.asarray(frozen["head"]).T),
        torch.tensor(x["tokens"]).long(), torch.tensor(x["positions"]).long(),
        ctx_features=torch.tensor(x["feats"]), ctx_positions=torch.arange(S)[None].expand(B, S),
        ctx_valid=torch.tensor(np.arange(S)[None] < x["ctx_len"][:, None]), **kw,
    ).numpy(), weights


@pytest.mark.parametrize("variant", ["dflash-zlab", "dflash-deepspec", "markov-deepspec"])
@pytest.mark.parametrize("with_carried", [False, True])
def test_export_reproduces_logits_in_pytorch_reference(variant, with_carried, tmp_path):
    kind, layout = VARIANTS[variant]
    cfg, params = tiny_drafter(kind, layout)
    frozen = tiny_frozen()
    folder = export_drafter(cfg, params, tmp_path / "export", layout, frozen=frozen, dtype=None)
    x = _inputs(cfg)
    ours = _jax_logits(cfg, params, frozen, x, with_carried)
    theirs, weights = _torch_logits(folder, frozen, x, with_carried)
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
    if kind == "markov":
        # sequential Markov decoding (greedy) agrees token for token and in corrected logits
        toks, _, corrected = sequential_proposals(cfg, params, jnp.asarray(ours), jnp.asarray(x["anchor"]),
                                                  jax.random.key(0), jnp.zeros((B,)))
        rt, rc = ref.markov_sequential(weights, torch.tensor(ours), torch.tensor(x["anchor"]).long())
        np.testing.assert_array_equal(np.asarray(toks), rt.numpy())
        np.testing.assert_allclose(np.asarray(corrected), rc.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["native", "zlab", "deepspec"])
def test_import_of_export_is_identity(fmt, tmp_path):
    kind, layout = {"native": ("markov", "zlab"), "zlab": ("dflash", "zlab"), "deepspec": ("markov", "deepspec")}[fmt]
    cfg, params = tiny_drafter(kind, layout)
    if fmt == "native":
        folder = save_drafter(cfg, params, tmp_path / "d")
    else:
        folder = export_drafter(cfg, params, tmp_path / "d", fmt, frozen=tiny_frozen(), dtype=None)
    cfg2, params2 = load_drafter(folder)
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)


def test_pretrained_without_carryover_starts_e_rej_at_zero(tmp_path):
    cfg, params = tiny_drafter("dflash", "zlab", carryover=False)
    folder = export_drafter(cfg, params, tmp_path / "d", "zlab", dtype=None)
    cfg2, params2 = load_drafter(folder, carryover=True)
    assert cfg2.carryover and not np.any(np.asarray(params2["e_rej"]))
    cfg3, params3 = load_drafter(folder)
    assert not cfg3.carryover and "e_rej" not in params3


def _decode_setup(cfg, params, frozen, x):
    cache = new_context_cache(cfg, B, 32)
    return append_context(cfg, params, cache, jnp.asarray(x["feats"]), jnp.asarray(x["ctx_len"]))


@pytest.mark.parametrize("variant", ["dflash-zlab", "markov-deepspec"])
def test_carryover_off_or_zero_count_is_the_baseline_exactly(variant):
    cfg, params = tiny_drafter(*VARIANTS[variant])
    frozen = tiny_frozen()
    x = _inputs(cfg)
    cache = _decode_setup(cfg, params, frozen, x)
    anchor = jnp.asarray(x["anchor"])
    base = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor))
    zero = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor, jnp.asarray(x["carried"]),
                                         jnp.zeros((B,), jnp.int32)))
    np.testing.assert_array_equal(base, zero)
    # a drafter built without Carryover (no e_rej at all) gives the same baseline
    cfg_off = cfg.replace(carryover=False)
    params_off = {k: v for k, v in params.items() if k != "e_rej"}
    np.testing.assert_array_equal(base, np.asarray(draft_block_logits(cfg_off, params_off, frozen, cache, anchor)))


def test_masked_carried_rows_are_ignored_and_valid_ones_matter():
    cfg, params = tiny_drafter("dflash", "zlab")
    frozen = tiny_frozen()
    x = _inputs(cfg)
    cache = _decode_setup(cfg, params, frozen, x)
    anchor, count = jnp.asarray(x["anchor"]), jnp.asarray(x["count"])
    carried = np.array(x["carried"])
    a = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor, jnp.asarray(carried), count))
    garbage = carried.copy()
    for b in range(B):
        garbage[b, x["count"][b]:] = 1e4 * np.random.default_rng(b).standard_normal(garbage[b, x["count"][b]:].shape)
    g = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor, jnp.asarray(garbage), count))
    np.testing.assert_array_equal(a, g)
    base = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor))
    assert np.max(np.abs(a - base)) > 1e-3
    # with e_rej = 0 the carried rows still change the drafter's output
    p0 = dict(params, e_rej=jnp.zeros_like(params["e_rej"]))
    z = np.asarray(draft_block_logits(cfg, p0, frozen, cache, anchor, jnp.asarray(carried), count))
    assert np.max(np.abs(z - base)) > 1e-3 and np.max(np.abs(z - a)) > 1e-4


@pytest.mark.parametrize("variant", ["markov-deepspec", "markov-zlab"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_markov_teacher_forced_equals_sequential(variant, temperature):
    cfg, params = tiny_drafter(*VARIANTS[variant])
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.standard_normal((B, cfg.num_proposals, TINY_TARGET.vocab_size)), jnp.float32)
    anchor = jnp.asarray([7, 9], jnp.int32)
    toks, q, corrected = sequential_proposals(cfg, params, logits, anchor, jax.random.key(1),
                                              jnp.full((B,), temperature))
    tf = teacher_forced_logits(cfg, params, logits, anchor, toks)
    np.testing.assert_allclose(np.asarray(tf), np.asarray(corrected), atol=1e-6)
    # q is the tempered distribution of the corrected logits (one-hot at T = 0)
    if temperature == 0:
        np.testing.assert_array_equal(np.asarray(toks), np.asarray(jnp.argmax(tf, -1)))
        np.testing.assert_array_equal(np.asarray(q).max(-1), 1.0)
    else:
        np.testing.assert_allclose(np.asarray(q), np.asarray(jax.nn.softmax(tf, -1)), atol=1e-6)


def test_context_cache_over_rounds_equals_one_full_forward():
    cfg, params = tiny_drafter("markov", "deepspec")
    frozen = tiny_frozen()
    rng = np.random.default_rng(5)
    total = 20
    feats = rng.standard_normal((B, total, cfg.feature_dim)).astype(np.float32)
    # prompt rows (bucket 8, lengths 5 and 8), then rounds committing a+1 rows of a P+1 chunk
    cache = new_context_cache(cfg, B, 48)
    lens = np.array([5, 8])
    chunk = np.zeros((B, 8, cfg.feature_dim), np.float32)
    for b in range(B):
        chunk[b, :lens[b]] = feats[b, :lens[b]]
    cache = append_context(cfg, params, cache, jnp.asarray(chunk), jnp.asarray(lens))
    width = cfg.num_proposals + 1
    for counts in ([3, 1], [6, 2], [1, 4]):
        chunk = rng.standard_normal((B, width, cfg.feature_dim)).astype(np.float32)  # garbage past count
        for b in range(B):
            chunk[b, :counts[b]] = feats[b, lens[b]:lens[b] + counts[b]]
        cache = append_context(cfg, params, cache, jnp.asarray(chunk), jnp.asarray(counts))
        lens = lens + np.asarray(counts)
    assert np.asarray(cache.lengths).tolist() == lens.tolist()
    anchor = jnp.asarray([11, 12], jnp.int32)
    got = np.asarray(draft_block_logits(cfg, params, frozen, cache, anchor))
    t = cfg.block_size
    fmask = np.broadcast_to((np.arange(total)[None] < lens[:, None])[:, None], (B, t, total))
    full = jit_apply(Drafter(cfg))({"params": params}, block_tokens(cfg, anchor), jnp.asarray(lens[:, None] + np.arange(t)),
                                   frozen, jnp.asarray(feats), jnp.broadcast_to(jnp.arange(total)[None], (B, total)),
                                   jnp.asarray(fmask))
    np.testing.assert_allclose(got, np.asarray(full), atol=1e-5, rtol=1e-5)


def test_bad_input_errors(tmp_path):
    cfg, params = tiny_drafter("dflash", "zlab")
    frozen = tiny_frozen()
    cache = new_context_cache(cfg, 1, 16)
    with pytest.raises(ConfigError, match="features have width 10, the drafter expects 192"):
        append_context(cfg, params, cache, jnp.zeros((1, 4, 10)), jnp.asarray([4]))
    with pytest.raises(ConfigError, match="final layer"):
        DrafterConfig.for_target(TINY_TARGET, mask_token_id=5, target_layer_ids=(1, 5))
    with pytest.raises(ConfigError, match="out of range"):
        DrafterConfig.for_target(TINY_TARGET, mask_token_id=5, target_layer_ids=(1, 9))
    with pytest.raises(ConfigError, match=r"target_layer_ids must hold integers in \[-1, "):
        DrafterConfig.for_target(TINY_TARGET, mask_token_id=5, target_layer_ids=(-2, 1))
    with pytest.raises(ConfigError, match="strictly increasing"):
        DrafterConfig.for_target(TINY_TARGET, mask_token_id=5, target_layer_ids=(3, 1))
    m_cfg, m_params = tiny_drafter("markov", "deepspec")
    with pytest.raises(ConfigError, match="z-lab format holds DFlash"):
        export_drafter(m_cfg, m_params, tmp_path / "x", "zlab", frozen=frozen)
    folder = export_drafter(cfg, params, tmp_path / "z", "zlab", dtype=None)
    with pytest.raises(CheckpointError, match="zlab layout .* not deepspec"):
        load_drafter(folder, layout="deepspec")
    with pytest.raises(CheckpointError, match="zlab format, not deepspec"):
        load_drafter(folder, fmt="deepspec")
    assert not (tmp_path / "x").exists()  # a refused export leaves nothing behind


@pytest.mark.parametrize("variant", ["markov-deepspec", "dflash-zlab"])
def test_greedy_fast_path_equals_temperature_zero(variant):
    cfg, params = tiny_drafter(*VARIANTS[variant])
    logits = jnp.asarray(np.random.default_rng(4).standard_normal((B, cfg.num_proposals, TINY_TARGET.vocab_size)),
                         jnp.float32)
    anchor = jnp.asarray([3, 8], jnp.int32)
    slow = sequential_proposals(cfg, params, logits, anchor, jax.random.key(0), jnp.zeros((B,)))
    fast = sequential_proposals(cfg, params, logits, anchor, jax.random.key(0), jnp.zeros((B,)), sampling=False)
    np.testing.assert_array_equal(np.asarray(slow[0]), np.asarray(fast[0]))
    np.testing.assert_allclose(np.asarray(slow[2]), np.asarray(fast[2]), atol=1e-6)
    assert fast[1] is None


def test_blockwise_block_attention_equals_the_dense_block_mask():
    """Training's block-diagonal segment (an int group size) == a dense [T, T] block-diagonal mask."""
    cfg, params = tiny_drafter("markov", "deepspec")
    frozen = tiny_frozen()
    rng = np.random.default_rng(7)
    n, t = 3, cfg.block_size
    tokens = jnp.asarray(rng.integers(5, 97, (B, n * t)), jnp.int32)
    positions = jnp.asarray(rng.integers(0, 30, (B, n * t)), jnp.int32)
    feats = jnp.asarray(rng.standard_normal((B, S, cfg.feature_dim)), jnp.float32)
    fmask = jnp.asarray(rng.random((B, n * t, S)) < 0.6)
    dense = np.kron(np.eye(n, dtype=bool), np.ones((t, t), bool))[None].repeat(B, 0)
    args = (tokens, positions, frozen, feats, jnp.broadcast_to(jnp.arange(S)[None], (B, S)), fmask)
    a = jit_apply(Drafter(cfg))({"params": params}, *args, block_mask=jnp.asarray(dense))
    b = jit_apply(Drafter(cfg), ("method", "block_mask"))({"params": params}, *args, block_mask=t)  # t: static
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
