"""Training steps (configs/smollm2 with a synthetic batch, random drafter weights, as `carryover bench roofline
--rows baseline dvd control` builds them, float32) with the `Prefix` attention's forward by the CPU kernel's
per-query path (`live_attention`, as before) or its tiled path (`prefix_attention`, new); backward by einsum in
both; "tiles again" times the tiled steps a second time (the A/A). Every step from the same state; the calls rotated
step by step in one process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`),
and each mode's loss in both arms.

    python ab_steps.py ROUNDS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_arms import step_arms, step_report  # noqa: E402

from carryover_jax.models import cpu_attention  # noqa: E402

rounds = int(sys.argv[1])
tiles = cpu_attention.prefix_attention
calls, losses = {}, {}
for arm in ("per-query", "tiles"):
    cpu_attention.prefix_attention = cpu_attention.live_attention if arm == "per-query" else tiles  # read when traced
    step_arms(arm, calls, losses, again=arm == "tiles")
cpu_attention.prefix_attention = tiles
step_report(calls, losses, rounds, "per-query", "tiles")
