"""The paper's attention diagnostic (Figure 6): where a drafting round's block looks, carried rows or not.

For every round of a T = 0 decode (`diagnostics._decode_with_log` drives the engine's rounds), the
drafter's attention probabilities of each block query over its keys — the committed context (cropped to the
`window` rows before the anchor, not renormalised: the mass further back is left out, as in the paper),
the carried rows j = 0..P−1 and the block slots 0..T−1 — averaged over heads and draft layers. Rounds are
pooled by their carried count r (the previous round's P − a; an arm without carried rows attends to none,
whatever r was), so the figure compares baseline rounds with rounds carrying few and many rows.

The probabilities come from the layers' own projections (flax `capture_intermediates` of each attention's
`queries` and `keys_values`, i.e. q and k after their norms and RoPE) and the engine's own cache and
carried rows, through a plain softmax over [context ; carried ; block] with the engine's masks;
tests/test_attention_diagnostic.py checks them against the PyTorch reference's probabilities.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import drafting as D
from carryover_jax.models.drafter import Drafter, carried_segment_mask, frozen_from_target
from carryover_jax.models.cache import values
from carryover_jax.models.layers import LiveMask

WINDOW = 16  # context rows before the anchor shown (the paper's figure crops the context too)


@functools.partial(jax.jit, static_argnames=("sc", "window"))
def round_attention(sc, target_params, draft_params, s, *, window: int = WINDOW):
    """The next round's attention map per row, [B, T, window + P + T] (columns: context rows anchor−window ..
    anchor−1, carried rows 0..P−1, block slots 0..T−1), averaged over heads and draft layers, and each row's
    whole context mass [B] (what the crop leaves out is that minus the shown context columns)."""
    cfg = sc.drafter
    bc = cfg.backbone
    m = Drafter(cfg)
    frozen = frozen_from_target(target_params, sc.target)
    cache = s.draft_cache
    b, t, p = s.anchor.shape[0], cfg.block_size, cfg.num_proposals
    anchor_pos = cache.lengths
    positions = anchor_pos[:, None] + jnp.arange(t)[None, :]
    rows, valid = (), jnp.zeros((b, p), bool)
    if sc.attend_carried:
        valid = jnp.arange(p)[None, :] < s.rejected_count[:, None]
        rows = ((s.carried, anchor_pos[:, None] + jnp.arange(p)[None, :], carried_segment_mask(valid, t)),)
    ctx_mask = LiveMask(jnp.broadcast_to(cache.lengths[:, None], (b, t)))
    _, state = m.apply({"params": draft_params}, D.block_tokens(cfg, s.anchor), positions, frozen,
                       cached=(cache.k, cache.v, ctx_mask), rows=rows, method=Drafter.block_hidden,
                       capture_intermediates=lambda mdl, method: method in ("queries", "keys_values"),
                       mutable=["intermediates"])
    layers = state["intermediates"]["layers"]
    slots = jnp.arange(cache.k[0].shape[2])
    ctx_ok = slots[None, :] < cache.lengths[:, None]  # [B, S]
    win = cache.lengths[:, None] - window + jnp.arange(window)[None, :]  # [B, W] slots shown
    total, ctx_mass = 0.0, 0.0
    for i in range(bc.num_layers):
        cap = layers[str(i)]["self_attn"]
        q = cap["queries"][0]  # [B, T, H, D]
        kvs = cap["keys_values"]  # (carried (k, v),)? + (block (k, v),), head-major [B, Hkv, R, D]
        k_blk = kvs[-1][0]
        k_car = kvs[0][0] if sc.attend_carried else jnp.zeros((b, k_blk.shape[1], p, k_blk.shape[3]), k_blk.dtype)
        h, d = q.shape[2], q.shape[3]
        rep = h // k_blk.shape[1]  # query head j reads K/V head j // rep

        def scores(k):
            k = jnp.repeat(k, rep, axis=1).astype(jnp.float32)
            return jnp.einsum("bthd,bhsd->bhts", q.astype(jnp.float32), k)

        scale = bc.attention_scale or 1.0 / math.sqrt(d)
        logits = jnp.concatenate([scores(values(cache.k[i])), scores(k_car), scores(k_blk)], axis=-1) * scale
        ok = jnp.concatenate([ctx_ok, valid, jnp.ones((b, t), bool)], axis=-1)[:, None, None, :]
        pr = jax.nn.softmax(jnp.where(ok, logits, -jnp.inf), axis=-1).mean(axis=1)  # [B, T, S + P + T]
        s_len = cache.k[i].shape[2]
        shown = jnp.take_along_axis(pr[..., :s_len], jnp.clip(win, 0, s_len - 1)[:, None, :], axis=-1)
        shown = jnp.where((win >= 0)[:, None, :], shown, 0.0)
        total = total + jnp.concatenate([shown, pr[..., s_len:]], axis=-1)
        ctx_mass = ctx_mass + pr[..., :s_len].sum(axis=-1).mean(axis=-1)
    return total / bc.num_layers, ctx_mass / bc.num_layers


class AttentionTally:
    """Sums of the per-round maps by carried count r = 0..P (`round_attention`), for one arm."""

    def __init__(self, P: int, block: int, window: int = WINDOW):
        self.window, self.P = window, P
        self.sums = np.zeros((P + 1, block, window + P + block))
        self.context = np.zeros(P + 1)
        self.rounds = np.zeros(P + 1, np.int64)

    def add(self, maps, ctx_mass, counts, active) -> None:
        for i in np.nonzero(active)[0]:
            r = int(counts[i])
            self.sums[r] += maps[i]
            self.context[r] += ctx_mass[i]
            self.rounds[r] += 1

    def report(self, carryover: bool) -> dict[str, Any]:
        """{"carryover", "window", "P", "by_carried": [{"rounds", "mean" [T][C] | None, "context_mass"}] (r =
        0..P)}: means over the rounds that had r carried rows."""
        by = [{"rounds": int(n), "mean": None if n == 0 else (s / n).round(6).tolist(),
               "context_mass": None if n == 0 else round(float(c / n), 6)}
              for s, c, n in zip(self.sums, self.context, self.rounds)]
        return {"carryover": carryover, "window": self.window, "P": self.P, "by_carried": by}


def pooled(rep: dict[str, Any], counts) -> tuple[np.ndarray | None, int]:
    """The mean map over the rounds whose carried count is in `counts`, and their number."""
    cells = [rep["by_carried"][r] for r in counts if rep["by_carried"][r]["rounds"]]
    n = sum(c["rounds"] for c in cells)
    if not n:
        return None, 0
    return sum(np.asarray(c["mean"]) * c["rounds"] for c in cells) / n, n


def panels(attention: dict[str, dict[str, Any]]) -> list[tuple[str, list[tuple[str, np.ndarray | None, int]]]]:
    """Figure 6's panels per Carryover arm: baseline rounds (every round of the first arm without carried rows;
    without one, this arm's rounds with none), rounds with few (1..⌈P/2⌉) and with many (⌈P/2⌉+1..P) rows.
    [(row title, [(panel title, mean map or None, rounds)])]."""
    base = next((rep for rep in attention.values() if not rep["carryover"]), None)
    if not any(rep["carryover"] for rep in attention.values()):  # no Carryover arm: every arm's rounds
        return [("all arms", [(f"{lab}, all rounds", *pooled(rep, range(rep["P"] + 1)))
                              for lab, rep in attention.items()])]
    out = []
    for lab, rep in attention.items():
        if not rep["carryover"]:
            continue
        P = rep["P"]
        half = -(-P // 2)
        ref_label = next((k for k, v in attention.items() if v is base), None)
        first = (f"baseline ({ref_label}), all rounds", *pooled(base, range(P + 1))) if base else \
            (f"{lab}, no carried rows", *pooled(rep, [0]))
        out.append((lab, [first, (f"{lab}, 1-{half} carried rows", *pooled(rep, range(1, half + 1))),
                          (f"{lab}, {half + 1}-{P} carried rows", *pooled(rep, range(half + 1, P + 1)))]))
    return out


def column_labels(window: int, P: int, block: int) -> list[str]:
    return [f"-{window - i}" for i in range(window)] + [f"c{j}" for j in range(P)] + [f"b{t}" for t in range(block)]


def plot(attention: dict[str, dict[str, Any]], path) -> None:
    """attention.png: one row of heat maps per Carryover arm (`panels`), block queries down, keys across."""
    import matplotlib.pyplot as plt  # the caller (plots.write_plots) selected the Agg backend

    rows = panels(attention)
    ncol = max(len(ps) for _, ps in rows)
    fig, axes = plt.subplots(len(rows), ncol, figsize=(5.5 * ncol, 2.6 * len(rows) + 0.8), squeeze=False)
    rep = next(iter(attention.values()))
    w, P = rep["window"], rep["P"]
    vmax = max((float(m.max()) for _, ps in rows for _, m, _ in ps if m is not None), default=1.0)
    for ax_row, (_, ps) in zip(axes, rows):
        for ax, (title, m, n) in zip(ax_row, ps):
            ax.set_title(f"{title}\n({n} rounds)", fontsize=8)
            if m is None:
                ax.text(0.5, 0.5, "no such rounds", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            im = ax.imshow(m, aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
            labels = column_labels(w, P, m.shape[0])
            step = max(1, len(labels) // 16)
            ax.set_xticks(range(0, len(labels), step), labels[::step], fontsize=6, rotation=90)
            ax.set_yticks(range(m.shape[0]), [f"b{t}" for t in range(m.shape[0])], fontsize=6)
            for x in (w - 0.5, w + P - 0.5):  # context | carried | block
                ax.axvline(x, color="white", lw=1.0)
            ax.set_xlabel("keys: context before the anchor | carried rows | block", fontsize=7)
        for ax in ax_row[len(ps):]:
            ax.set_axis_off()
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="attention probability (heads, layers, rounds)")
    fig.suptitle("attention to carried rows (T = 0; context cropped, not renormalised)", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)

