"""PyTorch-side code: `torch_reference`, an independent PyTorch drafter forward (with Carryover) that
reads exported z-lab / DeepSpec checkpoints. The exporters themselves are JAX-side
(`carryover_jax.weights.drafter_formats.export_drafter`, `carryover export`). Target LMs need no
PyTorch code: `carryover_jax.weights.hf.save_params` writes an HF folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads (tested in tests/test_loading.py).

This folder is installed as `carryover_jax.export` (pyproject.toml maps it into the package)."""
