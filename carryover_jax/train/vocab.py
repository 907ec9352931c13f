"""The draft vocabulary (EAGLE-3): the K target tokens a drafter may propose, chosen as the most
frequent supervised tokens of the training responses.

A small head over K rows instead of the target's V makes each draft cheaper (on the default target
the 7-row head over 49,152 tokens is most of a draft step) and each training step's logits ~V/K x
cheaper. Verification is untouched, so decoding stays lossless; a round only loses the tokens the
drafter can no longer propose, which the coverage printed at build time measures.
"""

from __future__ import annotations

import numpy as np

from carryover_jax.errors import ConfigError


def token_counts(store, vocab_size: int) -> np.ndarray:
    """[V] how often each token is a supervised (loss-masked) token in the store (read a chunk at a time)."""
    counts = np.zeros(vocab_size, np.int64)
    for ids, mask in store.token_chunks():
        counts += np.bincount(ids[mask.astype(bool)], minlength=vocab_size)[:vocab_size]
    return counts


def draft_vocabulary(counts: np.ndarray, k: int, always: tuple[int, ...] = ()) -> tuple[tuple[int, ...], float]:
    """(the K most frequent ids, ties to the lower id, plus `always` (stop tokens), sorted; the share
    of supervised tokens they cover)."""
    v = counts.shape[0]
    if not 2 <= k <= v:
        raise ConfigError(f"draft_vocab_size must be in [2, {v}], got {k}")
    chosen = {int(i) for i in always}
    for i in np.lexsort((np.arange(v), -counts)):  # by count descending, then id
        if len(chosen) >= k:
            break
        chosen.add(int(i))
    vocab = tuple(sorted(chosen))
    return vocab, float(counts[list(vocab)].sum()) / max(int(counts.sum()), 1)
