"""`carryover bench decode --torch`: the PyTorch loop (`carryover_jax.export.speculative`) beside transformers'
AR `generate`, z-lab's `dflash_generate` and the JAX engine — same prompts, same weights, one run, batch 1.

The drafter is exported once (float32) to a temporary folder in the format its kind holds (z-lab for a
DFlash drafter in the z-lab layout, DeepSpec for the deepspec layout, the native folder for a draft
vocabulary); every engine reads that folder. z-lab's loop comes from a z-lab/dflash checkout given by
`--zlab DIR` (or `$CARRYOVER_ZLAB_DFLASH`): it is imported from there at run time, never copied into this
repository; without one, or for a drafter z-lab's class cannot hold, its column is skipped and says why.
Greedy decoding, so every engine should emit the AR tokens; each row reports whether it did. Every timed
call follows an untimed call with the same shapes (JAX compilation, PyTorch warm-up); with `repeats` > 1 each
(prompt, engine) is timed that many times, interleaved with the other engines, and its median kept (2 prompts
x 32 tokens timed once vary by ~15% on 2 cores, more than the 10% the comparison is about).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from carryover_jax.bench.prompts import BENCH_PROMPTS


def _export(drafter, target, folder: Path) -> tuple[Path, str]:
    from carryover_jax.models.drafter import frozen_from_target
    from carryover_jax.weights.drafter_formats import export_drafter, save_drafter

    cfg = drafter.cfg
    if cfg.draft_vocab or cfg.backbone.family != "qwen3":
        return save_drafter(cfg, drafter.params, folder / "native"), "native"
    fmt = "zlab" if cfg.kind == "dflash" and cfg.layout == "zlab" else "deepspec"
    frozen = frozen_from_target(target.params, target.cfg) if fmt == "deepspec" else None
    return export_drafter(cfg, drafter.params, folder / fmt, fmt, frozen=frozen, dtype="float32"), fmt


def _zlab_runner(zlab: Path | None, folder: Path, fmt: str, model, stops):
    """z-lab's dflash_generate on the exported folder, or (None, why not)."""
    if zlab is None:
        return None, "no z-lab/dflash checkout given (--zlab DIR or $CARRYOVER_ZLAB_DFLASH)"
    if fmt != "zlab":
        return None, f"z-lab's DFlashDraftModel holds DFlash drafters in the z-lab layout; this one exports as {fmt}"
    if not (Path(zlab) / "dflash" / "model.py").is_file():
        return None, f"{zlab} is not a z-lab/dflash checkout (no dflash/model.py)"
    sys.path.insert(0, str(Path(zlab).resolve()))
    try:
        import dflash.model as zm
    finally:
        sys.path.pop(0)
    import torch
    from transformers import DynamicCache

    class LegacyCropCache(DynamicCache):
        """z-lab's loop crops to an absolute length (`crop(start)`), which newer transformers refuse (they
        take the count to remove, negative); this maps one onto the other, leaving z-lab's code as it is."""

        def crop(self, max_length: int) -> None:
            if max_length >= 0:
                extra = self.get_seq_length() - max_length
                if extra <= 0:
                    return
                max_length = -extra
            super().crop(max_length)

    zm.DynamicCache = LegacyCropCache
    DFlashDraftModel, dflash_generate = zm.DFlashDraftModel, zm.dflash_generate

    draft = DFlashDraftModel.from_pretrained(str(folder), dtype=torch.float32).eval()

    def run(ids, max_new):
        x = torch.tensor([ids])
        out = dflash_generate(draft, model, x, max_new, stops, 0.0)
        return out[0, len(ids):].tolist()

    return run, (f"z-lab/dflash at {Path(zlab).resolve()} (imported at run time; its DynamicCache crop mapped "
                 "onto this transformers' negative-count crop)")


def run(target, drafter, *, num_prompts: int = 2, max_new_tokens: int = 32, zlab: str | os.PathLike | None = None,
        jax_engine: bool = True, repeats: int = 1, progress: bool = True) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    from carryover_jax.export.speculative import SpeculativeDecoder, load_target

    if target.path is None:
        raise ValueError("bench decode --torch needs a target loaded from an HF folder")
    zlab = zlab or os.environ.get("CARRYOVER_ZLAB_DFLASH")
    prompts = [target.encode(p) for p in BENCH_PROMPTS[:num_prompts]]
    stops = list(target.stop_token_ids)
    with tempfile.TemporaryDirectory() as tmp:
        folder, fmt = _export(drafter, target, Path(tmp))
        model, _, _ = load_target(target.path, dtype=torch.float32)
        dec = SpeculativeDecoder(model, folder, stop_token_ids=stops)
        carry_ok = dec.drafter.e_rej is not None
        zlab_run, zlab_note = _zlab_runner(Path(zlab) if zlab else None, folder, fmt, model, stops)

        @torch.inference_mode()
        def ar(ids):
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=stops or None, pad_token_id=0)
            return out[0, len(ids):].tolist(), None

        def torch_loop(carry):
            def f(ids):
                g = dec.generate(ids, max_new_tokens=max_new_tokens, carryover=carry)
                return g.token_ids, g.rounds
            return f

        engines = {"ar_transformers": ar}
        if zlab_run is not None:
            engines["zlab_dflash_generate"] = lambda ids: (zlab_run(ids, max_new_tokens), None)
        engines["torch_loop_carry_off"] = torch_loop(False)
        if carry_ok:
            engines["torch_loop_carry_on"] = torch_loop(True)
        if jax_engine:
            from carryover_jax.decode.generate import speculative_generate
            from carryover_jax.loading import load_drafter

            jd = load_drafter(folder, target=target, carryover=carry_ok)

            def jax_loop(carry):
                def f(ids):
                    (g,), st = speculative_generate(target, jd, [ids], carryover=carry, max_new_tokens=max_new_tokens)
                    return g.token_ids, st["rounds"]
                return f

            engines["jax_carry_off"] = jax_loop(False)
            if carry_ok:
                engines["jax_carry_on"] = jax_loop(True)

        stats = {m: {"time_s": 0.0, "tokens": 0, "rounds": 0, "outputs": []} for m in engines}
        bar = tqdm(total=len(prompts) * len(engines) * repeats, desc="bench decode --torch", disable=not progress)
        for ids in prompts:
            results = {name: fn(ids) for name, fn in engines.items()}  # untimed (compile / warm up): the tokens
            times = {name: [] for name in engines}
            for _ in range(repeats):
                for name, fn in engines.items():  # interleaved: machine load hits every engine alike
                    t = time.perf_counter()
                    toks, _ = fn(ids)
                    times[name].append(time.perf_counter() - t)
                    if toks != results[name][0]:
                        raise RuntimeError(f"bench decode --torch: {name} emitted different tokens on a repeat")
                    bar.update()
            for name, (toks, rounds) in results.items():
                s = stats[name]
                s["time_s"] += statistics.median(times[name])
                s["tokens"] += len(toks)
                s["rounds"] += rounds or 0
                s["outputs"].append(toks)
        bar.close()
    ref = stats["ar_transformers"]
    ar_rate = ref["tokens"] / ref["time_s"]
    rows = []
    for name, s in stats.items():
        rate = s["tokens"] / s["time_s"]
        row = {"engine": name, "tokens": s["tokens"], "tokens_per_s": round(rate, 2),
               "vs_ar": round(rate / ar_rate, 3), "same_tokens_as_ar": s["outputs"] == ref["outputs"]}
        if s["rounds"]:
            row["tau"] = round((s["tokens"] - len(prompts)) / s["rounds"], 3)
        rows.append(row)
    by = {r["engine"]: r for r in rows}
    out = {"target": str(target.path), "drafter_format": fmt, "num_prompts": len(prompts),
           "max_new_tokens": max_new_tokens, "num_proposals": drafter.cfg.num_proposals,
           "zlab": zlab_note, "rows": rows, "torch_threads": torch.get_num_threads(), "repeats": repeats}
    if "zlab_dflash_generate" in by:
        out["torch_off_vs_zlab"] = round(by["torch_loop_carry_off"]["tokens_per_s"]
                                         / by["zlab_dflash_generate"]["tokens_per_s"], 3)
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = [f"target {result['target']}, drafter exported as {result['drafter_format']} "
             f"({result['num_proposals']} proposals), {result['num_prompts']} prompts x {result['max_new_tokens']} "
             f"new tokens, greedy, batch 1, median of {result.get('repeats', 1)} timed calls",
             f"z-lab loop: {result['zlab']}",
             "| engine | tokens/s | vs AR | tau | same tokens as AR |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['engine']} | {r['tokens_per_s']} | {r['vs_ar']}x | {r.get('tau', '-')} | "
                     f"{r['same_tokens_as_ar']} |")
    if "torch_off_vs_zlab" in result:
        lines.append(f"PyTorch loop (carried rows off) / z-lab dflash_generate: {result['torch_off_vs_zlab']}x")
    return "\n".join(lines)
