"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`, in its
passes of 8 sequences), float32 and bf16, its one-segment causal attention by the CPU kernel's tiled path in the
head-major layout (q transposed to [B, Hkv, G, T, D] before the kernel, the output merged and transposed back after
it, as `622a2b3` ran it) or whole in the model's token-major layout (`layers._prefix_cpu_whole`: the kernel reads q
and writes its results as [B, T, Hkv, G, ...], no transposes; new); "... again" arms are the token-major arms
compiled a second time (the A/As). Whole calls, the arms rotated round by round in one process; ratios of mean times
with 95% intervals over the rounds (`eval/paired.paired_bootstrap`) and the outputs' largest differences.

    git apply token_major.patch   # on 622a2b3
    python ab_layout.py ROUNDS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from ab_arms import feature_arm, feature_report  # noqa: E402

from carryover_jax.models import layers  # noqa: E402

rounds = int(sys.argv[1])
whole = layers._whole_prefix
arms, outs = {}, {}
for name in ("float32 head-major", "float32 token-major", "bf16 head-major", "bf16 token-major",
             "float32 token-major again", "bf16 token-major again"):
    layers._whole_prefix = (lambda *a: False) if "head-major" in name else whole  # read when the arm is traced
    arms[name], outs[name] = feature_arm(**({"dtype": "bfloat16"} if name.startswith("bf16") else {}))
layers._whole_prefix = whole
feature_report(arms, outs, rounds, (("float32 token-major", "float32 head-major"),
                                    ("bf16 token-major", "bf16 head-major")))
