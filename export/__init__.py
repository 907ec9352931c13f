"""PyTorch-side code, importable without JAX:

- `speculative`: speculative decoding with Carryover for an HF transformers target and a drafter folder
  (z-lab, DeepSpec or native), batch 1, greedy or lossless sampling, KV caches on both sides;
  `python -m carryover_jax.export.speculative --target DIR --drafter DIR --prompt TEXT --json`.
- `torch_drafter`: the drafter that loop runs (its context K/V cache, the carried rows).
- `torch_reference`: an independent, cache-free PyTorch drafter forward (with Carryover) that the JAX
  model and the loop are tested against.

The exporters themselves are JAX-side (`carryover_jax.weights.drafter_formats.export_drafter`,
`carryover export`, which also writes the folder's README.md). Target LMs need no PyTorch code:
`carryover_jax.weights.hf.save_params` writes an HF folder that `transformers.AutoModelForCausalLM`
loads. This folder is installed as `carryover_jax.export` (pyproject.toml maps it into the package)."""
