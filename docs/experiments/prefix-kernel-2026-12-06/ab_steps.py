"""Training steps (configs/smollm2 with a synthetic batch, random drafter weights, as `carryover bench roofline
--rows baseline dvd control` builds them) with `Prefix` attention by einsum (attention backend "einsum", as before)
or forward by the CPU attention kernel and backward by einsum (backend "cpu", the CPU default); "cpu again" times the
"cpu" steps a second time (the A/A). float32, every step from the same state; the calls rotated step by step in one
process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`), and each mode's
loss in both backends.

    python ab_steps.py ROUNDS"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ab_arms import step_arms, step_report  # noqa: E402

rounds = int(sys.argv[1])
calls, losses = {}, {}
for backend in ("einsum", "cpu"):
    step_arms(backend, calls, losses, again=backend == "cpu", attention_backend=backend)
step_report(calls, losses, rounds, "einsum", "cpu")
