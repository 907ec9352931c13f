"""How much of the target's held-out replies a draft vocabulary can propose at all: the recipe's 8,192 most frequent
supervised tokens of a store (or a store with extra stores), against the target's greedy replies (64 tokens, T = 0,
the eval's prompts: HumanEval, MT-Bench, held-out ShareGPT). A reply token outside the vocabulary is a proposal the
drafter cannot make, so its round accepts nothing past it.

    python coverage.py REPLIES.json NAME=STORE[+EXTRA...][@K] ...     (K: the vocabulary's size, 8,192 by default)

REPLIES.json is written on the first call (bf16 target) and reused after.
"""

import json
import sys
from pathlib import Path

import numpy as np

from carryover_jax.eval.datasets import load_prompts
from carryover_jax.loading import load_target
from carryover_jax.train.store import open_store
from carryover_jax.train.vocab import draft_vocabulary, token_counts

K = 8192
DATASETS = ["humaneval", "mtbench", "sharegpt"]


def replies(path: Path, target) -> dict[str, list[list[int]]]:
    if path.exists():
        return json.loads(path.read_text())
    from carryover_jax.decode.generate import generate

    prompts, _ = load_prompts(DATASETS, limit=400, fits=lambda p: len(target.encode(list(p.messages))) <= 1024)
    encoded = sorted(((target.encode(list(p.messages)), p.dataset) for p in prompts), key=lambda e: len(e[0]))
    out: dict[str, list[list[int]]] = {d: [] for d in DATASETS}
    for i in range(0, len(encoded), 32):  # by length, so a batch pads little
        chunk = encoded[i:i + 32]
        gens = generate(target, [ids for ids, _ in chunk], max_new_tokens=64, chat=False)
        for (_, dataset), g in zip(chunk, gens):
            out[dataset].append([int(t) for t in g.token_ids])
        print(f"replies {i + len(chunk)}/{len(encoded)}", file=sys.stderr)
    path.write_text(json.dumps(out))
    return out


def main(path: str, *arms: str) -> None:
    target = load_target("smollm2", dtype="bfloat16")
    reps = replies(Path(path), target)
    print("| vocabulary from | records | " + " | ".join(f"{d} ({len(reps[d])} replies)" for d in DATASETS) + " |")
    print("|---|---|" + "---|" * len(DATASETS))
    for arm in arms:
        name, _, spec = arm.partition("=")
        stores, _, k = spec.partition("@")
        first, *extra = stores.split("+")
        store = open_store(first, extra)
        vocab, _ = draft_vocabulary(token_counts(store, target.cfg.vocab_size), int(k or K),
                                    tuple(target.stop_token_ids))
        inside = np.zeros(target.cfg.vocab_size, bool)
        inside[list(vocab)] = True
        cells = []
        for d in DATASETS:
            toks = np.concatenate([np.asarray(r, np.int64) for r in reps[d]])
            cells.append(f"{inside[toks].mean():.4f}")
        print(f"| {name} | {len(store)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
