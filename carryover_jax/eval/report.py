"""Markdown report of an eval result (shaped like the paper's Table 1), rendered from the stored JSON."""

from __future__ import annotations

from typing import Any

import numpy as np

from carryover_jax.eval.metrics import accept_histogram, acceptance_profile, result_summary
from carryover_jax.eval.paired import MIN_PROMPTS, MIN_TIMING_REPEATS


def _num(x, digits=2, ci=None, suffix="", interval=None):
    if x is None:
        return "-"
    s = f"{x:.{digits}f}{suffix}"
    if ci is not None:
        s += f" ± {ci:.{digits}f}"
    elif interval is not None:
        s += f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
    return s


def _pct(x):
    return "-" if x is None else f"{x:+.1f}%"


def _recall_rows(rep: dict) -> list[str]:
    """A per-slot Recall@1/@16 table, carried rows supplied (ON) vs withheld (OFF), then a blank line."""
    n = len(rep["recall1_on"])
    rows = ["| slot | " + " | ".join(str(i + 1) for i in range(n)) + " |", "|---|" + "---|" * n]
    for key, name in (("recall1_on", "R@1 ON"), ("recall1_off", "R@1 OFF"),
                      ("recall16_on", "R@16 ON"), ("recall16_off", "R@16 OFF")):
        rows.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in rep[key]) + " |")
    return rows + [""]


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """The stored summary, or one derived from the log (a result written without it)."""
    return result.get("summary") or result_summary(result)


def _main_table(summary, drafters, metric: str, title: str, digits: int, suffix: str = "") -> list[str]:
    labels = [d["label"] for d in drafters]
    gains = []
    for T, tb in summary["temperatures"].items():
        for g in tb["gains"]:
            if (g["label"], g["vs"]) not in gains:
                gains.append((g["label"], g["vs"]))
    head = ["dataset", "T"] + labels + [f"{c} vs {b}" for c, b in gains]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for T, tb in summary["temperatures"].items():
        gmap = {(g["label"], g["vs"]): g["datasets"] for g in tb["gains"]}
        for ds, cell in tb["datasets"].items():
            row = [f"**{ds}**" if ds == "all" else ds, T]
            for lab in labels:
                c = cell.get(lab)
                row.append(_num(c[metric], digits, c.get(f"{metric}_ci"), suffix, c.get(f"{metric}_interval"))
                           if c else "-")
            for key in gains:
                row.append(_pct(gmap.get(key, {}).get(ds, {}).get(f"{metric}_pct")))
            lines.append("| " + " | ".join(row) + " |")
    return lines


def _decode_table(summary, drafters) -> list[str]:
    """The speedup with the prompt prefill left out, and the prefill's share of AR's time (logs that timed it)."""
    cells = [c for tb in summary["temperatures"].values() for c in tb["datasets"].values()]
    if not any(c.get(d["label"], {}).get("speedup_decode") for c in cells for d in drafters):
        return []
    lines = _main_table(summary, drafters, "speedup_decode", "Speedup over AR, prompt prefill left out (batch 1)",
                        2, "x")
    shares = [(ds, T, c["ar"]["prefill_share"]) for T, tb in summary["temperatures"].items()
              for ds, c in tb["datasets"].items() if c.get("ar", {}).get("prefill_share") is not None]
    return lines + ["", "A drafter cannot shorten the prompt's prefill, so the prefill dilutes the end-to-end "
                    "speedup above; its share of AR's time: "
                    + ", ".join(f"{ds} (T = {T}) {100 * x:.0f}%" for ds, T, x in shares) + ".", ""]


def render_curve(curve: list[dict[str, Any]]) -> list[str]:
    """The rows of `curve.curve_rows` as a Markdown table (with the offline τ column when scored)."""
    off = any("tau_offline" in r for r in curve)
    n = next((r.get("offline_rollouts") for r in curve if "tau_offline" in r), None)
    head = "| step | training minutes | τ | speedup over AR |" + (f" τ offline ({n} rollouts) |" if off else "")
    return [head, "|---|---|---|---|" + ("---|" if off else "")] + [
        f"| {r['step']} | {'-' if r['train_minutes'] is None else r['train_minutes']} | {r['tau']:.3f} | "
        f"{r['speedup']:.2f}x |" + (f" {r['tau_offline']:.3f} |" if "tau_offline" in r else (" - |" if off else ""))
        for r in curve]


def render_markdown(result: dict[str, Any]) -> str:
    summary = summary_of(result)
    drafters = result["drafters"]
    cfg = result.get("config", {})
    L: list[str] = ["# carryover eval", ""]
    L.append(f"- target: `{result.get('target')}`; device: {result.get('device', '?')}; started {result.get('started', '?')}")
    L.append(f"- max_new_tokens {cfg.get('max_new_tokens')}; temperatures {cfg.get('temperatures')}; "
             f"seeds at T > 0: {cfg.get('seeds')}; prompts per dataset: {cfg.get('datasets')}")
    for d in drafters:
        L.append(f"- drafter **{d['label']}**: `{d['path']}` ({d.get('kind')}/{d.get('layout')}, "
                 f"{d['num_proposals']} proposals, MASK {d.get('mask_token_id')}), carried rows "
                 f"{'ON' if d['carryover'] else 'off'}")
    L += ["", "τ = mean of (accepted + 1) over all verification rounds, micro-averaged over the prompts of a "
              "dataset (**all** = the mix). Speedup = AR time per output token / speculative time per output "
              "token, same prompts, batch 1, same run (compile time excluded); with one seed [its 95% interval], the "
              "paired bootstrap over prompts (`eval/paired.speedup_interval`). At T > 0: mean over seeds "
              "± the half-width of a 95% Student-t interval. Gains are relative (Carryover arm vs each arm "
              "without carried rows).", ""]
    L += _main_table(summary, drafters, "tau", "Acceptance length τ", 3)
    L.append("")
    L += _main_table(summary, drafters, "speedup", "Speedup over AR (batch 1)", 2, "x")
    L.append("")
    L += _decode_table(summary, drafters)

    L += render_paired(summary)

    ck = summary["check"]
    L.append("### Losslessness check (T = 0)")
    L.append("")
    if ck["sequences"] == 0:
        L.append("No T = 0 pass was run: nothing was checked against AR decoding.")
    elif not ck["mismatches"]:
        nd = len(ck["drafters"])
        L.append(f"All {ck['sequences']} speculative sequences at T = 0 ({nd} drafter{'s' * (nd != 1)}) are "
                 "token-identical to the AR sequences of the same run.")
    else:
        L.append(f"**{len(ck['mismatches'])} of {ck['sequences']} speculative sequences at T = 0 differ from AR**: "
                 + ", ".join(ck["mismatches"][:20]) + (" …" if len(ck["mismatches"]) > 20 else ""))
    if "throughput_identical_to_ar" in ck and result.get("throughput"):
        L.append(f"Throughput batches identical to AR: {'yes' if ck['throughput_identical_to_ar'] else '**NO**'}.")
    L.append("")

    tp = result.get("throughput") or []
    if tp:
        labels = [d["label"] for d in drafters]
        L += ["### Throughput (output tokens/s, T = 0)", "",
              "| batch | AR | " + " | ".join(labels) + " |", "|" + "---|" * (2 + len(labels))]
        for r in tp:
            L.append(f"| {r['batch']} | {r['ar']:.1f} | " + " | ".join(
                f"{r[lab]:.1f} ({r[lab] / r['ar']:.2f}x)" for lab in labels) + " |")
        L.append("")

    t0 = summary["temperatures"].get("0", {}).get("datasets", {}).get("all", {})
    L += render_acceptance({d["label"]: t0[d["label"]]["accept_histogram"] for d in drafters if t0.get(d["label"])})

    diag = result.get("diagnostics")
    if diag:
        L += render_diagnostics(diag)
    curve = result.get("curve")
    if curve:
        L += ["### τ and speedup against training time (T = 0, all datasets)", "", *render_curve(curve), ""]
    L.append("Plots: `tau.png` (τ per dataset per drafter), `throughput.png` (throughput vs batch), "
             "`accept_lengths.png` (distribution of accepted lengths)"
             + (", `diagnostics.png` (ON/OFF replay, re-convergence)" if diag else "")
             + (", `attention.png` (attention to carried rows)" if diag and diag.get("attention") else "")
             + (", `curve.png` (τ and speedup vs training time)" if curve else "") + ".")
    return "\n".join(L) + "\n"


def _ci(c: dict, key: str, digits: int, suffix: str = "") -> str:
    if c[f"{key}_ci"] is None:
        return f"{c[key]:+.{digits}f}{suffix}"
    lo, hi = c[f"{key}_ci"]
    return f"{c[key]:+.{digits}f}{suffix} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _claim(c: dict) -> str:
    """What a comparison may say (paired.py): resolved or not, or why it cannot be."""
    if c["status"] == "too few prompts":
        return f"too few prompts (< {MIN_PROMPTS})"
    if c["status"] == "one timing per prompt":
        return "not resolved: one timing per prompt"
    return c["status"]


def _speedup_cells(sp: dict | None) -> str:
    if sp is None:
        return "- | - |"
    if sp["status"] == "timing noise":
        return (f"±{sp['noise_bound_pct']:.1f}% timing-noise bound | not a gain: identical rounds "
                f"({sp['gain_pct']:+.1f}% is noise) |")
    return f"{_ci(sp, 'gain_pct', 1, '%')} | {_claim(sp)} |"


PAIRED_RULES = (f"**resolved**: the interval excludes 0, on >= {MIN_PROMPTS} prompts (fewer: **too few prompts**, no "
                "interval; below 6 no 95% interval exists at all). Speedup intervals carry the timing spread within "
                f"each prompt (AR and the arms timed interleaved, >= {MIN_TIMING_REPEATS} repeats; one timing per "
                "prompt resolves nothing); two arms that accepted the same drafts in every round did the same "
                "work, so their speed difference is reported as a **timing-noise bound**, never as a gain.")


def render_acceptance(histograms: dict[str, list[int]]) -> list[str]:
    """The accepted drafts per round of each drafter at T = 0 (counts of a = 0..P), and what they bound τ to."""
    L = ["### Accepted drafts per round (T = 0, all datasets)", "",
         "Slot 1: the share of rounds that accept the first proposal; then each slot's acceptance given the one "
         "before it. τ, unlimited proposals: 1 + the expected accepted drafts if every slot after P kept slot P's "
         "rate: what more proposals could add at this drafter's quality.", "",
         "| drafter | rounds | mean accepted | a = 0 | a = P | slot 1 | slot k given k − 1 | τ, unlimited proposals |",
         "|---|---|---|---|---|---|---|---|"]
    for label, h in histograms.items():
        n = max(sum(h), 1)
        mean = sum(a * k for a, k in enumerate(h)) / n
        slot1 = given = bound = "–"
        if sum(h) and len(h) > 1:
            prof = acceptance_profile(h)
            slot1 = f"{prof['slot1']:.3f}"
            given = " / ".join("–" if g is None else f"{g:.3f}" for g in prof["given_previous"]) or "–"
            bound = "–" if prof["tau_unlimited"] is None else f"{prof['tau_unlimited']:.3f}"
        L.append(f"| {label} | {sum(h)} | {mean:.3f} | {100 * h[0] / n:.1f}% | {100 * h[-1] / n:.1f}% | "
                 f"{slot1} | {given} | {bound} |")
    return L + [""]


def render_paired(summary: dict[str, Any]) -> list[str]:
    """The paired comparisons of every pair of arms."""
    rows = []
    for T, tb in summary["temperatures"].items():
        for pr in tb["paired"]["pairs"]:
            for ds, cell in pr["datasets"].items():
                t, sp = cell.get("tau"), cell.get("speedup")
                if t is None:
                    continue
                rows.append(f"| {pr['label']} vs {pr['vs']} | {'**all**' if ds == 'all' else ds} | {T} | "
                            f"{t['prompts']} x {t['seeds']} | {sp['repeats'] if sp else '-'} | "
                            f"{_ci(t, 'diff', 3)} | {_ci(t, 'gain_pct', 1, '%')} | {_claim(t)} | "
                            + _speedup_cells(sp))
    if not rows:
        return []
    return ["### Paired comparisons (same prompts)", "",
            "Every pair of arms on the same prompts (and seeds): the difference of τ (micro-averaged, as in the τ "
            "table) and the relative gains of τ and of the mean per-prompt speedup over AR, each with a 95% "
            "paired-bootstrap interval (prompts resampled with replacement, then each prompt's timing repeats; at "
            "T > 0 a prompt pools its seeds). " + PAIRED_RULES + " Per-prompt values: `results.json`, "
            "`summary.temperatures.T.paired.values`.", "",
            "| arms | dataset | T | prompts x seeds | timings per prompt | Δτ [95%] | τ gain [95%] | "
            "τ: resolved? | speedup gain [95%] | speedup: resolved? |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _attention_rows(attention: dict[str, dict[str, Any]]) -> list[str]:
    """Per arm and carried count r: the block's mean attention mass on the context (all of it, and the rows
    shown in attention.png), on the carried rows and on the block itself (eval/attention.py)."""
    rows = []
    for lab, rep in attention.items():
        w, P = rep["window"], rep["P"]
        for r, cell in enumerate(rep["by_carried"]):
            if not cell["rounds"]:
                continue
            m = np.asarray(cell["mean"]).mean(axis=0)  # over the block queries
            rows.append(f"| {lab} | {'ON' if rep['carryover'] else 'off'} | {r} | {cell['rounds']} | "
                        f"{cell['context_mass']:.3f} | {m[:w].sum():.3f} | {m[w:w + P].sum():.3f} | "
                        f"{m[w + P:].sum():.3f} |")
    return ["| arm | carried rows | r | rounds | context (all) | context (shown) | carried rows | block |",
            "|---|---|---|---|---|---|---|---|", *rows]


def render_diagnostics(diag: dict[str, Any]) -> list[str]:
    L = ["### Diagnostics (T = 0)", ""]
    for lab, rep in diag.get("replay", {}).items():
        L += [f"ON/OFF replay, drafter **{lab}** ({rep['rounds']} rounds with carried rows; same weights and "
              "anchors, carried rows supplied vs withheld; target-token recall per proposal slot):", "",
              *_recall_rows(rep)]
    for lab, rep in diag.get("replay_recorded", {}).items():
        c = rep["carried"]
        L += [f"ON/OFF replay on recorded sequences (training-style, `train/dvd.py`), drafter **{lab}**: "
              f"{rep['sequences']} AR outputs, {rep['anchors_per_sequence']} anchors each, draft 2 at s + a + 1 "
              f"after a greedy draft 1; anchors with carried rows per slot: {c['slot_counts']}", "",
              *_recall_rows(c)]
    if diag.get("attention"):
        w = next(iter(diag["attention"].values()))["window"]
        L += ["Attention of the block to carried rows (Figure 6 of the paper, `attention.png`): the drafter's "
              "attention probabilities, averaged over heads, draft layers, block queries and the rounds with r "
              f"carried rows (the previous round's P − a); \"shown\" = the {w} context rows before the anchor.", "",
              *_attention_rows(diag["attention"]), ""]
    for lab, rc in diag.get("reconvergence", {}).items():
        L.append(f"Re-convergence, drafter **{lab}**: {rc['rejections']} rejected branches; "
                 f"{100 * rc['reappear_rate']:.1f}% of the rejected suffix tokens after the first reappear in "
                 f"the next {rc['window']} committed tokens; position-aligned at offset 1..: "
                 + ", ".join("-" if v is None else f"{v:.3f}" for v in rc["aligned_by_offset"][:8]) + ".")
    L.append("")
    return L


def render_offline(result: dict[str, Any]) -> str:
    s = result["summary"]
    labels = [d["label"] for d in result["drafters"]]
    cfg = result.get("config", {})
    L = ["# carryover eval --offline", "",
         f"- target: `{result.get('target')}`; device: {result.get('device', '?')}; started {result.get('started', '?')}",
         f"- rollouts: the target's own outputs, max_new_tokens {cfg.get('max_new_tokens')}, temperatures "
         f"{cfg.get('temperatures')}, seeds at T > 0: {cfg.get('seeds')}; prompts per dataset: {cfg.get('datasets')}"]
    for d in result["drafters"]:
        L.append(f"- drafter **{d['label']}**: `{d['path']}` ({d.get('kind')}/{d.get('layout')}, "
                 f"{d['num_proposals']} proposals), "
                 + (f"carried rows ON ({d.get('carry', 'hidden')}): rounds replayed" if d.get("carryover")
                    else "no carried rows: expected rounds"))
    L += ["", "Every arm on the same rollouts (the target's own outputs, recorded once). Arms without carried rows: "
              "expected decoding rounds from one teacher-forced drafter pass (exact at T = 0: the greedy engine's "
              "round count; at T > 0 the acceptance min(1, q/p) of the realized rollout token). Carryover arms: the "
              "engine's rounds replayed on the rollout (exact at T = 0; at T > 0 one seeded draw of the engine's "
              "rounds given the rollout, unbiased: `eval/replay.py`). τ = tokens the rounds generate (all but the "
              "prefill's first) / rounds, summed over the rollouts of a dataset (**all** = the mix). No AR timing, "
              "so no speedup: that needs `carryover eval` without --offline.", "",
          "| dataset | T | rollouts | " + " | ".join(labels) + " |", "|" + "---|" * (3 + len(labels))]
    for T, tb in s["temperatures"].items():
        for ds, cell in tb["datasets"].items():
            n = max((c["rollouts"] for c in cell.values()), default=0)
            L.append(f"| {'**all**' if ds == 'all' else ds} | {T} | {n} | "
                     + " | ".join(f"{cell[lab]['tau']:.3f}" if lab in cell else "-" for lab in labels) + " |")
    P = {d["label"]: d["num_proposals"] for d in result["drafters"]}
    greedy = {lab: [e for e in result.get("log", []) if e["mode"] == lab and e["temperature"] == 0 and "accepted" in e]
              for lab in labels}
    if any(greedy.values()):
        hists = {lab: accept_histogram(logs, P[lab]) for lab, logs in greedy.items() if logs}
        L += [""] + render_acceptance(hists)[:-1]
    rows = []
    for T, tb in s["temperatures"].items():
        for pr in tb["paired"]["pairs"]:
            for ds, c in pr["datasets"].items():
                t = c.get("tau")
                if t:
                    rows.append(f"| {pr['label']} vs {pr['vs']} | {'**all**' if ds == 'all' else ds} | {T} | "
                                f"{t['prompts']} x {t['seeds']} | {_ci(t, 'diff', 3)} | {_ci(t, 'gain_pct', 1, '%')} | "
                                f"{_claim(t)} |")
    if rows:
        L += ["", "### Paired comparisons (same rollouts)", "",
              "The difference of τ (micro, as in the table above: a ratio of summed rounds) and its relative gain, "
              "95% paired-bootstrap interval over prompts (at T > 0 a prompt pools its seeds). " + PAIRED_RULES, "",
              "| arms | dataset | T | prompts x seeds | Δτ [95%] | τ gain [95%] | resolved? |",
              "|---|---|---|---|---|---|---|",
              *rows]
    return "\n".join(L) + "\n"
