"""The T = 1 losslessness check shared by the speculative-decoding tests: on a target with a tiny
vocabulary, the first three sampled tokens must follow the exact target distribution (enumerated with
cache-free forwards), by a chi-square test at a fixed seed."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import chisquare

from carryover_jax import load_target
from carryover_jax.decode.generate import speculative_generate
from tests.hf_models import tiny_hf_model
from tests.jitted import jit_apply

V = 8
PROMPT = [3, 5, 6, 1]


def tiny_sampling_target(folder):
    tiny = tiny_hf_model("llama", folder, seed=3, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return load_target(tiny.path, tokenizer=False)


def exact_three_tokens(target) -> np.ndarray:
    """p(x1, x2, x3 | PROMPT) for all V^3 continuations, index x1 V^2 + x2 V + x3."""
    seqs = np.array([PROMPT + list(c) for c in itertools.product(range(V), repeat=3)], np.int32)
    logp = jax.nn.log_softmax(jit_apply(target.model)({"params": target.params}, jnp.asarray(seqs))[0], -1)
    n0, r = len(PROMPT), np.arange(len(seqs))
    # float64 from here: chi-square's expected counts must sum to the observed ones within ~1e-8
    exact = np.exp(np.asarray(logp[:, n0 - 1][r, seqs[:, n0]] + logp[:, n0][r, seqs[:, n0 + 1]]
                              + logp[:, n0 + 1][r, seqs[:, n0 + 2]], np.float64))
    assert abs(exact.sum() - 1) < 1e-4
    return exact


def sampled_pvalue(target, drafter, n: int = 3000, **kw) -> tuple[float, dict]:
    """Speculative decoding at T = 1 of n copies of PROMPT -> (chi-square p-value against the exact
    distribution, run stats). Cells with small expectation are pooled so the approximation holds."""
    exact = exact_three_tokens(target)
    out, stats = speculative_generate(target, drafter, [PROMPT] * n, max_new_tokens=3, temperature=1.0,
                                      stop_token_ids=[], seed=11, **kw)
    idx = np.array([t.token_ids[0] * V * V + t.token_ids[1] * V + t.token_ids[2] for t in out])
    counts = np.bincount(idx, minlength=V ** 3)
    order = np.argsort(exact)
    small = order[np.cumsum(exact[order]) < 0.05]
    keep = np.setdiff1d(np.arange(V ** 3), small)
    obs = np.append(counts[keep], counts[small].sum())
    expected = n * np.append(exact[keep], exact[small].sum())
    return chisquare(obs, expected * obs.sum() / expected.sum()).pvalue, stats
