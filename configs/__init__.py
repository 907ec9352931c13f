"""Python run configs (frozen dataclasses). Target model shapes live in `carryover_jax.config.PRESETS`;
drafter and training configs (tiny test config, the SmolLM2 default, the paper's Qwen3-4B settings)
land here with the drafter and training issues."""
