"""Target presets: the shapes of the public checkpoints (weights come from the user's HF folders), for
configs, benchmarks and memory plans that need no checkpoint."""

from __future__ import annotations

from carryover_jax.config.target import TargetConfig
from carryover_jax.errors import ConfigError


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
