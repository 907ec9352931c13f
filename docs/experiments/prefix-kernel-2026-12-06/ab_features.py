"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`) with its
causal `Prefix` attention by einsum (attention backend "einsum": the full [320, 320] scores, as before) or by the CPU
attention kernel (backend "cpu", the CPU default), in float32 and bf16; "bf16 cpu again" is "bf16 cpu" compiled a
second time (the A/A). Whole calls, the arms rotated round by round in one process; ratios of mean times with 95%
intervals over the rounds (`eval/paired.paired_bootstrap`) and the outputs' largest differences.

    python ab_features.py ROUNDS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_arms import feature_arm, feature_report  # noqa: E402

rounds = int(sys.argv[1])
arms, outs = {}, {}
for name in ("float32 einsum", "float32 cpu", "bf16 einsum", "bf16 cpu", "bf16 cpu again"):
    dtype, backend = ("float32" if name.startswith("float32") else "bfloat16"), name.split()[1]
    arms[name], outs[name] = feature_arm(dtype=dtype, attention_backend=backend)  # traced per arm
feature_report(arms, outs, rounds, (("float32 cpu", "float32 einsum"), ("bf16 cpu", "bf16 einsum")))
