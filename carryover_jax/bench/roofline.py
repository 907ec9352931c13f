"""`carryover bench roofline`: this machine's matmul rate and weight-streaming bandwidth, and each main path
of the project as a fraction of the bound that applies to it, in one run.

The machine, measured first (jitted, best of `repeats` calls):

- matmul rate (GFLOP/s) at the target's own shapes for each row count: rows x d x ffn chained with its
  way back (the MLP's up and down projections, looped in one call so that dispatch does not count), and
  rows x d x V (the LM head), with float32 and with bfloat16 inputs accumulating in float32
  (`preferred_element_type`);
- weight-streaming bandwidth (GB/s): a sum and a one-row matrix-vector product over a buffer of
  `stream_bytes` (above the caches), in float32 and bfloat16.

Each path's model FLOPs and bytes come from the config (`bench/flops.py`). Its roofline bound is
max(FLOPs / matmul rate, bytes / bandwidth): the best matmul rate measured in the compute dtype (over the
shapes and row counts) and the best streaming rate in the param dtype; a path made of parts (generation:
prefill + steps) adds its parts' bounds. The fraction printed is bound time / measured time (1 = at the
roofline). The paths, timed with the other benches' code:

- `ar`: one target AR step at batch 1, live length `prompt_len` (`bench decode --breakdown`), greedy as the decode
  loops run it: where the head's screen serves it (`models/greedy_head.py`) its bound reads the head's bf16 copy
  (`flops.greedy_decode_costs`), as `verifyP`'s do;
- `gen16` / `gen64` / `gen128`: `generate` at that batch, `prompt_len` random prompt tokens and
  `new_tokens` new ones per row (prefill included), as prepare's regeneration and eval rollouts run it, its steps'
  bound reading the head as the screen does where it serves them (`flops.generation_costs(greedy=True)`);
- `features`: prepare's stored-feature pass (`train.responses.target_features`) over one generation
  batch of `data.max_len` tokens;
- `baseline` / `dvd` / `control`: one training step of the config on a synthetic batch (`bench train
  --mode dvd`), stored features where the config stores them (and for DVD the stored K/V where it
  stores them, `data.store_kv`); DVD without its carried-withheld diagnostic (not training compute, as
  the pipeline's equal-compute probe times it);
- `verify3` / `verify7` / `verify15`: verification of P + 1 rows ÷ an AR step at batch 1 (`bench decode
  --breakdown`, the config's drafter with P proposals); the bound is the ratio of their bounds (~1 where
  both stream the weights), so the fraction exceeds 1 where the AR step is further from its own bound than
  verification is (the table gives verification's own fraction beside it). The ratio is of mean times over the
  same rotated rounds, with its 95% interval and the AR step's A/A beside it.

The drafters are random (timing only: which draft-vocabulary ids does not matter).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from carryover_jax.bench import decode as bench_decode
from carryover_jax.bench import flops as F
from carryover_jax.bench.probe import _twice
from carryover_jax.bench.steps import _best_ms, _device
from carryover_jax.bench.train import interleaved_ms, step_call, synthetic_batch
from carryover_jax.config import TrainConfig, zlab_layer_ids
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode.generate import generate
from carryover_jax.loading import init_drafter
from carryover_jax.train.gen_memory import generation_batch
from carryover_jax.train.responses import target_features

ROWS = ("ar", "gen16", "gen64", "gen128", "features", "baseline", "dvd", "control", "verify3", "verify7", "verify15")
MATMUL_ROWS = (1, 16, 64, 128, 2048)
MATMUL_DTYPES = ("float32", "bfloat16")
STREAM_BYTES = 256 << 20  # above the last-level cache of the CPUs this runs on
_CHAIN_FLOPS = 2e8  # FLOPs per timed call of the chained MLP shape: dispatch (~10 us) is noise next to them


# ---- the machine -----------------------------------------------------------------------------------------
def _normal(rng, shape, dtype, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape, np.float32) * scale, dtype)


def _mlp_rate(rows: int, d: int, ffn: int, dtype, repeats: int, rng) -> float:
    """GFLOP/s of rows x d x ffn and back, chained in a loop (each product needs the previous one)."""
    up, down = _normal(rng, (d, ffn), dtype, d ** -0.5), _normal(rng, (ffn, d), dtype, ffn ** -0.5)
    x = _normal(rng, (rows, d), dtype)
    per_iter = 4 * rows * d * ffn
    iters = max(1, min(10_000, math.ceil(_CHAIN_FLOPS / per_iter)))

    @jax.jit
    def chain(x, up, down):
        def body(_, x):
            h = jnp.dot(x, up, preferred_element_type=jnp.float32).astype(x.dtype)
            return jnp.dot(h, down, preferred_element_type=jnp.float32).astype(x.dtype)
        return jax.lax.fori_loop(0, iters, body, x)

    jax.block_until_ready(chain(x, up, down))
    return per_iter * iters / _best_ms(lambda: chain(x, up, down), repeats) / 1e6


def _head_rate(rows: int, d: int, vocab: int, dtype, repeats: int, rng) -> float:
    """GFLOP/s of one rows x d x vocab product (the LM head: its weight does not fit the caches)."""
    x, w = _normal(rng, (rows, d), dtype), _normal(rng, (d, vocab), dtype, d ** -0.5)
    dot = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    jax.block_until_ready(dot(x, w))
    return 2 * rows * d * vocab / _best_ms(lambda: dot(x, w), repeats) / 1e6


def _stream_rates(d: int, nbytes: int, dtype, repeats: int, rng) -> dict[str, float]:
    """GB/s reading `nbytes` of weights once: a sum over them, and a 1 x d x n matrix-vector product."""
    dt = jnp.dtype(dtype)
    n = max(1, nbytes // (d * dt.itemsize))
    w = _normal(rng, (d, n), dt)
    x = _normal(rng, (1, d), dt)
    total = jax.jit(lambda w: jnp.sum(w, dtype=jnp.float32))
    matvec = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    out = {}
    for name, fn in (("sum", lambda: total(w)), ("matvec", lambda: matvec(x, w))):
        jax.block_until_ready(fn())
        out[name] = w.size * dt.itemsize / _best_ms(fn, repeats) / 1e6
    return out


def measure_machine(tcfg, *, matmul_rows=MATMUL_ROWS, dtypes=MATMUL_DTYPES, repeats: int = 5,
                    stream_bytes: int = STREAM_BYTES, bar=None) -> dict[str, Any]:
    """Matmul GFLOP/s per (dtype, shape, rows) at the target's shapes and streaming GB/s per dtype."""
    d, ffn, vocab = tcfg.hidden_size, tcfg.intermediate_size, tcfg.vocab_size
    rng = np.random.default_rng(0)
    mm, stream = {}, {}
    for dt in dtypes:
        for r in matmul_rows:
            if bar is not None:
                bar.set_postfix_str(f"matmul {dt}, {r} rows")
            mm[f"{dt}/mlp/{r}"] = _mlp_rate(r, d, ffn, dt, repeats, rng)
            mm[f"{dt}/head/{r}"] = _head_rate(r, d, vocab, dt, repeats, rng)
        if bar is not None:
            bar.set_postfix_str(f"stream {dt}")
        stream[dt] = _stream_rates(d, stream_bytes, dt, repeats, rng)
    return {"shapes": {"mlp": f"rows x {d} x {ffn} and back (chained)", "head": f"rows x {d} x {vocab}"},
            "matmul_rows": list(matmul_rows), "dtypes": list(dtypes), "matmul_gflops": mm,
            "stream_gbs": stream, "stream_mb": stream_bytes / 2 ** 20, "repeats": repeats}


def peak_rate(machine: dict, dtype: str) -> float:
    """GFLOP/s: the best matmul rate measured in `dtype`, over the shapes and row counts."""
    return max(v for k, v in machine["matmul_gflops"].items() if k.startswith(f"{dtype}/"))


def bandwidth(machine: dict, dtype: str) -> float:
    return max(machine["stream_gbs"][dtype].values())


def bound(cost: F.Cost, machine: dict, tcfg, dtype: str | None = None) -> dict[str, Any]:
    """The roofline time of one cost (seconds) and which side bounds it; `dtype` (e.g. "float32") prices it
    at that dtype's rate and bandwidth instead of the run's or the cost's own (the bytes stay the run's)."""
    compute, params = dtype or cost.dtype or tcfg.dtype, dtype or cost.dtype or tcfg.param_dtype
    rate, bw = peak_rate(machine, compute), bandwidth(machine, params)
    t_mm, t_bw = cost.flops / (rate * 1e9), cost.bytes / (bw * 1e9)
    if t_mm >= t_bw:
        return {"s": t_mm, "by": f"matmul {rate:.0f} GFLOP/s ({compute})"}
    return {"s": t_bw, "by": f"bandwidth {bw:.1f} GB/s ({params})"}


def _bound_of(costs: list[F.Cost], machine, tcfg) -> dict[str, Any]:
    """The costs' summed bound in the run's numerics and, for a narrow compute dtype, at the float32 rate
    (`s_f32`: how a bf16 run compares with what float32 arithmetic could do at best)."""
    parts = [bound(c, machine, tcfg) for c in costs]
    out = {"s": sum(p["s"] for p in parts), "by": max(parts, key=lambda p: p["s"])["by"],
           "gflop": sum(c.flops for c in costs) / 1e9, "gb": sum(c.bytes for c in costs) / 1e9}
    if tcfg.dtype != "float32" and "float32" in machine["dtypes"]:
        out["s_f32"] = sum(bound(c, machine, tcfg, "float32")["s"] for c in costs)
    return out


# ---- the paths -------------------------------------------------------------------------------------------
def _drafter(cfg: TrainConfig, target, proposals: int | None = None):
    """The config's drafter shape (random weights; a draft vocabulary of the first K ids), with Carryover."""
    spec = dataclasses.replace(cfg.drafter, carryover=True,
                               num_proposals=proposals or cfg.drafter.num_proposals)
    kw = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "draft_vocab_size"}
    return init_drafter(target, seed=cfg.seed, draft_vocab=tuple(range(spec.draft_vocab_size)), **kw)


def _row(name: str, what: str, measured_s: float, b: dict[str, Any], **extra) -> dict[str, Any]:
    row = {"row": name, "path": what, "measured_s": measured_s, "bound_s": b["s"], "bound_by": b["by"],
           "fraction": b["s"] / measured_s, "gflop": b["gflop"], "gb": b["gb"], **extra}
    if "s_f32" in b:
        row["fraction_of_f32_bound"] = b["s_f32"] / measured_s
    return row


def _decode_rows(cfg, target, machine, rows, prompt_len, repeats) -> list[dict[str, Any]]:
    """`ar` and `verifyP` from one `bench decode --breakdown` per P (AR from the smallest P's run), each step
    timed inside a compiled loop as the decode loops run it (the separately dispatched times ride along)."""
    ps = sorted({int(r[len("verify"):]) for r in rows if r.startswith("verify")} or {3})
    max_len = next_bucket(max(sp.cache_slots(p, prompt_len, p + 2) for p in ps))
    tcfg, tp = target.cfg, target.params
    ar_b = _bound_of(F.greedy_decode_costs(tcfg, tp, batch=1, rows=1, context=prompt_len), machine, tcfg)
    out = []
    for i, p in enumerate(ps):
        r = bench_decode.breakdown(target, _drafter(cfg, target, p), max_lens=(max_len,), prompt_len=prompt_len,
                                   repeats=repeats, progress=False)["rows"][0]
        ar_s = r["loop_ar_ms"] / 1e3
        if i == 0 and "ar" in rows:
            out.append(_row("ar", f"AR step, batch 1, context {prompt_len}", ar_s, ar_b,
                            dispatched_s=r["ar_ms"] / 1e3))
        name = f"verify{p}"
        if name in rows:
            vb = _bound_of(F.greedy_decode_costs(tcfg, tp, batch=1, rows=p + 1, context=prompt_len), machine, tcfg)
            verify_s = r["loop_verify_ms"] / 1e3
            (measured, lo, hi), ideal = r["loop_verify_over_ar"], vb["s"] / ar_b["s"]
            out.append({"row": name, "path": f"verify({p + 1}) ÷ AR step, batch 1", "measured_ratio": measured,
                        "measured_ratio_ci": [lo, hi], "aa_ratio": r["loop_ar_again_over_ar"],
                        "bound_ratio": ideal, "fraction": ideal / measured, "bound_by": vb["by"],
                        "verify_s": verify_s, "ar_s": ar_s, "verify_fraction": vb["s"] / verify_s,
                        "dispatched_ratio": r["verify_over_ar"], "gflop": vb["gflop"], "gb": vb["gb"]})
    return out


def _generation_row(target, machine, batch: int, prompt_len: int, new_tokens: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(10, target.cfg.vocab_size, (batch, prompt_len)).tolist()
    _, s = _twice(lambda: [r.token_ids for r in generate(target, prompts, max_new_tokens=new_tokens,
                                                         stop_token_ids=[], chat=False)])
    b = _bound_of(F.generation_costs(target.cfg, target.params, batch=batch, prompt_len=prompt_len,
                                     new_tokens=new_tokens, greedy=True), machine, target.cfg)
    return _row(f"gen{batch}", f"generation, batch {batch}, {prompt_len} + {new_tokens} tokens", s, b,
                tokens_per_s=batch * new_tokens / s)


def _features_row(cfg, target, machine, seed: int) -> dict[str, Any]:
    rows, _ = generation_batch(cfg.data, target.cfg, max_rows=cfg.data.max_prompts)
    seq = cfg.data.max_len
    layer_ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids
                      or zlab_layer_ids(target.cfg.num_layers))
    seqs = np.random.default_rng(seed).integers(10, target.cfg.vocab_size, (rows, seq)).tolist()
    kv_dtype = cfg.data.store_kv  # prepare stores K/V with its features where the config asks
    _, s = _twice(lambda: target_features(target, seqs, layer_ids, batch_rows=rows, kv_dtype=kv_dtype)[-1]["features"])
    b = _bound_of([F.feature_pass_cost(target.cfg, target.params, rows=rows, seq=seq)], machine, target.cfg)
    kv = f" (and {kv_dtype} K/V)" if kv_dtype else ""
    return _row("features", f"prepare's feature pass, {rows} x {seq} tokens{kv}", s, b)


def _train_rows(cfg, target, machine, modes, repeats: int) -> list[dict[str, Any]]:
    d = _drafter(cfg, target)
    stored = cfg.features == "store"
    with_kv = synthetic_batch(cfg, target, d.cfg, stored=stored)
    batch = {k: v for k, v in with_kv.items() if k != "kv"}
    calls = {m: step_call(cfg, target, d.cfg, d.params, with_kv if m == "dvd" else batch, mode=m, off_metrics=False)
             for m in modes}
    ms = interleaved_ms(calls, repeats)
    shape = (f"{cfg.batch_size} x {cfg.data.max_len} tokens, {cfg.num_anchors} anchors, "
             f"{'stored' if stored else 'online'} features")
    out = []
    for m in modes:
        kv = m == "dvd" and "kv" in with_kv
        c = F.train_cost(target.cfg, d.cfg, target.params, d.params, batch=cfg.batch_size, seq=cfg.data.max_len,
                         anchors=cfg.num_anchors, mode=m, stored_features=stored, stored_kv=kv)
        out.append(_row(m, f"train step {m}, {shape}{' and K/V' if kv else ''}", ms[m] / 1e3,
                        _bound_of([c], machine, target.cfg)))
    return out


def _cpu() -> str:
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return ""
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "")
    flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    # the widest vector unit: hosts of one model name differ (prepare and training ran ~2x slower on an AVX2-only one)
    simd = next((f for f in ("avx512f", "avx2", "avx", "asimd") if f in flags), "")
    return (f"{model}, {os.cpu_count()} cores" + (f", {simd}" if simd else "")
            + (f", {' '.join(bf16)}" if bf16 else ", no native bf16"))


def run(cfg: TrainConfig, target, *, rows=ROWS, matmul_rows=MATMUL_ROWS, repeats: int = 5, new_tokens: int = 64,
        prompt_len: int = 100, stream_bytes: int = STREAM_BYTES, progress: bool = True) -> dict[str, Any]:
    """The machine's rates, then each path in `rows` (`ROWS`) against its bound. `cfg` gives the drafter,
    training and prepare shapes; `target` is loaded with the run's numerics."""
    rows = [r for r in ROWS if r in set(rows)]
    tcfg = target.cfg
    dtypes = tuple(dict.fromkeys(MATMUL_DTYPES + (tcfg.dtype, tcfg.param_dtype)))
    load_start = os.getloadavg()
    tasks = (["machine"] + (["decode"] if any(r == "ar" or r.startswith("verify") for r in rows) else [])
             + [r for r in rows if r.startswith("gen") or r == "features"]
             + (["train"] if any(r in ("baseline", "dvd", "control") for r in rows) else []))
    bar = tqdm(total=len(tasks), desc="bench roofline", disable=not progress)
    out_rows: list[dict[str, Any]] = []
    machine = None
    for task in tasks:
        bar.set_postfix_str(task)
        if task == "machine":
            machine = measure_machine(tcfg, matmul_rows=matmul_rows, dtypes=dtypes, repeats=repeats,
                                      stream_bytes=stream_bytes, bar=bar)
        elif task == "decode":
            out_rows += _decode_rows(cfg, target, machine, rows, prompt_len, repeats)
        elif task.startswith("gen"):
            out_rows.append(_generation_row(target, machine, int(task[3:]), prompt_len, new_tokens, cfg.seed))
        elif task == "features":
            out_rows.append(_features_row(cfg, target, machine, cfg.seed))
        else:
            out_rows += _train_rows(cfg, target, machine, [r for r in rows if r in ("baseline", "dvd", "control")],
                                    repeats)
        bar.update()
    bar.close()
    order = {r: i for i, r in enumerate(ROWS)}
    return {"benchmark": "roofline", "target": str(getattr(target, "path", "")),
            "target_shape": f"{tcfg.family} {tcfg.num_layers} layers, d={tcfg.hidden_size}, "
                            f"ffn={tcfg.intermediate_size}, V={tcfg.vocab_size}",
            "config": cfg.name, "numerics": tcfg.numerics.describe(), "device": _device(), "cpu": _cpu(),
            "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
            "load_avg": {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]},
            "prompt_len": prompt_len, "new_tokens": new_tokens, "machine": machine,
            "rows": sorted(out_rows, key=lambda r: order[r["row"]])}


def _t(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def format_table(r: dict[str, Any]) -> str:
    m = r["machine"]
    dts = m["dtypes"]
    head = " | ".join(dt if dt == "float32" else f"{dt} in, float32 acc" for dt in dts)
    lines = [f"{r['target']} ({r['target_shape']}), config {r['config']} | {r['numerics']} | {r['device']} | "
             f"{r['cpu']} | jax {r['jax']} | {r['date']} | load average {r['load_avg']['start'][0]} at start, "
             f"{r['load_avg']['end'][0]} at end", "",
             f"| machine (best of {m['repeats']}) | {head} |", "|---|" + "---|" * len(dts)]
    for shape in ("mlp", "head"):
        for rows in m["matmul_rows"]:
            label = m["shapes"][shape].replace("rows", str(rows), 1)
            lines.append(f"| matmul {label}, GFLOP/s | "
                         + " | ".join(f"{m['matmul_gflops'][f'{dt}/{shape}/{rows}']:.1f}" for dt in dts) + " |")
    for kind, label in (("sum", "sum"), ("matvec", "1-row matvec")):
        lines.append(f"| stream: {label} over {m['stream_mb']:g} MiB, GB/s | "
                     + " | ".join(f"{m['stream_gbs'][dt][kind]:.1f}" for dt in dts) + " |")
    lines += ["", "| path | measured | roofline bound | fraction of bound | bound by | GFLOP | GB read |",
              "|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        frac = f"{x['fraction']:.2f}"
        if "measured_ratio" in x:
            ratio, aa = bench_decode.ratio_text([x["measured_ratio"], *x["measured_ratio_ci"]]), x["aa_ratio"]
            meas = (f"{ratio} AR steps ({_t(x['verify_s'])} / {_t(x['ar_s'])} medians; A/A "
                    f"{bench_decode.ratio_text(aa)}; {x['dispatched_ratio']:.2f} dispatched one by one)")
            bnd = f"{x['bound_ratio']:.2f} AR steps"
            frac += f" (verify alone {x['verify_fraction']:.2f})"
        else:
            meas = _t(x["measured_s"]) + (f" ({x['tokens_per_s']:.1f} tok/s)" if "tokens_per_s" in x else "")
            if "dispatched_s" in x:
                meas += f" ({_t(x['dispatched_s'])} dispatched one by one)"
            bnd = _t(x["bound_s"])
            if "fraction_of_f32_bound" in x:
                frac += f" (of the float32 bound: {x['fraction_of_f32_bound']:.2f})"
        lines.append(f"| {x['path']} | {meas} | {bnd} | {frac} | {x['bound_by']} | "
                     f"{x['gflop']:.3g} | {x['gb']:.3g} |")
    return "\n".join(lines)
