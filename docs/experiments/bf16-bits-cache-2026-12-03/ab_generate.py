"""Whole generations in two numerics, compiled side by side in one process and alternated pair by pair.

    python ab_generate.py BATCH PAIRS ARM_A ARM_B
    (arms: float32 | bfloat16 | bfloat16-f32cache | bfloat16-xla-products: XLA's dots for every product)

SmolLM2 (the embedded default), BATCH random 100-token prompts, 64 greedy tokens, no stop tokens. Prints the
prefill and the whole `generate` of each arm in every pair, the B / A throughput ratio per pair, its median
and range, and how many greedy tokens the arms share. ARM_A == ARM_B is the A/A check."""

import sys
import time

import numpy as np

from carryover_jax.decode.generate import generate
from carryover_jax.loading import load_target
from carryover_jax.numerics import Numerics

ARMS = {"float32": None, "bfloat16": Numerics(dtype="bfloat16"),
        "bfloat16-f32cache": Numerics(dtype="bfloat16", cache_dtype="float32"),
        "bfloat16-xla-products": Numerics(dtype="bfloat16", decode_products="xla")}


def main(batch: int, pairs: int, a: str, b: str) -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 49000, 100).tolist() for _ in range(batch)]
    targets = {}
    for name in (a, b):
        targets[name] = targets.get(name) or load_target("smollm2", numerics=ARMS[name])
    arms = [("A", targets[a]), ("B", targets[b])]
    toks = {}
    for label, t in arms:  # compile and warm up both before timing either
        toks[label] = [r.token_ids for r in generate(t, prompts, max_new_tokens=64, stop_token_ids=[])]
    ratios = []
    for i in range(pairs):
        secs = {}
        for label, t in (arms if i % 2 == 0 else arms[::-1]):
            start = time.perf_counter()
            generate(t, prompts, max_new_tokens=64, stop_token_ids=[])
            secs[label] = time.perf_counter() - start
        ratios.append(secs["A"] / secs["B"])
        print(f"pair {i}: A {a} {batch * 64 / secs['A']:.1f} tok/s, B {b} {batch * 64 / secs['B']:.1f} tok/s, "
              f"B/A {ratios[-1]:.2f}", flush=True)
    same = np.mean([x == y for ra, rb in zip(toks["A"], toks["B"]) for x, y in zip(ra, rb)])
    print(f"batch {batch}: B/A throughput median {np.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f},"
          f" {pairs} alternated pairs); greedy tokens shared {same:.1%}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
