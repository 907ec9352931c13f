"""Whole generations at batch 64: float32, bf16 with XLA's dots, bf16 with the products kernel's avx512_bf16 pairs;
compiled side by side in one process and alternated round by round.

    python ab_pairs.py BATCH ROUNDS [ARM ...]
    (arms: float32 | bf16-xla | bf16-pairs | bf16-pairs-again; default all four)

SmolLM2 (the embedded default), BATCH random 100-token prompts, 64 greedy tokens, no stop tokens. bf16-xla is
`decode_products="xla"`: at a batch of 9-64 rows every product of a generation (the prefill's thousands of rows and
the decode steps' BATCH rows) is XLA's dot in both bf16 arms unless the kernel takes BATCH rows, so the two arms
differ in the decode steps' Dense products only (above `cpu_products.BF16_PAIR_ROWS` rows both are XLA's: leave
bf16-xla out there). bf16-pairs-again is bf16-pairs timed a second time each round (the
A/A). The arms' order rotates round by round. Prints each timed call, then per pair of arms the ratio of their mean
throughputs with its 95% interval over the rounds (`eval/paired.paired_bootstrap`) and the greedy tokens they
share."""

import itertools
import sys
import time

import numpy as np

from carryover_jax.decode.generate import generate
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products
from carryover_jax.numerics import Numerics

ARMS = {"float32": Numerics(), "bf16-xla": Numerics(dtype="bfloat16", decode_products="xla"),
        "bf16-pairs": Numerics(dtype="bfloat16"), "bf16-pairs-again": Numerics(dtype="bfloat16")}


def main(batch: int, rounds: int, arms: list[str]) -> None:
    if "bf16-xla" in arms:  # else the two bf16 arms would be the same program
        assert cpu_products.most_rows("kn", "bfloat16") >= batch, "this CPU or build takes no bf16 batch in the kernel"
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 49000, 100).tolist() for _ in range(batch)]
    targets = {a: load_target("smollm2", numerics=ARMS[a]) for a in arms}
    toks = {a: [x.token_ids for x in generate(targets[a], prompts, max_new_tokens=64, stop_token_ids=[])]
            for a in arms}  # compile and warm up every arm before timing any
    secs = {a: [] for a in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            start = time.perf_counter()
            generate(targets[arm], prompts, max_new_tokens=64, stop_token_ids=[])
            secs[arm].append(time.perf_counter() - start)
            print(f"round {r} {arm}: {batch * 64 / secs[arm][-1]:.1f} tok/s", flush=True)
    for a, b in itertools.combinations(arms, 2):
        cmp = paired_bootstrap(secs[a], secs[b], min_prompts=2)  # gain: mean time of a over b's, minus 1
        lo, hi = (1 + g / 100 for g in cmp["gain_pct_ci"])
        same = np.mean([x == y for ra, rb in zip(toks[a], toks[b]) for x, y in zip(ra, rb)])
        print(f"batch {batch}: {b} / {a} throughput {1 + cmp['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}] over "
              f"{rounds} rounds; greedy tokens shared {same:.1%}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] or list(ARMS))
