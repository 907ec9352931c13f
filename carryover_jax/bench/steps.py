"""`carryover bench steps`: per-step times at real model shapes with random weights — the device check.

Presets (`carryover_jax.config.PRESETS`) include Gemma 4 12B (`gemma4-12b`; `gemma4-12b-kv1` with one
K/V head in the global layers, the other reading of the unpublished config) with the paper's feature
layers 5, 17, 29, 41, 46: `carryover bench steps --preset gemma4-12b --kind markov --layout deepspec`.
On one H200 (bf16, batch 1, context 512, random weights): AR step 18.6 ms, drafting 0.32x, verifying
16 tokens 1.22x, a round 1.50x (break-even tau), a baseline training step (1 x 1024 tokens, 64
anchors) 98 ms; `-kv1`: 20.8 ms, 0.29x, 0.94x, 1.22x.

No checkpoint is needed: params are drawn from the abstract shapes of a preset (Qwen3-4B, ...), so the
same command runs on a GPU/TPU at full size or on a CPU with `--layers` cut down. Measured in one run:
target AR step (T=1), verification (T=P+1), drafting, a full speculative round, and one baseline
training step; printed as milliseconds and as ratios to the AR step. `round / AR` is the break-even
acceptance length: a drafter beats AR decoding on this device when its τ exceeds it.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.flops import TRAIN_FLOPS_DOC, train_flops, weight_bytes
from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig, zlab_layer_ids
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.errors import ConfigError
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.layers import LiveMask, Prefix, attention_core
from carryover_jax.models.target import abstract_params
from carryover_jax.train.gen_memory import device_free_bytes
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step


def random_params(abstract, seed: int = 0, scale: float = 0.02):
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [(jax.random.normal(k, x.shape, jnp.float32) * scale).astype(x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def _call_ms(fn, n: int) -> list[float]:
    """Milliseconds of `n` calls of `fn`, each waited for."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(1e3 * (time.perf_counter() - t))
    return ts


def rotated_seconds(calls: dict, rounds: int, on_round=None) -> dict[str, list[float]]:
    """Seconds of each zero-argument call (compiled already) in each of `rounds` rounds: the calls timed in turn,
    their order rotated round by round (round r starts at call r mod n), so a slow spell of a shared machine and
    the order's own effect fall on every call alike. `on_round(r, secs)` runs after each round (progress lines).
    Pairs of these lists are what `eval.paired.speed_ratio` compares."""
    names = list(calls)
    secs = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            jax.block_until_ready(calls[k]())
            secs[k].append(time.perf_counter() - start)
        if on_round is not None:
            on_round(r, secs)
    return secs


def _median_ms(fn, n: int) -> float:
    return float(np.median(_call_ms(fn, n)))


def _best_ms(fn, n: int) -> float:
    return min(_call_ms(fn, n))


HBM_TB_S = 4.8  # H200 HBM3e bandwidth (TB/s): the weight-read floor of a decode step
PEAK_TFLOPS = 790.0  # H100/H200 dense bf16 tensor-core peak (TFLOP/s): MFU's denominator


def run(target_cfg: TargetConfig, *, kind: str = "dflash", layout: str = "zlab", proposals: int = 15,
        draft_layers: int = 5, batch: int = 1, context: int = 512, train_batch: int = 1, train_len: int = 1024,
        anchors: int = 64, repeats: int = 10, backends: tuple[str, ...] = ("einsum",),
        train_modes: tuple[str, ...] = ("baseline",), train_backends: tuple[str, ...] | None = None,
        kernel_head_dims: tuple[int, ...] | None = None, kernel_backends: tuple[str, ...] | None = None,
        trace_dir: str | None = None, deadline: float | None = None, hbm_tb_s: float = HBM_TB_S,
        peak_tflops: float = PEAK_TFLOPS, on_row=None) -> dict[str, Any]:
    """`backends`: attention backends (models/layers.py) measured one after the other on the same
    weights and inputs; the first is the reference of the `x_first_backend` ratios and of the top-level
    numbers. A backend that fails to compile or run is reported (`error`), not raised, so one device
    run covers the others.

    `train_modes`: training steps timed per backend ("baseline", "dvd", "control"), each with its model
    FLOPs (`train_flops`) and MFU against `peak_tflops`; `train_backends` limits them to some backends
    (None: all). The AR step is also given as a multiple of its weight-read floor (`weight_bytes` at
    `hbm_tb_s`). `kernel_head_dims` / `kernel_backends`: the kernel check (each backend vs einsum) at
    these head dims (default: the target's, backends[1:]). `trace_dir`: a `jax.profiler` trace of one
    round of the first backend. `deadline` (time.monotonic()): parts that would start after it are
    reported as skipped, so a device check fits its lease; `on_row(rows)` is called after each part (a
    device check saves what it has)."""
    tcfg = target_cfg
    check_fits(tcfg, free_bytes())
    dcfg = DrafterConfig.for_target(tcfg, kind=kind, layout=layout, num_proposals=proposals, num_layers=draft_layers,
                                    mask_token_id=0, target_layer_ids=_layer_ids(tcfg))
    tp = random_params(abstract_params(tcfg))
    dp = jax.tree_util.tree_map(lambda x: x.astype(tcfg.param_dtype), init_drafter_params(dcfg, jax.random.key(1)))
    dcfg = dcfg.replace(backbone=dcfg.backbone.replace(dtype=tcfg.dtype, param_dtype=tcfg.param_dtype))
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(10, tcfg.vocab_size, (batch, context)), jnp.int32)
    lens = jnp.full((batch,), context, jnp.int32)
    max_len = next_bucket(context + 4 * (proposals + 1) * (repeats + 4))
    batch_ = {"input_ids": jnp.asarray(rng.integers(10, tcfg.vocab_size, (train_batch, train_len)), jnp.int32),
              "loss_mask": jnp.ones((train_batch, train_len), jnp.int32)}
    wbytes = weight_bytes(tp, tcfg)
    floor_ms = 1e3 * wbytes / (hbm_tb_s * 1e12)
    out: dict[str, Any] = {"target": _describe(tcfg), "drafter": f"{kind}/{layout}, {proposals} proposals, "
                           f"{draft_layers} layers", "batch": batch, "context": context, "device": _device(),
                           "jax": jax.__version__, "weight_gb": round(wbytes / 1e9, 3),
                           "weight_floor_ms": float(f"{floor_ms:.4g}"),
                           "weight_floor": f"target weights read once per AR step ({wbytes / 1e9:.2f} GB; a tied "
                                           f"embedding counted once, as the LM head) at {hbm_tb_s} TB/s",
                           "peak_tflops": peak_tflops}
    late = lambda: deadline is not None and time.monotonic() > deadline  # noqa: E731
    rows = []
    for i, bk in enumerate(backends):
        tb = tcfg.replace(attention_backend=bk)
        db = dcfg.replace(backbone=dcfg.backbone.replace(attention_backend=bk))
        row: dict[str, Any] = {"backend": bk}
        errors = []
        if late():
            row["skipped"] = "device-check budget spent"
            rows.append(row)
            continue
        try:
            row.update(_decode_times(tb, db, tp, dp, prompt, lens, max_len, repeats,
                                     trace_dir=trace_dir if i == 0 else None))
        except Exception as e:  # noqa: BLE001 - a device check reports every backend
            errors.append("decode: " + _error(e))
        if "ar_step_ms" in row:
            ar_ms = row["ar_step_ms"]
            row.update(ar_over_weight_floor=float(f"{ar_ms / floor_ms:.4g}"), verify_over_ar=round(row["verify_ms"] / ar_ms, 3),
                       draft_over_ar=round(row["draft_ms"] / ar_ms, 3), break_even_tau=round(row["round_ms"] / ar_ms, 3))
        if train_backends is None or bk in train_backends:
            for mode in train_modes:
                if late():
                    row[f"train_{mode}"] = {"skipped": "device-check budget spent"}
                    continue
                t = _train_step(tcfg, dcfg, tp, batch_, anchors, bk, max(3, repeats // 3), mode=mode,
                                peak_tflops=peak_tflops)
                if "error" in t:
                    errors.append(f"train {mode}: " + t["error"])
                row[f"train_{mode}"] = t
                if on_row is not None:
                    on_row(rows + [row])
                if mode == train_modes[0]:  # the flat fields of earlier versions: the first mode's
                    row.update({("train_" + k if k in ("compile_s", "temp_gb", "loss") else k): v for k, v in t.items()
                                if k in ("compile_s", "temp_gb", "loss", "train_step_ms", "mfu")})
        if errors:
            row["error"] = " | ".join(errors)
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    first = rows[0]
    for r in rows[1:]:
        for key in ("ar_step_ms", "verify_ms", "round_ms", "train_step_ms"):
            if key in r and key in first:
                r[f"{key}_x_first_backend"] = round(r[key] / first[key], 3)
    out["backends"] = rows
    kb = tuple(kernel_backends) if kernel_backends is not None else tuple(backends[1:])
    if kb:
        kc = []
        for d in kernel_head_dims or (tcfg.head_dim,):
            if late():
                kc.append({"head_dim": d, "skipped": "device-check budget spent"})
                continue
            kc += kernel_check(tcfg.replace(head_dim=d), kb, queries=anchors * dcfg.block_size, keys=train_len,
                               block=dcfg.block_size, context=context, decode_queries=proposals + 1)
        out["kernel_check"] = kc
    trained = next((r for r in rows if "train_step_ms" in r), first)  # the first backend with a train step
    for key in ("ar_step_ms", "draft_ms", "verify_ms", "round_ms", "ar_over_weight_floor", "verify_over_ar",
                "draft_over_ar", "break_even_tau"):
        out[key] = first.get(key, float("nan"))
    for key in ("train_step_ms", "train_compile_s", "mfu"):
        out[key] = trained.get(key, float("nan"))
    out["train_shape"] = f"{train_batch} x {train_len} tokens, {anchors} anchors"
    out["train_flops_counted"] = TRAIN_FLOPS_DOC
    return {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in out.items()}


def _device() -> str:
    d = jax.devices()[0]
    return f"{d.platform}: {getattr(d, 'device_kind', d)}"


def free_bytes() -> int | None:
    """Memory free where the bench runs: the device's as JAX reports it, else (CPU) the host's available memory;
    None where neither is known."""
    free = device_free_bytes()
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return free


def memory_needed(tcfg: TargetConfig) -> int:
    """A floor on the bench's memory: the random target weights, plus on a CPU their float32 copies (XLA's CPU
    dots run narrower weights in float32)."""
    shapes = jax.tree_util.tree_leaves(abstract_params(tcfg))
    need = sum(x.size * jnp.dtype(x.dtype).itemsize for x in shapes)
    if jax.default_backend() == "cpu":
        need += sum(x.size * 4 for x in shapes if jnp.dtype(x.dtype).itemsize < 4)
    return int(need)


def check_fits(tcfg: TargetConfig, free: int | None) -> None:
    """Refuse, before any weight is drawn, a target that cannot fit (the full-size default preset on a CPU
    ended in the kernel's OOM kill, not an error)."""
    need = memory_needed(tcfg)
    if free is not None and need > free:
        raise ConfigError(f"bench steps: {_describe(tcfg)} needs at least {need / 1e9:.1f} GB for its weights here, "
                          f"{free / 1e9:.1f} GB are free: cut it with --layers N or pick a smaller --preset")


def _error(e: Exception) -> str:
    """One line for a backend that failed: a device check reports every backend instead of raising."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def kernel_check(tcfg: TargetConfig, backends, *, queries: int, keys: int, block: int, context: int,
                 decode_queries: int, seed: int = 0) -> list[dict[str, Any]]:
    """Each backend against einsum on the device, at the model's head shapes and dtype: training's
    anchor-prefix context attention (+ its own block-diagonal block), output and gradients, and a
    decode-time live-length cache read (verification's P+1 queries over `context` slots). Max abs
    difference relative to the reference's max abs value (bf16: ~1e-2 is rounding)."""
    rng = np.random.default_rng(seed)
    h, hkv, d = tcfg.num_heads, tcfg.num_kv_heads, tcfg.head_dim
    dt = jnp.dtype(tcfg.dtype)
    n = max(1, queries // block)
    t = n * block
    rnd = lambda *shape: jnp.asarray(rng.standard_normal(shape), dt)  # noqa: E731
    q, k, v, kb, vb = rnd(1, t, h, d), rnd(1, hkv, keys, d), rnd(1, hkv, keys, d), rnd(1, hkv, t, d), rnd(1, hkv, t, d)
    anchors = np.sort(rng.choice(np.arange(1, keys - block), n, replace=False))
    limit = jnp.asarray(np.repeat(anchors, block)[None], jnp.int32)
    scale = d ** -0.5

    def train_fn(backend):
        def loss(q, k, v, kb, vb):
            o = attention_core(q, [(k, v, Prefix(limit)), (kb, vb, block)], scale, backend)
            return jnp.sum(o.astype(jnp.float32) ** 2), o
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))

    tq = decode_queries
    qd, kc, vc = rnd(1, tq, h, d), rnd(1, hkv, next_bucket(context + tq), d), rnd(1, hkv, next_bucket(context + tq), d)
    live = LiveMask(jnp.asarray(context + 1 + np.arange(tq), jnp.int32)[None])

    def decode_fn(backend):
        return jax.jit(lambda q, k, v: attention_core(q, [(k, v, live)], scale, backend))

    rel = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))) /  # noqa: E731
                             max(float(jnp.max(jnp.abs(b.astype(jnp.float32)))), 1e-30))
    (_, o_ref), g_ref = train_fn("einsum")(q, k, v, kb, vb)
    d_ref = decode_fn("einsum")(qd, kc, vc)
    rows = []
    for bk in backends:
        row: dict[str, Any] = {"backend": bk, "head_dim": d,
                               "shape": f"train q {t} x ctx {keys}, decode q {tq} x {context}"}
        try:
            (_, o), g = train_fn(bk)(q, k, v, kb, vb)
            row["train_out_rel"] = float(f"{rel(o, o_ref):.3g}")
            row["train_grad_rel"] = float(f"{max(rel(a, b) for a, b in zip(g, g_ref)):.3g}")
            row["decode_out_rel"] = float(f"{rel(decode_fn(bk)(qd, kc, vc), d_ref):.3g}")
        except Exception as e:  # noqa: BLE001 - a device check reports every backend
            row["error"] = _error(e)
        rows.append(row)
    return rows


def _decode_times(tcfg, dcfg, tp, dp, prompt, lens, max_len: int, repeats: int,
                  trace_dir: str | None = None) -> dict[str, float]:
    """Target AR step, drafting, verification and a full round at a fixed context, in ms; with
    `trace_dir`, a `jax.profiler` trace of one more (warm) round there."""
    batch = prompt.shape[0]
    sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=True)
    out = {}
    # AR step
    cache, logits = ar.prefill(tcfg, tp, prompt, lens, max_len=max_len)
    tok = jnp.argmax(logits, -1).astype(jnp.int32)
    state = {"cache": cache}

    def ar_step():
        lg, state["cache"] = ar.step(tcfg, tp, state["cache"].with_lengths(lens + 0), tok)  # a fresh array: the cache is donated
        return lg

    ar_step()
    out["ar_step_ms"] = _median_ms(ar_step, repeats)

    # draft / verify / round (lengths reset each time so the context stays at `context`)
    n = dcfg.num_proposals + 2  # every timed call is reset to one round from the prompt
    s0 = sp.prefill(sc, tp, dp, prompt, lens, jnp.full((batch,), n, jnp.int32), jnp.zeros((batch,)),
                    jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=max_len, out_size=n)
    box = {"s": s0}

    def reset(s):
        return s.replace(target_cache=s.target_cache.with_lengths(lens + 0), draft_cache=s.draft_cache.with_lengths(lens + 0),
                         num_out=jnp.ones_like(s.num_out), rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))

    def draft():
        toks, q, box["s"] = sp.draft_step(sc, tp, dp, reset(box["s"]))
        box["toks"], box["q"] = toks, q
        return toks

    def verify():
        box["s"] = sp.verify_step(sc, tp, dp, reset(box["s"]), box["toks"], box["q"])
        return box["s"].num_out

    def round_():
        draft()
        return verify()

    round_()
    out["draft_ms"] = _median_ms(draft, repeats)
    out["verify_ms"] = _median_ms(verify, repeats)
    out["round_ms"] = _median_ms(round_, repeats)
    if trace_dir:
        with jax.profiler.trace(trace_dir):
            jax.block_until_ready(round_())
        out["trace_dir"] = trace_dir
    return out


def _train_step(tcfg, dcfg, tp, batch, anchors: int, backend: str, repeats: int, *, mode: str = "baseline",
                peak_tflops: float = PEAK_TFLOPS) -> dict[str, Any]:
    """Compile (with XLA's memory analysis of the step) and time one training step of `mode` with
    `backend`, with its model FLOPs (`train_flops`) and MFU; a backend that fails to compile or run is
    reported, not raised, so one device run covers the rest."""
    row: dict[str, Any] = {"backend": backend, "mode": mode}
    try:
        cfg = TrainConfig(loss=LossConfig(mode=mode), num_anchors=anchors, steps=10, compute_dtype=tcfg.dtype,
                          remat=True, attention_backend=backend)
        stc = step_config(cfg, tcfg, dcfg)
        opt = make_optimizer(cfg, 10)
        st = init_state(init_drafter_params(stc.drafter, jax.random.key(2)), opt, 0)
        t = time.perf_counter()
        compiled = jax.jit(functools.partial(train_step, stc, opt)).lower(st, tp, batch).compile()
        ma = compiled.memory_analysis()
        if ma is not None:
            row["temp_gb"] = round(ma.temp_size_in_bytes / 1e9, 3)
        loss = compiled(st, tp, batch)[1]["loss"]
        row["loss"] = float(jax.block_until_ready(loss))
        row["compile_s"] = round(time.perf_counter() - t, 2)
        ms = _median_ms(lambda: compiled(st, tp, batch)[1]["loss"], repeats)
        b, seq = batch["input_ids"].shape
        flops = train_flops(tcfg, stc.drafter, tp, st.params, batch=b, seq=seq, anchors=anchors, mode=mode)
        row["train_step_ms"] = round(ms, 2)
        row["tflop"] = {k: float(f"{v / 1e12:.4g}") for k, v in flops.items()}
        row["mfu"] = float(f"{flops['total'] / (ms / 1e3) / (peak_tflops * 1e12):.3g}")
    except Exception as e:  # noqa: BLE001 - a device check reports every backend
        row["error"] = _error(e)
    return row


# the paper's feature layers where they differ from z-lab's rule (DeepSpec's Gemma 4 12B drafters)
PAPER_LAYER_IDS = {("gemma4", 48): (5, 17, 29, 41, 46)}


def _layer_ids(c: TargetConfig) -> tuple[int, ...]:
    n = c.num_layers
    if (c.family, n) in PAPER_LAYER_IDS:
        return PAPER_LAYER_IDS[c.family, n]
    return zlab_layer_ids(n)  # cut-down CPU runs (--layers): every layer but the last


def _describe(c: TargetConfig) -> str:
    g = next((i for i in range(c.num_layers) if not c.is_sliding(i)), 0)
    geo = (f"heads {c.num_heads}/{c.num_kv_heads}" if c.uniform_layers else
           f"heads {c.num_heads}/{c.num_kv_heads} x {c.head_dim} (sliding, window {c.sliding_window}) and "
           f"{c.num_heads}/{c.layer_kv_heads(g)} x {c.layer_head_dim(g)} (global)")
    return f"{c.family} {c.num_layers} layers, d={c.hidden_size}, {geo}, V={c.vocab_size}, {c.dtype}"


def format_table(r: dict[str, Any]) -> str:
    """Markdown: the first backend's step times and ratios, one row per backend, the training steps
    (time, MFU, FLOPs), the kernel check."""
    num = lambda x: isinstance(x, (int, float)) and x == x  # noqa: E731  (not NaN)
    ar = r["ar_step_ms"]
    rows = [("target AR step (T=1)", ar, 1.0), ("drafting", r["draft_ms"], r["draft_over_ar"]),
            ("verification (T=P+1)", r["verify_ms"], r["verify_over_ar"]),
            ("speculative round", r["round_ms"], r["break_even_tau"]),
            (f"train step ({r['train_shape']})", r["train_step_ms"],
             r["train_step_ms"] / ar if num(ar) and num(r["train_step_ms"]) else float("nan"))]
    lines = [f"{r['target']} | drafter {r['drafter']} | batch {r['batch']}, context {r['context']} | {r['device']}"
             f" | jax {r.get('jax', jax.__version__)}", "", "| step | ms | / AR step |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.2f} | {ratio:.2f}x |" for name, ms, ratio in rows]
    lines.append(f"\nbreak-even tau (round / AR step): {r['break_even_tau']}")
    if "weight_floor_ms" in r:
        lines.append(f"AR step / weight-read floor: {r.get('ar_over_weight_floor')} (floor {r['weight_floor_ms']} ms: "
                     f"{r['weight_floor']})")
    bks = r.get("backends", [])
    f = lambda b, k: f"{b[k]:.2f}" if num(b.get(k)) else "-"  # noqa: E731
    if len(bks) > 1 or any("error" in b or "skipped" in b for b in bks):
        lines += ["", "| backend | AR ms | AR / floor | verify ms | verify / AR | round / AR | train ms | "
                  "train x first | train temp GB | error |", "|---|---|---|---|---|---|---|---|---|---|"]
        for b in bks:
            lines.append(f"| {b['backend']} | {f(b, 'ar_step_ms')} | {f(b, 'ar_over_weight_floor')} | "
                         f"{f(b, 'verify_ms')} | {f(b, 'verify_over_ar')} | {f(b, 'break_even_tau')} | "
                         f"{f(b, 'train_step_ms')} | {f(b, 'train_step_ms_x_first_backend')} | "
                         f"{b.get('train_temp_gb', '-')} | {b.get('error', b.get('skipped', ''))} |")
    trains = [(b["backend"], v) for b in bks for k, v in b.items() if k.startswith("train_") and isinstance(v, dict)]
    if trains:
        lines += ["", f"| train step ({r['train_shape']}) | ms | model TFLOP | MFU (of {r.get('peak_tflops')} TFLOP/s) "
                  "| temp GB | note |", "|---|---|---|---|---|---|"]
        for bk, t in trains:
            tf = t.get("tflop", {})
            lines.append(f"| {t.get('mode')} ({bk}) | {f(t, 'train_step_ms')} | {tf.get('total', '-')} | "
                         f"{t.get('mfu', '-')} | {t.get('temp_gb', '-')} | {t.get('error', t.get('skipped', ''))} |")
        lines.append(f"\nFLOPs counted: {r.get('train_flops_counted', '')}")
    for c in r.get("kernel_check", []):
        head = f"\nkernel check {c.get('backend', '')} vs einsum, head dim {c.get('head_dim')} ({c.get('shape', '')}): "
        lines.append(head + (c.get("error") or c.get("skipped") or (
            f"train out {c['train_out_rel']}, grads {c['train_grad_rel']}, decode out {c['decode_out_rel']} "
            "(max abs diff / max abs)")))
    return "\n".join(lines)
