"""Profile prepare's feature pass (the roofline's `features` row) by op kind, float32 or bf16."""
import sys
import numpy as np
from carryover_jax.bench import opprofile
from carryover_jax.configs import load_config
from carryover_jax.config import zlab_layer_ids
from carryover_jax.loading import load_target
from carryover_jax.train.gen_memory import generation_batch
from carryover_jax.train.responses import target_features

dtype = sys.argv[1]
cfg = load_config("smollm2")
if dtype != "float32":
    cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
target = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
print(target.cfg.numerics.describe(), flush=True)
rows, _ = generation_batch(cfg.data, target.cfg, max_rows=cfg.data.max_prompts)
seq = cfg.data.max_len
layer_ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(target.cfg.num_layers))
seqs = np.random.default_rng(0).integers(10, target.cfg.vocab_size, (rows, seq)).tolist()
fn = lambda: target_features(target, seqs, layer_ids, batch_rows=rows, kv_dtype=cfg.data.store_kv)[-1]["features"]
prof = opprofile.profile_calls({f"features {rows}x{seq}": fn}, 2)
print(opprofile.format_profile(prof))
for name, p in prof.items():
    print(sorted(p["top_ops_ms"].items(), key=lambda kv: -kv[1])[:12])
