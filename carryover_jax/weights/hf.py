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
import ml_dtypes
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from carryover_jax.errors import CheckpointError, first_line
from carryover_jax.io import atomic_dir, read_json

Params = Any
_LEAF_TO_HF = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias",
               "layer_scalar": "layer_scalar"}


def flatten(tree: Mapping) -> list[tuple[tuple[str, ...], Any]]:
    """(path, leaf) pairs of a nested param dict (paths of str keys)."""
    return list(traverse_util.flatten_dict(tree).items())


def hf_name(path: tuple[str, ...], prefix: str = "") -> tuple[str, bool]:
    """A module path + leaf -> (PyTorch tensor name, transposed?): `layers/3/self_attn/q_proj/kernel`
    is `layers.3.self_attn.q_proj.weight` transposed. The one leaf table of targets and drafters."""
    *mods, leaf = path
    return prefix + ".".join([*mods, _LEAF_TO_HF[leaf]]), leaf == "kernel"


def target_hf_name(path: tuple[str, ...], model_prefix: str = "model.") -> tuple[str, bool]:
    """Our target param path -> (HF tensor name, transposed?)."""
    return hf_name(path, "" if path[0] == "lm_head" else model_prefix)


# multimodal checkpoints keep the text model under another prefix (transformers 5 / 4 names)
_TEXT_MODEL_PREFIXES = ("model.language_model.", "language_model.model.")


def _target_names_in(reader: "SafetensorsReader"):
    """`target_hf_name` for this checkpoint: a multimodal one (Gemma 3/4 ...ForConditionalGeneration)
    holds the text model under `model.language_model.` (and its lm_head, if any, at `lm_head`)."""
    if "model.embed_tokens.weight" in reader:
        return target_hf_name
    for prefix in _TEXT_MODEL_PREFIXES:
        if prefix + "embed_tokens.weight" in reader:
            head = "language_model.lm_head.weight" if prefix.startswith("language_model") else "lm_head.weight"
            return lambda path: ((head, True) if path[0] == "lm_head" else target_hf_name(path, prefix))
    return target_hf_name


def to_tensors(params: Params, name_fn: Callable[[tuple[str, ...]], tuple[str, bool]], dtype: Any = None
               ) -> dict[str, np.ndarray]:
    """A param tree -> {PyTorch name: contiguous array} (transposed back where `name_fn` says, cast to
    `dtype` if given): the one writer of targets and drafters."""
    out = {}
    for path, leaf in flatten(params):
        name, transposed = name_fn(path)
        arr = np.asarray(jax.device_get(leaf))
        if dtype is not None:
            arr = arr.astype(dtype)
        out[name] = np.ascontiguousarray(arr.T if transposed else arr)
    return out


# safetensors dtypes numpy has no type for (its numpy reader refuses them): read as raw bytes through
# the file header, typed by ml_dtypes (the dtypes jax itself uses). HF ships Qwen3 and Gemma in BF16.
_ML_DTYPES = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's JSON header and the offset of its data section."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def _read_raw(path: Path, name: str) -> np.ndarray:
    """One tensor of a dtype numpy lacks, memory-mapped (a lazy read, like safe_open's)."""
    header, start = _header(path)
    info = header[name]
    lo, hi = info["data_offsets"]
    dt = np.dtype(_ML_DTYPES[info["dtype"]])
    shape = tuple(info["shape"])
    if hi - lo != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise CheckpointError(f"tensor {name!r} in {path}: {hi - lo} bytes for shape {shape} {info['dtype']}")
    return np.memmap(path, dtype=dt, mode="r", offset=start + lo, shape=shape)


def open_safetensors(path: Path):
    """An open safetensors handle (numpy); a missing/empty/truncated/corrupt file is a CheckpointError.
    The caller closes it with `handle.__exit__(None, None, None)`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"missing safetensors file {path}")
    try:
        return safe_open(path, "numpy").__enter__()
    except Exception as e:  # SafetensorError (bad header), OSError
        what = "empty" if path.stat().st_size == 0 else "truncated or corrupt"
        raise CheckpointError(f"{what} safetensors file {path} ({first_line(e)})") from None


class SafetensorsReader:
    """Lazy, by-name access to the tensors of a checkpoint folder (single file or sharded index), or
    of one named `file` in it (e.g. a drafter's `carryover.safetensors`)."""

    def __init__(self, folder: str | os.PathLike, file: str | None = None):
        self.folder = Path(folder)
        if not self.folder.exists():
            raise CheckpointError(f"no such checkpoint folder: {self.folder}")
        if not self.folder.is_dir():
            raise CheckpointError(f"not a checkpoint folder: {self.folder}")
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        self._open: dict[Path, Any] = {}
        self.label = self.folder if file is None else self.folder / file  # where, in error messages
        if file is not None:
            self._where = {name: self.label for name in self._file(self.label).keys()}
        elif index.exists():
            weight_map = read_json(index, "safetensors index", error=CheckpointError).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"no \"weight_map\" of tensor -> file names in safetensors index {index}")
            self._where = {name: self.folder / f for name, f in weight_map.items()}
        elif single.exists():
            self._where = {name: single for name in self._file(single).keys()}
        else:
            others = sorted(p.name for p in self.folder.glob("*.safetensors"))
            if len(others) == 1:
                only = self.folder / others[0]
                self._where = {name: only for name in self._file(only).keys()}
            else:
                raise CheckpointError(
                    f"{self.folder} holds no weights (expected model.safetensors or model.safetensors.index.json)"
                )

    def _file(self, path: Path):
        """The open safetensors file at `path`; a truncated/corrupt/unreadable one is a CheckpointError."""
        if path not in self._open:
            self._open[path] = open_safetensors(path)
        return self._open[path]

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise CheckpointError(f"{self.label}: tensor {name!r} is missing")
        path = self._where[name]
        if not path.exists():
            raise CheckpointError(f"{self.folder}: shard {path.name} (holding {name}) is missing")
        f = self._file(path)
        if name not in f.keys():
            raise CheckpointError(f"tensor {name!r} is missing in {path} (the index lists it there)")
        try:
            if f.get_slice(name).get_dtype() in _ML_DTYPES:
                return _read_raw(path, name)
            return f.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"unreadable tensor {name!r} in {path} ({first_line(e)})") from None

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
    file: str | None = None,
) -> Params:
    """Read every leaf of `abstract` (a ShapeDtypeStruct tree) from the folder (or its `file`),
    lazily and checked.

    `shardings`, a tree of NamedSharding like `abstract`, places each leaf on its devices as it is
    read, so no full unsharded copy of the model is ever built on one device.
    """
    reader = SafetensorsReader(folder, file)
    if name_fn is target_hf_name:
        name_fn = _target_names_in(reader)
    flat_sh = dict(flatten(shardings)) if shardings is not None else {}
    out = {}
    try:
        for path, spec in flatten(abstract):
            tname, transposed = name_fn(path)
            arr = reader.get(tname)
            if arr.dtype.kind in "biuc" or arr.dtype == object:  # floats only: no silent int -> float cast
                raise CheckpointError(
                    f"{tname}: dtype {arr.dtype} in {reader.label}, expected a floating-point tensor")
            if transposed:
                arr = arr.T
            if tuple(arr.shape) != tuple(spec.shape):
                raise CheckpointError(
                    f"{tname}: shape {tuple(arr.shape if not transposed else arr.T.shape)} in "
                    f"{reader.label} does not match the config's "
                    f"{tuple(spec.shape if not transposed else spec.shape[::-1])}"
                )
            arr = np.ascontiguousarray(arr).astype(spec.dtype, copy=False)  # any float -> the numerics' dtype
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
    tensors = to_tensors(params, name_fn, dtype)

    def write(tmp: Path):
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
        for fname, text in (extra_files or {}).items():
            (tmp / fname).write_text(text)

    atomic_dir(folder, write, replaces=("config.json", "model.safetensors"))
    return folder


def read_config(folder: str | os.PathLike) -> dict:
    folder = Path(folder)
    if not folder.exists():
        raise CheckpointError(f"no such checkpoint folder: {folder}")
    cfg = folder / "config.json"
    if not cfg.exists():
        raise CheckpointError(f"{folder} has no config.json")
    return read_json(cfg, "config", error=CheckpointError)
