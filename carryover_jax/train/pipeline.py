"""grain input pipeline over a response store: fixed-length examples, shuffled per epoch, host-sharded,
batched, with a checkpointable iterator state.

Every step of the pipeline is index based (source -> shuffle -> slice -> repeat), so the iterator
state is a position and `get_state()/set_state()` resume exactly; the trainer saves it through
`grain.checkpoint.CheckpointSave`.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

from carryover_jax.config import DataConfig
from carryover_jax.errors import CarryoverError
from carryover_jax.train.store import ResponseStore, StoreView


class StoreSource:
    """A grain `RandomAccessDataSource` over the committed records of a store (a `StoreView`: every
    shard, in plan order; or one `ResponseStore`, in stored order) that have at least
    `min_loss_tokens` masked tokens within their first `max_len` tokens.

    Records that truncation leaves with too few loss tokens are removed here, from the loss masks
    alone, rather than with a `.filter` on loaded examples: no features are read for nothing, and every
    host sees the same record count (a per-host filter could give hosts different numbers of batches).
    """

    def __init__(self, store: StoreView | ResponseStore, *, max_len: int, min_loss_tokens: int,
                 with_features: bool = False, kv_dtype: str | None = None, multiple_of: int = 1):
        if with_features and store.feature_dim is None:
            raise CarryoverError(
                f"{store.path}: this response store has no target features (prepare it with store_features)"
            )
        if kv_dtype and store.kv_dtype != kv_dtype:
            held = f"holds {store.kv_dtype} K/V" if store.kv_dtype else "holds no target K/V"
            raise CarryoverError(f"{store.path}: this response store {held}, data.store_kv asks for {kv_dtype} "
                                 f"(prepare a store with data.store_kv={kv_dtype}, or unset data.store_kv to compute "
                                 "them)")
        self.store, self.max_len, self.with_features, self.with_kv = store, max_len, with_features, bool(kv_dtype)
        keep = np.flatnonzero(store.loss_counts(max_len) >= max(min_loss_tokens, 1))
        # Equal-length host shards: drop the last (len % multiple_of) records.
        self.indices = keep[: len(keep) - len(keep) % multiple_of]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, Any]:
        rec = self.store.get(int(self.indices[index]), max_len=self.max_len, features=self.with_features,
                             kv=self.with_kv)
        n, S = len(rec["input_ids"]), self.max_len
        out = {
            "input_ids": np.zeros(S, np.int32),
            "loss_mask": np.zeros(S, np.int32),  # right padding is never a label
            "length": np.int32(n),
        }
        out["input_ids"][:n] = rec["input_ids"]
        out["loss_mask"][:n] = rec["loss_mask"]
        for name in ("features", "last_hidden", "target_lse", "kv"):
            if name in rec:  # zero rows past the record: never a key (DVD's prefix ends at an anchor inside it)
                x = np.zeros((S, rec[name].shape[1]), rec[name].dtype)
                x[:n] = rec[name]
                out[name] = x
        return out

    def __repr__(self) -> str:  # grain uses it to identify the source in checkpoints
        return (f"StoreSource(path={str(self.store.path)!r}, records={len(self)}, max_len={self.max_len}, "
                f"features={self.with_features}{', kv=True' if self.with_kv else ''})")


class HostBlocks(grain.MapDataset):
    """Host p's share of every global batch: the contiguous rows p*b .. p*b+b-1 of each block of
    B = b * process_count consecutive (shuffled) records. `make_array_from_process_local_data` then
    stacks the hosts' rows in the same order one process would read them, so the global batch — and
    every per-row random draw of the step (anchors) — is identical for any number of processes."""

    def __init__(self, parent: grain.MapDataset, local_batch: int, process_index: int, process_count: int):
        super().__init__(parent)
        self._b, self._p, self._B = local_batch, process_index, local_batch * process_count

    def __len__(self) -> int:
        return (len(self._parent) // self._B) * self._b

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[(index // self._b) * self._B + self._p * self._b + index % self._b]

    def __str__(self) -> str:
        return f"HostBlocks(local_batch={self._b}, process={self._p}, global_batch={self._B})"


def make_train_iter(
    cfg: DataConfig,
    store: StoreView | ResponseStore,
    *,
    batch_size: int,
    seed: int,
    num_epochs: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    with_features: bool = False,
    with_kv: bool = False,
    read_threads: int = 4,
) -> grain.DatasetIterator:
    """Batches of {"input_ids" int32[B, S], "loss_mask" int32[B, S], "length" int32[B]} (+ "features"
    bf16[B, S, F], "last_hidden" bf16[B, S, d] and, where the store holds it, "target_lse" float32[B, S, 1] with
    `with_features`, + "kv" [B, S, W] in the store's K/V
    dtype, which must be `cfg.store_kv`, with `with_kv`), S = cfg.max_len.

    Every host shuffles the same permutation (same seed; reshuffled each epoch by grain) and takes its
    contiguous share of each global batch (`HostBlocks`), so hosts never share a record and the global
    batch equals the single-process one.
    `num_epochs=None` repeats forever. `batch_size` is per host."""
    if not 0 <= process_index < process_count:
        raise CarryoverError(f"process_index {process_index} outside [0, {process_count})")
    src = StoreSource(store, max_len=cfg.max_len, min_loss_tokens=cfg.min_loss_tokens,
                      with_features=with_features, kv_dtype=cfg.store_kv if with_kv else None,
                      multiple_of=process_count)
    if len(src) < batch_size * process_count:
        raise CarryoverError(
            f"{store.path}: {len(src)} usable records (min_loss_tokens={cfg.min_loss_tokens} within max_len="
            f"{cfg.max_len}) cannot fill one batch of {batch_size} on each of {process_count} hosts"
        )
    ds = grain.MapDataset.source(src).seed(seed).shuffle().repeat(num_epochs)
    if process_count > 1:
        ds = HostBlocks(ds, batch_size, process_index, process_count)
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=2 * batch_size))
    # batch after to_iter_dataset (grain's recommended order; keeps later packing/filters possible)
    return iter(it.batch(batch_size, drop_remainder=True))
