"""bf16 safetensors checkpoints, as HF ships Qwen3 and Gemma: tiny Qwen3 (tied head) and Gemma 3 models
written by transformers in bfloat16. Loaded in float32 they equal HF's float32 forward of the same (bf16)
weights; loaded in bf16 (params, activations, caches; float32 LM heads) greedy decoding follows float32 for
the first tokens, and greedy speculative decoding equals AR decoding for every drafter variant."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from carryover_jax import generate, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.numerics import Numerics
from tests.hf_models import hf_forward, tiny_hf_config
from tests.jitted import jit_apply

# a bf16 body rounds its hidden states (and verification's P+1 rows round unlike AR's 1 row), which can
# split a near-tie of the target's logits: where two greedy sequences differ, the first differing tokens
# must be such a tie, i.e. their float32-reference logits differ by less than this. (These random tiny
# models have flat distributions: Gemma 3's soft-capped logits here span ~0.4, its top 3 within 0.003.)
TIE_MARGIN = 0.05
MAX_NEW = [12, 5, 16]


def _gemma3_config():
    return transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, sliding_window=5, tie_word_embeddings=True, attn_implementation="eager",
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=24,
        final_logit_softcapping=5.0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})


@pytest.fixture(scope="module", params=["qwen3", pytest.param("gemma3", marks=pytest.mark.heavy)])
def bf16_ckpt(request, tmp_path_factory):
    """(folder, HF float32 model holding exactly the bf16 checkpoint's values)."""
    torch.manual_seed(0)
    if request.param == "qwen3":
        model = transformers.Qwen3ForCausalLM(tiny_hf_config("qwen3"))
    else:
        model = transformers.Gemma3ForCausalLM(_gemma3_config())
    model = model.float().eval()
    with torch.no_grad():  # norms start at 0/1: perturb them so a mishandled norm weight shows up
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    path = tmp_path_factory.mktemp(f"bf16_{request.param}")
    model.to(torch.bfloat16).save_pretrained(path)
    # the reference: transformers reading that checkpoint into float32 (RoPE tables computed afresh in
    # float32, as when HF loads a bf16 release; the bf16-cast model's own buffers are rounded)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return path, ref.eval()


def test_the_checkpoint_is_bf16_on_disk(bf16_ckpt):
    path, _ = bf16_ckpt
    with safe_open(path / "model.safetensors", "numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_float32_compute_equals_hf_float32(bf16_ckpt):
    path, hf = bf16_ckpt
    target = load_target(path, tokenizer=False)  # this CPU's default: float32
    assert target.cfg.numerics == Numerics.for_platform("cpu")
    assert {x.dtype for x in jax.tree_util.tree_leaves(target.params)} == {jnp.dtype(jnp.float32)}
    ids = np.random.default_rng(0).integers(3, 97, size=(2, 11)).astype(np.int32)
    want, _ = hf_forward(hf, ids.astype(np.int64))
    got = np.asarray(jit_apply(target.model)({"params": target.params}, jnp.asarray(ids))[0])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_bf16_compute_keeps_the_checkpoint_and_follows_float32(bf16_ckpt):
    path, _ = bf16_ckpt
    f32 = load_target(path, tokenizer=False)
    bf = load_target(path, tokenizer=False, dtype="bfloat16")
    assert (bf.cfg.param_dtype, bf.cfg.dtype, bf.cfg.cache_dtype) == ("bfloat16", "bfloat16", "bfloat16")  # CPU: kept as bits
    # the bf16 params are the file's values bit for bit (no round trip through another dtype)
    for a, b in zip(jax.tree_util.tree_leaves(bf.params), jax.tree_util.tree_leaves(f32.params)):
        assert a.dtype == jnp.bfloat16 and np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b))
    logits = jit_apply(bf.model)({"params": bf.params}, jnp.ones((1, 4), jnp.int32))[0]
    assert logits.dtype == jnp.float32
    prompts = _prompts()
    want = generate(f32, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    got = generate(bf, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    # bf16 follows float32 until a near-tie splits them (a split elsewhere fails); after a split the
    # sequences are different continuations, so the shared prefix is bounded below only loosely
    matched = sum(_matched_until_a_tie(f32, p, w.token_ids, g.token_ids) for p, w, g in zip(prompts, want, got))
    assert matched >= sum(MAX_NEW) / 3, matched


def _matched_until_a_tie(f32, prompt, a, b) -> int:
    """Tokens two greedy sequences share before they first differ; where they do, the differing tokens'
    float32 logits (`f32`, the same weights) must be within TIE_MARGIN."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        assert a == b
        return len(a)
    logits = np.asarray(jit_apply(f32.model)({"params": f32.params}, jnp.asarray([prompt + a[:i]]))[0][0, -1])
    margin = abs(float(logits[a[i]] - logits[b[i]]))
    assert margin < TIE_MARGIN, f"token {i} differs ({a[i]} vs {b[i]}) by a float32 logit margin of {margin:.4f}"
    return i


def _prompts(seed=0, lens=(4, 13, 7)):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


# name -> DrafterConfig.for_target kwargs, speculative carryover. With tests/test_bf16_decode.py (an untied
# Llama: dflash/zlab and markov/deepspec with Carryover, dflash/deepspec without) every variant runs in bf16
# against float32 target heads; here the tied heads (Qwen3, Gemma 3), where AR's 1-row and verification's
# multi-row head take different forms on CPU (`Numerics.lm_head`)
VARIANTS = {
    "dflash-zlab": (dict(kind="dflash", layout="zlab"), True),
    "markov-deepspec": (dict(kind="markov", layout="deepspec", markov_rank=8), True),
    "markov-zlab": (dict(kind="markov", layout="zlab", markov_rank=8), True),
    "dflash-draft-vocab": (dict(kind="dflash", layout="zlab", draft_vocab=tuple(range(3, 60))), True),
}


@pytest.mark.parametrize("variant", [v if i == 0 else pytest.param(v, marks=pytest.mark.heavy)
                                     for i, v in enumerate(VARIANTS)])
def test_bf16_greedy_speculative_equals_bf16_ar(bf16_ckpt, variant):
    """Drafter variants, bf16 target and drafter compute (float32 drafter params), float32 heads: greedy
    speculative decoding emits AR's tokens; a difference is allowed only at a near-tie (TIE_MARGIN). (~50 s
    each on the shared 2-core machine at load ~10, most of it compiling the decode loop.)"""
    path, _ = bf16_ckpt
    if path.name.startswith("bf16_gemma3") and variant != "markov-deepspec":
        pytest.skip("Gemma 3: one variant (the draft layers are shared; the Qwen3 target runs them all)")
    target = load_target(path, tokenizer=False, dtype="bfloat16")
    kw, carryover = VARIANTS[variant]
    cfg = DrafterConfig.for_target(target.cfg, num_proposals=4, num_layers=1, mask_token_id=4,
                                   target_layer_ids=(0, 1), **kw)
    assert cfg.backbone.dtype == "bfloat16" and cfg.backbone.param_dtype == "float32"
    drafter = (cfg, init_drafter_params(cfg, jax.random.key(0)))
    prompts = _prompts()
    ref = generate(target, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[],
                                      carryover=carryover)
    assert stats["rounds"] > 0
    if [r.token_ids for r in out] == [r.token_ids for r in ref]:
        return
    f32 = load_target(path, tokenizer=False)  # the float32 reference of the same (bf16) weights
    matched = sum(_matched_until_a_tie(f32, p, r.token_ids, o.token_ids) for p, r, o in zip(prompts, ref, out))
    assert matched >= 0.5 * sum(MAX_NEW), matched
