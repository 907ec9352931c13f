"""Greedy generation with the head's screen against the float32 head, in one process, arms rotated per round.

python ab_generate.py REPEATS NEW_TOKENS [P ...]
DRAFTER=FOLDER python ab_generate.py REPEATS NEW_TOKENS   (speculative decoding with that trained drafter instead)
TARGET=gemma3-270m python ab_generate.py ...   (that target instead of SmolLM2)

SmolLM2 (float32, the CPU default), the first `batch` of four fixed prompts: AR at batch 1, 4 and 16 (16 rows take
the full head in both arms: a control) and speculative decoding at batch 1 with an untrained drafter for each P (its
proposals are nearly all rejected, so every round is a verification of P + 1 rows and one token). Arms: "screen"
(`Target.greedy_screen`, the default), "full" (no screen) and "full again" (the same program as "full", the A/A).
Per pair of rounds the time ratio to "full"; every arm's tokens must equal the others'.
"""
import os
import sys
import time

import numpy as np

import carryover_jax.decode.generate as G
from carryover_jax.loading import init_drafter, load_drafter, load_target

reps, new = int(sys.argv[1]), int(sys.argv[2])
proposals = [int(p) for p in sys.argv[3:]] or [3]
target = load_target(os.environ.get("TARGET", "smollm2"))
prompts = ["Write a short story about a robot learning to paint.", "Explain how a hash table works.",
           "def fibonacci(n):", "What are the causes of the French Revolution?"] * 4
screen_of = G._screen
arms = {"screen": screen_of, "full": lambda t: None, "full again": lambda t: None}


def run(arm, kind, batch, drafter):
    G._screen = arms[arm]
    t0 = time.perf_counter()
    if kind == "ar":
        gens = G.generate(target, prompts[:batch], max_new_tokens=new)
    else:
        gens, _ = G.speculative_generate(target, drafter, prompts[:batch], carryover=False, max_new_tokens=new)
    return time.perf_counter() - t0, [g.token_ids for g in gens]


cases = [("ar", 1, None), ("ar", 4, None), ("ar", 16, None)]
if os.environ.get("DRAFTER"):
    cases += [("spec", 1, load_drafter(os.environ["DRAFTER"])), ("spec", 4, load_drafter(os.environ["DRAFTER"]))]
else:
    cases += [("spec", 1, init_drafter(target, seed=0, num_proposals=p)) for p in proposals]
env = "".join(f"{k}={os.environ[k]} " for k in ("TARGET", "DRAFTER") if os.environ.get(k))
print(f"# {env}python ab_generate.py {' '.join(sys.argv[1:])}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
print("| case | full s | screen s | screen / full, median of pairs [min, max] | A/A (full again / full) | tokens |")
print("|---|---|---|---|---|---|")
for kind, batch, drafter in cases:
    ref = run("full", kind, batch, drafter)[1]
    for arm in arms:  # compile every program before timing
        run(arm, kind, batch, drafter)
    secs = {a: [] for a in arms}
    for r in range(reps):
        order = list(arms)[r % 3:] + list(arms)[:r % 3]
        for arm in order:
            dt, toks = run(arm, kind, batch, drafter)
            assert toks == ref, (arm, kind, batch)
            secs[arm].append(dt)
    full = np.array(secs["full"])
    ratio, aa = np.array(secs["screen"]) / full, np.array(secs["full again"]) / full
    name = f"AR, batch {batch}" if kind == "ar" else f"speculative, batch {batch}, P = {drafter.cfg.num_proposals}"
    print(f"| {name} | {np.median(full):.3f} | {np.median(secs['screen']):.3f} | {np.median(ratio):.3f} "
          f"[{ratio.min():.3f}, {ratio.max():.3f}] | {np.median(aa):.3f} [{aa.min():.3f}, {aa.max():.3f}] | "
          f"equal ({sum(map(len, ref))}) |", flush=True)
