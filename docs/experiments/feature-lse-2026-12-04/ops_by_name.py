"""Prepare's feature pass (ROWS x 320 tokens, configs/smollm2) op by op: each XLA op's time per call from a
`jax.profiler` trace of 2 calls, summed over the 30 layers by what the op computes (its HLO metadata), with its
output shape.

python docs/experiments/feature-lse-2026-12-04/ops_by_name.py {float32|bfloat16} [ROWS]"""
import collections
import re
import sys
import tempfile

import jax
import numpy as np

from carryover_jax.bench import opprofile
from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.train import responses

dtype, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
cfg = load_config("smollm2")
if dtype != "float32":
    cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
target = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
layer_ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(target.cfg.num_layers))
toks = jax.numpy.asarray(np.random.default_rng(0).integers(10, target.cfg.vocab_size, (rows, cfg.data.max_len)))
args = dict(cfg=target.cfg, layer_ids=layer_ids, kv_dtype=cfg.data.store_kv)
hlo = responses._features.lower(target.params, toks, **args).compile().as_text()
meta = {m.group(1): (m.group(2), re.sub(r"layers/\d+/\d+\.", "layers/N/", m.group(3)))
        for m in re.finditer(r'^\s*(?:ROOT )?%(\S+) = (\S+) [^\n]*?op_name="jit\(_features\)/([^"]+)"', hlo, re.M)}
jax.block_until_ready(responses._features(target.params, toks, **args))
with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d)
    for _ in range(2):
        jax.block_until_ready(responses._features(target.params, toks, **args))
    jax.profiler.stop_trace()
    events = opprofile._events(d)
per_op = collections.Counter()
for name, start, end in events:
    if opprofile._OP.match(name):
        per_op[name] += (end - start) / 2e6
groups, shapes = collections.Counter(), {}
for name, ms in per_op.items():
    shape, what = meta.get(name, ("?", "?"))
    key = (name.split(".")[0], what)
    groups[key] += ms
    shapes[key] = shape
print(f"# {dtype}, {rows} x {cfg.data.max_len} tokens: {sum(per_op.values()):.1f} ms of ops per call")
print("| ms per call | op | computes | output |\n|---|---|---|---|")
for (op, what), ms in groups.most_common(20):
    print(f"| {ms:.1f} | {op} | {what[:80]} | {shapes[op, what]} |")
