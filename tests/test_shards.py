"""Data at pod scale: prepare's memory-budgeted generation batch, sharded prepare (independent processes,
one store shard each) read by training as one store with the 1-process store's batches, and whole-store
scans in bounded chunks."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from carryover_jax.config import DataConfig, preset
from carryover_jax.errors import CarryoverError, ConfigError, DataError
from carryover_jax.models.target import new_cache
from carryover_jax.numerics import Numerics
from carryover_jax.train import gen_memory as gm
from carryover_jax.train import store as store_mod
from carryover_jax.train.pipeline import make_train_iter
from carryover_jax.train.store import ResponseStore, open_store, shard_name, shard_path
from carryover_jax.train.vocab import token_counts
from tests.xla_flags import cpu_xla_flags

REPO = Path(__file__).resolve().parents[1]


# ---- the memory-budgeted generation batch -------------------------------------------------------------
def _eval_shape_bytes(tcfg, batch, slots):
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(lambda: new_cache(tcfg, batch, slots))))


def test_generation_batch_is_the_largest_that_fits_the_budget():
    q = preset("qwen3-4b")  # shapes only: nothing is allocated
    data = DataConfig(max_prompt_tokens=2048, max_new_tokens=4096)  # configs/qwen3_4b.py
    assert gm.generation_lengths(data, q) == (2048, 8192)
    f32 = q.with_numerics(Numerics.for_platform("cpu"))
    # the number: a float32 cache of 64 rows x 8,192 slots is ~155 GB
    assert gm.cache_bytes(f32, 64, 8192) == _eval_shape_bytes(f32, 64, 8192) == \
        2 * 36 * 64 * 8 * 8192 * 128 * 4 + 64 * 4
    assert round(gm.cache_bytes(f32, 64, 8192) / 1e9) == 155
    bf16 = q.with_numerics(Numerics.for_platform("cuda"))  # bf16 cache, the fused attention kernel
    assert gm.cache_bytes(bf16, 64, 8192) == _eval_shape_bytes(bf16, 64, 8192)
    for tcfg, platform in ((f32, "cpu"), (bf16, "cuda")):
        b = gm.batch_for_budget(data, tcfg, 80e9, platform=platform)
        need = [gm.generation_bytes(data, tcfg, n, platform) for n in (b, b + 1)]
        assert need[0]["total"] <= 80e9 < need[1]["total"]
        assert need[0]["cache"] == _eval_shape_bytes(tcfg, b, 8192)
        assert need[0]["total"] == need[0]["cache"] + need[0]["activations"]
    # fused kernels materialise no [T, S] scores: bf16 on CUDA fits far more rows than float32 einsum
    assert gm.batch_for_budget(data, bf16, 80e9, platform="cuda") > 4 * gm.batch_for_budget(data, f32, 80e9)
    with pytest.raises(ConfigError, match=r"the budget: one conversation needs [\d.]+ GB \(KV cache [\d.]+ GB for "
                                          r"8192 slots, activations ~[\d.]+ GB\); raise the budget"):
        gm.batch_for_budget(data, f32, 1e9)
    # the feature pass (no cache) is sized too; source replies without features need no device memory
    feats = dataclasses.replace(data, responses="source", store_features=True, feature_layer_ids=(1, 9))
    assert gm.generation_bytes(feats, f32, 2)["cache"] == 0 < gm.generation_bytes(feats, f32, 2)["total"]
    plain = dataclasses.replace(data, responses="source", gen_memory_gb=1e-6)
    assert gm.generation_batch(plain, f32) == (8, "data.gen_batch_size (no device pass to size)")


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_generation_batch_choice():
    tiny = preset("qwen3-4b").replace(num_layers=2).with_numerics(Numerics.for_platform("cpu"))
    data = DataConfig(max_prompt_tokens=64, max_new_tokens=64, gen_batch_size=8)
    assert gm.generation_batch(data, tiny, device=_Device(None)) == (8, "data.gen_batch_size")  # CPU: no stats
    assert gm.generation_batch(data, tiny, max_rows=3, device=_Device(None))[0] == 3  # no more rows than prompts
    budget = dataclasses.replace(data, gen_memory_gb=2.0)
    b, why = gm.generation_batch(budget, tiny)
    assert b == gm.batch_for_budget(budget, tiny, 2e9) > 8 and why == "the largest in data.gen_memory_gb=2"
    # an accelerator's free memory caps gen_batch_size (the params are already in bytes_in_use)
    one = gm.generation_bytes(data, tiny, 1)["total"]
    room = _Device({"bytes_limit": 10**12, "bytes_in_use": 10**12 - int(3.5 * one / gm.DEVICE_FRACTION)})
    assert gm.generation_batch(data, tiny, device=room)[0] == 3
    assert gm.generation_batch(data, tiny, device=_Device({"bytes_limit": 10**12, "bytes_in_use": 0}))[0] == 8
    with pytest.raises(ConfigError, match=r"GB free on the device after loading the target: one conversation"):
        gm.generation_batch(data, tiny, device=_Device({"bytes_limit": 10**9, "bytes_in_use": 10**9}))
    with pytest.raises(ConfigError, match=r"data\.gen_memory_gb=1e-06: one conversation needs"):
        gm.generation_batch(dataclasses.replace(data, gen_memory_gb=1e-6), tiny)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match=r"data\.gen_memory_gb must be a finite number in \(0, "):
            DataConfig(gen_memory_gb=bad)


# ---- whole-store scans in chunks ---------------------------------------------------------------------
def _records(n, rng, start=0, index=None):
    out = []
    for i in range(start, start + n):
        S = int(rng.integers(3, 40))
        r = {"id": f"r{i}", "input_ids": rng.integers(0, 50, S), "loss_mask": (rng.random(S) < 0.7).astype(np.uint8)}
        r["input_ids"][0] = i
        if index is not None:
            r["index"] = index(i)
        out.append(r)
    return out


def test_loss_and_token_counts_read_in_bounded_chunks(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    recs = _records(40, rng)
    s = ResponseStore.create_or_open(tmp_path / "s")
    s.append(recs)
    s.commit()
    want_counts = np.bincount(np.concatenate([r["input_ids"][r["loss_mask"] == 1] for r in recs]), minlength=60)
    for chunk in (1 << 24, 64, 16, 5):  # 16 and 5: records longer than one read
        monkeypatch.setattr(store_mod, "READ_CHUNK", chunk)
        st = ResponseStore.open(tmp_path / "s")
        for max_len in (None, 4, 17):
            got = st.loss_counts(max_len)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, [r["loss_mask"][:max_len].sum() for r in recs])
        parts = list(st.token_chunks())
        assert all(len(t) <= chunk and t.dtype == np.int32 and m.dtype == np.uint8 for t, m in parts)
        np.testing.assert_array_equal(token_counts(st, 60), want_counts)


# ---- sharded stores (synthetic shards) ---------------------------------------------------------------
def _shard(root, i, n, recs, *, complete=True, meta=None, plan_size=None):
    st = ResponseStore.create_or_open(shard_path(root, i, n), meta={"t": 1, **(meta or {}), "shard": {"index": i,
                                                                                                    "count": n}},
                                      indexed=True)
    st.append(recs)
    st.commit()
    if complete:
        st.mark_complete({"plan_size": plan_size})
    return st


def test_sharded_store_reads_as_one_store_in_plan_order(tmp_path):
    rng = np.random.default_rng(1)
    recs = _records(20, rng, index=lambda i: i)
    # each shard in its own (shuffled) stored order, as prepare's length-sorted batches leave them
    root = tmp_path / "sharded"
    for i in range(3):
        mine = [r for r in recs if r["index"] % 3 == i]
        _shard(root, i, 3, [mine[j] for j in rng.permutation(len(mine))], plan_size=20)
    one = tmp_path / "one"
    st = ResponseStore.create_or_open(one, meta={"t": 1}, indexed=True)
    st.append([recs[j] for j in rng.permutation(20)])
    st.commit()
    view, single = open_store(root), open_store(one)
    assert view.ids() == single.ids() == [f"r{i}" for i in range(20)] != ResponseStore.open(one).ids()
    assert len(view) == 20 and view.num_tokens == single.num_tokens and view.meta == {"t": 1}
    for i in (0, 7, 19):
        np.testing.assert_array_equal(view[i]["input_ids"], recs[i]["input_ids"])
    np.testing.assert_array_equal(view.loss_counts(9), [r["loss_mask"][:9].sum() for r in recs])
    cfg = DataConfig(max_len=16, min_loss_tokens=2)
    a = make_train_iter(cfg, view, batch_size=4, seed=5, read_threads=1)
    b = make_train_iter(cfg, single, batch_size=4, seed=5, read_threads=1)
    for _ in range(6):  # past an epoch
        x, y = next(a), next(b)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    # an older store without plan indices keeps its stored order
    old = tmp_path / "old"
    st = ResponseStore.create_or_open(old)
    st.append([{k: v for k, v in r.items() if k != "index"} for r in recs[::-1]])
    st.commit()
    assert open_store(old).ids() == [f"r{i}" for i in range(19, -1, -1)]


def test_sharded_store_refusals(tmp_path):
    rng = np.random.default_rng(2)
    recs = _records(6, rng, index=lambda i: i)

    def fresh(name):
        return tmp_path / name

    missing = fresh("missing")
    _shard(missing, 0, 3, recs[:2])
    with pytest.raises(DataError, match=r"2 of its 3 shards are missing \(first shard-00001-of-00003\); run "
                                        r"`carryover prepare --shard 1 --num-shards 3`"):
        open_store(missing)
    unfinished = fresh("unfinished")
    _shard(unfinished, 0, 2, recs[::2])
    _shard(unfinished, 1, 2, recs[1::2], complete=False)
    with pytest.raises(DataError, match=r"shard shard-00001-of-00002 is incomplete \(its prepare has not finished\)"):
        open_store(unfinished)
    # an append after the completion (a prepare extending the shard) makes it incomplete again
    done = fresh("done")
    _shard(done, 0, 2, recs[::2])
    s1 = _shard(done, 1, 2, recs[1:4:2])
    assert len(open_store(done)) == 5
    s1.append(recs[5:6])
    with pytest.raises(DataError, match="is incomplete"):
        open_store(done)
    other = fresh("other")
    _shard(other, 0, 2, recs[::2])
    _shard(other, 1, 2, recs[1::2], meta={"t": 2})
    with pytest.raises(DataError, match=r"shards shard-00000-of-00002 and shard-00001-of-00002 were prepared with "
                                        r"other settings \(t\)"):
        open_store(other)
    plans = fresh("plans")
    _shard(plans, 0, 2, recs[::2], plan_size=6)
    _shard(plans, 1, 2, recs[1::2], plan_size=7)
    with pytest.raises(DataError, match=r"plan_size \(6 vs 7 prompts\)"):
        open_store(plans)
    dup = fresh("dup")
    _shard(dup, 0, 2, recs[:3])
    _shard(dup, 1, 2, recs[2:])
    with pytest.raises(DataError, match=r"two records have plan index 2"):
        open_store(dup)
    mixed = fresh("mixed")
    _shard(mixed, 0, 2, recs[:1])
    shutil.copytree(mixed / shard_name(0, 2), mixed / shard_name(0, 3))
    with pytest.raises(DataError, match=r"holds the shards of 2 and 3-way preparations"):
        open_store(mixed)
    # prepare's layout checks, before any work
    with pytest.raises(CarryoverError, match=r"holds the shards of a 2-way preparation, not 3; use --num-shards 2"):
        shard_path(done, 0, 3)
    with pytest.raises(CarryoverError, match=r"prepared in 2 shards; prepare it with --num-shards 2"):
        shard_path(done, 0, 1)
    single = fresh("single")
    ResponseStore.create_or_open(single)
    with pytest.raises(CarryoverError, match=r"holds a 1-process response store; prepare 2 shards into another"):
        shard_path(single, 1, 2)
    shutil.copytree(done / shard_name(0, 2), single / shard_name(0, 2))
    with pytest.raises(DataError, match="holds both a response store and shard folders"):
        open_store(single)
    notes = fresh("notes")
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    with pytest.raises(CarryoverError, match=r"exists and is not a sharded response store \(it holds notes\.txt\)"):
        shard_path(notes, 0, 2)
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(CarryoverError, match=r"shard index .* is outside"):
            shard_path(tmp_path / "any", index, count)


# ---- a 2-process prepare of the tiny model == the 1-process store (greedy) ----------------------------
# prompt lengths out of order (prepare sorts them into batches), all in one prompt bucket and cache size:
# every process compiles one generation program
PROMPT_WORDS = (7, 2, 9, 4, 8, 3, 6, 5)


def _prepare_argv(target, prompts, store, *extra):
    sets = {"target": target, "data.store": store, "data.source": prompts, "data.heldout_per_mille": 0,
            "data.max_prompts": None, "data.max_new_tokens": 5, "data.max_prompt_tokens": 64,
            "data.gen_batch_size": 4, "data.min_loss_tokens": 2, "data.max_turns": 1}
    return ["prepare", "--config", "tiny", "--quiet", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}")),
            *extra]


def test_two_process_prepare_matches_the_one_process_store(tiny_llama, tmp_path, capsys):
    from carryover_jax.cli import main
    from tests.hf_models import add_word_tokenizer

    target = tmp_path / "target"
    shutil.copytree(tiny_llama.path, target)
    add_word_tokenizer(target)
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("w") as f:
        for i, n in enumerate(PROMPT_WORDS):
            msgs = [{"role": "user", "content": " ".join(f"w{5 + (i * 7 + j) % 90}" for j in range(n))},
                    {"role": "assistant", "content": "w50 w51"}, {"role": "user", "content": f"w{60 + i}"}]
            f.write(json.dumps({"id": f"p{i}", "messages": msgs}) + "\n")
    sharded, single = tmp_path / "sharded", tmp_path / "single"

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRYOVER_", "SLURM_"))}
    env.update(JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false", CARRYOVER_CACHE=str(tmp_path / "cache"),
               XLA_FLAGS=cpu_xla_flags())  # one device, as a host of its own
    procs = []
    for i in range(2):  # two independent processes, as on two hosts: no coordinator, no collective
        log = (tmp_path / f"shard{i}.log").open("w")
        argv = _prepare_argv(target, prompts, sharded, "--shard", str(i), "--num-shards", "2")
        procs.append((subprocess.Popen([sys.executable, "-m", "carryover_jax.cli", *argv], cwd=REPO, env=env,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    try:
        assert main(_prepare_argv(target, prompts, single)) == 0, capsys.readouterr().err  # meanwhile, here
        deadline = time.monotonic() + 180
        while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait()
            log.close()
    for i, (p, _) in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"shard{i}.log").read_text()[-3000:]
    out = json.loads((tmp_path / "shard1.log").read_text().strip().splitlines()[-1])
    assert out["written"] == str(sharded / "shard-00001-of-00002")

    assert sorted(p.name for p in sharded.iterdir()) == [  # the shards, and each writer's lock (io.exclusive)
        ".shard-00000-of-00002.lock", ".shard-00001-of-00002.lock", "shard-00000-of-00002", "shard-00001-of-00002"]
    one, two = open_store(single), open_store(sharded)
    shards = [ResponseStore.open(sharded / shard_name(i, 2)) for i in range(2)]
    assert all(len(s) for s in shards) and sum(map(len, shards)) == len(one) >= 6
    for i, s in enumerate(shards):  # disjoint: plan index i mod 2
        assert set(s.plan_indices() % 2) == {i}
        assert s.completion()["plan_size"] == len(PROMPT_WORDS)
    assert ResponseStore.open(single).ids() != one.ids()  # the stored (length-sorted) order is not plan order
    assert one.ids() == two.ids() and one.num_tokens == two.num_tokens
    for i in range(len(one)):
        for k in ("input_ids", "loss_mask"):
            np.testing.assert_array_equal(one[i][k], two[i][k])
    cfg = DataConfig(max_len=48, min_loss_tokens=2)
    a = make_train_iter(cfg, one, batch_size=2, seed=3, read_threads=1)
    b = make_train_iter(cfg, two, batch_size=2, seed=3, read_threads=1)
    for _ in range(2 * len(one)):  # a few epochs
        x, y = next(a), next(b)
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    # a resumed shard with nothing left to do stays complete and unchanged
    assert main(_prepare_argv(target, prompts, sharded, "--shard", "0", "--num-shards", "2")) == 0
    assert open_store(sharded).ids() == one.ids()
