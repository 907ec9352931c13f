"""Tiny drafters on a tiny target shape, with random frozen embedding/head."""

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.config import DrafterConfig, TargetConfig
from carryover_jax.models.drafter import init_drafter_params

TINY_TARGET = TargetConfig(
    family="llama", vocab_size=97, hidden_size=64, intermediate_size=112, num_layers=6, num_heads=4,
    num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
)
VARIANTS = {  # name -> (kind, layout)
    "dflash-zlab": ("dflash", "zlab"),
    "dflash-deepspec": ("dflash", "deepspec"),
    "markov-deepspec": ("markov", "deepspec"),
    "markov-zlab": ("markov", "zlab"),
}


def tiny_drafter(kind="dflash", layout="zlab", *, proposals=5, carryover=True, seed=0, e_rej_scale=0.5):
    cfg = DrafterConfig.for_target(
        TINY_TARGET, kind=kind, layout=layout, num_proposals=proposals, num_layers=2, mask_token_id=5,
        target_layer_ids=(-1, 1, 3), markov_rank=8 if kind == "markov" else None, carryover=carryover,
    )
    params = init_drafter_params(cfg, jax.random.key(seed))
    # Unit norms and a zero e_rej would hide mistakes; perturb them.
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.1 * rng.standard_normal(x.shape).astype(np.float32)
        if "norm" in jax.tree_util.keystr(path) else x, params)
    if carryover:
        params["e_rej"] = jnp.asarray(e_rej_scale * rng.standard_normal(cfg.hidden_size), jnp.float32)
    return cfg, params


def tiny_frozen(seed=1):
    rng = np.random.default_rng(seed)
    v, d = TINY_TARGET.vocab_size, TINY_TARGET.hidden_size
    return {"embed": jnp.asarray(rng.standard_normal((v, d)), jnp.float32),
            "head": jnp.asarray(0.2 * rng.standard_normal((d, v)), jnp.float32)}
