"""`ResponseStore`: an append-only, resumable record store on tensorstore zarr3 arrays.

Layout of a store folder (levanter's jagged-array pattern: flat data + offsets):

    meta.json          format, version, feature_dim, hidden, kv_dim, kv_dtype, and the caller's `meta`
                       (target, layers, chat-template hash, data settings); fixed at creation, checked on
                       every reopen
    commit.json        {"records": n, "tokens": T, "ids_bytes": .., "skipped_bytes": ..}: what is visible
    tokens/            zarr3 int32  [T]        all records' input ids, back to back
    loss_mask/         zarr3 uint8  [T]
    offsets/           zarr3 int64  [n + 1]    record i is [offsets[i], offsets[i + 1])
    plan_index/        zarr3 int64  [n]        optional (stores `prepare` writes): each record's position in
                                               prepare's global prompt plan, the order training reads
    features/          zarr3 bf16   [T, F]     optional: target features of the chosen layers
    last_hidden/       zarr3 bf16   [T, d]     optional: final-normed last hidden state
    target_lse/        zarr3 f32    [T, 1]     optional (stores `prepare` writes with features): log-sum-exp of
                                               the target's logits at that (bf16) last hidden state
    kv/                zarr3 kv_dtype [T, W]   optional: every target layer's K/V (`train/kv_rows.py`), the
                                               recorded prefix DVD's verification attends to (float32 or bf16)
    ids.jsonl          one JSON string per record: its source conversation id
    skipped.jsonl      ids processed but dropped (too few loss tokens), so a resumed run skips them too
    complete.json      written when a prepare pass has finished (removed by the next append): what it planned

A sharded store (`prepare --num-shards N`, one writer per shard) is a folder of such stores,
`shard-00000-of-0000N/` ... `shard-0000{N-1}-of-0000N/`; `open_store` reads a single store or all shards
as one, in plan order, so training sees the same records in the same order for any shard count.

Commit protocol: `append` writes the array slices past the committed end (resizing the arrays) and
appends to the two id files; `commit` then replaces commit.json atomically (os.replace), strictly
after the data writes have completed. Readers use only the committed prefix, so a writer killed at
any point leaves no partial record visible, and a writer reopening the folder truncates the id files
to the committed bytes and overwrites anything in the arrays past the commit. One writer at a time.

zarr3 (not zarr v2): it is tensorstore's current format, stores bfloat16 natively and resizes by
rewriting one small zarr.json.

Whole-store scans (loss counts, token counts) read the per-token arrays `READ_CHUNK` tokens at a time
in their stored dtypes: host memory is bounded by the chunk plus per-record arrays, never [T] int64.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np
import tensorstore as ts

from carryover_jax.errors import CarryoverError, DataError, first_line
from carryover_jax.io import atomic_dir, atomic_write_json, read_json

FORMAT = "carryover-response-store"
VERSION = 1
TOKEN_CHUNK = 1 << 16  # elements per chunk of the 1-D arrays (256 KiB of int32)
FEATURE_CHUNK_BYTES = 4 << 20  # ~4 MiB chunks for the per-token feature rows
READ_CHUNK = 1 << 24  # tokens per read of a whole-store scan: 16 MiB of masks, 64 MiB of token ids
SHARD_GLOB = "shard-*-of-*"
BF16 = ml_dtypes.bfloat16
_NP = {"bfloat16": BF16, "float32": np.float32}

# name -> (zarr3 dtype, numpy dtype, compress): token arrays compress well, bf16 activations do not.
_FLAT = {"tokens": ("int32", np.int32, True), "loss_mask": ("uint8", np.uint8, True)}
# per-token row arrays: name -> the meta.json key of their width (kv: its dtype under "kv_dtype", target_lse:
# float32, else bf16)
_ROWS = {"features": "feature_dim", "last_hidden": "hidden", "target_lse": "lse_dim", "kv": "kv_dim"}
KV_DTYPES = ("float32", "bfloat16")


def _row_dtype(info: Mapping[str, Any], name: str) -> str:
    return info["kv_dtype"] if name == "kv" else "float32" if name == "target_lse" else "bfloat16"


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


def _row_chunk(width: int, itemsize: int) -> int:
    rows = max(1, FEATURE_CHUNK_BYTES // (itemsize * width))
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
    """Committed records: `len(store)`, `store[i]` -> {"input_ids", "loss_mask"[, "features", "last_hidden"]}
    (`get(i, kv=True)`: also "kv")."""

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
        for k in ("feature_dim", "hidden", "lse_dim", "kv_dim"):
            v = self.info.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise DataError(f"invalid {k} {v!r} in response store metadata {info_file}")
        if self.info.get("kv_dim") and self.info.get("kv_dtype") not in KV_DTYPES:
            raise DataError(f"invalid kv_dtype {self.info.get('kv_dtype')!r} in response store metadata {info_file}")
        self.feature_dim: int | None = self.info.get("feature_dim")
        self.hidden: int | None = self.info.get("hidden")
        self.kv_dim: int | None = self.info.get("kv_dim")
        self.kv_dtype: str | None = self.info.get("kv_dtype") if self.kv_dim else None
        self.writable = writable
        names = ["tokens", "loss_mask", "offsets"] + [n for n, k in _ROWS.items() if self.info.get(k)]
        if (self.path / "plan_index").is_dir():
            names.append("plan_index")
        self._arrays = {n: self._open_array(n) for n in names}
        for n, arr in self._arrays.items():
            want_dtype = {"tokens": "int32", "loss_mask": "uint8", "offsets": "int64",
                          "plan_index": "int64"}.get(n) or _row_dtype(self.info, n)
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
        kv_dim: int | None = None,
        kv_dtype: str | None = None,
        target_lse: bool = False,
        meta: Mapping[str, Any] | None = None,
        meta_defaults: Mapping[str, Any] | None = None,
        indexed: bool = False,
    ) -> "ResponseStore":
        """Create a store, or reopen one for appending after checking that it was made with the same
        `feature_dim`, `hidden`, `kv_dim` / `kv_dtype` (the per-token K/V rows, `kv_rows.py`) and `meta`
        (one `CarryoverError` listing every difference: K/V are never added to a store written without
        them). A flattened meta key missing on one side reads as its `meta_defaults` value, so a store
        written before a config field existed still opens when the field has its default. A store created
        `indexed` records each record's plan index, one created with `target_lse` each token's log-sum-exp of
        the target's logits (an existing store keeps the layout it was created with: `has`)."""
        path = Path(path)
        if kv_dim is not None and kv_dtype not in KV_DTYPES:
            raise CarryoverError(f"stored K/V rows need a kv_dtype in {KV_DTYPES}, got {kv_dtype!r}")
        want = {"format": FORMAT, "version": VERSION, "feature_dim": feature_dim, "hidden": hidden,
                "meta": _jsonable(dict(meta or {}))}
        if kv_dim is not None:  # absent otherwise: meta.json of a store without K/V is as before
            want.update(kv_dim=kv_dim, kv_dtype=kv_dtype)
        if target_lse:
            want["lse_dim"] = 1
        if not (path / "meta.json").is_file():
            if path.exists() and any(path.iterdir()):
                raise CarryoverError(f"{path}: exists and is not a response store; choose an empty or new folder")
            # Built in a temporary sibling and renamed: a crash mid-creation leaves no half store.
            atomic_dir(path, lambda tmp: cls._init_folder(tmp, want, indexed))
            return cls(path, writable=True)
        store = cls(path, writable=False)
        diffs = []
        for key in ("format", "version", "feature_dim", "hidden", "kv_dim", "kv_dtype"):
            if store.info.get(key) != want.get(key):
                diffs.append(f"{key}: stored {store.info.get(key)!r}, requested {want.get(key)!r}")
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
    def _init_folder(folder: Path, info: dict, indexed: bool) -> None:
        for name, (dtype, _, compress) in _FLAT.items():
            _create_array(folder, name, dtype, (), TOKEN_CHUNK, compress)
        _create_array(folder, "offsets", "int64", (), TOKEN_CHUNK, True)
        if indexed:
            _create_array(folder, "plan_index", "int64", (), TOKEN_CHUNK, True)
        for name, key in _ROWS.items():
            if info.get(key):
                dtype = _row_dtype(info, name)
                _create_array(folder, name, dtype, (info[key],), _row_chunk(info[key], np.dtype(_NP[dtype]).itemsize),
                              False)
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
        if "plan_index" in self._arrays and self._arrays["plan_index"].shape[0] < n:
            raise DataError(f"array plan_index/ in response store {self.path} is shorter than the {n} committed "
                            "records")
        self._offsets = self._read("offsets", 0, n + 1).astype(np.int64)
        if self._offsets[0] != 0 or self._offsets[n] != c["tokens"] or np.any(np.diff(self._offsets) < 1):
            raise DataError(f"inconsistent offsets in response store {self.path} (commit {commit_file})")
        for name, key in (("ids.jsonl", "ids_bytes"), ("skipped.jsonl", "skipped_bytes")):
            self._check_size(name, c[key])
        self._ids: list[str] | None = None  # read when asked for: training never needs them

    def _check_size(self, name: str, nbytes: int) -> None:
        path = self.path / name
        try:
            size = path.stat().st_size
        except OSError as e:
            raise DataError(f"cannot read {path} ({e.strerror or e})") from None
        if size < nbytes:
            raise DataError(f"truncated file {path} ({size} bytes, {nbytes} committed)")

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
        if self._ids is None:
            ids = self._read_lines("ids.jsonl", self._commit["ids_bytes"])
            if len(ids) != len(self):
                raise DataError(f"ids.jsonl in response store {self.path} lists {len(ids)} committed ids for "
                                f"{len(self)} records")
            self._ids = ids
        return list(self._ids)

    def done_ids(self) -> set[str]:
        """Ids a resumed run must not redo: committed records and committed skips."""
        return set(self.ids()) | set(self._read_lines("skipped.jsonl", self._commit["skipped_bytes"]))

    def has(self, name: str) -> bool:
        """Whether the store holds the per-token array `name` ("features", "last_hidden", "target_lse", "kv")."""
        return name in self._arrays

    @property
    def indexed(self) -> bool:
        """Whether the records carry their plan index (stores `prepare` creates do)."""
        return "plan_index" in self._arrays

    def plan_indices(self) -> np.ndarray:
        """[n] int64: each committed record's position in prepare's global prompt plan (indexed stores)."""
        if not self.indexed:
            raise DataError(f"{self.path}: this response store records no plan index")
        return self._read("plan_index", 0, len(self)) if len(self) else np.zeros(0, np.int64)

    def _record_groups(self):
        """Consecutive record ranges [r0, r1) spanning at most READ_CHUNK tokens, or one longer record."""
        n, r0 = len(self), 0
        while r0 < n:
            last = int(np.searchsorted(self._offsets, self._offsets[r0] + READ_CHUNK, side="right")) - 1
            r1 = min(max(last, r0 + 1), n)
            yield r0, r1
            r0 = r1

    def loss_counts(self, max_len: int | None = None) -> np.ndarray:
        """[n] int32: masked tokens per record within its first `max_len` tokens (all when None)."""
        out = np.zeros(len(self), np.int32)
        for r0, r1 in self._record_groups():
            start = self._offsets[r0:r1]
            end = self._offsets[r0 + 1 : r1 + 1]
            if max_len is not None:
                end = np.minimum(end, start + max_len)
            a, b = int(start[0]), int(end[-1])
            if b - a <= READ_CHUNK:
                cs = np.concatenate([[0], np.cumsum(self._read("loss_mask", a, b), dtype=np.int32)])
                out[r0:r1] = cs[end - a] - cs[start - a]
            else:  # a single record longer than one read
                out[r0] = sum(int(np.count_nonzero(self._read("loss_mask", x, min(x + READ_CHUNK, b))))
                              for x in range(a, b, READ_CHUNK))
        return out

    def token_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every committed token (int32) with its loss mask (uint8), READ_CHUNK tokens at a time."""
        for a in range(0, self.num_tokens, READ_CHUNK):
            b = min(a + READ_CHUNK, self.num_tokens)
            yield self._read("tokens", a, b), self._read("loss_mask", a, b)

    def completion(self) -> dict[str, Any] | None:
        """What the last finished prepare pass planned (complete.json); None while none has finished
        since the last append."""
        path = self.path / "complete.json"
        if not path.is_file():
            return None
        info = read_json(path, "response store completion", error=DataError)
        if info.get("records") != len(self):
            raise DataError(f"{path} marks {info.get('records')!r} records complete, the store commits {len(self)}")
        return info

    def get(self, i: int, *, max_len: int | None = None, features: bool = True,
            kv: bool = False) -> dict[str, np.ndarray]:
        """Record `i` (its first `max_len` tokens), with the feature arrays (and "target_lse") when stored and
        `features`, and its K/V rows when stored and `kv`."""
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for a store of {len(self)}")
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        if max_len is not None:
            b = min(b, a + max_len)
        names = ["tokens", "loss_mask"] + [n for n in _ROWS if n in self._arrays and (kv if n == "kv" else features)]
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
        "input_ids" [S], "loss_mask" [S], "features" [S, F] / "last_hidden" [S, d] / "target_lse" [S, 1] /
        "kv" [S, W] when the store has them, and "index" (its plan index) when the store is indexed. `skipped` ids are
        remembered as done without a record."""
        if not self.writable:
            raise CarryoverError(f"{self.path}: opened read-only; use ResponseStore.create_or_open to append")
        records = list(records)
        rows = {n: [] for n in ["tokens", "loss_mask", *(n for n in _ROWS if n in self._arrays)]}
        ids, lengths, plan = [], [], []
        for r in records:
            ids.append(str(r["id"]))
            if self.indexed:
                index = r.get("index")
                if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
                    raise CarryoverError(f"record {ids[-1]!r}: this store records plan indices; \"index\" must be "
                                         f"an integer >= 0, got {index!r}")
                plan.append(int(index))
            tokens = np.asarray(r["input_ids"], np.int32).reshape(-1)
            mask = np.asarray(r["loss_mask"], np.uint8).reshape(-1)
            if len(tokens) == 0 or mask.shape != tokens.shape:
                raise CarryoverError(f"record {ids[-1]!r}: input_ids and loss_mask must be non-empty and equally long")
            lengths.append(len(tokens))
            rows["tokens"].append(tokens)
            rows["loss_mask"].append(mask)
            for name, key in _ROWS.items():
                width = self.info.get(key)
                if name not in self._arrays:
                    if r.get(name) is not None:
                        raise CarryoverError(f"record {ids[-1]!r} has {name} but this store holds none")
                    continue
                x = r.get(name)
                if x is None or np.shape(x) != (len(tokens), width):
                    raise CarryoverError(
                        f"record {ids[-1]!r}: {name} must have shape {(len(tokens), width)}, got {np.shape(x)}"
                    )
                rows[name].append(np.asarray(x).astype(_NP[_row_dtype(self.info, name)]))
        # the store changes: the last finished pass no longer describes it
        (self.path / "complete.json").unlink(missing_ok=True)
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
            if self.indexed:
                arr = self._arrays["plan_index"].resize(exclusive_max=[n0 + len(records)]).result()
                arr[n0 : n0 + len(records)].write(np.asarray(plan, np.int64)).result()
                self._arrays["plan_index"] = arr
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
        if self._ids is not None:
            self._ids += self._pending_ids
        self._pending_ids = []

    def mark_complete(self, info: Mapping[str, Any]) -> None:
        """Record that a prepare pass has finished (`info`: what it planned), after its last commit."""
        if not self.writable:
            raise CarryoverError(f"{self.path}: opened read-only")
        atomic_write_json(self.path / "complete.json", {"records": len(self), **_jsonable(dict(info))})


# ---- sharded stores ----------------------------------------------------------------------------------
def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def _shard_folders(root: Path) -> dict[tuple[int, int], Path]:
    """(index, count) -> folder, for every shard folder in `root` (a writer's hidden temporaries excluded)."""
    out = {}
    for p in root.glob(SHARD_GLOB):
        m = re.fullmatch(r"shard-(\d{5})-of-(\d{5})", p.name)
        if m and p.is_dir():
            out[(int(m[1]), int(m[2]))] = p
    return out


def shard_path(root: str | os.PathLike, index: int, count: int) -> Path:
    """The folder `prepare` writes shard `index` of `count` into: `root` itself for one shard (a plain
    store, the layout from before shards), else `root/shard-IIIII-of-NNNNN`. Refuses a root holding
    the other layout, shards of another count, or anything else, before any work."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1 or \
            isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise CarryoverError(f"shard index {index!r} is outside [0, {count!r}) ({count!r} shards)")
    root = Path(root)
    shards = _shard_folders(root) if root.is_dir() else {}
    counts = sorted({n for _, n in shards})
    if count == 1:
        if shards:
            raise CarryoverError(f"{root}: holds a response store prepared in {counts[0]} shards; prepare it with "
                                 f"--num-shards {counts[0]}, or use another folder")
        return root
    if (root / "meta.json").is_file():
        raise CarryoverError(f"{root}: holds a 1-process response store; prepare {count} shards into another folder")
    if counts and counts != [count]:
        raise CarryoverError(f"{root}: holds the shards of a {counts[0]}-way preparation, not {count}; use "
                             f"--num-shards {counts[0]}, or another folder")
    if root.is_dir():
        other = sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and p not in shards.values())
        if other:
            raise CarryoverError(f"{root}: exists and is not a sharded response store (it holds {other[0]}); "
                                 "choose an empty or new folder")
    return root / shard_name(index, count)


def open_store(path: str | os.PathLike, extra: Sequence[str | os.PathLike] = ()) -> "StoreView | StoreMix":
    """A store folder for training: a single store, or every shard of a sharded one as one store; with
    `extra` folders (`data.extra_stores`), their records after `path`'s, as one (`StoreMix`)."""
    views = [StoreView(p) for p in (path, *extra)]
    return views[0] if len(views) == 1 else StoreMix(views)


class StoreView:
    """Read-only records of a store folder, as training reads them: one `ResponseStore`, or all shards
    of a sharded store (every one present and finished, from the same settings and prompt plan) as
    one. Records come in plan order where they carry their plan index (stores `prepare` writes), so a
    sharded store and a 1-process store of the same prompts give the same record sequence — and the
    same grain batches; an older store without plan indices keeps its stored order."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        folders = _shard_folders(self.path) if self.path.is_dir() else {}
        if not folders:
            self.shards = [ResponseStore(self.path)]  # its own errors: no such store, no meta.json, ...
        elif (self.path / "meta.json").is_file():
            raise DataError(f"{self.path}: holds both a response store and shard folders; keep one of them")
        else:
            self.shards = _open_shards(self.path, folders)
        first = self.shards[0]
        self.feature_dim, self.hidden, self.kv_dim, self.kv_dtype = (first.feature_dim, first.hidden, first.kv_dim,
                                                                     first.kv_dtype)
        self._starts = np.cumsum([0] + [len(s) for s in self.shards])
        self._order = None
        if all(s.indexed for s in self.shards):
            keys = np.concatenate([s.plan_indices() for s in self.shards])
            self._order = np.argsort(keys, kind="stable")
            ranked = keys[self._order]
            dup = np.flatnonzero(ranked[1:] == ranked[:-1])
            if dup.size:
                raise DataError(f"{self.path}: two records have plan index {int(ranked[dup[0]])} (shards of "
                                "different preparations?); re-prepare the store")

    @property
    def meta(self) -> dict[str, Any]:
        return {k: v for k, v in self.shards[0].meta.items() if k != "shard"}

    def has(self, name: str) -> bool:
        return self.shards[0].has(name)  # shards agree (`_open_shards`)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, i: int) -> tuple[ResponseStore, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for a store of {len(self)}")
        p = int(self._order[i]) if self._order is not None else i
        s = int(np.searchsorted(self._starts, p, side="right")) - 1
        return self.shards[s], p - int(self._starts[s])

    def get(self, i: int, *, max_len: int | None = None, features: bool = True,
            kv: bool = False) -> dict[str, np.ndarray]:
        store, j = self._locate(int(i))
        return store.get(j, max_len=max_len, features=features, kv=kv)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.get(int(i))

    def _ordered(self, per_shard: list[np.ndarray]) -> np.ndarray:
        x = np.concatenate(per_shard)
        return x if self._order is None else x[self._order]

    def ids(self) -> list[str]:
        ids = [i for s in self.shards for i in s.ids()]
        return ids if self._order is None else [ids[p] for p in self._order]

    def loss_counts(self, max_len: int | None = None) -> np.ndarray:
        return self._ordered([s.loss_counts(max_len) for s in self.shards])

    def token_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for s in self.shards:
            yield from s.token_chunks()


# Settings stores may differ in and still train together: which prompts and replies they hold. Everything else
# in meta.json (the target, its template and stop tokens, the feature layers, the split) must agree.
MIX_FREE = ("data.source", "data.prompt_turns", "data.responses", "data.max_turns", "data.max_prompt_tokens",
            "data.max_new_tokens", "data.temperature", "data.top_p", "data.top_k", "data.seed",
            "data.min_loss_tokens")


def _replies_drawn(meta: Mapping[str, Any]) -> tuple:
    """Which replies a store's records hold, as far as two stores of the same prompts can tell: the source's,
    the target's greedy ones, or one draw of its sampling (another seed or setting, other replies)."""
    d = meta.get("data", {})
    if d.get("responses", "regenerate") == "source":
        return ("source",)
    if not d.get("temperature", 0.0):
        return ("greedy",)
    return ("sampled", d["temperature"], d.get("top_p", 1.0), d.get("top_k", 0), d.get("seed", 0))


class StoreMix:
    """Several store folders (each a `StoreView`) read as one: the records of each in turn. For training on
    prompts prepared separately (another source, later turns, replies made elsewhere): the stores must hold
    the same target's records with the same per-token arrays and come from the same train/held-out split,
    and no conversation may be in two of them with the same replies (it would be trained on twice): the same
    prompts with sampled replies (`data.temperature` > 0, another `data.seed`) are other records."""

    def __init__(self, views: Sequence[StoreView]):
        self.views = list(views)
        first = self.views[0]
        self.path = Path(" + ".join(str(v.path) for v in self.views))  # names the mix in messages and grain's repr
        self.feature_dim, self.hidden, self.kv_dim, self.kv_dtype = (first.feature_dim, first.hidden, first.kv_dim,
                                                                     first.kv_dtype)
        ref = _flatten(first.meta)
        for v in self.views[1:]:
            meta = _flatten(v.meta)
            diffs = [k for k in sorted(set(ref) & set(meta)) if ref[k] != meta[k] and k not in MIX_FREE]
            diffs += [k for k in ("feature_dim", "hidden", "kv_dim", "kv_dtype") if getattr(v, k) != getattr(first, k)]
            diffs += ["target_lse"] * (v.has("target_lse") != first.has("target_lse"))
            if diffs:
                raise DataError(f"{first.path} and {v.path} cannot train together: they differ in "
                                f"{', '.join(diffs[:4])}")
        seen: dict[tuple[str, tuple], Path] = {}
        for v in self.views:
            draw = _replies_drawn(v.meta)
            for i in v.ids():
                if seen.setdefault((i, draw), v.path) != v.path:
                    raise DataError(f"{seen[i, draw]} and {v.path} both hold conversation {i!r} with the same "
                                    "replies; train on one of them, prepare the other with prompts the first lacks "
                                    "(data.prompt_turns=later) or sample its replies (data.temperature > 0, "
                                    "another data.seed)")
        self._starts = np.cumsum([0] + [len(v) for v in self.views])

    @property
    def meta(self) -> dict[str, Any]:
        return self.views[0].meta

    def has(self, name: str) -> bool:
        return self.views[0].has(name)

    @property
    def num_tokens(self) -> int:
        return sum(v.num_tokens for v in self.views)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def get(self, i: int, *, max_len: int | None = None, features: bool = True,
            kv: bool = False) -> dict[str, np.ndarray]:
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} out of range for stores of {len(self)}")
        s = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self.views[s].get(int(i) - int(self._starts[s]), max_len=max_len, features=features, kv=kv)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.get(int(i))

    def ids(self) -> list[str]:
        return [i for v in self.views for i in v.ids()]

    def loss_counts(self, max_len: int | None = None) -> np.ndarray:
        return np.concatenate([v.loss_counts(max_len) for v in self.views])

    def token_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for v in self.views:
            yield from v.token_chunks()


def _open_shards(root: Path, folders: dict[tuple[int, int], Path]) -> list[ResponseStore]:
    counts = sorted({n for _, n in folders})
    if len(counts) > 1:
        raise DataError(f"{root}: holds the shards of {' and '.join(map(str, counts))}-way preparations; keep one set")
    n = counts[0]
    missing = [i for i in range(n) if (i, n) not in folders]
    if missing:
        raise DataError(f"{root}: {len(missing)} of its {n} shards are missing (first {shard_name(missing[0], n)}); "
                        f"run `carryover prepare --shard {missing[0]} --num-shards {n}` with the same settings")
    stores, plans = [], []
    for i in range(n):
        st = ResponseStore(folders[(i, n)])
        if st.meta.get("shard") != {"index": i, "count": n} or not st.indexed:
            raise DataError(f"{st.path}: not shard {i} of {n} of a prepared store (meta.json shard "
                            f"{st.meta.get('shard')!r}{'' if st.indexed else ', no plan_index/'})")
        done = st.completion()
        if done is None:
            raise DataError(f"{root}: shard {shard_name(i, n)} is incomplete (its prepare has not finished); run "
                            f"`carryover prepare --shard {i} --num-shards {n}` again with the same settings")
        stores.append(st)
        plans.append(done.get("plan_size"))
    ref, ref_meta = stores[0], _flatten({k: v for k, v in stores[0].meta.items() if k != "shard"})
    for st, plan in zip(stores[1:], plans[1:]):
        meta = _flatten({k: v for k, v in st.meta.items() if k != "shard"})
        diffs = [k for k in sorted(set(ref_meta) | set(meta)) if ref_meta.get(k) != meta.get(k)]
        diffs += [k for k in ("feature_dim", "hidden", "kv_dim", "kv_dtype") if getattr(st, k) != getattr(ref, k)]
        diffs += ["target_lse"] * (st.has("target_lse") != ref.has("target_lse"))
        if plan != plans[0]:  # the same prompt plan: same source file, split and prompt filter
            diffs.append(f"plan_size ({plans[0]!r} vs {plan!r} prompts)")
        if diffs:
            raise DataError(f"{root}: shards {ref.path.name} and {st.path.name} were prepared with other settings "
                            f"({', '.join(diffs[:4])}); re-prepare them alike")
    return stores
