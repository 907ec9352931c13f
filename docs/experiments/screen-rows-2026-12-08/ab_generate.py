"""Greedy generation with the head's screen against the float32 head at more than 8 rows a step, in one process,
arms rotated per round.

python ab_generate.py REPEATS NEW_TOKENS CASE ...   CASE: ar:BATCH or spec:BATCH:P

SmolLM2 (float32, the CPU default), the first `batch` of 64 prompts (16 distinct texts, each 4 times). AR at that
batch (batch rows a step) and speculative decoding with an untrained drafter (its proposals are nearly all rejected,
so every round is a verification of batch x (P + 1) rows and one token). Arms: "screen" (`Target.greedy_screen`, the
default), "full" (no screen) and "full again" (the same program as "full", the A/A). Per pair of rounds the time
ratio to "full"; every arm's tokens must equal the others'.
"""
import sys
import time

import numpy as np

import carryover_jax.decode.generate as G
from carryover_jax.loading import init_drafter, load_target

reps, new = int(sys.argv[1]), int(sys.argv[2])
target = load_target("smollm2")
texts = ["Write a short story about a robot learning to paint.", "Explain how a hash table works.",
         "def fibonacci(n):", "What are the causes of the French Revolution?", "Summarise the plot of Hamlet.",
         "How do vaccines train the immune system?", "Write a haiku about autumn rain.", "What is a monad?",
         "List three uses of a Fourier transform.", "Why is the sky blue?", "Translate 'good morning' to French.",
         "Describe the water cycle.", "import numpy as np\n# a 2-D convolution", "What does TCP guarantee?",
         "Give a recipe for pancakes.", "Explain gradient descent to a child."]
prompts = texts * 4
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


cases = []
for c in sys.argv[3:]:
    kind, batch, *p = c.split(":")
    cases.append((kind, int(batch), init_drafter(target, seed=0, num_proposals=int(p[0])) if p else None))
print(f"# python ab_generate.py {' '.join(sys.argv[1:])}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
print("| case | rows a step | full s | screen s | screen / full, median of pairs [min, max] | A/A (full again / full) "
      "| tokens |")
print("|---|---|---|---|---|---|---|")
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
    rows = batch if kind == "ar" else batch * (drafter.cfg.num_proposals + 1)
    name = f"AR, batch {batch}" if kind == "ar" else f"speculative, batch {batch}, P = {drafter.cfg.num_proposals}"
    print(f"| {name} | {rows} | {np.median(full):.3f} | {np.median(secs['screen']):.3f} | {np.median(ratio):.3f} "
          f"[{ratio.min():.3f}, {ratio.max():.3f}] | {np.median(aa):.3f} [{aa.min():.3f}, {aa.max():.3f}] | "
          f"equal ({sum(map(len, ref))}) |", flush=True)
