"""HF `config.json` <-> `TargetConfig`: the families and architectures we load, the Gemma 3 / Gemma 4
switches, and the features we refuse by name rather than load silently wrong."""

from __future__ import annotations

from typing import Any, Mapping

from carryover_jax.config.target import LEGACY_NUMERICS_FIELDS, TargetConfig
from carryover_jax.errors import ConfigError

# HF architectures we can load, mapped to our family switch. The multimodal Gemma classes load
# their text model (`text_config`, weights under `model.language_model.`).
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
}
_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3",
                "gemma4_text": "gemma4", "gemma4": "gemma4"}
LAYER_TYPES = ("full_attention", "sliding_attention")
# Gemma 4 text-config fields the 12B text model does not use: a checkpoint that sets one is refused
# by name instead of loading silently wrong. (field, the value we support)
_GEMMA4_UNSUPPORTED = (("hidden_size_per_layer_input", 0), ("num_kv_shared_layers", 0),
                       ("enable_moe_block", False), ("use_double_wide_mlp", False),
                       ("use_bidirectional_attention", None))


def target_config_from_hf(hf: Mapping[str, Any], **overrides) -> TargetConfig:
    """The `TargetConfig` of an HF `config.json` dict (transformers 4.x or 5.x layout); `overrides` are
    TargetConfig fields (or the legacy numerics fields `dtype=` ...) set over it."""
    archs = list(hf.get("architectures") or [])
    family = None
    for a in archs:
        family = HF_ARCHITECTURES.get(a)
        if family:
            break
    if family is None:
        family = _MODEL_TYPES.get(hf.get("model_type"))
    if family in ("gemma3", "gemma4") and isinstance(hf.get("text_config"), Mapping):
        # multimodal checkpoint: the text model's config (ids may live at the top level)
        hf = {**{k: hf[k] for k in ("bos_token_id", "eos_token_id", "tie_word_embeddings") if k in hf},
              **hf["text_config"]}
    if family is None:
        what = ", ".join(archs) or hf.get("model_type") or "unknown"
        raise ConfigError(
            f"unsupported architecture {what}; supported: {', '.join(HF_ARCHITECTURES)}"
        )
    rope = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    if not rope:
        rope = dict(scaling)
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    num_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
    eos = hf.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    kw = dict(
        family=family,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=family == "qwen3",
        attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        hidden_act=hf.get("hidden_act", "silu"),
        rope_theta=float(theta),
        rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=int(
            rope.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192))
        ),
        max_position_embeddings=hf.get("max_position_embeddings", 8192),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos,
    )
    if family in ("gemma3", "gemma4"):
        kw.update(_gemma_fields(family, hf, head_dim))
    num = {k: overrides.pop(k) for k in LEGACY_NUMERICS_FIELDS if k in overrides}
    kw.update(overrides)
    cfg = TargetConfig(**kw)
    return cfg.replace(**num) if num else cfg


def target_config_to_hf(cfg: TargetConfig) -> dict[str, Any]:
    """An HF `config.json` dict that transformers loads into the same architecture."""
    arch = f"{cfg.family.capitalize()}ForCausalLM"
    rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": cfg.rope_type}
    if cfg.rope_type == "llama3":
        rope.update(
            factor=cfg.rope_factor,
            low_freq_factor=cfg.rope_low_freq_factor,
            high_freq_factor=cfg.rope_high_freq_factor,
            original_max_position_embeddings=cfg.rope_original_max_position,
        )
    elif cfg.rope_type == "linear":
        rope.update(factor=cfg.rope_factor)
    elif cfg.rope_type == "proportional":
        rope.update(factor=cfg.rope_factor, partial_rotary_factor=cfg.rope_partial_factor)
    out = {
        "architectures": [arch],
        "model_type": cfg.family + ("_text" if cfg.family.startswith("gemma") else ""),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": cfg.attention_bias,
        "hidden_act": cfg.hidden_act,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_parameters": rope,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.family == "llama":
        out["mlp_bias"] = cfg.mlp_bias
    if cfg.family.startswith("gemma"):
        out["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": cfg.rope_local_theta}}
        out.update(hidden_activation=cfg.hidden_act, sliding_window=cfg.sliding_window,
                   layer_types=list(cfg.layer_types) or ["full_attention"] * cfg.num_layers,
                   final_logit_softcapping=cfg.final_logit_softcapping)
    if cfg.family == "gemma3":
        out["query_pre_attn_scalar"] = (cfg.attention_scale or cfg.head_dim ** -0.5) ** -2
    if cfg.family == "gemma4":
        out.update(global_head_dim=cfg.global_head_dim, num_global_key_value_heads=cfg.num_global_kv_heads,
                   attention_k_eq_v=cfg.attention_k_eq_v, hidden_size_per_layer_input=0)
    return out


def _gemma_fields(family: str, hf: Mapping[str, Any], head_dim: int) -> dict[str, Any]:
    """The Gemma 3 / Gemma 4 switches of an HF text config; a feature we do not implement is a
    ConfigError naming its field."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:  # HF's default pattern: every 6th layer global (`sliding_window_pattern`)
        pattern = hf.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    rope = dict(hf.get("rope_parameters") or {})
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
    if family == "gemma3":
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        local.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
        if hf.get("rope_scaling"):
            full.update(hf["rope_scaling"])
    else:
        full = full or {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}
        local = local or {"rope_type": "default", "rope_theta": 10_000.0}
    if (local.get("rope_type") or "default") != "default":
        raise ConfigError(f"unsupported sliding-layer rope_type {local.get('rope_type')!r} (rope_parameters)")
    out: dict[str, Any] = dict(
        layer_types=tuple(types),
        sliding_window=hf.get("sliding_window"),
        rope_theta=float(full.get("rope_theta", 1_000_000.0)),
        rope_type=full.get("rope_type", "default") or "default",
        rope_factor=float(full.get("factor", 1.0)),
        rope_partial_factor=float(full.get("partial_rotary_factor", 1.0)),
        rope_local_theta=float(local.get("rope_theta", 10_000.0)),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        sandwich_norms=True, embed_scale=True, qk_norm=True,
        hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )
    if family == "gemma3":
        if hf.get("attn_logit_softcapping") is not None:
            raise ConfigError("unsupported Gemma field attn_logit_softcapping (attention logit soft-capping)")
        if hf.get("use_bidirectional_attention"):
            raise ConfigError("unsupported Gemma field use_bidirectional_attention (a causal LM is needed)")
        out.update(norm_kind="gemma", attention_scale=float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5)
    else:
        for name, ok in _GEMMA4_UNSUPPORTED:
            if hf.get(name, ok) not in (ok, None) and not (ok == 0 and hf.get(name) in (0, False)):
                raise ConfigError(f"unsupported Gemma 4 field {name}={hf.get(name)!r} (the 12B text model "
                                  f"has {ok!r})")
        k_eq_v = bool(hf.get("attention_k_eq_v", False))
        g_hd, g_kv = hf.get("global_head_dim"), hf.get("num_global_key_value_heads")
        per_layer = hf.get("per_layer_config") or {}
        if per_layer:  # transformers >= 5.2x saves the global layers' overrides per layer
            full_ids = [i for i, t in enumerate(types) if t == "full_attention"]
            vals = {(v.get("head_dim"), v.get("num_key_value_heads")) for v in per_layer.values()
                    if isinstance(v, Mapping) and set(v) <= {"head_dim", "num_key_value_heads"}}
            if len(vals) != 1 or sorted(int(k) for k in per_layer) != full_ids:
                raise ConfigError("unsupported Gemma 4 field per_layer_config (overrides other than one "
                                  "head_dim/num_key_value_heads for every full-attention layer)")
            g_hd, g_kv = vals.pop()
        out.update(norm_kind="gemma4", attention_scale=1.0, v_norm=True, layer_scalar=True,
                   global_head_dim=g_hd or head_dim, num_global_kv_heads=g_kv if k_eq_v else None,
                   attention_k_eq_v=k_eq_v)
    return out
