"""What a target checkpoint is: `TargetConfig`, the architecture of a decoder-only LM (frozen, hashable: a
`jax.jit` static argument). A family (Llama, Qwen3, Gemma 3/4) differs only by its switches; there is one
model implementation (`carryover_jax.models.target`). Reading and writing HF `config.json` lives beside the
weights code (`carryover_jax.weights.hf_config`), the public checkpoints' shapes in `config.presets`, and
the dtypes/kernels a run uses in `carryover_jax.numerics` (held here as `numerics`, never serialized)."""

from __future__ import annotations

import dataclasses

from carryover_jax import bounds as B
from carryover_jax.errors import ConfigError
from carryover_jax.numerics import REFERENCE, Numerics

# numerics fields a model config used to carry itself (drafter_config.json v1, old call sites): now
# `TargetConfig.numerics`, mapped by `TargetConfig.replace` / `target_config_from_hf` and ignored when
# deserializing
LEGACY_NUMERICS_FIELDS = ("dtype", "param_dtype", "attention_backend", "cache_dtype")

FAMILIES = ("llama", "qwen3", "gemma3", "gemma4")
LAYER_TYPES = ("full_attention", "sliding_attention")

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
    # prepare, the CLI) and left out of every serialized config. Default: the float32 CPU reference.
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
