"""Profile the roofline's training steps (baseline / dvd / control) by op kind, float32 and bf16."""
import sys
import jax
from carryover_jax.bench import opprofile, roofline
from carryover_jax.bench.train import step_call, synthetic_batch
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target

dtype = sys.argv[1]
modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["baseline", "dvd", "control"]
cfg = load_config("smollm2")
if dtype != "float32":
    cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
target = load_target(cfg.target, numerics=cfg.run_numerics())
print(target.cfg.numerics.describe(), flush=True)
d = roofline._drafter(cfg, target)
with_kv = synthetic_batch(cfg, target, d.cfg, stored=cfg.features == "store")
batch = {k: v for k, v in with_kv.items() if k != "kv"}
calls = {m: step_call(cfg, target, d.cfg, d.params, with_kv if m == "dvd" else batch, mode=m, off_metrics=False)
         for m in modes}
prof = opprofile.profile_calls(calls, 3)
print(opprofile.format_profile(prof))
