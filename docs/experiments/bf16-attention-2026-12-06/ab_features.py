"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`, in its
passes of 8 sequences) in float32 and in bf16, its attention by the CPU kernel's per-query path (`live_attention`;
bf16 queries widened to float32: as before) or by its tiled path (`cpu_attention.prefix_attention`, new); "bf16
tiles again" is the bf16 tiled arm compiled a second time (the A/A). Whole calls, the arms rotated round by round
in one process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`) and the
outputs' largest differences.

    python ab_features.py ROUNDS [ARM ...]   (default: every arm)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_arms import feature_arm, feature_report  # noqa: E402

from carryover_jax.models import cpu_attention  # noqa: E402

rounds = int(sys.argv[1])
tiles = cpu_attention.prefix_attention
arms, outs = {}, {}
for name in sys.argv[2:] or ("float32 per-query", "float32 tiles", "bf16 per-query", "bf16 tiles", "bf16 tiles again"):
    # read when the arm is traced (in feature_arm)
    cpu_attention.prefix_attention = cpu_attention.live_attention if "per-query" in name else tiles
    arms[name], outs[name] = feature_arm(**({"dtype": "bfloat16"} if name.startswith("bf16") else {}))
cpu_attention.prefix_attention = tiles
feature_report(arms, outs, rounds, (("float32 tiles", "float32 per-query"), ("bf16 tiles", "bf16 per-query"),
                                    ("bf16 tiles", "bf16 tiles again")))
