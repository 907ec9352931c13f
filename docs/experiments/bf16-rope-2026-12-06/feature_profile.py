"""Where prepare's feature pass spends its time, float32 and bf16 (configs/smollm2: 32 random 320-token
sequences, `train.responses._features`), 2 profiled calls each after an untimed one, each call's time split by XLA
op kind (`bench/opprofile.profile_calls`, as `bench decode --profile` splits a step).

    python feature_profile.py"""
import jax
import numpy as np

from carryover_jax.bench.opprofile import format_profile, profile_calls
from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.train import responses

fns = {}
for dtype in ("float32", "bfloat16"):
    cfg = load_config("smollm2")
    if dtype != "float32":
        cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jax.numpy.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    fns[f"features {dtype}"] = (lambda t=t, toks=toks, ids=ids, kv=cfg.data.store_kv:
                                responses._features(t.params, toks, cfg=t.cfg, layer_ids=ids, kv_dtype=kv))
print(format_profile(profile_calls(fns, 2)))
