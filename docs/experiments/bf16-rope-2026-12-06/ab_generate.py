"""Whole generations (SmolLM2, BATCH random 100-token prompts, 64 greedy tokens, no stop tokens): float32, bf16
with RoPE on CPU in float32 rounded once ("bf16", `Attention._rope`), bf16 with RoPE as HF computes it
("bf16-hf-rope", the previous code), and "bf16-again", "bf16" timed a second time each round (the A/A). Compiled
side by side in one process, the arms' order rotated round by round; ratios of mean throughputs with 95% intervals
over the rounds (`eval/paired.paired_bootstrap`).

    python ab_generate.py BATCH ROUNDS

The decode functions are jitted with the target's config static, so "bf16-hf-rope" runs a config that differs in
`rope_original_max_position` alone (read by rope_type "llama3" only) to get programs of its own, traced while
the previous RoPE is patched in."""

import dataclasses
import itertools
import sys

import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode.generate import generate
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.models import layers
from carryover_jax.numerics import Numerics

NEW_ROPE = layers.Attention._rope


def hf_rope(self, x, positions):
    return layers.apply_rope(x.astype(self.dtype), positions, np.asarray(self.inv_freq, np.float32))


def main(batch: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 49000, 100).tolist() for _ in range(batch)]
    run = lambda t: [x.token_ids for x in generate(t, prompts, max_new_tokens=64, stop_token_ids=[])]  # noqa: E731
    f32, bf16 = load_target("smollm2"), load_target("smollm2", numerics=Numerics(dtype="bfloat16"))
    assert bf16.cfg.rope_type == "default"
    hf = dataclasses.replace(bf16, cfg=dataclasses.replace(
        bf16.cfg, rope_original_max_position=bf16.cfg.rope_original_max_position + 1))
    targets = {"float32": f32, "bf16-hf-rope": hf, "bf16": bf16, "bf16-again": bf16}
    toks = {}
    for arm, t in targets.items():  # compile and warm up every arm before timing any
        layers.Attention._rope = hf_rope if arm == "bf16-hf-rope" else NEW_ROPE
        toks[arm] = run(t)
    layers.Attention._rope = NEW_ROPE
    arms = list(targets)
    secs = rotated_seconds({a: (lambda t=t: run(t)) for a, t in targets.items()}, rounds, lambda r, s: print(
        f"round {r}: " + ", ".join(f"{a} {batch * 64 / s[a][-1]:.1f} tok/s" for a in arms), flush=True))
    for a, b in itertools.combinations(arms, 2):
        ratio, lo, hi = speed_ratio(secs[a], secs[b])
        same = np.mean([x == y for ra, rb in zip(toks[a], toks[b]) for x, y in zip(ra, rb)])
        print(f"batch {batch}: {b} / {a} throughput {ratio:.3f} [{lo:.3f}, {hi:.3f}] over "
              f"{rounds} rounds; greedy tokens shared {same:.1%}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
