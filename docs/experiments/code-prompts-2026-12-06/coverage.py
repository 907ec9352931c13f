"""How much of the target's held-out replies a draft vocabulary can propose at all: the recipe's 8,192 most frequent
supervised tokens of a store (or a store with extra stores), against the target's greedy replies (64 tokens, T = 0,
the eval's prompts: HumanEval, MT-Bench, held-out ShareGPT). A reply token outside the vocabulary is a proposal the
drafter cannot make, so its round accepts nothing past it. A second figure per dataset: the same vocabulary with
each prompt's own tokens added (what a per-request extension by the prompt's tokens could propose), and the median
number of prompt tokens it would add.

    python coverage.py REPLIES.json NAME=STORE[+EXTRA...][@K] ...     (K: the vocabulary's size, 8,192 by default)

REPLIES.json (prompt and reply ids per dataset) is written on the first call (bf16 target) and reused after.
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


def prompts_by_length(target) -> list[tuple[list[int], str]]:
    prompts, _ = load_prompts(DATASETS, limit=400, fits=lambda p: len(target.encode(list(p.messages))) <= 1024)
    return sorted(((target.encode(list(p.messages)), p.dataset) for p in prompts), key=lambda e: len(e[0]))


def replies(path: Path, target) -> dict[str, list[list[list[int]]]]:
    """{dataset: [[prompt ids, reply ids], ...]}"""
    if path.exists():
        return json.loads(path.read_text())
    from carryover_jax.decode.generate import generate

    encoded = prompts_by_length(target)
    out: dict[str, list] = {d: [] for d in DATASETS}
    for i in range(0, len(encoded), 32):  # by length, so a batch pads little
        chunk = encoded[i:i + 32]
        gens = generate(target, [ids for ids, _ in chunk], max_new_tokens=64, chat=False)
        for (ids, dataset), g in zip(chunk, gens):
            out[dataset].append([ids, [int(t) for t in g.token_ids]])
        print(f"replies {i + len(chunk)}/{len(encoded)}", file=sys.stderr)
    path.write_text(json.dumps(out))
    return out


def main(path: str, *arms: str) -> None:
    target = load_target("smollm2", dtype="bfloat16")
    reps = replies(Path(path), target)
    print("| vocabulary from | records | " + " | ".join(
        f"{d} ({len(reps[d])} replies): vocabulary / + the prompt's tokens (added, median)" for d in DATASETS) + " |")
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
            total = hits = with_prompt = 0
            added = []
            for prompt, reply in reps[d]:
                seen = set(prompt)
                added.append(sum(not inside[t] for t in seen))
                total += len(reply)
                hits += sum(bool(inside[t]) for t in reply)
                with_prompt += sum(bool(inside[t]) or t in seen for t in reply)
            cells.append(f"{hits / total:.4f} / {with_prompt / total:.4f} ({int(np.median(added))})")
        print(f"| {name} | {len(store)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:])
