"""GGUF files -> HF safetensors folders, once, through transformers' dequantizing loader.

Two workarounds (measured in `shared/spec/environment.md` §4): transformers needs `accelerate` to
load GGUF, and `save_pretrained` refuses a GGUF-loaded model until its quantizer is removed even
though the weights are dense float32 by then.
"""

from __future__ import annotations

import os
from pathlib import Path

from carryover_jax.errors import CheckpointError
from carryover_jax.io import atomic_dir


def convert_gguf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike, *, quiet: bool = True) -> Path:
    """Dequantize `gguf_file` to a float32 HF folder at `out_dir` (atomic: complete or absent)."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    if not gguf_file.is_file():
        raise CheckpointError(f"no such GGUF file: {gguf_file}")
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - torch is a declared extra
        raise CheckpointError(f"GGUF conversion needs torch and transformers ({e})") from None
    if quiet:
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    import sys

    print(f"converting {gguf_file.name} once to {out_dir} ...", file=sys.stderr)
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:
        raise CheckpointError(f"transformers cannot load {gguf_file}: {str(e).splitlines()[0]}") from None
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    def write(tmp: Path):
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    atomic_dir(out_dir, write)
    return out_dir
