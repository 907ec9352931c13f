"""`carryover bench ar`: JAX AR decoding vs transformers (PyTorch) `generate`, same prompts, one run.

Both sides decode exactly `max_new_tokens` greedy tokens per prompt (stop tokens off) so token
counts match; tokens/s counts generated tokens over wall time including prefill. JAX compile time
is measured separately by a warm-up call with the same shapes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tqdm import tqdm

from carryover_jax.bench.prompts import BENCH_PROMPTS
from carryover_jax.decode.generate import generate


def _torch_generate(model, tok, prompt_ids: list[list[int]], max_new: int):
    import torch  # the optional [torch] extra: only this benchmark's PyTorch side needs it

    width = max(len(p) for p in prompt_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])  # HF generate wants left padding
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=attn, max_new_tokens=max_new, min_new_tokens=max_new,
            do_sample=False, pad_token_id=pad,
        )
    return out[:, width:].tolist()


def run(target, *, batch_sizes=(1, 8), max_new_tokens: int = 64, repeats: int = 1,
        torch_threads: int | None = None, progress: bool = True) -> dict[str, Any]:
    import torch  # the optional [torch] extra: only this benchmark's PyTorch side needs it
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(torch_threads or os.cpu_count() or 1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(target.path), dtype=torch.float32).eval()
    rows = []
    bar = tqdm(batch_sizes, desc="bench ar", disable=not progress)
    for b in bar:
        prompts = [BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(b)]
        ids = [target.encode(p) for p in prompts]
        kw = dict(max_new_tokens=max_new_tokens, stop_token_ids=[])
        t = time.perf_counter()
        generate(target, ids, **kw)  # compile for these shapes
        compile_s = time.perf_counter() - t
        jax_s, torch_s = [], []
        for _ in range(repeats):
            bar.set_postfix_str(f"batch {b}: jax")
            t = time.perf_counter()
            res = generate(target, ids, **kw)
            jax_s.append(time.perf_counter() - t)
            bar.set_postfix_str(f"batch {b}: torch")
            t = time.perf_counter()
            ref = _torch_generate(hf, target.tokenizer, ids, max_new_tokens)
            torch_s.append(time.perf_counter() - t)
        n_tok = b * max_new_tokens
        same = sum(r.token_ids == o for r, o in zip(res, ref))
        jt, tt = n_tok / min(jax_s), n_tok / min(torch_s)
        rows.append({
            "batch": b, "new_tokens": n_tok, "jax_tok_s": round(jt, 2), "torch_tok_s": round(tt, 2),
            "jax_over_torch": round(jt / tt, 3), "jax_compile_s": round(compile_s - min(jax_s), 2),
            "greedy_rows_identical": f"{same}/{b}",
        })
    return {
        "benchmark": "ar", "target": str(target.path), "max_new_tokens": max_new_tokens,
        "torch_threads": torch.get_num_threads(), "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    head = "| batch | JAX tok/s | PyTorch tok/s | JAX / PyTorch | JAX compile s | identical greedy rows |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['jax_tok_s']} | {r['torch_tok_s']} | {r['jax_over_torch']}x | "
            f"{r['jax_compile_s']} | {r['greedy_rows_identical']} |"
        )
    return "\n".join(lines)
