"""How many conversations `prepare` replays at once: the largest generation batch whose KV cache and
activations fit a memory budget — `data.gen_memory_gb`, or on an accelerator that reports its memory
the memory left free there once the target is loaded (then `data.gen_batch_size` is the cap).

The KV cache is measured, not modelled: `jax.eval_shape` of the cache that generation allocates
(`models.target.new_cache`, the run's cache dtype, per-layer head dims and KV heads) for prepare's
longest call, a prompt of `max_prompt_tokens` with `max_new_tokens` to generate, bucketed as
`generate` buckets it. Activations are an estimate of one layer's intermediates at a time (XLA
reuses a finished layer's buffers) at the larger of the two device passes:
- prefill of the prompt bucket with the cache allocated: hidden states, q/k/v, the MLP, float32
  scores and probabilities over the cache's slots (unless a fused attention kernel runs: pallas,
  cudnn, or auto on CUDA), and the float32 logits the sampler works on;
- with `store_features`, regenerated replies record their features as they are generated: bfloat16 buffers
  of the prompt bucket's and the reply's tokens per row (with the compute dtype's taps of the prefill
  beside them), and the float32 logits of up to `LSE_CHUNK` prompt rows for their log-sum-exp;
- the feature pass of `store_features` where nothing generates the replies (`responses="source"`) or
  `store_kv` asks for every layer's K/V (no cache): one record of max_prompt_tokens + max_new_tokens
  tokens per row, its tapped layers kept in the compute dtype and as bfloat16 (with `store_kv`, every
  layer's K/V too, in the compute dtype and the stored one), and the float32 logits of up to `LSE_CHUNK` rows
  at a time for the stored log-sum-exp.
The budget is per process: `prepare` runs its target on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from carryover_jax.bounds import SIZE_MAX
from carryover_jax.config import DataConfig, TargetConfig
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode.generate import plan_lengths
from carryover_jax.errors import ConfigError
from carryover_jax.models.target import LSE_CHUNK, new_cache
from carryover_jax.numerics import canonical_platform
from carryover_jax.train.kv_rows import kv_width

GB = 1e9
DEVICE_FRACTION = 0.9  # of a device's free memory: headroom for XLA's temporaries and fragmentation
# the feature pass (responses.target_features) pads records to a multiple of this many tokens
FEATURE_BUCKET = 64


def records_features(cfg: DataConfig) -> bool:
    """Whether `prepare` takes a store's features from the generation that writes its replies (then no feature
    pass runs): regenerated replies without `store_kv` (whose K/V rows the feature pass gives) unless
    `data.feature_pass` asks for the pass."""
    return cfg.store_features and cfg.responses == "regenerate" and not cfg.store_kv and not cfg.feature_pass


def cache_bytes(tcfg: TargetConfig, batch: int, cache_len: int) -> int:
    """Bytes of the KV cache `generate` allocates for `batch` rows of `cache_len` slots."""
    shapes = jax.eval_shape(lambda: new_cache(tcfg, batch, cache_len))
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def generation_lengths(cfg: DataConfig, tcfg: TargetConfig) -> tuple[int, int]:
    """(prompt bucket, cache slots) of prepare's longest generation call."""
    return plan_lengths([cfg.max_prompt_tokens], [cfg.max_new_tokens], None, tcfg.max_position_embeddings)


def _fused_attention(tcfg: TargetConfig, platform: str | None) -> bool:
    backend = tcfg.numerics.attention_backend
    return backend in ("pallas", "cudnn") or (backend == "auto" and canonical_platform(platform) == "cuda")


def _layer_bytes(tcfg: TargetConfig, rows: int, tokens: int, keys: int, dense_scores: bool) -> int:
    layers = range(tcfg.num_layers)
    head_dim = max(tcfg.layer_head_dim(i) for i in layers)
    kv_heads = max(tcfg.layer_kv_heads(i) for i in layers)
    # the residual stream, its norm, the attention output and their sum; q, k, v; gate, up, their product
    per_token = 4 * tcfg.hidden_size + (tcfg.num_heads + 2 * kv_heads) * head_dim + 3 * tcfg.intermediate_size
    out = rows * tokens * per_token * tcfg.numerics.compute.itemsize
    if dense_scores:
        out += 2 * rows * tcfg.num_heads * tokens * keys * 4
    return out


def generation_bytes(cfg: DataConfig, tcfg: TargetConfig, batch: int, platform: str | None = None) -> dict[str, int]:
    """{"cache", "activations", "total"}: prepare's device memory at its peak for `batch` rows (params
    excluded), over the passes this config runs (regeneration, the feature pass)."""
    dense = not _fused_attention(tcfg, platform)
    cache = act = 0
    recorded = records_features(cfg)
    if cfg.responses == "regenerate":
        bucket, slots = generation_lengths(cfg, tcfg)
        cache = cache_bytes(tcfg, batch, slots)
        act = _layer_bytes(tcfg, batch, bucket, slots, dense) + 4 * batch * tcfg.vocab_size * 4
        if recorded:
            width = (len(cfg.feature_layer_ids) + 1) * tcfg.hidden_size
            act += batch * (bucket + next_bucket(cfg.max_new_tokens, minimum=1)) * (2 * width + 4)
            act += batch * bucket * width * tcfg.numerics.compute.itemsize
            act += 2 * min(batch * bucket, LSE_CHUNK) * tcfg.vocab_size * 4
    total = cache + act
    if cfg.store_features and not recorded:
        length = -(-(cfg.max_prompt_tokens + cfg.max_new_tokens) // FEATURE_BUCKET) * FEATURE_BUCKET
        taps = (len(cfg.feature_layer_ids) + 1) * tcfg.hidden_size * (tcfg.numerics.compute.itemsize + 2)
        if cfg.store_kv:
            taps += kv_width(tcfg) * (tcfg.numerics.compute.itemsize + jnp.dtype(cfg.store_kv).itemsize)
        features = _layer_bytes(tcfg, batch, length, length, dense) + batch * length * taps
        features += 2 * min(batch * length, LSE_CHUNK) * tcfg.vocab_size * 4  # the stored log-sum-exp's logits
        if features > total:
            cache, act, total = 0, features, features
    return {"cache": cache, "activations": act, "total": total}


def batch_for_budget(cfg: DataConfig, tcfg: TargetConfig, budget_bytes: float, *, limit: int = SIZE_MAX,
                     what: str = "the budget", platform: str | None = None) -> int:
    """The largest batch in [1, limit] whose `generation_bytes` fit `budget_bytes`; one ConfigError
    naming `what` when not even one row fits."""
    one = generation_bytes(cfg, tcfg, 1, platform)
    if one["total"] > budget_bytes:
        slots = generation_lengths(cfg, tcfg)[1]
        raise ConfigError(
            f"{what}: one conversation needs {one['total'] / GB:.3g} GB (KV cache {one['cache'] / GB:.3g} GB for "
            f"{slots} slots, activations ~{one['activations'] / GB:.3g} GB); raise the budget or lower "
            "data.max_prompt_tokens / data.max_new_tokens")
    lo, hi = 1, max(1, limit)
    while lo < hi:  # memory grows with the batch: bisect for the last batch that fits
        mid = (lo + hi + 1) // 2
        if generation_bytes(cfg, tcfg, mid, platform)["total"] <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def device_free_bytes(device=None) -> int | None:
    """Bytes free on `device` (default: this process's first) as JAX reports them; None where it
    reports nothing (CPU)."""
    stats = (device or jax.local_devices()[0]).memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def generation_batch(cfg: DataConfig, tcfg: TargetConfig, *, max_rows: int | None = None,
                     device=None) -> tuple[int, str]:
    """(the generation batch, why): the largest that fits `data.gen_memory_gb`; else on a device that
    reports its memory, `data.gen_batch_size` lowered to what fits DEVICE_FRACTION of its free memory;
    else `data.gen_batch_size`. `max_rows` (the prompts there are) caps it."""
    cap = min(max_rows or SIZE_MAX, SIZE_MAX)
    if cfg.responses != "regenerate" and not cfg.store_features:
        return min(cfg.gen_batch_size, cap), "data.gen_batch_size (no device pass to size)"
    if cfg.gen_memory_gb is not None:
        what = f"data.gen_memory_gb={cfg.gen_memory_gb:g}"
        return batch_for_budget(cfg, tcfg, cfg.gen_memory_gb * GB, limit=cap, what=what), f"the largest in {what}"
    free = device_free_bytes(device)
    if free is None:
        return min(cfg.gen_batch_size, cap), "data.gen_batch_size"
    what = f"{free / GB:.3g} GB free on the device after loading the target"
    b = batch_for_budget(cfg, tcfg, DEVICE_FRACTION * free, limit=min(cfg.gen_batch_size, cap), what=what)
    return b, f"data.gen_batch_size={cfg.gen_batch_size}, capped by {DEVICE_FRACTION:.0%} of {what}"
