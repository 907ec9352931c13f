"""`carryover bench decode`: AR vs speculative baseline vs speculative Carryover, same prompts, one run.

Greedy decoding is lossless, so all three modes emit the same tokens and their tokens/s compare
directly. Each timed call is preceded by an untimed call with the same shapes (compilation).
The draft/verify split comes from the step-wise engine (host-timed rounds); throughput from the
`while_loop` engine.
"""

from __future__ import annotations

import time
from typing import Any

from carryover_jax.bench.prompts import BENCH_PROMPTS
from carryover_jax.decode.generate import generate, speculative_generate


def _timed(fn, *args, **kw):
    fn(*args, **kw)  # compile for these shapes
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def run(target, drafter, *, num_prompts: int = 4, max_new_tokens: int = 64, batch_sizes=(1, 2, 4, 8),
        progress: bool = True) -> dict[str, Any]:
    from tqdm import tqdm

    prompts = [target.encode(p) for p in BENCH_PROMPTS[:num_prompts]]
    kw = dict(max_new_tokens=max_new_tokens)
    modes = ("ar", "baseline", "carryover")

    def call(mode, batch, stepwise=False):
        if mode == "ar":
            return generate(target, batch, **kw), None
        return speculative_generate(target, drafter, batch, carryover=mode == "carryover", stepwise=stepwise, **kw)

    # -- batch 1, prompt by prompt: tokens/s, tau, speedup, and the round time split
    per_mode = {m: {"time_s": 0.0, "tokens": 0, "rounds": 0, "draft_s": 0.0, "verify_s": 0.0} for m in modes}
    outputs = {m: [] for m in modes}
    bar = tqdm(total=len(prompts) * (len(modes) + 2) + len(batch_sizes) * len(modes), desc="bench decode",
               disable=not progress)
    for p in prompts:
        for m in modes:
            (res, stats), dt = _timed(call, m, [p])
            per_mode[m]["time_s"] += dt
            per_mode[m]["tokens"] += len(res[0].token_ids)
            outputs[m].append(res[0].token_ids)
            if stats:
                per_mode[m]["rounds"] += stats["rounds"]
            bar.update()
        for m in ("baseline", "carryover"):
            _, stats = call(m, [p], stepwise=True)
            per_mode[m]["draft_s"] += stats["draft_s"]
            per_mode[m]["verify_s"] += stats["verify_s"]
            bar.update()
    ar_rate = per_mode["ar"]["tokens"] / per_mode["ar"]["time_s"]
    rows = []
    for m in modes:
        d = per_mode[m]
        rate = d["tokens"] / d["time_s"]
        row = {"mode": m, "tokens": d["tokens"], "tokens_per_s": round(rate, 2), "speedup_vs_ar": round(rate / ar_rate, 3),
               "same_tokens_as_ar": outputs[m] == outputs["ar"]}
        if m != "ar":
            r = max(d["rounds"], 1)
            row.update(tau=round((d["tokens"] - len(prompts)) / r, 3), rounds=d["rounds"],
                       draft_ms_per_round=round(1e3 * d["draft_s"] / r, 2),
                       verify_ms_per_round=round(1e3 * d["verify_s"] / r, 2),
                       draft_fraction=round(d["draft_s"] / max(d["draft_s"] + d["verify_s"], 1e-9), 3))
        rows.append(row)
    base, carry = rows[1], rows[2]
    overhead = (carry["draft_ms_per_round"] - base["draft_ms_per_round"]) / max(
        base["draft_ms_per_round"] + base["verify_ms_per_round"], 1e-9)

    # -- throughput at several batch sizes (prompts cycled to fill the batch)
    throughput = []
    for b in batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(b)]
        row = {"batch": b}
        for m in modes:
            (res, _), dt = _timed(call, m, batch)
            row[f"{m}_tokens_per_s"] = round(sum(len(r.token_ids) for r in res) / dt, 2)
            bar.update()
        row["carryover_over_ar"] = round(row["carryover_tokens_per_s"] / row["ar_tokens_per_s"], 3)
        row["carryover_over_baseline"] = round(row["carryover_tokens_per_s"] / row["baseline_tokens_per_s"], 3)
        throughput.append(row)
    bar.close()
    return {
        "benchmark": "decode", "target": str(target.path), "drafter": str(getattr(drafter, "path", None)),
        "drafter_config": {"kind": drafter.cfg.kind, "layout": drafter.cfg.layout,
                           "proposals": drafter.cfg.num_proposals},
        "num_prompts": len(prompts), "max_new_tokens": max_new_tokens, "rows": rows,
        "carryover_draft_overhead_of_round": round(overhead, 4), "throughput": throughput,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = ["| mode | tokens/s | speedup vs AR | tau | draft ms/round | verify ms/round | same tokens as AR |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['mode']} | {r['tokens_per_s']} | {r['speedup_vs_ar']}x | {r.get('tau', '-')} | "
                     f"{r.get('draft_ms_per_round', '-')} | {r.get('verify_ms_per_round', '-')} | {r['same_tokens_as_ar']} |")
    lines.append(f"\nCarryover's extra drafting work: {100 * result['carryover_draft_overhead_of_round']:.1f}% of a "
                 "baseline round")
    lines += ["", "| batch | AR tok/s | baseline tok/s | carryover tok/s | carryover/AR | carryover/baseline |",
              "|---|---|---|---|---|---|"]
    for t in result["throughput"]:
        lines.append(f"| {t['batch']} | {t['ar_tokens_per_s']} | {t['baseline_tokens_per_s']} | "
                     f"{t['carryover_tokens_per_s']} | {t['carryover_over_ar']}x | {t['carryover_over_baseline']}x |")
    return "\n".join(lines)
