"""Copy the records of a response store whose plan index is below N (its first N prompts) into a new store.

    python subset.py SRC DST N

So two arms can share the same first N ShareGPT records exactly, one of them trained on SRC's first 2N: the
equal-size A/B of this folder's README. DST gets SRC's metadata with data.max_prompts = N, and is marked complete;
it is written beside DST and renamed when whole (an interrupted copy leaves no DST: run it again).
"""
import shutil
import sys
from pathlib import Path

from carryover_jax.train.store import ResponseStore

src_path, dst_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
src = ResponseStore.open(src_path)
meta = dict(src.info["meta"])
meta["data"] = {**meta.get("data", {}), "max_prompts": n}
if Path(dst_path).exists():
    sys.exit(f"{dst_path}: exists")
tmp = Path(f"{dst_path}.partial")
shutil.rmtree(tmp, ignore_errors=True)
dst = ResponseStore.create_or_open(
    tmp, feature_dim=src.feature_dim, hidden=src.hidden, kv_dim=src.kv_dim, kv_dtype=src.kv_dtype,
    target_lse=src.has("target_lse"), meta=meta, indexed=True)
ids, plan = src.ids(), src.plan_indices()
keep = [i for i in range(len(src)) if plan[i] < n]
for start in range(0, len(keep), 64):
    records = []
    for i in keep[start:start + 64]:
        r = src.get(i)
        records.append({**r, "id": ids[i], "index": int(plan[i])})
    dst.append(records)
    dst.commit()
dst.mark_complete({"plan_size": n, "max_prompts": n, "subset_of": src_path})
tmp.rename(dst_path)
print(f"{dst_path}: {len(dst)} records, {dst.num_tokens} tokens (of {len(src)} in {src_path})")
