"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`) with its
forward in one pass ("whole", as before) or in passes of `responses.FEATURE_PASS_TOKENS` token rows (8 sequences,
`numerics.sub_batched`), float32 and bf16; "float32 passes again" is "float32 passes" compiled a second time (the
A/A). Whole calls, the arms rotated round by round in one process; ratios of mean times with 95% intervals over the
rounds (`eval/paired.paired_bootstrap`) and the outputs' largest differences.

    python ab_feature_passes.py ROUNDS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_arms import feature_arm, feature_report  # noqa: E402

from carryover_jax.train import responses  # noqa: E402

rounds = int(sys.argv[1])
PASS = responses.FEATURE_PASS_TOKENS
arms, outs = {}, {}
for name in ("float32 whole", "float32 passes", "bf16 whole", "bf16 passes", "float32 passes again"):
    responses.FEATURE_PASS_TOKENS = 10 ** 9 if "whole" in name else PASS  # read when the arm is traced
    arms[name], outs[name] = feature_arm(**({"dtype": "bfloat16"} if name.startswith("bf16") else {}))
responses.FEATURE_PASS_TOKENS = PASS
feature_report(arms, outs, rounds, (("float32 passes", "float32 whole"), ("bf16 passes", "bf16 whole")))
