"""`carryover eval`: one target, several drafters, the same prompts, one run.

Passes (every call at batch 1, prompt by prompt, timed after an untimed compile call per new shape):
- for each temperature T and seed (one seed at T = 0), on every prompt: AR and every drafter entry, each
  timed `timing_repeats` times interleaved (repeat r runs every mode once, the order rotated by r), so the
  speedup of a prompt is a ratio of neighbouring calls and its spread is measured (`paired.py`).
  At T = 0 every speculative sequence is compared token by token with the AR sequence.
- throughput at each batch size (T = 0, prompts cycled to fill the batch): AR and every drafter, interleaved
  the same way, the median time of each.
The log (one record per call, `metrics` module) is the ground truth; the summary, the Markdown table and
the plots are derived from it and can be re-rendered from the stored JSON.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
from tqdm import tqdm

from carryover_jax import bounds as B
from carryover_jax.config import CARRY_INTERFACES, DataConfig
from carryover_jax.decode.generate import generate, plan_lengths, speculative_generate
from carryover_jax.errors import CarryoverError
from carryover_jax.eval.datasets import load_prompts
from carryover_jax.eval.diagnostics import run_diagnostics
from carryover_jax.eval.metrics import result_summary
from carryover_jax.eval.paired import TIMING_REPEATS, check_resolvable
from carryover_jax.eval.plots import write_plots
from carryover_jax.eval.report import render_markdown, render_offline
from carryover_jax.eval.settings import BOUNDS
from carryover_jax.io import atomic_dir
from carryover_jax.loading import default_mask_token_id, load_drafter
from carryover_jax.models.drafter import check_pair

RESERVED_LABELS = ("ar", "all")


@dataclasses.dataclass(frozen=True)
class DrafterEntry:
    """One arm of the eval: a label, a drafter folder, and whether it decodes with carried rows."""

    label: str
    path: str
    carryover: bool = False
    carry: str = "hidden"  # what the carried rows hold (SpecConfig.carry; the drafter's loss.carry)


def parse_drafter_spec(spec: str) -> DrafterEntry:
    """``LABEL=DIR`` (decodes without carried rows), ``LABEL=DIR:carryover`` (attends to the target's rejected
    verify states) or ``LABEL=DIR:carryover=draft_tokens|target_tokens`` (the interface ablation's rows)."""
    usage = "use LABEL=DIR, LABEL=DIR:carryover or LABEL=DIR:carryover=" + "|".join(CARRY_INTERFACES)
    label, sep, rest = spec.partition("=")
    if not sep or not label or not rest:
        raise CarryoverError(f"--drafter {spec!r}: {usage}")
    if label in RESERVED_LABELS:
        raise CarryoverError(f"--drafter {spec!r}: the label {label!r} is reserved")
    path, carry = rest, None
    head, colon, tail = rest.rpartition(":carryover")
    if colon and (tail == "" or tail.startswith("=")):
        path, carry = head, tail[1:] or "hidden"
        if carry not in CARRY_INTERFACES:
            raise CarryoverError(f"--drafter {spec!r}: unknown carried-row interface {carry!r}; {usage}")
    if not path:
        raise CarryoverError(f"--drafter {spec!r}: no drafter folder")
    return DrafterEntry(label, path, carry is not None, carry or "hidden")


def check_drafter(label: str, cfg, target_cfg, mask_token_id: int | None) -> None:
    """One-line refusal of a drafter built for another target or another MASK row."""
    try:
        check_pair(cfg, target_cfg)
    except CarryoverError as e:
        raise CarryoverError(f"drafter {label}: {e}") from None
    if mask_token_id is not None and cfg.mask_token_id != mask_token_id:
        raise CarryoverError(f"drafter {label}: MASK token id {cfg.mask_token_id} does not match the target's "
                             f"MASK id {mask_token_id}")


def load_entries(target, entries: Sequence[DrafterEntry], mask_token_id: int | None = None, dtype=None):
    """Load every drafter (carryover as the entry asks) and check it against the target and the MASK id.

    `mask_token_id=None`: the target's default MASK row when it has one, else the drafters must agree."""
    if not entries:
        raise CarryoverError("give at least one --drafter LABEL=DIR[:carryover]")
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise CarryoverError(f"duplicate drafter labels: {labels}")
    if mask_token_id is None:
        try:
            mask_token_id = default_mask_token_id(target)
        except CarryoverError:
            mask_token_id = None
    out = []
    for e in entries:
        if not Path(e.path).exists():
            raise CarryoverError(f"drafter {e.label}: no such folder {e.path}")
        # --dtype also puts the drafter's params in its compute dtype: the run's, or --drafter-dtype's when set
        d = load_drafter(e.path, carryover=e.carryover, dtype=target.cfg.numerics.drafter_dtype if dtype else None,
                         numerics=target.cfg.numerics)
        check_drafter(e.label, d.cfg, target.cfg, mask_token_id)
        if mask_token_id is None:
            mask_token_id = d.cfg.mask_token_id  # tokenizer-less target: the first drafter sets it
        out.append((e, d))
    return out


@dataclasses.dataclass(frozen=True)
class Item:
    dataset: str
    id: str
    ids: tuple[int, ...]


def encode_items(target, prompts, *, chat: bool = True) -> list[Item]:
    """EvalPrompts -> token ids through the target's chat template."""
    return [Item(p.dataset, p.id, tuple(target.encode(p.as_messages(), chat=chat))) for p in prompts]


def drafter_info(entry: DrafterEntry, d) -> dict[str, Any]:
    c = d.cfg
    return {"label": entry.label, "path": str(entry.path), "carryover": entry.carryover, "carry": entry.carry,
            "kind": c.kind,
            "layout": c.layout, "num_proposals": c.num_proposals, "mask_token_id": c.mask_token_id,
            "num_layers": c.backbone.num_layers, "target_layer_ids": list(c.target_layer_ids)}


class _Runner:
    """Calls AR / speculative decoding; an untimed call first for every new compiled shape (`warm`)."""

    def __init__(self, target, drafters, *, max_new_tokens, max_len, stop_token_ids, top_k, top_p):
        self.target, self.drafters = target, dict((e.label, (e, d)) for e, d in drafters)
        self.kw = dict(max_new_tokens=max_new_tokens, max_len=max_len, stop_token_ids=stop_token_ids,
                       top_k=top_k, top_p=top_p)
        self.seen: set = set()

    def _key(self, mode, batch, temperature):
        lens = [len(x) for x in batch]
        extra = 0 if mode == "ar" else self.drafters[mode][1].cfg.num_proposals + 1
        m = self.kw["max_new_tokens"]
        shape = plan_lengths(lens, [m + extra] * len(lens), self.kw["max_len"],
                             self.target.cfg.max_position_embeddings)
        return mode, len(batch), shape, temperature > 0

    def warm(self, mode, batch: list[list[int]], temperature: float, seed: int) -> None:
        key = self._key(mode, batch, temperature)
        if key not in self.seen:
            self(mode, batch, temperature, seed)  # compile for these shapes (not timed)
            self.seen.add(key)

    def __call__(self, mode, batch: list[list[int]], temperature: float, seed: int):
        """-> (generations, (wall time, its prompt prefill) in s) of one call (the same seed gives the same
        tokens every time)."""
        if mode == "ar":
            res = generate(self.target, batch, temperature=temperature, seed=seed, chat=False, **self.kw)
            stats = res[0].stats
        else:
            e, d = self.drafters[mode]
            res, stats = speculative_generate(self.target, d, batch, carryover=e.carryover, carry=e.carry,
                                              temperature=temperature, seed=seed, chat=False, **self.kw)
        return res, (stats["time_s"], stats["prefill_s"])

    def interleaved(self, modes: Sequence[str], batch: list[list[int]], temperature: float, seed: int,
                    repeats: int) -> dict[str, tuple[list, list[tuple[float, float]]]]:
        """Every mode `repeats` times, alternated: repeat r times each mode once, the order rotated by r so
        no mode always runs first. Returns {mode: (generations of its first call, its (time, prefill)s)}."""
        for m in modes:
            self.warm(m, batch, temperature, seed)
        out: dict[str, tuple[list, list[tuple[float, float]]]] = {}
        for r in range(repeats):
            k = r % len(modes)
            for m in list(modes[k:]) + list(modes[:k]):
                res, t = self(m, batch, temperature, seed)
                if m in out:
                    out[m][1].append(t)
                else:
                    out[m] = (res, [t])
        return out


def _timing(times: list[tuple[float, float]]) -> dict[str, Any]:
    """The median call time and prompt prefill, and every repeat's (the prefill lets a report say how much of
    the time decoding alone took: `metrics.speedup_decode`)."""
    total, prefill = [t for t, _ in times], [p for _, p in times]
    return {"time_s": statistics.median(total), "time_s_repeats": total,
            "prefill_s": statistics.median(prefill), "prefill_s_repeats": prefill}


def run_eval(target, drafters, items: Sequence[Item], *, max_new_tokens: int = 128,
             temperatures: Sequence[float] = (0.0, 1.0), seeds: int = 3, batch_sizes: Sequence[int] = (1, 2, 4, 8),
             max_len: int | None = None, stop_token_ids=None, top_k: int = 0, top_p: float = 1.0,
             progress: bool = True, diagnostics: Callable | None = None,
             timing_repeats: int = TIMING_REPEATS) -> dict[str, Any]:
    """Run every pass and return the full result (config, drafters, log, throughput, summary).

    Per prompt, AR and every arm are timed `timing_repeats` times, interleaved (`_Runner.interleaved`);
    a record keeps every time (`time_s_repeats`) and their median (`time_s`)."""
    if not items:
        raise CarryoverError("no prompts")
    B.check("seeds", seeds, BOUNDS["seeds"])
    B.check("timing_repeats", timing_repeats, BOUNDS["timing_repeats"])
    run = _Runner(target, drafters, max_new_tokens=max_new_tokens, max_len=max_len, stop_token_ids=stop_token_ids,
                  top_k=top_k, top_p=top_p)
    labels = [e.label for e, _ in drafters]
    passes = [(float(T), s) for T in temperatures for s in (range(seeds) if T > 0 else [0])]
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    log: list[dict] = []
    bar = tqdm(total=len(passes) * len(items), desc="eval prompts", unit="prompt", disable=not progress)
    for T, seed in passes:
        bar.set_postfix_str(f"T={T:g} seed={seed}")
        for i, it in enumerate(items):
            s = seed * 100_003 + i  # a different stream per prompt, the same for every mode
            calls = run.interleaved(["ar", *labels], [list(it.ids)], T, s, timing_repeats)
            res, times = calls["ar"]
            ref = res[0].token_ids
            log.append({"mode": "ar", "dataset": it.dataset, "prompt": it.id, "temperature": T, "seed": seed,
                        "new_tokens": len(ref), **_timing(times), "rounds": None, "accepted": None,
                        "matches_ar": None})
            for label in labels:
                res, times = calls[label]
                g = res[0]
                log.append({"mode": label, "dataset": it.dataset, "prompt": it.id, "temperature": T, "seed": seed,
                            "new_tokens": len(g.token_ids), **_timing(times), "rounds": g.stats["rounds"],
                            "accepted": g.stats["accepted_per_round"],
                            "matches_ar": (g.token_ids == ref) if T == 0 else None})
            bar.update()
    bar.close()

    throughput = []
    if batch_sizes:
        tb = tqdm(total=len(batch_sizes), desc="eval throughput", disable=not progress)
        for b in batch_sizes:
            batch = [list(items[i % len(items)].ids) for i in range(b)]
            calls = run.interleaved(["ar", *labels], batch, 0.0, 0, timing_repeats)
            ref = [r.token_ids for r in calls["ar"][0]]
            row: dict[str, Any] = {"batch": b}
            same = True
            for m in ["ar", *labels]:
                res, times = calls[m]
                row[m] = sum(len(r.token_ids) for r in res) / max(statistics.median(t for t, _ in times), 1e-12)
                same &= [r.token_ids for r in res] == ref
            row["identical_to_ar"] = same
            throughput.append(row)
            tb.update()
        tb.close()

    infos = [drafter_info(e, d) for e, d in drafters]
    result = {
        "version": 1, "started": started,
        "target": str(getattr(target, "path", None)),
        "config": {"max_new_tokens": max_new_tokens, "temperatures": [float(t) for t in temperatures],
                   "seeds": seeds, "batch_sizes": list(batch_sizes), "max_len": max_len, "top_k": top_k,
                   "timing_repeats": timing_repeats,
                   "top_p": top_p, "datasets": {ds: sum(1 for it in items if it.dataset == ds)
                                                for ds in dict.fromkeys(it.dataset for it in items)}},
        "device": _device(),
        "drafters": infos, "log": log, "throughput": throughput,
    }
    if diagnostics is not None:
        result["diagnostics"] = diagnostics()
    result["summary"] = result_summary(result)
    return result


def _device() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')} x{jax.device_count()}"


def write_outputs(result: dict[str, Any], out: str | Path, *, plots: bool = True) -> Path:
    """results.json, report.md and the PNGs, written into `out` atomically (all or nothing)."""
    def write(tmp: Path):
        (tmp / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        if result.get("offline"):  # expected rounds on rollouts: τ tables only, nothing timed to plot
            (tmp / "report.md").write_text(render_offline(result))
            return
        (tmp / "report.md").write_text(render_markdown(result))
        if plots:
            write_plots(result, tmp)

    return atomic_dir(out, write)


def load_result(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise CarryoverError(f"{p}: no such results file")
    try:
        result = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CarryoverError(f"{p}: not valid JSON ({e.msg})") from None
    if not isinstance(result, dict) or "log" not in result or "drafters" not in result:
        raise CarryoverError(f"{p}: not a carryover eval result (no log/drafters)")
    if not result.get("offline"):
        # the summary is derived from the log: rebuilt, so a result stored by an older version gains what the
        # summary holds now (the paired comparisons' per-prompt values) and a hand-edited one cannot disagree
        try:
            result["summary"] = result_summary(result)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CarryoverError(f"{p}: a malformed eval result ({type(e).__name__}: {e})") from None
    return result


def load_items(target, datasets: Sequence[str], *, prompts_per_dataset: int, max_prompt_tokens: int,
               system: str | None, heldout_per_mille: int | None, chat: bool, log=None):
    """The eval's prompts as token ids: (items, skipped-long-prompt counts, the held-out split used)."""
    if heldout_per_mille is None:
        heldout_per_mille = DataConfig.heldout_per_mille  # the training split's default

    def fits(p):
        return len(target.encode(p.as_messages(), chat=chat)) <= max_prompt_tokens

    prompts, skipped = load_prompts(list(datasets), limit=prompts_per_dataset, system=system,
                                    heldout_per_mille=heldout_per_mille, fits=fits)
    if any(skipped.values()) and log is not None:
        log(f"eval: skipped prompts longer than {max_prompt_tokens} tokens: {skipped}")
    return encode_items(target, prompts, chat=chat), skipped, heldout_per_mille


def evaluate(target, drafters: Sequence[DrafterEntry | str], *, datasets: Sequence[str] = ("humaneval", "mtbench", "sharegpt"),
             prompts_per_dataset: int = 8, max_prompt_tokens: int = 512, system: str | None = None,
             heldout_per_mille: int | None = None, chat: bool = True, max_new_tokens: int = 128,
             temperatures: Sequence[float] = (0.0, 1.0), seeds: int = 3, batch_sizes: Sequence[int] = (1, 2, 4, 8),
             max_len: int | None = None, mask_token_id: int | None = None, dtype: str | None = None,
             diagnostics: bool = False, diagnostic_prompts: int = 4, out: str | Path | None = None,
             plots: bool = True, progress: bool = True, log=None,
             timing_repeats: int = TIMING_REPEATS, min_prompts: int | None = None) -> dict[str, Any]:
    """The whole `carryover eval` as one call (what `carryover pipeline` builds on).

    `target`: a loaded `Target` (with a tokenizer). `drafters`: `DrafterEntry`s or ``LABEL=DIR[:carryover]``
    strings. Loads and checks the drafters, reads and encodes the prompts, runs every pass, and writes
    `out` (results.json, report.md, PNGs) when given; `min_prompts`: fewer prompts that fit are refused before
    any decoding (an A/B that could resolve nothing, paired.py). Returns the result dict."""
    entries = [parse_drafter_spec(d) if isinstance(d, str) else d for d in drafters]
    loaded = load_entries(target, entries, mask_token_id, dtype=dtype)
    items, skipped, heldout_per_mille = load_items(target, datasets, prompts_per_dataset=prompts_per_dataset,
                                                   max_prompt_tokens=max_prompt_tokens, system=system,
                                                   heldout_per_mille=heldout_per_mille, chat=chat, log=log)
    if min_prompts:
        check_resolvable(len(items), "eval: the prompts that fit")
    diag = None  # the diagnostics pass, run after the decoding passes when asked for
    if diagnostics:
        per_ds: dict[str, int] = {}
        diag_items = []
        for it in items:
            if per_ds.get(it.dataset, 0) < diagnostic_prompts:
                diag_items.append(it)
                per_ds[it.dataset] = per_ds.get(it.dataset, 0) + 1

        def run_diag():
            return run_diagnostics(target, loaded, diag_items, max_new_tokens=max_new_tokens, max_len=max_len,
                                   progress=progress)

        diag = run_diag

    result = run_eval(target, loaded, items, max_new_tokens=max_new_tokens, temperatures=temperatures, seeds=seeds,
                      batch_sizes=batch_sizes, max_len=max_len, progress=progress, diagnostics=diag,
                      timing_repeats=timing_repeats)
    result["config"].update(skipped_long_prompts=skipped, max_prompt_tokens=max_prompt_tokens, system=system,
                            chat=chat, heldout_per_mille=heldout_per_mille)
    if out is not None:
        write_outputs(result, out, plots=plots)
    return result
