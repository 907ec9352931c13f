"""PyTorch-side code: the reference drafter forward and the z-lab / DeepSpec checkpoint exporters.

Target LMs need no PyTorch code: `carryover_jax.weights.hf.save_params` writes an HF folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads (tested in tests/test_loading.py)."""
