"""The attention diagnostic (eval/attention.py, the paper's Figure 6) against the PyTorch reference drafter.

Every round of a greedy Carryover decode on the tiny Llama, at the engine's own carried count and at every
other count 0..P (the state's count replaced), the map of `round_attention` equals the reference's attention
probabilities (export/torch_reference.py) averaged over heads and layers and cropped to the context window, on
context features from a cache-free target forward of the committed tokens and carried features from one of the
committed prefix followed by the previous round's rejected drafts; the diagnostics pass tallies those maps by
carried count, reports them and draws attention.png.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from carryover_jax import load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.generate import MAX_STOP_IDS, generate, pad_batch
from carryover_jax.eval.attention import WINDOW, AttentionTally, panels, round_attention
from carryover_jax.export import torch_reference as ref
from carryover_jax.loading import DraftModel
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.models.target import TargetLM
from carryover_jax.weights.drafter_formats import export_drafter

P = 3


def _drafter(target):
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="zlab", num_proposals=P, num_layers=2,
                                   mask_token_id=4, target_layer_ids=(0, 1), carryover=True)
    params = init_drafter_params(cfg, jax.random.key(1))
    rng = np.random.default_rng(1)  # unit norms and a zero e_rej would hide mistakes
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32)
        if "norm" in jax.tree_util.keystr(path) else x, params)
    params["e_rej"] = rng.standard_normal(cfg.hidden_size).astype(np.float32)
    return DraftModel(cfg, params)


@functools.partial(jax.jit, static_argnums=0)
def _taps(cfg, params, ids):
    taps, _ = TargetLM(cfg).apply({"params": params}, ids, (0, 1), method=TargetLM.features)
    return jnp.concatenate(taps, axis=-1)


def _features(target, ids):
    """Cache-free target features [1, len(ids), m·d] (right-padded to one shape: causal, so the padding changes
    nothing before it)."""
    padded = jnp.asarray([list(ids) + [0] * (64 - len(ids))], jnp.int32)
    return torch.tensor(np.asarray(_taps(target.cfg, target.params, padded))[:, : len(ids)])


def _reference_map(target, weights, config, frozen, committed, anchor, previous, r, block):
    """The reference's attention of one round of one row: [T, WINDOW + P + T] and the whole context mass.
    `committed`: the tokens before the anchor; `previous`: the last round's verify chunk (the committed prefix
    and [anchor, d_1..d_P]) and its accepted count a — the engine's carried row j is that chunk's state at
    index min(a + 1 + j, P), the rows past the rejected count being masked — or None in the first round."""
    pos = len(committed)
    feats = _features(target, committed)
    carried = torch.zeros((1, P, feats.shape[-1]))
    if previous is not None:
        chunk, a = previous
        start = len(chunk) - P - 1  # the previous anchor's position
        carried[0] = _features(target, chunk)[0, [start + min(a + 1 + j, P) for j in range(P)]]
    probs = []
    ref.drafter_logits(weights, config, torch.tensor(np.asarray(frozen["embed"])),
                       torch.tensor(np.asarray(frozen["head"]).T), torch.tensor([[anchor] + [4] * (block - 1)]),
                       torch.arange(pos, pos + block)[None], ctx_features=feats, ctx_positions=torch.arange(pos)[None],
                       carried_features=carried, carried_positions=torch.arange(pos, pos + P)[None],
                       rejected_count=torch.tensor([r]), attn_probs=probs)
    m = torch.stack(probs).mean(dim=(0, 2))[0].numpy()  # over layers and heads: [T, pos + P + T]
    ctx = np.zeros((block, WINDOW))
    shown = m[:, max(0, pos - WINDOW): pos]
    ctx[:, WINDOW - shown.shape[1]:] = shown
    return np.concatenate([ctx, m[:, pos:]], axis=1), float(m[:, :pos].sum(axis=1).mean())


def test_round_attention_equals_the_pytorch_reference(tiny_llama, tmp_path):
    from carryover_jax.eval.diagnostics import _decode_with_log
    from carryover_jax.eval.run import DrafterEntry

    target = load_target(tiny_llama.path, tokenizer=False)
    drafter = _drafter(target)
    frozen = frozen_from_target(target.params, target.cfg)
    config, weights = ref.load_checkpoint(export_drafter(drafter.cfg, drafter.params, tmp_path / "x", "zlab",
                                                         frozen=frozen, dtype=None))
    tp, dp, block = target.params, drafter.params, drafter.cfg.block_size
    rng = np.random.default_rng(4)
    prompts = [rng.integers(5, 97, n).tolist() for n in (5, 21)]  # one context shorter than the window
    max_new = 9
    sc = sp.SpecConfig(target=target.cfg, drafter=drafter.cfg, attend_carried=True)
    s = sp.prefill(sc, tp, dp, jnp.asarray(pad_batch(prompts, 32)), jnp.asarray([5, 21], jnp.int32),
                   jnp.full((2,), max_new, jnp.int32), jnp.zeros((2,), jnp.float32),
                   jnp.full((MAX_STOP_IDS,), -1, jnp.int32), jax.random.key(0), max_len=64, out_size=16, max_rounds=16)
    tally = AttentionTally(P, block)
    previous = [None, None]  # per row: the last round's verify chunk and accepted count
    checked = set()
    while not bool(jnp.all(s.done)):
        maps, ctx = map(np.asarray, jax.device_get(round_attention(sc, tp, dp, s)))
        done, out, num_out, counts = jax.device_get((s.done, s.out, s.num_out, s.rejected_count))
        tally.add(maps, ctx, counts, ~done)
        # every other carried count on the same state (not in the first round: no verify has filled the buffer)
        rounds = np.asarray(jax.device_get(s.rounds))
        forced = np.where(rounds > 0, (rounds + np.arange(2)) % (P + 1), counts)
        fmaps, fctx = map(np.asarray, jax.device_get(round_attention(sc, tp, dp, s.replace(
            rejected_count=jnp.asarray(forced, jnp.int32)))))
        toks, q, s_next = sp.draft_step(sc, tp, dp, s)
        for i in np.nonzero(~done)[0]:
            committed = prompts[i] + out[i, : num_out[i] - 1].tolist()
            for r, got, got_ctx in ((int(counts[i]), maps[i], ctx[i]), (int(forced[i]), fmaps[i], fctx[i])):
                want, want_ctx = _reference_map(target, weights, config, frozen, committed, int(out[i, num_out[i] - 1]),
                                                previous[i], r, block)
                np.testing.assert_allclose(got, want, atol=2e-5)
                assert abs(got_ctx - want_ctx) < 2e-5
                checked.add(r)
        s = sp.verify_step(sc, tp, dp, s_next, toks, q)
        a = np.asarray(s.accepted)[np.arange(2), np.asarray(s.rounds) - 1]
        for i in np.nonzero(~done)[0]:
            previous[i] = (prompts[i] + out[i, : num_out[i]].tolist() + np.asarray(toks)[i].tolist(), int(a[i]))
    assert checked == set(range(P + 1))
    # the diagnostics pass tallies the same decode's maps by carried count
    ref_ids = [g.token_ids for g in generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[])]
    other = AttentionTally(P, block)
    _decode_with_log(target, DrafterEntry("c", "-", True), drafter, prompts, ref_ids, max_new_tokens=max_new,
                     max_len=64, stop_ids=[], replay=False, attention=other)
    np.testing.assert_allclose(other.sums, tally.sums, atol=1e-6)
    assert (other.rounds == tally.rounds).all() and other.rounds.sum() > 0
    rep = other.report(True)
    assert sum(c["rounds"] for c in rep["by_carried"]) == other.rounds.sum()
    rows = panels({"base": AttentionTally(P, block).report(False), "c": rep})
    titles = [t for t, _, _ in rows[0][1]]
    assert titles == ["baseline (base), all rounds", "c, 1-2 carried rows", "c, 3-3 carried rows"]
    assert rows[0][1][2][2] == int(other.rounds[3])
