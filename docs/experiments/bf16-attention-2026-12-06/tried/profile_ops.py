"""Where one bf16 feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`) spends
its time, by XLA op name (numbering dropped, summed over the trace), after one untimed call: run on `622a2b3` and
with `token_major.patch` applied.

    python profile_ops.py"""
import re
import tempfile
from collections import Counter

import jax
import numpy as np

from carryover_jax.bench import opprofile
from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.train import responses

cfg = load_config("smollm2")
cfg = cfg.replace(numerics=cfg.numerics.replace(dtype="bfloat16"), compute_dtype=None)
t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
toks = jax.numpy.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
f = jax.jit(lambda p, x: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids, kv_dtype=None))
jax.block_until_ready(f(t.params, toks))
with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d)
    jax.block_until_ready(f(t.params, toks))
    jax.profiler.stop_trace()
    events = opprofile._events(d)
ms = Counter()
for name, start, end in events:
    if opprofile._OP.match(name):
        ms[re.sub(r"\.\d+$", "", name)] += (end - start) / 1e6
for name, v in ms.most_common(10):
    print(f"{v:9.1f} ms  {name}")
