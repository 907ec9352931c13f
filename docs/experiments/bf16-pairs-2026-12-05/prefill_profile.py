"""Where a batch-64 prefill's time goes, float32 and bf16: 64 random 100-token prompts through `autoregressive.prefill`
(max_len 256), 3 profiled calls each after an untimed one, each call's time split by XLA op kind
(`bench/opprofile.profile_calls`, as `bench decode --profile` splits a step).

    python prefill_profile.py"""
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.opprofile import format_profile, profile_calls
from carryover_jax.decode import autoregressive as ar
from carryover_jax.loading import load_target
from carryover_jax.numerics import Numerics

rng = np.random.default_rng(0)
ids = jnp.asarray(rng.integers(10, 49000, (64, 100)), jnp.int32)
lens = jnp.full((64,), 100, jnp.int32)
fns = {}
for name, numerics in (("float32", Numerics()), ("bf16", Numerics(dtype="bfloat16"))):
    t = load_target("smollm2", numerics=numerics)
    fns[f"prefill {name}"] = lambda t=t: ar.prefill(t.cfg, t.params, ids, lens, max_len=256)
print(format_profile(profile_calls(fns, 3)))
