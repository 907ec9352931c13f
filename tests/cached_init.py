"""`init_params` / `init_drafter_params` with the library's signature and values, computed once per (config,
key, options) in a test process. The library functions jit a fresh closure on every call, so every call
traced and compiled the init again (2-4 s on CPU), and the test modules call them dozens of times with the
same arguments. Each call returns a fresh copy: train steps donate the state that holds the drafter params."""

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.models.drafter import init_drafter_params as _init_drafter_params
from carryover_jax.models.target import init_params as _init_params

_CACHE: dict = {}


def _cached(fn, cfg, rng, kw):
    data = np.asarray(jax.random.key_data(rng) if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng)
    key = (fn.__name__, cfg, str(rng.dtype), data.shape, data.tobytes(), tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = fn(cfg, rng, **kw)
    return jax.tree_util.tree_map(jnp.copy, _CACHE[key])


def init_params(cfg, rng, **kw):
    return _cached(_init_params, cfg, rng, kw)


def init_drafter_params(cfg, rng, **kw):
    if kw.get("boxed"):  # flax's partitioning boxes (read under eval_shape): not cached
        return _init_drafter_params(cfg, rng, **kw)
    return _cached(_init_drafter_params, cfg, rng, kw)
