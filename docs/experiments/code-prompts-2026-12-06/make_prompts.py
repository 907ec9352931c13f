"""HumanEval-shaped code prompts from the Python standard library and the installed packages, as a prompt JSONL for
`data.source`: the first N prompts of the built-in source "pycode" (`carryover_jax/train/code_prompts.py`, where
the stubs and their order are defined), written as the file this experiment's code store was prepared from.

    python make_prompts.py OUT.jsonl [N]
"""

import json
import sys

from carryover_jax.train.code_prompts import code_prompts, default_roots


def main(out: str, n: int | None = None) -> None:
    every = code_prompts()
    rows = every[:n] if n else every
    with open(out, "w", encoding="utf-8") as f:
        for cid, prompt in rows:
            f.write(json.dumps({"id": cid, "prompt": prompt}) + "\n")
    where = ", ".join(str(r) for r in default_roots())
    print(f"{len(rows)} prompts from {len(every)} stubs of {where} (Python {sys.version.split()[0]}) -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
