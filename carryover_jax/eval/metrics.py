"""Eval arithmetic on a decode log (pure Python, no JAX): τ, speedup, throughput, confidence intervals.

A decode log is a list of records, one per (mode, temperature, seed, prompt) call at batch 1:

    {"mode": "ar" | drafter label, "dataset": str, "prompt": str, "temperature": float, "seed": int,
     "new_tokens": int, "time_s": float, "prefill_s": float (optional), "rounds": int | None,
     "accepted": [a_1, a_2, ...] | None, "matches_ar": bool | None}

Definitions (as in the Carryover Drafting paper, Table 1):
- τ = mean of (a + 1) over all verification rounds, micro-averaged: Σ_rounds (a + 1) / #rounds over
  every prompt of a dataset (or of the mix). `tau_committed` = Σ(new_tokens - 1) / #rounds instead counts
  only tokens kept (the last round may be cut by a stop token or max_new_tokens; the first token comes
  from the prefill).
- speedup = AR time per output token / speculative time per output token, totals over the same prompts.
  `speedup_decode` the same with every call's prompt prefill (`prefill_s`, when logged) left out of its time.
- At T > 0 each seed is one full pass; the reported value is the mean over seeds with a two-sided
  Student-t confidence interval (half-width) over the per-seed values.
- Paired comparisons (`paired.py`): every pair of arms on the same prompts, the difference and relative gain
  of τ (micro) and of the mean per-prompt speedup with a paired-bootstrap 95% interval, and what that may
  claim ("resolved", "not resolved", "too few prompts", "one timing per prompt", "timing noise").
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

from carryover_jax.eval.paired import paired_comparisons, speedup_interval
from carryover_jax.eval.stats import t_quantile_975

# two-sided 95% Student-t quantiles t_{0.975}(df), df = 1..30
def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% Student-t interval (None for fewer than 2 values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    if n < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, t_quantile_975(n - 1) * math.sqrt(var / n)


def tau(records: Iterable[dict]) -> float:
    rounds = accepted = 0
    for r in records:
        rounds += len(r["accepted"])
        accepted += sum(a + 1 for a in r["accepted"])
    return accepted / rounds if rounds else float("nan")


def tau_committed(records: Iterable[dict]) -> float:
    records = list(records)
    rounds = sum(r["rounds"] for r in records)
    return sum(r["new_tokens"] - 1 for r in records) / rounds if rounds else float("nan")


def time_per_token(records: Iterable[dict]) -> float:
    records = list(records)
    return sum(r["time_s"] for r in records) / max(sum(r["new_tokens"] for r in records), 1)


def speedup(ar_records: Iterable[dict], spec_records: Iterable[dict]) -> float:
    return time_per_token(ar_records) / time_per_token(spec_records)


def speedup_decode(ar_records: Iterable[dict], spec_records: Iterable[dict]) -> float | None:
    """`speedup` with every call's prompt prefill (`prefill_s`) taken out of its time: what the decode loop
    alone gains. Drafting cannot shorten the prefill, so a long prompt hides part of the end-to-end gain (the
    speculative call's prefill also holds the drafter's first pass, left out with it); None for a log stored
    before calls recorded their prefill."""
    ar, spec = list(ar_records), list(spec_records)
    if not all("prefill_s" in r for r in ar + spec):
        return None
    decode = [sum(r["time_s"] - r["prefill_s"] for r in recs) / max(sum(r["new_tokens"] for r in recs), 1)
              for recs in (ar, spec)]
    return decode[0] / decode[1] if decode[1] > 0 else None


def prefill_share(records: Iterable[dict]) -> float | None:
    """The prompt prefill's share of the calls' total time (None without `prefill_s`)."""
    records = list(records)
    if not records or not all("prefill_s" in r for r in records):
        return None
    return sum(r["prefill_s"] for r in records) / max(sum(r["time_s"] for r in records), 1e-12)


def accept_histogram(records: Iterable[dict], num_proposals: int) -> list[int]:
    """Counts of accepted drafts a = 0..P over all rounds."""
    c = Counter(a for r in records for a in r["accepted"])
    return [c.get(a, 0) for a in range(num_proposals + 1)]


def acceptance_profile(histogram: list[int]) -> dict[str, Any]:
    """What bounds τ at a drafter's measured acceptance, from `accept_histogram` (counts of a = 0..P):
    "slot1", the share of rounds that accept the first proposal; "given_previous", slot k's acceptance
    given slot k - 1 was accepted (k = 2..P; None once no round reached slot k - 1); and "tau_unlimited",
    1 + the expected accepted drafts if every slot after P kept slot P's conditional rate (a geometric
    tail): what more proposals could add at this drafter's quality (None when that rate is 1)."""
    n = sum(histogram)
    if n == 0 or len(histogram) < 2:
        raise ValueError("acceptance_profile needs the counts of a = 0..P (P >= 1) over at least one round")
    at_least = [sum(histogram[k:]) / n for k in range(1, len(histogram))]
    given = [at_least[k] / at_least[k - 1] if at_least[k - 1] > 0 else None for k in range(1, len(at_least))]
    last = given[-1] if given else at_least[0]  # P = 1: the one slot's own rate
    if at_least[-1] == 0:
        tail = 0.0  # no round reached slot P: nothing to extend
    else:
        tail = None if last >= 1.0 else at_least[-1] * last / (1.0 - last)
    return {"slot1": at_least[0], "given_previous": given,
            "tau_unlimited": None if tail is None else 1.0 + sum(at_least) + tail}


def rel_gain(new: float, ref: float) -> float:
    return 100.0 * (new / ref - 1.0)


def _select(log, **kw):
    return [r for r in log if all(k not in kw or kw[k] is None or r[k] == kw[k] for k in kw)]


def summarize(log: list[dict], drafters: list[dict]) -> dict[str, Any]:
    """Everything the report shows, from the log alone.

    `drafters`: [{"label", "carryover", "num_proposals", ...}]. Returns
    {"temperatures": {T: {"datasets": {name: {"ar": {...}, label: {...}}}, "gains": [...]}},
     "check": {...}}, with "all" the micro-average over the mix of datasets.
    """
    labels = [d["label"] for d in drafters]
    datasets = list(dict.fromkeys(r["dataset"] for r in log))
    out: dict[str, Any] = {"temperatures": {}}
    for T in sorted({r["temperature"] for r in log}):
        seeds = sorted({r["seed"] for r in log if r["temperature"] == T})
        per_ds: dict[str, Any] = {}
        for ds in datasets + ["all"]:
            dsel = None if ds == "all" else ds
            cell: dict[str, Any] = {}
            ar_by_seed = {s: _select(log, mode="ar", temperature=T, seed=s, dataset=dsel) for s in seeds}
            ar_tps = [sum(r["new_tokens"] for r in v) / max(sum(r["time_s"] for r in v), 1e-12)
                      for v in ar_by_seed.values() if v]
            if not ar_tps:
                continue
            m, ci = mean_ci(ar_tps)
            cell["ar"] = {"tokens_per_s": m, "tokens_per_s_ci": ci, "prompts": len(ar_by_seed[seeds[0]]),
                          "prefill_share": prefill_share(r for v in ar_by_seed.values() for r in v)}
            for d in drafters:
                taus, taus_c, speeds, tps, decode = [], [], [], [], []
                for s in seeds:
                    recs = _select(log, mode=d["label"], temperature=T, seed=s, dataset=dsel)
                    if not recs:
                        continue
                    taus.append(tau(recs))
                    taus_c.append(tau_committed(recs))
                    tps.append(sum(r["new_tokens"] for r in recs) / max(sum(r["time_s"] for r in recs), 1e-12))
                    if ar_by_seed[s]:
                        speeds.append(speedup(ar_by_seed[s], recs))
                        decode.append(speedup_decode(ar_by_seed[s], recs))
                if not taus:
                    continue
                t, t_ci = mean_ci(taus)
                sp, sp_ci = mean_ci(speeds) if speeds else (None, None)
                dc, dc_ci = mean_ci(decode) if decode and None not in decode else (None, None)
                tp, tp_ci = mean_ci(tps)
                recs = _select(log, mode=d["label"], temperature=T, dataset=dsel)
                cell[d["label"]] = {
                    "tau": t, "tau_ci": t_ci, "tau_per_seed": taus, "tau_committed": mean_ci(taus_c)[0],
                    "speedup": sp, "speedup_ci": sp_ci, "speedup_per_seed": speeds,
                    "speedup_interval": (speedup_interval(log, d["label"], T, dsel)
                                         if sp is not None and len(seeds) == 1 else None),
                    "speedup_decode": dc, "speedup_decode_ci": dc_ci,
                    "tokens_per_s": tp, "tokens_per_s_ci": tp_ci,
                    "rounds": sum(r["rounds"] for r in recs), "seeds": len(taus),
                    "accept_histogram": accept_histogram(recs, d["num_proposals"]),
                }
            per_ds[ds] = cell
        gains = []
        for c in (d for d in drafters if d["carryover"]):
            for b in (d for d in drafters if not d["carryover"]):
                g = {"label": c["label"], "vs": b["label"], "datasets": {}}
                for ds, cell in per_ds.items():
                    if c["label"] in cell and b["label"] in cell:
                        x, y = cell[c["label"]], cell[b["label"]]
                        g["datasets"][ds] = {
                            "tau_pct": rel_gain(x["tau"], y["tau"]),
                            "speedup_pct": rel_gain(x["speedup"], y["speedup"]) if x["speedup"] and y["speedup"] else None,
                            "speedup_decode_pct": (rel_gain(x["speedup_decode"], y["speedup_decode"])
                                                   if x["speedup_decode"] and y["speedup_decode"] else None),
                        }
                gains.append(g)
        paired = paired_comparisons(log, labels, T, datasets)
        out["temperatures"][_tkey(T)] = {"seeds": seeds, "datasets": per_ds, "gains": gains, "paired": paired}
    checked = _select(log, temperature=0.0)
    checked = [r for r in checked if r["mode"] != "ar"]
    bad = [f"{r['mode']}/{r['dataset']}/{r['prompt']}" for r in checked if r.get("matches_ar") is False]
    out["check"] = {"sequences": len(checked), "identical_to_ar": len(checked) - len(bad), "mismatches": bad,
                    "drafters": labels}
    return out


def result_summary(result: dict[str, Any]) -> dict[str, Any]:
    """`summarize` of an eval result (its log and drafters), with the check that every throughput batch (if
    any ran) decoded AR's tokens."""
    summary = summarize(result["log"], result["drafters"])
    summary["check"]["throughput_identical_to_ar"] = all(r["identical_to_ar"] for r in result.get("throughput", []))
    return summary


def _tkey(T: float) -> str:
    return f"{float(T):g}"
