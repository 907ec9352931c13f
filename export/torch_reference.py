"""Independent PyTorch reference for the DFlash-style drafter forward, with Carryover.

Written from the published designs (z-lab DFlash `dflash/model.py`, DeepSpec's DSpark Markov head
`deepspec/modeling/dspark/markov_head.py`, the Carryover Drafting paper), not from the JAX code, so
that agreement between the two is evidence that both follow those designs and that an exported
checkpoint carries the JAX model's numerics. Deliberately plain: one function per concept, everything in float32,
no caches, no fused kernels.

Weights use HF/PyTorch names and layouts (Linear weights are [out, in]).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file

Tensor = torch.Tensor


def load_checkpoint(folder) -> tuple[dict, dict[str, Tensor]]:
    """config.json + every *.safetensors file in the folder (safetensors.torch.load_file), merged."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    weights: dict[str, Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    return config, weights


# --------------------------------------------------------------------------------------------------
# Building blocks


def _f32(t: Tensor) -> Tensor:
    # The reference exists to pin numerics, so every weight is promoted once at use.
    return t.to(torch.float32)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x = _f32(x)
    return _f32(weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    return x @ _f32(weight).T


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def rope_inv_freq(config: dict) -> Tensor:
    """Inverse frequencies [D/2]; llama3 scaling mirrors transformers' `_compute_llama3_parameters`."""
    rp = dict(config.get("rope_parameters") or {})
    theta = rp.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    dim = _head_dim(config)
    # Same expression as HF (int64 arange, then float32) so the two agree bit for bit.
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {rope_type!r}")

    factor = rp["factor"]
    low, high = rp["low_freq_factor"], rp["high_freq_factor"]
    old_len = rp["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """x [B, L, heads, D], positions [B, L] (or [L]) -> rotated x (HF rotate-half layout)."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq  # [B, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]  # broadcast over heads
    return x * emb.cos() + _rotate_half(x) * emb.sin()


# --------------------------------------------------------------------------------------------------
# Drafter


def _fuse(weights: dict, features: Tensor, eps: float) -> Tensor:
    # DFlash context fusion of the tapped target layers: done once, never passed through the layers.
    return _rms_norm(_linear(_f32(features), weights["fc.weight"]), weights["hidden_norm.weight"], eps)


def _layer(weights: dict, i: int, h: Tensor, block_positions: Tensor, segments: list, block_mask: Tensor,
           config: dict, inv_freq: Tensor, attn_probs: Optional[list] = None) -> Tensor:
    """One pre-norm decoder layer. `segments` = [(rows [B, L, d], positions, visible [B, L]), ...] are the
    non-block key/value sources (context, carried): same rows at every layer, no input_layernorm.
    `attn_probs`: a list the layer's attention probabilities [B, H, T, keys] are appended to."""
    p = f"layers.{i}."
    eps = config["rms_norm_eps"]
    n_heads, n_kv, dh = config["num_attention_heads"], config["num_key_value_heads"], _head_dim(config)
    B, T, _ = h.shape

    def keys_values(rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        L = rows.shape[1]
        k = _linear(rows, weights[p + "self_attn.k_proj.weight"]).view(B, L, n_kv, dh)
        k = _apply_rope(_rms_norm(k, weights[p + "self_attn.k_norm.weight"], eps), positions, inv_freq)
        v = _linear(rows, weights[p + "self_attn.v_proj.weight"]).view(B, L, n_kv, dh)
        return k, v

    a = _rms_norm(h, weights[p + "input_layernorm.weight"], eps)
    q = _linear(a, weights[p + "self_attn.q_proj.weight"]).view(B, T, n_heads, dh)
    q = _apply_rope(_rms_norm(q, weights[p + "self_attn.q_norm.weight"], eps), block_positions, inv_freq)

    ks, vs, masks = [], [], []
    for rows, positions, visible in segments:
        k, v = keys_values(rows, positions)
        ks.append(k)
        vs.append(v)
        masks.append(visible[:, None, :].expand(B, T, -1))
    k, v = keys_values(a, block_positions)
    ks.append(k)
    vs.append(v)
    masks.append(block_mask)
    k, v = torch.cat(ks, dim=1), torch.cat(vs, dim=1)
    mask = torch.cat(masks, dim=2)[:, None]  # [B, 1, T, S_total]

    # GQA: query head j reads kv head j // (H / Hkv), i.e. each kv head repeated contiguously.
    groups = n_heads // n_kv
    k = k.repeat_interleave(groups, dim=2).transpose(1, 2)  # [B, H, S, D]
    v = v.repeat_interleave(groups, dim=2).transpose(1, 2)
    scores = (q.transpose(1, 2) @ k.transpose(-1, -2)) * dh ** -0.5  # [B, H, T, S]
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    # A row with no visible key softmaxes to NaN; define its output as zero instead.
    probs = torch.where(mask.any(-1, keepdim=True), probs, torch.zeros_like(probs))
    if attn_probs is not None:
        attn_probs.append(probs)
    attn = (probs @ v).transpose(1, 2).reshape(B, T, n_heads * dh)
    h = h + _linear(attn, weights[p + "self_attn.o_proj.weight"])

    x = _rms_norm(h, weights[p + "post_attention_layernorm.weight"], eps)
    gate = torch.nn.functional.silu(_linear(x, weights[p + "mlp.gate_proj.weight"]))
    return h + _linear(gate * _linear(x, weights[p + "mlp.up_proj.weight"]), weights[p + "mlp.down_proj.weight"])


def drafter_logits(weights, config, embed, lm_head, block_tokens, block_positions,
                   ctx_features=None, ctx_positions=None, ctx_valid=None,
                   carried_features=None, carried_positions=None, rejected_count=None,
                   block_mask=None, attn_probs: Optional[list] = None) -> Tensor:
    """Backbone logits [B, T, V] (no Markov bias). Any segment given as None is absent.

    Shapes: block_tokens/block_positions [B, T]; ctx_features [B, S, m*d], ctx_positions/ctx_valid [B, S]
    (ctx_valid None = all valid); carried_features [B, P, m*d], carried_positions [B, P],
    rejected_count [B] (None = all P rows valid); block_mask [B, T, T] bool (None = all visible).
    `attn_probs`: a list each layer's attention probabilities [B, H, T, keys] are appended to (keys: context,
    carried, block, in that order: the attention diagnostic's reference).
    A missing `e_rej` in weights is treated as zeros (a Carryover embedding that was never trained); the
    projection module's `carry_proj.*` tensors, when present, map the fused carried rows first."""
    eps = config["rms_norm_eps"]
    B, T = block_tokens.shape
    dev = block_tokens.device
    inv_freq = rope_inv_freq(config).to(dev)

    segments = []
    if ctx_features is not None:
        if ctx_positions is None:
            raise ValueError("ctx_positions is required with ctx_features")
        S = ctx_features.shape[1]
        valid = torch.ones(B, S, dtype=torch.bool, device=dev) if ctx_valid is None else ctx_valid.to(torch.bool)
        segments.append((_fuse(weights, ctx_features, eps), ctx_positions, valid))
    if carried_features is not None:
        if carried_positions is None:
            raise ValueError("carried_positions is required with carried_features")
        P = carried_features.shape[1]
        u = _fuse(weights, carried_features, eps)
        if "carry_proj.down_proj.weight" in weights:
            # the projection-module interface: a residual SwiGLU module on the fused rows
            gate = torch.nn.functional.silu(_linear(u, weights["carry_proj.gate_proj.weight"]))
            up = _linear(u, weights["carry_proj.up_proj.weight"])
            u = u + _linear(gate * up, weights["carry_proj.down_proj.weight"])
        if "e_rej" in weights:
            # e_rej, one learned embedding, tags these rows as rejected states (Carryover paper).
            u = u + _f32(weights["e_rej"])
        count = torch.full((B,), P, device=dev) if rejected_count is None else rejected_count
        valid = torch.arange(P, device=dev)[None, :] < count.reshape(B, 1)
        segments.append((u, carried_positions, valid))

    mask = torch.ones(B, T, T, dtype=torch.bool, device=dev) if block_mask is None else block_mask.to(torch.bool)
    h = _f32(embed)[block_tokens]
    for i in range(config["num_hidden_layers"]):
        h = _layer(weights, i, h, block_positions, segments, mask, config, inv_freq, attn_probs)
    return _rms_norm(h, weights["norm.weight"], eps) @ _f32(lm_head).T


# --------------------------------------------------------------------------------------------------
# Markov head (vanilla DSpark: `deepspec/modeling/dspark/markov_head.py`)


def markov_bias(weights, prev_tokens) -> Tensor:
    """[B, T] previous tokens -> [B, T, V] additive bias W2(W1[prev]); raises KeyError if the head is absent."""
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
        if name not in weights:
            raise KeyError(f"checkpoint has no Markov head ({name} missing)")
    w1 = _f32(weights["markov_head.markov_w1.weight"])
    return _linear(w1[prev_tokens], weights["markov_head.markov_w2.weight"])


def markov_sequential(weights, backbone_logits, first_prev, temperature=0.0,
                      generator: Optional[torch.Generator] = None):
    """Sequential Markov decoding over the T slots of backbone_logits [B, T, V]: slot k's logits are
    backbone_logits[:, k] + markov_bias(prev_k) where prev_0 = first_prev [B] and prev_k = the token chosen at
    slot k-1 (argmax if temperature == 0, else a multinomial sample of softmax(logits / temperature)).
    Returns (tokens [B, T] long, corrected_logits [B, T, V])."""
    backbone_logits = _f32(backbone_logits)
    prev = first_prev.to(torch.long)
    tokens, corrected = [], []
    # The bias at slot k depends on the token chosen at k-1, so the slots cannot be decoded in parallel.
    for k in range(backbone_logits.shape[1]):
        logits = backbone_logits[:, k] + markov_bias(weights, prev[:, None])[:, 0]
        if temperature == 0:
            prev = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            prev = torch.multinomial(probs, 1, generator=generator)[:, 0]
        tokens.append(prev)
        corrected.append(logits)
    return torch.stack(tokens, dim=1), torch.stack(corrected, dim=1)
