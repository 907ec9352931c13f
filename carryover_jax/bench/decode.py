"""`carryover bench decode`: AR vs speculative baseline vs speculative Carryover, same prompts, one run.

Greedy decoding is lossless, so all three modes emit the same tokens and their tokens/s compare
directly. Each timed call is preceded by an untimed call with the same shapes (compilation).
The draft/verify split comes from the step-wise engine (host-timed rounds); throughput from the
`while_loop` engine.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from carryover_jax.bench import steps
from carryover_jax.bench.prompts import BENCH_PROMPTS
from carryover_jax.decode.buckets import prompt_bucket
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.errors import RequestError
from carryover_jax.eval.paired import speed_ratio


def _timed(fn, *args, **kw):
    fn(*args, **kw)  # compile for these shapes
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def run(target, drafter, *, num_prompts: int = 4, max_new_tokens: int = 64, batch_sizes=(1, 2, 4, 8),
        progress: bool = True) -> dict[str, Any]:
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
        row = {"mode": m, "tokens": d["tokens"], "tokens_per_s": round(rate, 2),
               "speedup_vs_ar": round(rate / ar_rate, 3), "same_tokens_as_ar": outputs[m] == outputs["ar"]}
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
                     f"{r.get('draft_ms_per_round', '-')} | {r.get('verify_ms_per_round', '-')} | "
                     f"{r['same_tokens_as_ar']} |")
    lines.append(f"\nCarryover's extra drafting work: {100 * result['carryover_draft_overhead_of_round']:.1f}% of a "
                 "baseline round")
    lines += ["", "| batch | AR tok/s | baseline tok/s | carryover tok/s | carryover/AR | carryover/baseline |",
              "|---|---|---|---|---|---|"]
    for t in result["throughput"]:
        lines.append(f"| {t['batch']} | {t['ar_tokens_per_s']} | {t['baseline_tokens_per_s']} | "
                     f"{t['carryover_tokens_per_s']} | {t['carryover_over_ar']}x | {t['carryover_over_baseline']}x |")
    return "\n".join(lines)


# ---- `carryover bench decode --breakdown`: the cost of one speculative round -------------------------
def breakdown(target, drafter, *, max_lens=(256, 1024, 4096), prompt_len: int = 100, repeats: int = 25,
              batch: int = 1, carryover: bool = True, progress: bool = True, profile: int = 0) -> dict[str, Any]:
    """Median times of one AR step, one `draft_step`, one `verify_step` and one round (draft + verify)
    at each cache size `max_len`, with the committed length reset to `prompt_len` before every call
    (so every call does the same work). Calls are interleaved across step kinds and cache sizes, so
    slow phases of a shared machine hit all of them alike; ratios to the AR step at the same max_len
    are the numbers to compare. Also reports how many times each jitted step compiled (once per
    max_len is the contract) and that repeated calls compile nothing new. `profile` > 0: that many more calls of
    each kind under `jax.profiler`, each call's time split by XLA op kind (`bench/opprofile.py`)."""
    tcfg, tp, dcfg, dp = target.cfg, target.params, drafter.cfg, drafter.params
    screen = target.greedy_screen()  # greedy steps and verifications as the decode loops run them
    low = sp.cache_slots(dcfg.num_proposals, prompt_len, dcfg.num_proposals + 2)  # one round's tokens, below
    for L in max_lens:
        if not low <= L <= tcfg.max_position_embeddings:
            raise RequestError(f"--max-lens {L}: a cache for a {prompt_len}-token prompt and one round is in "
                               f"[{low}, {tcfg.max_position_embeddings}] (the target's context)")
    sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=carryover and dcfg.carryover)
    rng = np.random.default_rng(0)
    bucket = prompt_bucket(prompt_len)
    tokens = np.zeros((batch, bucket), np.int32)
    tokens[:, :prompt_len] = rng.integers(10, tcfg.vocab_size, (batch, prompt_len))
    tokens, lens = jnp.asarray(tokens), jnp.full((batch,), prompt_len, jnp.int32)
    jitted = {"ar.prefill": ar.prefill, "ar.greedy_step": ar.greedy_step, "sp.prefill": sp.prefill_jit,
              "sp.draft_step": sp.draft_parts, "sp.verify_step": sp.verify_step}

    def compiled():
        try:  # private jax API
            return {k: f._cache_size() for k, f in jitted.items()}
        except AttributeError:
            return None

    before = compiled()
    boxes = {}
    # every timed call is reset to one round from the prompt: room for one round's tokens is enough
    n = dcfg.num_proposals + 2
    for L in max_lens:
        cache, logits = ar.prefill(tcfg, tp, tokens, lens, max_len=L)
        s = sp.prefill(sc, tp, dp, tokens, lens, jnp.full((batch,), n, jnp.int32), jnp.zeros((batch,)),
                       jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=L, out_size=n)
        boxes[L] = {"cache": cache, "tok": jnp.argmax(logits, -1).astype(jnp.int32), "s": s}

    def reset(s):
        return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                         draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                         rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))

    def ar_step(bx):
        tok, bx["cache"] = ar.greedy_step(tcfg, tp, bx["cache"].with_lengths(lens + 0), bx["tok"], screen)
        return tok

    def draft(bx):
        toks, q, bx["s"] = sp.draft_step(sc, tp, dp, reset(bx["s"]))
        bx["toks"], bx["q"] = toks, q
        return toks

    def verify(bx):
        bx["s"] = sp.verify_step(sc, tp, dp, reset(bx["s"]), bx["toks"], bx["q"], screen=screen)
        return bx["s"].num_out

    def round_(bx):
        draft(bx)
        return verify(bx)

    fns = {"ar": ar_step, "draft": draft, "verify": verify, "round": round_}
    for bx in boxes.values():  # compile + warm up
        for f in fns.values():
            jax.block_until_ready(f(bx))
    warm = compiled()
    times = {(L, k): [] for L in max_lens for k in fns}
    for _ in tqdm(range(repeats), desc="bench decode --breakdown", disable=not progress):
        for L in max_lens:
            for k, f in fns.items():
                t = time.perf_counter()
                jax.block_until_ready(f(boxes[L]))
                times[(L, k)].append(time.perf_counter() - t)
    after = compiled()
    # at least 10 rounds of each loop: the ratios' intervals need them (each call is 32 steps)
    looped = _in_loop_ms(sc, tp, dp, boxes, lens, reset, max(10, repeats // 2), progress, screen)
    rows = []
    for L in max_lens:
        ms = {k: 1e3 * float(np.median(times[(L, k)])) for k in fns}
        rows.append({"max_len": L, **{f"{k}_ms": round(v, 2) for k, v in ms.items()},
                     **{f"{k}_over_ar": round(ms[k] / ms["ar"], 3) for k in ("draft", "verify", "round")},
                     **{f"loop_{k}": v for k, v in looped[L].items()}})
    first, last = rows[0], rows[-1]
    growth = {k: round(last[f"{k}_ms"] / first[f"{k}_ms"] - 1, 3) for k in fns}
    out = {"benchmark": "decode-breakdown", "target": str(target.path),
           "drafter": {"kind": dcfg.kind, "layout": dcfg.layout, "proposals": dcfg.num_proposals,
                       "layers": dcfg.backbone.num_layers, "draft_vocab": dcfg.draft_vocab_size},
           "carryover": sc.attend_carried, "batch": batch,
           "prompt_len": prompt_len, "repeats": repeats, "device": str(jax.devices()[0]), "rows": rows,
           f"growth_{first['max_len']}_to_{last['max_len']}": growth}
    if before is not None:
        out["compiles"] = {k: warm[k] - before[k] for k in jitted}
        out["recompiles_while_timing"] = sum(after[k] - warm[k] for k in jitted)
    if profile:
        from carryover_jax.bench.opprofile import profile_calls

        out["profile"] = profile_calls({f"{k} @ {L}": (lambda f=f, bx=boxes[L]: f(bx)) for L in max_lens
                                        for k, f in fns.items()}, profile)
    return out


LOOP_STEPS = 32  # steps per compiled loop in `_in_loop_ms` (what a loop pays once per call is spread over 32)


def _in_loop_ms(sc, tp, dp, boxes, lens, reset, rounds: int, progress: bool,
                screen=None) -> dict[int, dict[str, Any]]:
    """Milliseconds per AR step, verification and round when `LOOP_STEPS` of them run in one compiled
    `fori_loop`, as inside the decode loops (`generate_loop`), which hand the host nothing per step: a
    separately dispatched call also pays the host's handling of every parameter array (~2-3 ms for SmolLM2),
    and XLA moves loop-invariant work (a drafter's weight conversions) out of a loop. Each loop is compiled
    once per max_len, then timed in `rounds` rotated rounds (`steps.rotated_seconds`) with a second AR arm (the
    A/A); per max_len the medians, and verify ÷ AR, round ÷ AR and the A/A as ratios of mean times over the same
    rounds with 95% intervals (`eval.paired.speed_ratio`): the loop's ratios move with a shared machine's memory
    stream, so a ratio is a claim only where the A/A's interval holds 1."""
    def ar_body(args, c):  # greedy: each step's token is the last one's argmax, as in AR decoding
        params, screen = args
        cache, tok = c
        tok, cache = ar.greedy_step(sc.target, params, cache.with_lengths(lens + 0), tok, screen)
        return cache, tok

    def verify_body(args, s):
        params, dparams, toks, q, screen = args
        return sp.verify_step(sc, params, dparams, reset(s), toks, q, screen=screen)

    def round_body(args, s):
        params, dparams, screen = args
        toks, q, s = sp.draft_step(sc, params, dparams, reset(s))
        return sp.verify_step(sc, params, dparams, s, toks, q, screen=screen)

    def looped(body):
        return jax.jit(lambda args, carry: jax.lax.fori_loop(0, LOOP_STEPS, lambda _, c: body(args, c), carry))

    calls = {}
    for L, bx in boxes.items():
        calls[L, "ar"] = functools.partial(looped(ar_body), (tp, screen), (bx["cache"], bx["tok"]))
        calls[L, "verify"] = functools.partial(looped(verify_body), (tp, dp, bx["toks"], bx["q"], screen), bx["s"])
        calls[L, "round"] = functools.partial(looped(round_body), (tp, dp, screen), bx["s"])
        calls[L, "ar again"] = calls[L, "ar"]  # the same program timed as a second arm
    for k in calls:  # compile + warm up
        jax.block_until_ready(calls[k]())
    bar = tqdm(total=rounds, desc="bench decode --breakdown, in a loop", disable=not progress)
    secs = steps.rotated_seconds(calls, rounds, on_round=lambda r, s: bar.update())
    bar.close()
    out = {}
    for L in boxes:
        out[L] = {f"{k}_ms": round(1e3 * float(np.median(secs[L, k])) / LOOP_STEPS, 2)
                  for k in ("ar", "verify", "round")}
        for k in ("verify", "round", "ar again"):  # mean time of k over the AR step's, [95% interval]
            ratio = speed_ratio(secs[L, k], secs[L, "ar"])
            out[L][f"{k.replace(' ', '_')}_over_ar"] = [None if x is None else round(x, 3) for x in ratio]
    return out


def ratio_text(ratio) -> str:
    """(ratio, low, high) as "1.064 [1.031, 1.098]" (the interval left out where there is none)."""
    x, lo, hi = ratio
    return f"{x:.3f}" + ("" if lo is None else f" [{lo:.3f}, {hi:.3f}]")


def format_breakdown(r: dict[str, Any]) -> str:
    d = r["drafter"]
    lines = [f"batch {r['batch']}, prompt {r['prompt_len']} tokens, drafter {d['kind']}/{d['layout']} "
             f"{d['proposals']} proposals {d['layers']} layers, draft vocabulary {d.get('draft_vocab', 'all')}, "
             f"carryover={r['carryover']}, medians of "
             f"{r['repeats']} interleaved calls, {r['device']}",
             "| max_len | AR step ms | draft ms | verify ms | round ms | draft/AR | verify/AR | round/AR |",
             "|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['max_len']} | {x['ar_ms']} | {x['draft_ms']} | {x['verify_ms']} | {x['round_ms']} | "
                     f"{x['draft_over_ar']} | {x['verify_over_ar']} | {x['round_over_ar']} |")
    lines += ["", f"inside a compiled loop ({LOOP_STEPS} steps per call, as in the decode loops: no host handling per "
                  "step; medians; ratios of mean times over the same rotated rounds, [95% interval], and the AR "
                  "step against itself, the A/A):",
              "| max_len | AR step ms | verify ms | round ms | verify/AR | round/AR | A/A |",
              "|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['max_len']} | {x['loop_ar_ms']} | {x['loop_verify_ms']} | {x['loop_round_ms']} | "
                     + " | ".join(ratio_text(x[f"loop_{k}_over_ar"]) for k in ("verify", "round", "ar_again")) + " |")
    key = next(k for k in r if k.startswith("growth_"))
    lines.append(f"\n{key.replace('_', ' ')}: " + ", ".join(f"{k} {100 * v:+.1f}%" for k, v in r[key].items()))
    if "compiles" in r:
        lines.append(f"compiles: {r['compiles']} (while timing: {r['recompiles_while_timing']})")
    if "profile" in r:
        from carryover_jax.bench.opprofile import format_profile

        lines += ["", "where each call's time goes (ms, mean over the profiled calls; exclusive: the columns add up "
                      "to the window):", format_profile(r["profile"])]
    return "\n".join(lines)
