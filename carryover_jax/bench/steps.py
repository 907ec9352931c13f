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
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig, next_bucket, zlab_layer_ids
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.layers import LiveMask, Prefix, attention_core
from carryover_jax.models.target import abstract_params
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step


def random_params(abstract, seed: int = 0, scale: float = 0.02):
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [(jax.random.normal(k, x.shape, jnp.float32) * scale).astype(x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def _median_ms(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


def run(target_cfg: TargetConfig, *, kind: str = "dflash", layout: str = "zlab", proposals: int = 15,
        draft_layers: int = 5, batch: int = 1, context: int = 512, train_batch: int = 1, train_len: int = 1024,
        anchors: int = 64, repeats: int = 10, backends: tuple[str, ...] = ("einsum",)) -> dict[str, Any]:
    """`backends`: attention backends (models/layers.py) measured one after the other on the same
    weights and inputs; the first is the reference of the `x_first_backend` ratios and of the top-level
    numbers. A backend that fails to compile or run is reported (`error`), not raised, so one device
    run covers the others."""
    tcfg = target_cfg
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
    out: dict[str, Any] = {"target": _describe(tcfg), "drafter": f"{kind}/{layout}, {proposals} proposals, "
                           f"{draft_layers} layers", "batch": batch, "context": context, "device": str(jax.devices()[0])}
    rows = []
    for bk in backends:
        tb = tcfg.replace(attention_backend=bk)
        db = dcfg.replace(backbone=dcfg.backbone.replace(attention_backend=bk))
        row: dict[str, Any] = {"backend": bk}
        try:
            row.update(_decode_times(tb, db, tp, dp, prompt, lens, max_len, repeats))
        except Exception as e:  # noqa: BLE001 - a device check reports every backend
            row["error"] = "decode: " + _error(e)
        t = _train_step(tcfg, dcfg, tp, batch_, anchors, bk, max(3, repeats // 3))
        train_error = t.pop("error", None)
        errors = [row.pop("error", None), train_error and "train: " + train_error]
        row.update({("train_" + k if k in ("compile_s", "temp_gb", "loss") else k): v for k, v in t.items()
                    if k != "backend"})
        if any(errors):
            row["error"] = " | ".join(e for e in errors if e)
        if "ar_step_ms" in row:
            ar_ms = row["ar_step_ms"]
            row.update(verify_over_ar=round(row["verify_ms"] / ar_ms, 3), draft_over_ar=round(row["draft_ms"] / ar_ms, 3),
                       break_even_tau=round(row["round_ms"] / ar_ms, 3))
        rows.append(row)
    first = rows[0]
    for r in rows[1:]:
        for key in ("ar_step_ms", "verify_ms", "round_ms", "train_step_ms"):
            if key in r and key in first:
                r[f"{key}_x_first_backend"] = round(r[key] / first[key], 3)
    out["backends"] = rows
    if len(backends) > 1:
        out["kernel_check"] = kernel_check(tcfg, backends[1:], queries=anchors * dcfg.block_size, keys=train_len,
                                           block=dcfg.block_size, context=context, decode_queries=proposals + 1)
    for key in ("ar_step_ms", "draft_ms", "verify_ms", "round_ms", "verify_over_ar", "draft_over_ar",
                "break_even_tau", "train_step_ms", "train_compile_s"):
        out[key] = first.get(key, float("nan"))
    out["train_shape"] = f"{train_batch} x {train_len} tokens, {anchors} anchors"
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


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
        row: dict[str, Any] = {"backend": bk, "shape": f"train q {t} x ctx {keys}, decode q {tq} x {context}"}
        try:
            (_, o), g = train_fn(bk)(q, k, v, kb, vb)
            row["train_out_rel"] = float(f"{rel(o, o_ref):.3g}")
            row["train_grad_rel"] = float(f"{max(rel(a, b) for a, b in zip(g, g_ref)):.3g}")
            row["decode_out_rel"] = float(f"{rel(decode_fn(bk)(qd, kc, vc), d_ref):.3g}")
        except Exception as e:  # noqa: BLE001 - a device check reports every backend
            row["error"] = _error(e)
        rows.append(row)
    return rows


def _decode_times(tcfg, dcfg, tp, dp, prompt, lens, max_len: int, repeats: int) -> dict[str, float]:
    """Target AR step, drafting, verification and a full round at a fixed context, in ms."""
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
    return out


def _train_step(tcfg, dcfg, tp, batch, anchors: int, backend: str, repeats: int) -> dict[str, Any]:
    """Compile (with XLA's memory analysis of the step) and time one training step with `backend`; a
    backend that fails to compile or run is reported, not raised, so one device run covers the rest."""
    row: dict[str, Any] = {"backend": backend}
    try:
        cfg = TrainConfig(num_anchors=anchors, steps=10, compute_dtype=tcfg.dtype, remat=True,
                          attention_backend=backend)
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
        row["train_step_ms"] = round(_median_ms(lambda: compiled(st, tp, batch)[1]["loss"], repeats), 2)
    except Exception as e:  # noqa: BLE001 - a device check reports every backend
        row["error"] = _error(e)
    return row


# the paper's feature layers where they differ from z-lab's rule (DeepSpec's Gemma 4 12B drafters)
PAPER_LAYER_IDS = {("gemma4", 48): (5, 17, 29, 41, 46)}


def _layer_ids(c: TargetConfig) -> tuple[int, ...]:
    n = c.num_layers
    if (c.family, n) in PAPER_LAYER_IDS:
        return PAPER_LAYER_IDS[c.family, n]
    if n >= 6:
        return zlab_layer_ids(n)
    return tuple(range(max(1, n - 1)))  # cut-down CPU runs: every layer but the last


def _describe(c: TargetConfig) -> str:
    g = next((i for i in range(c.num_layers) if not c.is_sliding(i)), 0)
    geo = (f"heads {c.num_heads}/{c.num_kv_heads}" if c.uniform_layers else
           f"heads {c.num_heads}/{c.num_kv_heads} x {c.head_dim} (sliding, window {c.sliding_window}) and "
           f"{c.num_heads}/{c.layer_kv_heads(g)} x {c.layer_head_dim(g)} (global)")
    return f"{c.family} {c.num_layers} layers, d={c.hidden_size}, {geo}, V={c.vocab_size}, {c.dtype}"


def format_table(r: dict[str, Any]) -> str:
    rows = [("target AR step (T=1)", r["ar_step_ms"], 1.0), ("drafting", r["draft_ms"], r["draft_over_ar"]),
            ("verification (T=P+1)", r["verify_ms"], r["verify_over_ar"]),
            ("speculative round", r["round_ms"], r["break_even_tau"]),
            (f"train step ({r['train_shape']})", r["train_step_ms"], r["train_step_ms"] / r["ar_step_ms"])]
    lines = [f"{r['target']} | drafter {r['drafter']} | batch {r['batch']}, context {r['context']} | {r['device']}",
             "| step | ms | / AR step |", "|---|---|---|"]
    lines += [f"| {name} | {ms:.2f} | {ratio:.2f}x |" for name, ms, ratio in rows]
    lines.append(f"\nbreak-even tau (round / AR step): {r['break_even_tau']}")
    bks = r.get("backends", [])
    if len(bks) > 1 or any("error" in b for b in bks):
        f = lambda b, k: f"{b[k]:.2f}" if k in b else "-"  # noqa: E731
        lines += ["", "| backend | AR ms | verify ms | verify / AR | round / AR | train ms | train x first | "
                  "train temp GB | error |", "|---|---|---|---|---|---|---|---|---|"]
        for b in bks:
            lines.append(f"| {b['backend']} | {f(b, 'ar_step_ms')} | {f(b, 'verify_ms')} | {f(b, 'verify_over_ar')} | "
                         f"{f(b, 'break_even_tau')} | {f(b, 'train_step_ms')} | "
                         f"{f(b, 'train_step_ms_x_first_backend')} | {b.get('train_temp_gb', '-')} | "
                         f"{b.get('error', '')} |")
    for c in r.get("kernel_check", []):
        lines.append(f"\nkernel check {c['backend']} vs einsum ({c['shape']}): " + (
            c["error"] if "error" in c else f"train out {c['train_out_rel']}, grads {c['train_grad_rel']}, "
                                            f"decode out {c['decode_out_rel']} (max abs diff / max abs)"))
    return "\n".join(lines)
