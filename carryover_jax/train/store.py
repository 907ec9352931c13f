"""`ResponseStore`: an append-only, resumable record store on tensorstore zarr3 arrays.

Layout of a store folder (levanter's jagged-array pattern: flat data + offsets):

    meta.json          format, version, feature_dim, hidden, and the caller's `meta` (target, layers,
                       chat-template hash, data settings); fixed at creation, checked on every reopen
    commit.json        {"records": n, "tokens": T, "ids_bytes": .., "skipped_bytes": ..}: what is visible
    tokens/            zarr3 int32  [T]        all records' input ids, back to back
    loss_mask/         zarr3 uint8  [T]
    offsets/           zarr3 int64  [n + 1]    record i is [offsets[i], offsets[i + 1])
    features/          zarr3 bf16   [T, F]     optional: target features of the chosen layers
    last_hidden/       zarr3 bf16   [T, d]     optional: final-normed last hidden state
    ids.jsonl          one JSON string per record: its source conversation id
    skipped.jsonl      ids processed but dropped (too few loss tokens), so a resumed run skips them too

Commit protocol: `append` writes the array slices past the committed end (resizing the arrays) and
appends to the two id files; `commit` then replaces commit.json atomically (os.replace), strictly
after the data writes have completed. Readers use only the committed prefix, so a writer killed at
any point leaves no partial record visible, and a writer reopening the folder truncates the id files
to the committed bytes and overwrites anything in the arrays past the commit. One writer at a time.

zarr3 (not zarr v2): it is tensorstore's current format, stores bfloat16 natively and resizes by
rewriting one small zarr.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np
import tensorstore as ts

from carryover_jax.errors import CarryoverError, DataError, first_line
from carryover_jax.io import atomic_dir, atomic_write_json, read_json

FORMAT = "carryover-response-store"
VERSION = 1
TOKEN_CHUNK = 1 << 16  # elements per chunk of the 1-D arrays (256 KiB of int32)
FEATURE_CHUNK_BYTES = 4 << 20  # ~4 MiB chunks for the per-token feature rows
BF16 = ml_dtypes.bfloat16

# name -> (zarr3 dtype, numpy dtype, compress): token arrays compress well, bf16 activations do not.
_FLAT = {"tokens": ("int32", np.int32, True), "loss_mask": ("uint8", np.uint8, True)}
_ROWS = {"features": "feature_dim", "last_hidden": "hidden"}


def _spec(folder: Path, name: str) -> dict:
    # absolute: tensorstore refuses a path with a `..` component (API callers may pass one)
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.abspath(folder / name)}}


def _create_array(folder: Path, name: str, dtype: str, row: Sequence[int], chunk_rows: int, compress: bool):
    codecs: list[dict] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if compress:
        codecs.append({"name": "zstd", "configuration": {"level": 1}})
    metadata = {
        "shape": [0, *row], "data_type": dtype, "fill_value": 0, "codecs": codecs,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_rows, *row]}},
    }
    ts.open({**_spec(folder, name), "metadata": metadata}, create=True).result()


def _row_chunk(width: int) -> int:
    rows = max(1, FEATURE_CHUNK_BYTES // (2 * width))
    return 1 << (rows.bit_length() - 1)  # a power of two, so chunks align with typical appends


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x))  # tuples -> lists etc., so stored and requested meta compare equal


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b": leaf}, so a mismatch names the exact setting."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class ResponseStore:
    """Committed records: `len(store)`, `store[i]` -> {"input_ids", "loss_mask"[, "features", "last_hidden"]}."""

    def __init__(self, path: str | os.PathLike, *, writable: bool = False):
        self.path = Path(path)
        info_file = self.path / "meta.json"
        if not self.path.exists():
            raise DataError(f"no such response store {self.path} (run `carryover prepare` first)")
        if not info_file.is_file():
            raise DataError(f"{self.path}: not a response store (no meta.json)")
        self.info = read_json(info_file, "response store metadata", error=DataError)
        if self.info.get("format") != FORMAT or self.info.get("version") != VERSION:
            raise DataError(f"{self.path}: not a version-{VERSION} response store (meta.json)")
        for k in ("feature_dim", "hidden"):
            v = self.info.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DataError(f"invalid {k} {v!r} in response store metadata {info_file}")
        self.feature_dim: int | None = self.info.get("feature_dim")
        self.hidden: int | None = self.info.get("hidden")
        self.writable = writable
        names = ["tokens", "loss_mask", "offsets"] + [n for n, k in _ROWS.items() if self.info.get(k)]
        self._arrays = {n: self._open_array(n) for n in names}
        for n, arr in self._arrays.items():
            want_dtype = {"tokens": "int32", "loss_mask": "uint8", "offsets": "int64"}.get(n, "bfloat16")
            want_rank = 2 if n in _ROWS else 1
            if str(arr.dtype.numpy_dtype) != want_dtype or arr.rank != want_rank or (
                    n in _ROWS and arr.shape[1] != self.info[_ROWS[n]]):
                want = f"{want_dtype} [{'T, ' + str(self.info[_ROWS[n]]) if n in _ROWS else 'T'}]"
                raise DataError(f"array {n}/ in response store {self.path} is {arr.dtype.numpy_dtype} "
                                f"{list(arr.shape)}, expected {want}")
        self._load_commit()
        if writable:
            # Whatever a killed writer left past the commit is garbage: drop it from the id files
            # (the arrays are simply overwritten from the committed end by the next append).
            os.truncate(self.path / "ids.jsonl", self._commit["ids_bytes"])
            os.truncate(self.path / "skipped.jsonl", self._commit["skipped_bytes"])

    # ---- opening -----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike) -> "ResponseStore":
        """Open an existing store read-only (training)."""
        return cls(path)

    @classmethod
    def create_or_open(
        cls,
        path: str | os.PathLike,
        *,
        feature_dim: int | None = None,
        hidden: int | None = None,
        meta: Mapping[str, Any] | None = None,
        meta_defaults: Mapping[str, Any] | None = None,
    ) -> "ResponseStore":
        """Create a store, or reopen one for appending after checking that it was made with the same
        `feature_dim`, `hidden` and `meta` (one `CarryoverError` listing every difference). A flattened
        meta key missing on one side reads as its `meta_defaults` value, so a store written before a
        config field existed still opens when the field has its default."""
        path = Path(path)
        want = {"format": FORMAT, "version": VERSION, "feature_dim": feature_dim, "hidden": hidden,
                "meta": _jsonable(dict(meta or {}))}
        if not (path / "meta.json").is_file():
            if path.exists() and any(path.iterdir()):
                raise CarryoverError(f"{path}: exists and is not a response store; choose an empty or new folder")
            # Built in a temporary sibling and renamed: a crash mid-creation leaves no half store.
            atomic_dir(path, lambda tmp: cls._init_folder(tmp, want))
            return cls(path, writable=True)
        store = cls(path, writable=False)
        diffs = []
        for key in ("format", "version", "feature_dim", "hidden"):
            if store.info.get(key) != want[key]:
                diffs.append(f"{key}: stored {store.info.get(key)!r}, requested {want[key]!r}")
        have_meta, want_meta = _flatten(store.info.get("meta", {})), _flatten(want["meta"])
        default = _flatten(_jsonable(dict(meta_defaults or {})))
        for key in sorted(set(have_meta) | set(want_meta)):
            have, wanted = have_meta.get(key, default.get(key)), want_meta.get(key, default.get(key))
            if have != wanted:
                diffs.append(f"{key}: stored {have!r:.120}, requested {wanted!r:.120}")
        if diffs:
            raise CarryoverError(
                f"{path}: this response store was built with other settings ({'; '.join(diffs)}); "
                "use another store folder or delete this one"
            )
        return cls(path, writable=True)

    @staticmethod
    def _init_folder(folder: Path, info: dict) -> None:
        for name, (dtype, _, compress) in _FLAT.items():
            _create_array(folder, name, dtype, (), TOKEN_CHUNK, compress)
        _create_array(folder, "offsets", "int64", (), TOKEN_CHUNK, True)
        for name, key in _ROWS.items():
            if info[key]:
                _create_array(folder, name, "bfloat16", (info[key],), _row_chunk(info[key]), False)
        offsets = ts.open(_spec(folder, "offsets"), open=True).result()
        offsets.resize(exclusive_max=[1]).result()[0:1].write(np.zeros(1, np.int64)).result()
        (folder / "ids.jsonl").touch()
        (folder / "skipped.jsonl").touch()
        atomic_write_json(folder / "commit.json", {"records": 0, "tokens": 0, "ids_bytes": 0, "skipped_bytes": 0})
        atomic_write_json(folder / "meta.json", info)

    def _open_array(self, name: str):
        try:
            return ts.open(_spec(self.path, name), open=True).result()
        except Exception as e:  # missing/corrupt zarr.json: ValueError or a tensorstore status error
            raise DataError(f"missing or corrupt array {name}/ in response store {self.path} ({first_line(e)})") \
                from None

    def _read(self, name: str, a: int, b: int) -> np.ndarray:
        try:
            return np.asarray(self._arrays[name][a:b].read().result())
        except Exception as e:  # a truncated or deleted chunk file
            raise DataError(f"unreadable {name}[{a}:{b}] in response store {self.path} ({first_line(e)})") from None

    def _load_commit(self) -> None:
        commit_file = self.path / "commit.json"
        c = read_json(commit_file, "response store commit", error=DataError)
        keys = ("records", "tokens", "ids_bytes", "skipped_bytes")
        if any(isinstance(c.get(k), bool) or not isinstance(c.get(k), int) or c[k] < 0 for k in keys):
            raise DataError(f"response store commit {commit_file} needs non-negative integers {', '.join(keys)}")
        self._commit = c
        self._pending = dict(self._commit)
        self._pending_ids: list[str] = []
        n = self._commit["records"]
        for name in ("tokens", "loss_mask"):
            if self._arrays[name].shape[0] < c["tokens"]:
                raise DataError(f"array {name}/ in response store {self.path} holds {self._arrays[name].shape[0]} "
                                f"tokens, fewer than the {c['tokens']} committed in {commit_file}")
        if self._arrays["offsets"].shape[0] < n + 1:
            raise DataError(f"array offsets/ in response store {self.path} is shorter than the {n} committed records")
        self._offsets = self._read("offsets", 0, n + 1).astype(np.int64)
        if self._offsets[0] != 0 or self._offsets[n] != c["tokens"] or np.any(np.diff(self._offsets) < 1):
            raise DataError(f"inconsistent offsets in response store {self.path} (commit {commit_file})")
        self._ids = self._read_lines("ids.jsonl", self._commit["ids_bytes"])
        if len(self._ids) != n:
            raise DataError(f"ids.jsonl in response store {self.path} lists {len(self._ids)} committed ids for "
                            f"{n} records")

    def _read_lines(self, name: str, nbytes: int) -> list[str]:
        path = self.path / name
        try:
            with open(path, "rb") as f:
                data = f.read(nbytes)
        except OSError as e:
            raise DataError(f"cannot read {path} ({e.strerror or e})") from None
        if len(data) < nbytes:
            raise DataError(f"truncated file {path} ({len(data)} bytes, {nbytes} committed)")
        try:
            return [json.loads(line) for line in data.decode("utf-8").splitlines()]
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise DataError(f"corrupt file {path} (not one JSON string per line)") from None

    # ---- reading -----------------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return self.info["meta"]

    @property
    def num_tokens(self) -> int:
        return self._commit["tokens"]

    def __len__(self) -> int:
        return self._commit["records"]

    def ids(self) -> list[str]:
        """Source ids of the committed records, in record order."""
        return list(self._ids)

    def done_ids(self) -> set[str]:
        """Ids a resumed run must not redo: committed records and committed skips."""
        return set(self._ids) | set(self._read_lines("skipped.jsonl", self._commit["skipped_bytes"]))

    def loss_counts(self, max_len: int | None = None) -> np.ndarray:
        """Masked tokens per record within its first `max_len` tokens (all when None)."""
        n, T = len(self), self.num_tokens
        mask = self._read("loss_mask", 0, T).astype(np.int64) if T else np.zeros(0, np.int64)
        cs = np.concatenate([[0], np.cumsum(mask)])
        start = self._offsets[:n]
        end = self._offsets[1 : n + 1] if max_len is None else np.minimum(self._offsets[1 : n + 1], start + max_len)
        return cs[end] - cs[start]

    def tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """Every committed token and its loss mask, records concatenated ([T] each)."""
        T = self.num_tokens
        if not T:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return self._read("tokens", 0, T).astype(np.int64), self._read("loss_mask", 0, T).astype(np.int64)

    def get(self, i: int, *, max_len: int | None = None, features: bool = True) -> dict[str, np.ndarray]:
        """Record `i` (its first `max_len` tokens), with the feature arrays when stored and `features`."""
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for a store of {len(self)}")
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        if max_len is not None:
            b = min(b, a + max_len)
        names = ["tokens", "loss_mask"] + [n for n in _ROWS if n in self._arrays and features]
        futures = {n: self._arrays[n][a:b].read() for n in names}  # issue all reads, then wait
        out = {}
        for n, f in futures.items():
            try:
                out[n] = np.asarray(f.result())
            except Exception as e:  # a truncated or deleted chunk file
                raise DataError(f"unreadable record {i} ({n}) in response store {self.path} ({first_line(e)})") \
                    from None
        out["input_ids"] = out.pop("tokens")
        return out

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.get(int(i))

    # ---- writing -----------------------------------------------------------------------------------
    def append(self, records: Iterable[Mapping[str, Any]], *, skipped: Iterable[str] = ()) -> None:
        """Write records past the pending end (invisible until `commit`). Each record: "id",
        "input_ids" [S], "loss_mask" [S], and "features" [S, F] / "last_hidden" [S, d] when the store
        has them. `skipped` ids are remembered as done without a record."""
        if not self.writable:
            raise CarryoverError(f"{self.path}: opened read-only; use ResponseStore.create_or_open to append")
        records = list(records)
        rows = {n: [] for n in ["tokens", "loss_mask", *(n for n in _ROWS if n in self._arrays)]}
        ids, lengths = [], []
        for r in records:
            ids.append(str(r["id"]))
            tokens = np.asarray(r["input_ids"], np.int32).reshape(-1)
            mask = np.asarray(r["loss_mask"], np.uint8).reshape(-1)
            if len(tokens) == 0 or mask.shape != tokens.shape:
                raise CarryoverError(f"record {ids[-1]!r}: input_ids and loss_mask must be non-empty and equally long")
            lengths.append(len(tokens))
            rows["tokens"].append(tokens)
            rows["loss_mask"].append(mask)
            for name, key in _ROWS.items():
                width = self.info[key]
                if name not in self._arrays:
                    if r.get(name) is not None:
                        raise CarryoverError(f"record {ids[-1]!r} has {name} but this store holds none")
                    continue
                x = r.get(name)
                if x is None or np.shape(x) != (len(tokens), width):
                    raise CarryoverError(
                        f"record {ids[-1]!r}: {name} must have shape {(len(tokens), width)}, got {np.shape(x)}"
                    )
                rows[name].append(np.asarray(x).astype(BF16))
        n0, t0 = self._pending["records"], self._pending["tokens"]
        t1 = t0 + sum(lengths)
        if records:
            for name, parts in rows.items():
                arr = self._arrays[name].resize(exclusive_max=[t1] + [None] * (self._arrays[name].rank - 1)).result()
                arr[t0:t1].write(np.concatenate(parts)).result()
                self._arrays[name] = arr
            offsets = t0 + np.cumsum(lengths, dtype=np.int64)
            arr = self._arrays["offsets"].resize(exclusive_max=[n0 + 1 + len(records)]).result()
            arr[n0 + 1 : n0 + 1 + len(records)].write(offsets).result()
            self._arrays["offsets"] = arr
            self._offsets = np.concatenate([self._offsets[: n0 + 1], offsets])
        self._pending["ids_bytes"] += self._append_lines("ids.jsonl", ids)
        self._pending["skipped_bytes"] += self._append_lines("skipped.jsonl", [str(s) for s in skipped])
        self._pending.update(records=n0 + len(records), tokens=t1)
        self._pending_ids += ids

    def _append_lines(self, name: str, items: list[str]) -> int:
        if not items:
            return 0
        data = "".join(json.dumps(s) + "\n" for s in items).encode("utf-8")
        with open(self.path / name, "ab") as f:
            f.write(data)
        return len(data)

    def commit(self) -> None:
        """Make everything appended so far visible (after all its data writes have completed)."""
        if not self.writable:
            raise CarryoverError(f"{self.path}: opened read-only")
        atomic_write_json(self.path / "commit.json", self._pending)
        self._commit = dict(self._pending)
        self._ids += self._pending_ids
        self._pending_ids = []
