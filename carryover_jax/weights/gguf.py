"""GGUF files -> HF safetensors folders, once, through transformers' dequantizing loader.

Two workarounds (both hit with the installed transformers): it needs `accelerate` to
load GGUF, and `save_pretrained` refuses a GGUF-loaded model until its quantizer is removed even
though the weights are dense float32 by then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from carryover_jax.errors import CheckpointError, first_line
from carryover_jax.io import COMPLETE, atomic_dir, is_complete


SOURCE_FILE = "carryover_source.json"  # which GGUF a converted folder came from


def source_info(gguf_file: Path) -> dict:
    return {"gguf": gguf_file.name, "size": gguf_file.stat().st_size}


def _legacy_complete(out_dir: Path) -> bool:
    """An unmarked folder is trusted only if its config parses and its weights file is whole."""
    from carryover_jax.weights.hf import open_safetensors

    try:
        json.loads((out_dir / "config.json").read_text())
        if not (out_dir / "tokenizer.json").is_file():
            return False
        f = open_safetensors(out_dir / "model.safetensors")  # checks the header covers the whole file
        f.__exit__(None, None, None)
        return True
    except (OSError, ValueError, CheckpointError):
        return False


def is_converted(gguf_file: str | os.PathLike, out_dir: str | os.PathLike) -> bool:
    """Whether `out_dir` is a finished conversion of this GGUF file (a half-written or stale one is not)."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and not is_complete(out_dir) and _legacy_complete(out_dir):
        # written by a version before the markers (already renamed into place whole): adopt it
        try:
            (out_dir / SOURCE_FILE).write_text(json.dumps(source_info(Path(gguf_file))) + "\n")
            (out_dir / COMPLETE).write_text("")
        except OSError:
            return True
    if not is_complete(out_dir) or not (out_dir / SOURCE_FILE).is_file():
        return False
    try:
        return json.loads((out_dir / SOURCE_FILE).read_text()) == source_info(Path(gguf_file))
    except (OSError, ValueError):
        return False


def convert_gguf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike, *, quiet: bool = True) -> Path:
    """Dequantize `gguf_file` to a float32 HF folder at `out_dir` (atomic: complete or absent)."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    if not gguf_file.is_file():
        raise CheckpointError(f"no such GGUF file: {gguf_file}")
    if gguf_file.stat().st_size == 0:
        raise CheckpointError(f"empty GGUF file {gguf_file}")
    with open(gguf_file, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"not a GGUF file (no GGUF magic) {gguf_file}")
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
        raise CheckpointError(f"truncated or unreadable GGUF file {gguf_file} ({first_line(e)})") from None
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    def write(tmp: Path):
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(source_info(gguf_file)) + "\n")

    try:
        atomic_dir(out_dir, write)
    except OSError as e:
        raise CheckpointError(f"cannot write the converted target to {out_dir} ({e.strerror or e})") from None
    return out_dir
