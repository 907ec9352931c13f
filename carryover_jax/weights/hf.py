"""HF checkpoint folders (safetensors) <-> our param pytrees.

The mapping is mechanical because our module names mirror HF's: `layers/3/self_attn/q_proj/kernel`
is `model.layers.3.self_attn.q_proj.weight` transposed. Tensors are read lazily, one at a time by
name, shape-checked against `jax.eval_shape` of the model, and never go through `init`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from carryover_jax.errors import CheckpointError
from carryover_jax.io import atomic_dir

Params = Any
_LEAF_TO_HF = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias"}


def flatten(tree: Mapping) -> list[tuple[tuple[str, ...], Any]]:
    """(path, leaf) pairs of a nested param dict (paths of str keys)."""
    return list(traverse_util.flatten_dict(tree).items())


def target_hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Our param path -> (HF tensor name, transposed?)."""
    *mods, leaf = path
    prefix = "" if mods[0] == "lm_head" else "model."
    return prefix + ".".join(mods) + "." + _LEAF_TO_HF[leaf], leaf == "kernel"


class SafetensorsReader:
    """Lazy, by-name access to the tensors of a checkpoint folder (single file or sharded index)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if not self.folder.exists():
            raise CheckpointError(f"no such checkpoint folder: {self.folder}")
        if not self.folder.is_dir():
            raise CheckpointError(f"not a checkpoint folder: {self.folder}")
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._where = {name: self.folder / f for name, f in weight_map.items()}
        elif single.exists():
            with safe_open(single, "numpy") as f:
                self._where = {name: single for name in f.keys()}
        else:
            others = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if len(others) == 1:
                only = self.folder / others[0]
                with safe_open(only, "numpy") as f:
                    self._where = {name: only for name in f.keys()}
            else:
                raise CheckpointError(
                    f"{self.folder} holds no weights (expected model.safetensors or model.safetensors.index.json)"
                )
        self._open: dict[Path, Any] = {}

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise CheckpointError(f"{self.folder}: tensor {name!r} is missing")
        path = self._where[name]
        if not path.exists():
            raise CheckpointError(f"{self.folder}: shard {path.name} (holding {name}) is missing")
        if path not in self._open:
            self._open[path] = safe_open(path, "numpy").__enter__()
        return self._open[path].get_tensor(name)

    def close(self):
        for f in self._open.values():
            f.__exit__(None, None, None)
        self._open.clear()


def load_params(
    folder: str | os.PathLike,
    abstract: Params,
    name_fn: Callable[[tuple[str, ...]], tuple[str, bool]] = target_hf_name,
    *,
    shardings: Params | None = None,
) -> Params:
    """Read every leaf of `abstract` (a ShapeDtypeStruct tree) from the folder, lazily and checked.

    `shardings`, a tree of NamedSharding like `abstract`, places each leaf on its devices as it is
    read, so no full unsharded copy of the model is ever built on one device.
    """
    reader = SafetensorsReader(folder)
    flat_sh = dict(flatten(shardings)) if shardings is not None else {}
    out = {}
    try:
        for path, spec in flatten(abstract):
            hf_name, transposed = name_fn(path)
            arr = reader.get(hf_name)
            if transposed:
                arr = arr.T
            if tuple(arr.shape) != tuple(spec.shape):
                raise CheckpointError(
                    f"{hf_name}: shape {tuple(arr.shape if not transposed else arr.T.shape)} in "
                    f"{reader.folder} does not match the config's "
                    f"{tuple(spec.shape if not transposed else spec.shape[::-1])}"
                )
            arr = np.ascontiguousarray(arr).astype(spec.dtype, copy=False)
            sh = flat_sh.get(path)
            out[path] = jax.device_put(arr, sh) if sh is not None else jax.device_put(arr)
    finally:
        reader.close()
    return traverse_util.unflatten_dict(out)


def save_params(
    params: Params,
    folder: str | os.PathLike,
    config: Mapping[str, Any],
    name_fn: Callable[[tuple[str, ...]], tuple[str, bool]] = target_hf_name,
    *,
    extra_files: Mapping[str, str] | None = None,
    dtype: Any = None,
) -> Path:
    """Write `config.json` + `model.safetensors` atomically: the folder appears complete or not at all."""
    folder = Path(folder)
    tensors = {}
    for path, leaf in flatten(params):
        name, transposed = name_fn(path)
        arr = np.asarray(jax.device_get(leaf))
        if dtype is not None:
            arr = arr.astype(dtype)
        tensors[name] = np.ascontiguousarray(arr.T if transposed else arr)
    def write(tmp: Path):
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text)

    atomic_dir(folder, write)
    return folder


def read_config(folder: str | os.PathLike) -> dict:
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"no such checkpoint folder: {folder}")
    cfg = folder / "config.json"
    if not cfg.exists():
        raise CheckpointError(f"{folder} has no config.json")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg} is not valid JSON: {e}") from None
