"""Synthetic training data shared by the loop and multi-host tests."""

import numpy as np

from carryover_jax.train.store import ResponseStore


def synthetic_store(path, n: int = 24, seed: int = 0, vocab: int = 97):
    """n records of 12-29 random tokens whose loss mask starts after 2-5 prompt tokens."""
    rng = np.random.default_rng(seed)
    st = ResponseStore.create_or_open(path, meta={"test": "synthetic"})
    recs = []
    for i in range(n):
        length = int(rng.integers(12, 30))
        ids = rng.integers(5, vocab, length).astype(np.int32)
        mask = np.zeros(length, np.uint8)
        mask[int(rng.integers(2, 6)):] = 1
        recs.append({"id": f"r{i}", "input_ids": ids, "loss_mask": mask})
    st.append(recs)
    st.commit()
    return path
