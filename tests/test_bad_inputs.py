"""Bad input and faults: every case gets a one-line error (CLI: `carryover <cmd>: error: ...`, exit 2;
API: a `CarryoverError` subclass) or survives. One table row per case, plus fault rows that kill or
signal a subprocess at a chosen point (SIGKILL mid-write, SIGTERM mid-training) and a NaN row.

Everything runs on a tiny random Llama (3 layers, width 64, context 512) with a word-level tokenizer,
made once per module; every corrupted file is a copy in the row's own tmp folder."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from carryover_jax.errors import (CarryoverError, CheckpointError, ConfigError, DataError, RequestError,
                                  TrainingError)
from tests.hf_models import add_word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 512  # the tiny target's max_position_embeddings


# ---- fixtures: a tiny target with a tokenizer, a drafter, a store, a prompt file ------------------------
@dataclasses.dataclass
class Env:
    target: Path  # HF folder with tokenizer
    drafter: Path  # native drafter folder (dflash, zlab layout)
    markov: Path  # native drafter folder (markov, deepspec layout)
    store: Path  # a committed response store
    prompts: Path  # a valid JSONL prompt file
    loaded: Any  # the loaded Target
    tmp: Path = None  # the row's own folder

    def copy(self, what: str) -> Path:
        dst = self.tmp / what
        shutil.copytree(getattr(self, what), dst)
        return dst


@pytest.fixture(scope="module")
def base(tiny_llama, tmp_path_factory):
    from carryover_jax.loading import init_drafter, load_target
    from carryover_jax.weights.drafter_formats import save_drafter
    from tests.synthetic import synthetic_store

    root = tmp_path_factory.mktemp("bad_inputs")
    target = root / "target"
    shutil.copytree(tiny_llama.path, target)
    add_word_tokenizer(target)
    loaded = load_target(target)
    d = init_drafter(loaded, kind="dflash", layout="zlab", num_proposals=3, num_layers=1, target_layer_ids=(0, 1),
                     mask_token_id=4)
    save_drafter(d.cfg, d.params, root / "drafter")
    m = init_drafter(loaded, kind="markov", layout="deepspec", num_proposals=3, num_layers=1,
                     target_layer_ids=(0, 1), mask_token_id=4, markov_rank=4)
    save_drafter(m.cfg, m.params, root / "markov")
    store = synthetic_store(root / "store")
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7"}\n{"messages": [{"role": "user", "content": "w8 w9"}]}\n')
    return Env(target, root / "drafter", root / "markov", store, prompts, loaded)


@pytest.fixture
def env(base, tmp_path, monkeypatch):
    monkeypatch.setenv("CARRYOVER_CACHE", str(tmp_path / "cache"))
    return dataclasses.replace(base, tmp=tmp_path)


# ---- file corruptions ---------------------------------------------------------------------------------
def truncate(path: Path, keep: int | None = None) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if keep is None else keep])
    return path


def edit_json(path: Path, fn: Callable[[Any], Any]) -> Path:
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))
    return path


def edit_tensors(path: Path, fn: Callable[[dict], None]) -> Path:
    t = load_file(path)
    fn(t)
    save_file(t, path)
    return path


def _del(key):
    def f(d):
        del d[key]
        return d
    return f


def target_with(e: Env, fn: Callable[[Path], Any]) -> str:
    d = e.copy("target")
    fn(d)
    return str(d)


def drafter_with(e: Env, fn: Callable[[Path], Any]) -> str:
    d = e.copy("drafter")
    fn(d)
    return str(d)


def write(e: Env, name: str, data: bytes | str) -> str:
    p = e.tmp / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def words(n: int) -> str:
    return " ".join(f"w{5 + i % 90}" for i in range(n))


def train_args(e: Env, *extra: str, store: str | None = None, out: str | None = None) -> list[str]:
    return ["train", "--config", "tiny", "--quiet", "--set", f"target={e.target}",
            "--set", f"data.store={store or e.store}", "--set", f"out_dir={out or e.tmp / 'run'}",
            "--set", "data.max_len=32", "--set", "data.min_loss_tokens=2", "--set", "drafter.target_layer_ids=(0,1)",
            *extra]


def pipeline_args(e: Env, *extra: str) -> list[str]:
    return ["pipeline", "--config", "tiny", *extra, "--out", str(e.tmp / "p")]


def corrupt_store(e: Env, fn: Callable[[Path], Any]) -> str:
    d = e.copy("store")
    fn(d)
    return str(d)


def _int64_tokens(d: Path) -> None:
    from carryover_jax.train.store import TOKEN_CHUNK, _create_array

    shutil.rmtree(d / "tokens")
    _create_array(d, "tokens", "int64", (), TOKEN_CHUNK, True)


def sharded_store(e: Env, *, shards: int, of: int, complete: bool = True) -> str:
    """A sharded store root with shards 0 .. shards-1 of `of`, the last one finished or not."""
    from carryover_jax.train.store import ResponseStore, shard_path

    root = e.tmp / "sharded"
    for i in range(shards):
        st = ResponseStore.create_or_open(shard_path(root, i, of), meta={"shard": {"index": i, "count": of}},
                                          indexed=True)
        st.append([{"id": f"r{i}", "index": i, "input_ids": np.arange(5, 25), "loss_mask": np.ones(20)}])
        st.commit()
        if complete or i < shards - 1:
            st.mark_complete({"plan_size": of})
    return str(root)


def _file_in(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("x")
    return folder


# ---- the table ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    id: str
    build: Callable[[Env], Any]  # CLI: -> argv; API: -> a zero-argument callable
    match: str  # regex searched in the error line / exception message
    error: type = None  # API rows: the CarryoverError subclass raised; CLI rows: None (exit code below)
    code: int = 2


GEN = ["generate", "--prompt", "w5 w6 w7", "--max-new-tokens", "4"]

CLI_ROWS = [
    # generate: request values (refused before the target is even loaded)
    Row("generate top-p 1.5", lambda e: GEN + ["--target", str(e.target), "--top-p", "1.5"],
        r"top_p must be in \(0, 1\] \(1 = off\), got 1\.5"),
    Row("generate top-p 0", lambda e: GEN + ["--target", "nowhere", "--top-p", "0"], r"top_p must be in \(0, 1\]"),
    Row("generate top-k -3", lambda e: GEN + ["--target", "nowhere", "--top-k", "-3"],
        r"top_k must be an integer >= 0 \(0 = off\), got -3"),
    Row("generate temperature nan", lambda e: GEN + ["--target", "nowhere", "--temperature", "nan"],
        r"temperature must be a finite number >= 0 \(0 = greedy\), got nan"),
    Row("generate temperature inf", lambda e: GEN + ["--target", "nowhere", "--temperature", "inf"],
        r"temperature must be a finite number >= 0"),
    Row("generate temperature -1", lambda e: GEN + ["--target", "nowhere", "--temperature", "-1"],
        r"temperature must be a finite number >= 0"),
    Row("generate max-new-tokens 0", lambda e: GEN + ["--target", "nowhere", "--max-new-tokens", "0"],
        r"max_new_tokens must be an integer >= 1, got 0"),
    Row("generate max-len 0", lambda e: GEN + ["--target", "nowhere", "--max-len", "0"],
        r"max_len must be an integer >= 1"),
    Row("generate max-len below the prompt", lambda e: ["generate", "--target", str(e.target), "--prompt",
                                                        words(10), "--max-len", "4"],
        r"prompt 0 has 10 tokens; with max_new_tokens=128 it needs 138 cache slots but the cache holds 4 \(max_len\)"),
    Row("generate max-len past the context", lambda e: GEN + ["--target", str(e.target), "--max-len", "100000"],
        r"max_len 100,000 is longer than the target's context of 512 tokens"),
    Row("generate prompt longer than the context", lambda e: ["generate", "--target", str(e.target), "--prompt",
                                                              words(600)],
        r"prompt 0 has 600 tokens, more than the target's context of 512 tokens"),
    Row("generate prompt + max-new-tokens past the context", lambda e: ["generate", "--target", str(e.target),
                                                                        "--prompt", words(500)],
        r"prompt 0 has 500 tokens \+ max_new_tokens 128, more than the target's context of 512 tokens"),
    # generate: target files
    Row("target missing", lambda e: GEN + ["--target", str(e.tmp / "missing")], r"no such target: '.*missing'"),
    Row("target safetensors truncated", lambda e: GEN + ["--target", target_with(
        e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file .*target/model\.safetensors \(.*header"),
    Row("target safetensors empty", lambda e: GEN + ["--target", target_with(
        e, lambda d: truncate(d / "model.safetensors", 0))], r"empty safetensors file .*target/model\.safetensors"),
    Row("target safetensors garbage", lambda e: GEN + ["--target", target_with(
        e, lambda d: (d / "model.safetensors").write_bytes(os.urandom(4096)))],
        r"truncated or corrupt safetensors file .*model\.safetensors"),
    Row("target config.json truncated", lambda e: GEN + ["--target", target_with(
        e, lambda d: truncate(d / "config.json"))], r"invalid JSON in config .*target/config\.json"),
    Row("target config.json empty", lambda e: GEN + ["--target", target_with(
        e, lambda d: truncate(d / "config.json", 0))], r"empty config .*target/config\.json"),
    Row("target config.json wrong type", lambda e: GEN + ["--target", target_with(
        e, lambda d: (d / "config.json").write_text("[1, 2]"))],
        r"config .*config\.json holds a JSON list, expected a dict"),
    Row("target config.json missing field", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_json(d / "config.json", _del("hidden_size")))],
        r"missing field 'hidden_size' in config .*target/config\.json"),
    Row("target config.json wrong value type", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_json(d / "config.json", lambda c: {**c, "num_hidden_layers": "three"}))],
        r"num_layers must be an integer in \[1, 1048576\], got 'three' \(in config .*target/config\.json\)"),
    Row("target config.json zero heads", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_json(d / "config.json", lambda c: {**c, "num_attention_heads": 0}))],
        r"num_heads must be an integer in \[1, 1048576\], got 0 \(in config .*target/config\.json\)"),
    Row("target tensor wrong dtype", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_tensors(d / "model.safetensors", lambda t: t.update(
            {"model.norm.weight": t["model.norm.weight"].astype(np.int32)})))],
        r"model\.norm\.weight: dtype int32 in .*target, expected a floating-point tensor"),
    Row("target tensor wrong shape", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_tensors(d / "model.safetensors", lambda t: t.update(
            {"model.layers.1.mlp.up_proj.weight": np.zeros((5, 64), np.float32)})))],
        r"model\.layers\.1\.mlp\.up_proj\.weight: shape \(5, 64\) in .* does not match the config's \(112, 64\)"),
    Row("target tensor missing", lambda e: GEN + ["--target", target_with(
        e, lambda d: edit_tensors(d / "model.safetensors", lambda t: t.pop("model.norm.weight")))],
        r"tensor 'model\.norm\.weight' is missing"),
    Row("target tokenizer.json corrupt", lambda e: GEN + ["--target", target_with(
        e, lambda d: truncate(d / "tokenizer.json"))], r"target: cannot load the tokenizer"),
    Row("target index.json invalid", lambda e: GEN + ["--target", target_with(
        e, lambda d: (d / "model.safetensors.index.json").write_text("{oops"))],
        r"invalid JSON in safetensors index .*model\.safetensors\.index\.json"),
    Row("target index lists a missing shard", lambda e: GEN + ["--target", target_with(
        e, lambda d: (d / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.norm.weight": "model-00002.safetensors"}})))],
        r"shard model-00002\.safetensors \(holding model\.embed_tokens\.weight\)|tensor '.*' is missing"),
    Row("target .gguf empty", lambda e: GEN + ["--target", write(e, "m.gguf", b"")], r"empty GGUF file .*m\.gguf"),
    Row("target .gguf not a GGUF", lambda e: GEN + ["--target", write(e, "m.gguf", b"PK\3\4" + b"\0" * 64)],
        r"not a GGUF file \(no GGUF magic\) .*m\.gguf"),
    Row("target plain file", lambda e: GEN + ["--target", write(e, "weights.bin", b"x")],
        r"neither a checkpoint folder nor a \.gguf file"),
    # generate: drafter files
    Row("drafter safetensors truncated", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file .*drafter/model\.safetensors \(Error while deserializing header"),
    Row("drafter config truncated", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: truncate(d / "drafter_config.json"))],
        r"invalid JSON in drafter config .*drafter/drafter_config\.json"),
    Row("drafter config missing field", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: edit_json(d / "drafter_config.json", _del("backbone")))],
        r"missing field 'backbone' in drafter config .*drafter_config\.json"),
    Row("drafter config bad value", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: edit_json(d / "drafter_config.json", lambda c: {**c, "kind": "lstm"}))],
        r"unknown drafter kind 'lstm'.*\(in drafter config .*drafter_config\.json\)"),
    Row("drafter config from a newer version", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: edit_json(d / "drafter_config.json", lambda c: {**c, "config_version": 99}))],
        r"drafter config version 99 is not one this carryover-jax reads .*\(in drafter config .*drafter_config\.json\)"),
    Row("drafter e_rej wrong dtype", lambda e: GEN + ["--target", str(e.target), "--drafter", drafter_with(
        e, lambda d: edit_tensors(d / "model.safetensors", lambda t: t.update(
            {"e_rej": t["e_rej"].astype(np.int64)})))],
        r"e_rej: dtype int64 in .*model\.safetensors, expected a floating-point tensor"),
    Row("drafter missing", lambda e: GEN + ["--target", str(e.target), "--drafter", str(e.tmp / "nope")],
        r"no such drafter folder: .*nope"),
    # generate: prompt files
    Row("prompts-file invalid JSON", lambda e: ["generate", "--target", "nowhere", "--prompts-file",
                                                write(e, "p.jsonl", '{"prompt": "w5"}\n{"prompt": \n')],
        r"p\.jsonl:2: invalid JSON"),
    Row("prompts-file not UTF-8", lambda e: ["generate", "--target", "nowhere", "--prompts-file",
                                             write(e, "p.jsonl", b"\xff\xfe\x00garbage\n")],
        r"p\.jsonl:1: not UTF-8 text"),
    Row("prompts-file empty", lambda e: ["generate", "--target", "nowhere", "--prompts-file", write(e, "p.jsonl", "")],
        r"no prompts in .*p\.jsonl"),
    Row("prompts-file wrong type", lambda e: ["generate", "--target", "nowhere", "--prompts-file",
                                              write(e, "p.jsonl", '["w5"]\n')],
        r"p\.jsonl:1: expected a JSON object with \"messages\" or \"prompt\""),
    Row("prompts-file missing", lambda e: ["generate", "--target", "nowhere", "--prompts-file", str(e.tmp / "no.jsonl")],
        r"no such prompt file"),
    # export
    Row("export drafter truncated", lambda e: ["export", "--format", "zlab", "--out", str(e.tmp / "out"),
                                               "--drafter", drafter_with(e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file .*drafter/model\.safetensors"),
    Row("export over a foreign folder", lambda e: ["export", "--format", "zlab", "--drafter", str(e.drafter),
                                                   "--out", str(Path(write(e, "notes.txt", "mine")).parent)],
        r"exists and holds something else than this command writes; refusing to replace it"),
    Row("export format mismatch", lambda e: ["export", "--format", "zlab", "--drafter", str(e.markov),
                                             "--out", str(e.tmp / "out")],
        r"the z-lab format holds DFlash drafters in the zlab layout; this is markov/deepspec"),
    Row("export deepspec target truncated", lambda e: [
        "export", "--format", "deepspec", "--drafter", str(e.markov), "--out", str(e.tmp / "out"),
        "--target", target_with(e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file .*target/model\.safetensors"),
    Row("export over a target checkpoint", lambda e: ["export", "--format", "zlab", "--drafter", str(e.drafter),
                                                      "--out", str(e.copy("target"))],
        r"target exists and holds something else than this command writes; refusing to replace it"),
    # init-drafter
    Row("init-drafter target truncated", lambda e: ["init-drafter", "--out", str(e.tmp / "d"), "--target",
                                                    target_with(e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file"),
    Row("init-drafter out is a file", lambda e: ["init-drafter", "--target", str(e.target), "--layers", "1",
                                                 "--proposals", "3", "--layer-ids", "0,1",
                                                 "--out", write(e, "file", "x")],
        r"exists and is not a folder"),
    Row("init-drafter layer ids not integers", lambda e: ["init-drafter", "--target", str(e.target),
                                                          "--layer-ids", "a,b", "--out", str(e.tmp / "d")],
        r"--layer-ids must be comma-separated integers, got 'a,b'"),
    Row("init-drafter layer id out of range", lambda e: ["init-drafter", "--target", str(e.target),
                                                         "--layer-ids", "0,7", "--out", str(e.tmp / "d")],
        r"target layer id 7 out of range"),
    # convert
    Row("convert truncated GGUF", lambda e: ["convert", "--target", write(e, "t.gguf", b"GGUF\3\0\0\0" + b"\1" * 20)],
        r"truncated or unreadable GGUF file .*t\.gguf"),
    Row("convert missing file", lambda e: ["convert", "--target", str(e.tmp / "x.gguf")], r"no such target"),
    # prepare
    Row("prepare bad prompt source", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set",
        f"data.store={e.tmp / 'st'}", "--set", f"data.source={write(e, 'src.jsonl', 'not json')}"],
        r"src\.jsonl:1: invalid JSON"),
    Row("prepare store is a foreign folder", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set",
        f"data.store={Path(write(e, 'notes.txt', 'mine')).parent}", "--set", f"data.source={e.prompts}"],
        r"exists and is not a response store"),
    Row("prepare top_p 1.5", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set",
        f"data.store={e.tmp / 'st'}", "--set", f"data.source={e.prompts}", "--set", "data.top_p=1.5"],
        r"top_p must be in \(0, 1\]"),
    Row("prepare unknown key", lambda e: ["prepare", "--config", "tiny", "--set", "data.nope=1"],
        r"unknown config key 'data\.nope'"),
    # sharded prepare and the memory-budgeted generation batch
    Row("prepare shard index out of range", lambda e: ["prepare", "--config", "tiny", "--shard", "2", "--num-shards",
                                                       "2"], r"--shard 2 is outside \[0, 2\) \(--num-shards 2\)"),
    Row("prepare shard index negative", lambda e: ["prepare", "--config", "tiny", "--shard", "-1"],
        r"argument --shard: must be an integer in \[0, "),
    Row("prepare num-shards 0", lambda e: ["prepare", "--config", "tiny", "--num-shards", "0"],
        r"argument --num-shards: must be an integer in \[1, 1048576\], got 0"),
    Row("prepare data.gen_memory_gb 0", lambda e: ["prepare", "--config", "tiny", "--set", "data.gen_memory_gb=0"],
        r"data\.gen_memory_gb must be a finite number in \(0, 1e\+06\] or None, got 0\.0"),
    Row("prepare data.gen_memory_gb negative", lambda e: ["prepare", "--config", "tiny", "--set",
                                                          "data.gen_memory_gb=-2"],
        r"data\.gen_memory_gb must be a finite number in \(0, 1e\+06\] or None, got -2\.0"),
    Row("prepare data.gen_memory_gb too small for one conversation", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set", f"data.store={e.tmp / 'st'}",
        "--set", f"data.source={e.prompts}", "--set", "data.gen_memory_gb=1e-6"],
        r"data\.gen_memory_gb=1e-06: one conversation needs [\d.e-]+ GB \(KV cache .* for 256 slots, activations "
        r"~[\d.e-]+ GB\); raise the budget or lower data\.max_prompt_tokens / data\.max_new_tokens"),
    Row("prepare shards into a 1-process store", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set", f"data.store={e.copy('store')}",
        "--set", f"data.source={e.prompts}", "--shard", "1", "--num-shards", "2"],
        r"holds a 1-process response store; prepare 2 shards into another folder"),
    Row("prepare shards of another count", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set",
        f"data.store={sharded_store(e, shards=1, of=3)}", "--set", f"data.source={e.prompts}", "--num-shards", "2"],
        r"holds the shards of a 3-way preparation, not 2; use --num-shards 3, or another folder"),
    # a value of the wrong type is refused, never kept as a (truthy) string
    Row("train bool not a word", lambda e: train_args(e, "--set", "remat=maybe"), r"remat expects a bool, got 'maybe'"),
    Row("train int not a number", lambda e: train_args(e, "--set", "steps=abc"), r"steps expects an int, got 'abc'"),
    Row("train None for a field without None", lambda e: train_args(e, "--set", "steps=None"),
        r"steps expects an int, got None"),
    Row("train tuple of the wrong items", lambda e: train_args(e, "--set", "drafter.target_layer_ids=(0,'a')"),
        r"drafter\.target_layer_ids expects a tuple of int or None, got \(0, 'a'\)"),
    Row("train a nested config as a value", lambda e: train_args(e, "--set", "data=3"),
        r"data is a DataConfig: set its fields \(data\.NAME=VALUE\), got 3"),
    Row("prepare responses unknown", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set",
        f"data.store={e.tmp / 'st'}", "--set", f"data.source={e.prompts}", "--set", "data.responses=mine"],
        r"data\.responses must be 'regenerate' or 'source'"),
    Row("train labels unknown", lambda e: train_args(e, "--set", "loss.labels=mine"),
        r"loss\.labels must be one of 'data', 'target', got 'mine'"),
    Row("train a loss setting at its old top-level key", lambda e: train_args(e, "--set", "mode=dvd"),
        r"config key 'mode' is now loss\.mode"),
    Row("train numerics dtype unknown", lambda e: train_args(e, "--set", "numerics.dtype=fp8"),
        r"numerics\.dtype must be one of float32, bfloat16, float16, got 'fp8'"),
    Row("train compute_dtype contradicts numerics", lambda e: train_args(
        e, "--set", "compute_dtype=bfloat16", "--set", "numerics.dtype=float32"),
        r"compute_dtype='bfloat16' contradicts numerics\.dtype='float32'; set one"),
    # eval
    Row("eval drafter truncated", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--no-plots", "--out", str(e.tmp / "o"), "--datasets",
        str(e.prompts), "--drafter", "a=" + drafter_with(e, lambda d: truncate(d / "model.safetensors"))],
        r"truncated or corrupt safetensors file .*drafter/model\.safetensors"),
    Row("eval dataset invalid JSON", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--no-plots", "--out", str(e.tmp / "o"),
        "--drafter", f"a={e.drafter}", "--datasets", write(e, "ds.jsonl", '{"prompt": \n')],
        r"ds\.jsonl:1: invalid JSON"),
    Row("eval temperature inf", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--no-plots", "--out", str(e.tmp / "o"),
        "--drafter", f"a={e.drafter}", "--datasets", str(e.prompts), "--temperatures", "inf"],
        r"temperature must be a finite number >= 0"),
    Row("eval results.json truncated", lambda e: ["eval", "--out", str(e.tmp / "o"), "--from-json",
                                                  write(e, "results.json", '{"config": ')],
        r"results\.json: not valid JSON"),
    # an A/B that could resolve nothing (paired.MIN_PROMPTS), refused before the target loads
    Row("eval A/B on too few prompts", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--out", str(e.tmp / "o"), "--drafter", f"a={e.drafter}",
        "--drafter", f"b={e.drafter}:carryover", "--datasets", str(e.prompts), "--prompts-per-dataset", "2"],
        r"2 arms on 2 prompts per dataset x 1 dataset: 2 prompts cannot resolve a comparison of arms: a paired 95% "
        r"interval needs >= 10 prompts"),
    Row("eval offline A/B on too few prompts", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--offline", "--out", str(e.tmp / "o"),
        "--drafter", f"a={e.drafter}", "--drafter", f"b={e.drafter}:carryover", "--datasets", str(e.prompts),
        "humaneval", "--prompts-per-dataset", "4"],
        r"2 arms on 4 prompts per dataset x 2 datasets: 8 prompts cannot resolve a comparison of arms"),
    Row("eval offline batch 0", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--offline", "--offline-batch", "0", "--out", str(e.tmp / "o"),
        "--drafter", f"a={e.drafter}", "--datasets", str(e.prompts)],
        r"argument --offline-batch: must be an integer in \[1, 1048576\], got 0"),
    # a count past any run's size once took all memory building the list of passes
    Row("eval seeds absurdly large", lambda e: [
        "eval", "--target", str(e.target), "--quiet", "--seeds", "1000000000000", "--out", str(e.tmp / "o"),
        "--drafter", f"a={e.drafter}", "--datasets", str(e.prompts)],
        r"argument --seeds: must be an integer in \[1, 1048576\], got 1000000000000"),
    # train
    Row("train store missing", lambda e: train_args(e, store=str(e.tmp / "nostore")),
        r"no such response store .*nostore"),
    Row("train store commit.json corrupt", lambda e: train_args(e, store=corrupt_store(
        e, lambda d: truncate(d / "commit.json"))), r"invalid JSON in response store commit .*commit\.json"),
    Row("train store meta.json missing", lambda e: train_args(e, store=corrupt_store(
        e, lambda d: (d / "meta.json").unlink())), r"not a response store \(no meta\.json\)"),
    Row("train store ids.jsonl truncated", lambda e: train_args(e, store=corrupt_store(
        e, lambda d: truncate(d / "ids.jsonl"))), r"truncated file .*ids\.jsonl"),
    Row("train store array missing", lambda e: train_args(e, store=corrupt_store(
        e, lambda d: shutil.rmtree(d / "offsets"))), r"missing or corrupt array offsets/ in response store"),
    Row("train store commit past the data", lambda e: train_args(e, store=corrupt_store(
        e, lambda d: edit_json(d / "commit.json", lambda c: {**c, "tokens": c["tokens"] * 10}))),
        r"tokens/ in response store .* fewer than the \d+ committed"),
    Row("train store array wrong dtype", lambda e: train_args(e, store=corrupt_store(e, _int64_tokens)),
        r"array tokens/ in response store .* is int64 \[0\], expected int32 \[T\]"),
    Row("train sharded store with a shard missing", lambda e: train_args(e, store=sharded_store(e, shards=1, of=2)),
        r"sharded: 1 of its 2 shards are missing \(first shard-00001-of-00002\); run `carryover prepare --shard 1 "
        r"--num-shards 2` with the same settings"),
    Row("train sharded store with a shard unfinished", lambda e: train_args(
        e, store=sharded_store(e, shards=2, of=2, complete=False)),
        r"shard shard-00001-of-00002 is incomplete \(its prepare has not finished\); run `carryover prepare --shard 1 "
        r"--num-shards 2` again"),
    Row("train checkpoints folder is a file", lambda e: train_args(e, "--set", "batch_size=8",  # splits over 8 devices
                                                                   out=str(_file_in(e.tmp / "run", "checkpoints"))),
        r"checkpoint folder .*run/checkpoints is a file"),
    Row("train out_dir unwritable", lambda e: train_args(e, out=str(Path(write(e, "file", "x")) / "run")),
        r"cannot create the output folder .*file/run"),
    Row("train unknown config", lambda e: ["train", "--config", "nope"], r"no such config: 'nope'"),
    # numbers out of range: every numeric config field (TrainConfig, DataConfig, MeshConfig, DrafterSpec),
    # refused when the config is built, before anything loads
    Row("train steps -1", lambda e: train_args(e, "--set", "steps=-1"),
        r"steps must be an integer in \[1, 2147483647\], got -1"),
    Row("train steps 0", lambda e: train_args(e, "--set", "steps=0"), r"steps must be an integer in \[1, "),
    Row("train epochs 0", lambda e: train_args(e, "--set", "epochs=0"),
        r"epochs must be an integer in \[1, 2147483647\] or None, got 0"),
    Row("train batch_size absurd", lambda e: train_args(e, "--set", "batch_size=1000000000"),
        r"batch_size must be an integer in \[1, 1048576\], got 1000000000"),
    Row("train num_anchors 0", lambda e: train_args(e, "--set", "num_anchors=0"), r"num_anchors must be an integer in \[1, "),
    Row("train grad_accum_steps 0", lambda e: train_args(e, "--set", "grad_accum_steps=0"),
        r"grad_accum_steps must be an integer in \[1, 1048576\], got 0"),
    Row("train grad_accum_steps does not divide batch_size", lambda e: train_args(
        e, "--set", "batch_size=8", "--set", "grad_accum_steps=3"),
        r"batch_size 8 is not a multiple of grad_accum_steps 3: every micro-step needs the same number of sequences"),
    Row("train micro-batch does not split over the mesh", lambda e: train_args(
        e, "--set", "batch_size=8", "--set", "grad_accum_steps=2"),
        r"batch_size / grad_accum_steps = 4 sequences do not split over the mesh's data x fsdp = 8 devices"),
    Row("train lr 0", lambda e: train_args(e, "--set", "lr=0"), r"lr must be a finite number in \(0, 1\], got 0\.0"),
    Row("train lr 100", lambda e: train_args(e, "--set", "lr=100"), r"lr must be a finite number in \(0, 1\]"),
    Row("train warmup_ratio 2", lambda e: train_args(e, "--set", "warmup_ratio=2"), r"warmup_ratio must be a finite "
        r"number in \[0, 1\]"),
    Row("train grad_clip 0", lambda e: train_args(e, "--set", "grad_clip=0"), r"grad_clip must be a finite number in \(0, "),
    Row("train b2 1", lambda e: train_args(e, "--set", "b2=1"), r"b2 must be a finite number in \[0, 1\), got 1\.0"),
    Row("train seed -1", lambda e: train_args(e, "--set", "seed=-1"), r"seed must be an integer in \[0, 4294967295\]"),
    Row("train dvd_temperature -1", lambda e: train_args(e, "--set", "loss.dvd_temperature=-1.0"),
        r"loss\.dvd_temperature must be a finite number in \[0, "),
    Row("train objective unknown", lambda e: train_args(e, "--set", "loss.objective=rounds"),
        r"loss\.objective must be one of 'ce', 'edr', got 'rounds'"),
    Row("train objective edr in a DVD run", lambda e: train_args(e, "--set", "loss.objective=edr", "--set",
                                                                 "loss.mode=dvd"),
        r"objective=edr is a baseline-training objective"),
    Row("train labels=target with a sampled DVD draft 1",
        lambda e: train_args(e, "--set", "loss.labels=target", "--set", "loss.mode=control", "--set",
                             "loss.dvd_temperature=0.7"),
        r"labels=target accepts DVD's draft 1 against the target's greedy tokens"),
    Row("pipeline budget 0 s", lambda e: ["pipeline", "--preset", "gpu", "--budget-s", "0", "--out", str(e.tmp / "p")],
        r"--budget-s: must be"),
    Row("pipeline --eval-set without =", lambda e: ["pipeline", "--eval-set", "prompts", "--out", str(e.tmp / "p")],
        r"--eval-set expects KEY=VALUE, got 'prompts'"),
    # eval settings are checked when the pipeline starts, not when its eval stage comes after the trainings
    Row("pipeline --eval-set unknown key", lambda e: pipeline_args(e, "--eval-set", "promts=4"),
        r"--eval-set: unknown setting promts \(known: batch_sizes, "),
    Row("pipeline --eval-set seeds -1", lambda e: pipeline_args(e, "--eval-set", "seeds=-1"),
        r"--eval-set seeds must be an integer in \[1, 1048576\], got -1"),
    Row("pipeline --eval-set batch_sizes not a list", lambda e: pipeline_args(e, "--eval-set", "batch_sizes=4"),
        r"--eval-set batch_sizes must be a list, got 4"),
    Row("pipeline --eval-set batch size 0", lambda e: pipeline_args(e, "--eval-set", "batch_sizes=[1, 0]"),
        r"--eval-set batch_sizes must be an integer in \[1, 1048576\], got 0"),
    Row("pipeline feature layer past the target's depth", lambda e: pipeline_args(
        e, "--set", f"target={e.target}", "--set", "drafter.target_layer_ids=(0, 5)"),
        r"target layer id 5 out of range \[-1, 1\]"),
    # the Carryover A/B: refused before prepare, not after the trainings
    Row("pipeline A/B with too few prompts to resolve anything",
        lambda e: pipeline_args(e, "--preset", "full", "--eval-set", "prompts_per_dataset=3"),
        r"pipeline A/B: prompts_per_dataset x datasets: 9 prompts cannot resolve a comparison of arms"),
    Row("pipeline A/B start between snapshots", lambda e: pipeline_args(e, "--preset", "full", "--starts", "450"),
        r"A/B start 450: the baseline leaves a drafter only at its final step \(1200\) and every snapshot_every=300"),
    Row("pipeline --starts on a preset without an A/B", lambda e: pipeline_args(e, "--starts", "2"),
        r"--starts: preset 'quick' is not an A/B"),
    Row("pipeline --dry-run of an unbudgeted preset", lambda e: ["pipeline", "--config", "tiny", "--preset", "quick",
                                                                "--dry-run", "--out", str(e.tmp / "p")],
        r"--dry-run prints a budget plan: preset 'quick' has no budget"),
    Row("train save_every 0", lambda e: train_args(e, "--set", "save_every=0"), r"save_every must be an integer in \[1, "),
    Row("train loss weights all 0", lambda e: train_args(e, "--set", "loss.ce_weight=0", "--set", "loss.l1_weight=0"),
        r"ce_weight, l1_weight and kl_weight are all 0 \(and no objective=edr\): the loss would train nothing"),
    Row("train data.max_len 0", lambda e: train_args(e, "--set", "data.max_len=0"),
        r"data\.max_len must be an integer in \[2, 1048576\], got 0"),
    Row("train data.min_loss_tokens -1", lambda e: train_args(e, "--set", "data.min_loss_tokens=-1"),
        r"data\.min_loss_tokens must be an integer in \[2, "),
    Row("train mesh.data 0", lambda e: train_args(e, "--set", "mesh.data=0"),
        r"mesh\.data must be an integer in \[1, 65536\] or -1, got 0"),
    Row("train mesh.fsdp -2", lambda e: train_args(e, "--set", "mesh.fsdp=-2"), r"mesh\.fsdp must be an integer"),
    Row("train drafter.num_layers 0", lambda e: train_args(e, "--set", "drafter.num_layers=0"),
        r"drafter\.num_layers must be an integer in \[1, 1048576\], got 0"),
    Row("train drafter.num_proposals -1", lambda e: train_args(e, "--set", "drafter.num_proposals=-1"),
        r"drafter\.num_proposals must be an integer in \[1, "),
    Row("train drafter.draft_vocab_size 1", lambda e: train_args(e, "--set", "drafter.draft_vocab_size=1"),
        r"drafter\.draft_vocab_size must be 0 \(the whole vocabulary\) or >= 2, got 1"),
    Row("prepare data.gen_batch_size 0", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", f"target={e.target}", "--set", "data.gen_batch_size=0"],
        r"data\.gen_batch_size must be an integer in \[1, "),
    Row("prepare data.heldout_per_mille 2000", lambda e: [
        "prepare", "--config", "tiny", "--quiet", "--set", "data.heldout_per_mille=2000"],
        r"data\.heldout_per_mille must be an integer in \[0, 1000\], got 2000"),
    Row("prepare data.temperature -1", lambda e: ["prepare", "--config", "tiny", "--set", "data.temperature=-1"],
        r"data\.temperature must be a finite number in \[0, "),
    # numeric CLI options: refused by their argparse type, before the command loads anything
    Row("init-drafter layers 0", lambda e: ["init-drafter", "--target", "nowhere", "--layers", "0", "--out",
                                            str(e.tmp / "d")],
        r"argument --layers: must be an integer in \[1, 1048576\], got 0"),
    Row("init-drafter proposals absurd", lambda e: ["init-drafter", "--target", "nowhere", "--proposals",
                                                    "100000000", "--out", str(e.tmp / "d")],
        r"argument --proposals: must be an integer in \[1, 1048576\], got 100000000"),
    Row("init-drafter mask-token-id -1", lambda e: ["init-drafter", "--target", "nowhere", "--mask-token-id", "-1",
                                                    "--out", str(e.tmp / "d")],
        r"argument --mask-token-id: must be an integer in \[0, "),
    Row("init-drafter seed not a number", lambda e: ["init-drafter", "--target", "nowhere", "--seed", "x",
                                                     "--out", str(e.tmp / "d")],
        r"argument --seed: must be an integer in \[0, 4294967295\], got 'x'"),
    Row("generate seed -1", lambda e: GEN + ["--target", "nowhere", "--seed", "-1"],
        r"argument --seed: must be an integer in \[0, "),
    Row("bench batch 0", lambda e: ["bench", "steps", "--batch", "0"], r"argument --batch: must be an integer in \[1, "),
    Row("bench max-lens 0", lambda e: ["bench", "decode", "--max-lens", "256", "0"],
        r"argument --max-lens: must be an integer in \[1, "),
    Row("bench profile without breakdown", lambda e: ["bench", "decode", "--target", "nowhere", "--profile", "3"],
        r"--profile splits the --breakdown steps' time: add --breakdown"),
    Row("bench profile -1", lambda e: ["bench", "decode", "--breakdown", "--profile", "-1"],
        r"argument --profile: must be an integer in \[0, "),
    Row("bench repeats -3", lambda e: ["bench", "ar", "--repeats", "-3"], r"argument --repeats: must be an integer"),
    Row("bench roofline unknown row", lambda e: ["bench", "roofline", "--rows", "ar", "gen32"],
        r"argument --rows: invalid choice: 'gen32'"),
    Row("bench roofline stream-mb 0", lambda e: ["bench", "roofline", "--stream-mb", "0"],
        r"argument --stream-mb: must be an integer in \[1, 65536\], got 0"),
    Row("bench mesh malformed", lambda e: ["bench", "train", "--memory", "--mesh", "data=x"],
        r"--mesh must be AXIS=SIZE\[,AXIS=SIZE\.\.\.\] with axes data, fsdp, tensor, got 'data=x'"),
    Row("eval heldout-per-mille 5000", lambda e: ["eval", "--out", str(e.tmp / "o"), "--heldout-per-mille", "5000"],
        r"argument --heldout-per-mille: must be an integer in \[0, 1000\], got 5000"),
]


def _spec_prefill(e: Env, *, max_len: int, max_rounds: int | None = None):
    """The step-wise engine's prefill on a 9-token prompt, max_new 12, with the 3-proposal drafter: it
    checks the request against its buffers before compiling anything."""
    import jax
    import jax.numpy as jnp

    from carryover_jax.decode import speculative as sp
    from carryover_jax.loading import load_drafter

    d = load_drafter(e.drafter)
    sc = sp.SpecConfig(target=e.loaded.cfg, drafter=d.cfg)
    tokens = jnp.zeros((1, 16), jnp.int32).at[0, :9].set(5)
    return sp.prefill(sc, e.loaded.params, d.params, tokens, jnp.asarray([9]), jnp.asarray([12]), jnp.zeros((1,)),
                      jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=max_len, out_size=16,
                      max_rounds=max_rounds)


def _bench_breakdown(e: Env, max_len: int):
    from carryover_jax.bench import decode
    from carryover_jax.loading import load_drafter

    return decode.breakdown(e.loaded, load_drafter(e.drafter), max_lens=(256, max_len), repeats=1, progress=False)


def _spec_config(e: Env, **kw):
    from carryover_jax.decode import speculative as sp
    from carryover_jax.loading import load_drafter

    return sp.SpecConfig(target=e.loaded.cfg, drafter=load_drafter(e.drafter).cfg, **kw)


def _api_rows():
    from carryover_jax.config import DataConfig, TrainConfig
    from carryover_jax.decode.generate import generate, speculative_generate
    from carryover_jax.loading import init_drafter, load_drafter, load_target
    from carryover_jax.train.sources import iter_jsonl
    from carryover_jax.train.store import ResponseStore

    return [
        Row("api generate prompt past the context", lambda e: lambda: generate(e.loaded, [[5] * 600]),
            r"prompt 0 has 600 tokens, more than the target's context of 512", RequestError),
        Row("api generate top_p 1.5", lambda e: lambda: generate(e.loaded, [[5, 6]], top_p=1.5), r"top_p", RequestError),
        Row("api generate temperature list with nan", lambda e: lambda: generate(
            e.loaded, [[5], [6]], temperature=[0.0, float("nan")]), r"temperature must be a finite", RequestError),
        Row("api generate token id outside the vocabulary", lambda e: lambda: generate(e.loaded, [[5, 200]]),
            r"token id 200 outside the target's vocabulary \[0, 97\)", RequestError),
        Row("api generate prompt of the wrong type", lambda e: lambda: generate(e.loaded, [3.5]),
            r"prompt 0 must be a string, a list of chat messages or a list of token ids, got float", RequestError),
        Row("api generate malformed chat messages", lambda e: lambda: generate(e.loaded, [[{"role": "user"}]]),
            r"chat messages must be", RequestError),
        Row("api speculative top_k -1", lambda e: lambda: speculative_generate(
            e.loaded, load_drafter(e.drafter), [[5, 6]], top_k=-1), r"top_k must be an integer >= 0", RequestError),
        Row("api load_target truncated", lambda e: lambda: load_target(target_with(
            e, lambda d: truncate(d / "model.safetensors"))), r"truncated or corrupt safetensors", CheckpointError),
        Row("api load_drafter truncated", lambda e: lambda: load_drafter(drafter_with(
            e, lambda d: truncate(d / "model.safetensors", 100))), r"safetensors file .*model\.safetensors",
            CheckpointError),
        Row("api ResponseStore.open bad commit", lambda e: lambda: ResponseStore.open(corrupt_store(
            e, lambda d: edit_json(d / "commit.json", lambda c: {**c, "records": -1}))),
            r"needs non-negative integers", DataError),
        Row("api iter_jsonl duplicate id", lambda e: lambda: list(iter_jsonl(write(
            e, "d.jsonl", '{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n'))), r"d\.jsonl:2: duplicate id '1'",
            DataError),
        Row("api load_drafter layout mismatch", lambda e: lambda: load_drafter(e.drafter, layout="deepspec"),
            r"holds a drafter in the zlab layout \(native format\), not deepspec", CheckpointError),
        Row("api speculative prefill past max_len", lambda e: lambda: _spec_prefill(e, max_len=20),
            r"row 0: prompt 9 \+ max_new 12 \+ 3 proposals - 1 needs 23 cache slots, but max_len is 20", RequestError),
        Row("api speculative max_rounds too small", lambda e: lambda: _spec_prefill(e, max_len=64, max_rounds=4),
            r"max_rounds=4 cannot record 11 rounds", RequestError),
        Row("api speculative prompt bucket past max_len", lambda e: lambda: _spec_prefill(e, max_len=8),
            r"the prompt bucket of 16 tokens is longer than the cache \(max_len=8\)", RequestError),
        Row("api init_drafter num_layers 0", lambda e: lambda: init_drafter(e.loaded, num_layers=0, mask_token_id=4),
            r"num_layers must be an integer in \[1, 1048576\], got 0", ConfigError),
        Row("api bench decode breakdown past the context", lambda e: lambda: _bench_breakdown(e, 1000000),
            r"--max-lens 1000000: a cache for a 100-token prompt and one round is in \[107, 512\]", RequestError),
        Row("api SpecConfig top_p 0", lambda e: lambda: _spec_config(e, top_p=0.0), r"top_p must be in \(0, 1\]",
            RequestError),
        Row("api TrainConfig steps -1", lambda e: lambda: TrainConfig(steps=-1), r"steps must be an integer", ConfigError),
        Row("api DataConfig top_p 0", lambda e: lambda: DataConfig(top_p=0.0), r"data\.top_p must be in \(0, 1\]",
            ConfigError),
    ]


def _run_cli(argv, capsys) -> tuple[int, str]:
    from carryover_jax.cli import main

    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("row", CLI_ROWS, ids=[r.id for r in CLI_ROWS])
def test_cli_row(row: Row, env, capsys):
    argv = row.build(env)
    rc, err = _run_cli(argv, capsys)
    assert "Traceback" not in err, err
    errors = [l for l in err.splitlines() if l.startswith("carryover ")]
    assert rc == row.code, err
    assert len(errors) == 1 and errors[0].startswith(f"carryover {argv[0]}: error: "), err
    assert re.search(row.match, errors[0]), errors[0]


def test_a_folder_another_process_writes_is_refused_and_freed_when_it_dies(env, capsys):
    """Two writers of one run folder or store (a job submitted twice, a requeue while the first still runs) would
    interleave checkpoints or records. The second is one error naming the holder; a holder killed with SIGKILL
    leaves no stale lock."""
    from carryover_jax.io import exclusive

    run, store = env.tmp / "run", env.tmp / "st"
    with exclusive(run, "training"):  # held through another open file: flock refuses it in this process too
        rc, err = _run_cli(train_args(env, "--set", "steps=2", out=str(run)), capsys)
        assert rc == 2 and re.search(rf"{re.escape(str(run))} is being written by another training \(pid "
                                     rf"{os.getpid()} on .*\): wait for it to end, or use another folder", err), err
    with exclusive(store, "prepare"):
        rc, err = _run_cli(["prepare", "--config", "tiny", "--quiet", "--set", f"target={env.target}", "--set",
                            f"data.store={store}", "--set", f"data.source={env.prompts}"], capsys)
        assert rc == 2 and "is being written by another prepare" in err, err
    assert not store.exists()  # refused before the store was created
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from carryover_jax.io import exclusive
        with exclusive({str(run)!r}, "training"):
            print("held", flush=True)
            time.sleep(600)
        """)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CarryoverError, match=rf"pid {holder.pid} on "):
            with exclusive(run, "training"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(run, "training"):  # the kernel dropped the dead holder's lock
        pass


def test_a_bad_line_deep_in_a_prompt_file_fails_prepare_before_any_generation(env, capsys):
    """Prepare reads its plan lazily, batch by batch; a duplicate id or broken line far into a prompt file used to
    fail the command only when generation reached it (minutes to hours in). The file is now read through first."""
    src = env.tmp / "deep.jsonl"
    src.write_text("".join(json.dumps({"id": f"c{i}", "prompt": words(4 + i % 5)}) + "\n" for i in range(40))
                   + json.dumps({"id": "c3", "prompt": "again"}) + "\n")
    store = env.tmp / "deep-store"
    rc, err = _run_cli(["prepare", "--config", "tiny", "--quiet", "--set", f"target={env.target}", "--set",
                        f"data.store={store}", "--set", f"data.source={src}", "--set", "data.gen_batch_size=2",
                        "--set", "data.heldout_per_mille=0"], capsys)
    assert rc == 2 and re.search(r"deep\.jsonl:41: duplicate id 'c3'", err), err
    assert not store.exists()  # nothing generated, no store created


def test_paths_with_dotdot_are_resolved_at_the_boundary(env, capsys, monkeypatch):
    """A valid input that used to fail: a `..` in a store path reached tensorstore ("Invalid file path").
    Every path a user gives is made absolute once (CLI options, loaded configs), so `prepare` with a
    relative `../` store and source works, and writes where the path points."""
    work = env.tmp / "work"
    work.mkdir()
    (env.tmp / "src.jsonl").write_text("".join(
        json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": words(4 + i)},
                                                {"role": "assistant", "content": words(6 + i)}]}) + "\n"
        for i in range(3)))
    monkeypatch.chdir(work)
    rc, err = _run_cli(["prepare", "--config", "tiny", "--quiet", "--set", f"target={env.target}",
                        "--set", "data.store=../sub/../st", "--set", "data.source=../src.jsonl",
                        "--set", "data.responses=source", "--set", "data.heldout_per_mille=0"], capsys)
    assert rc == 0, err
    from carryover_jax.train.store import ResponseStore

    store = ResponseStore.open(env.tmp / "st")
    assert len(store) == 3 and store.meta["data"]["source"] == str(env.tmp / "src.jsonl")


def test_config_paths_are_absolute_and_names_stay_names(tmp_path, monkeypatch):
    from carryover_jax.config import TrainConfig, apply_overrides

    monkeypatch.chdir(tmp_path)
    c = apply_overrides(TrainConfig(), ["out_dir=../a/./run", "init_from=~/d", "data.store=st"])
    assert (c.out_dir, c.data.store) == (str(tmp_path.parent / "a" / "run"), str(tmp_path / "st"))
    assert c.init_from == os.path.expanduser("~/d")
    assert (c.target, c.data.source) == ("smollm2", "sharegpt")  # an alias and a dataset name, not paths
    c = apply_overrides(TrainConfig(), ["target=models/t.gguf", "data.source=./p.jsonl"])
    assert (c.target, c.data.source) == (str(tmp_path / "models/t.gguf"), str(tmp_path / "p.jsonl"))


API_ROW_IDS = ["api generate prompt past the context", "api generate top_p 1.5", "api generate temperature list with nan",
               "api generate token id outside the vocabulary", "api speculative top_k -1",
               "api generate prompt of the wrong type", "api generate malformed chat messages", "api load_target truncated",
               "api load_drafter truncated", "api ResponseStore.open bad commit",
               "api iter_jsonl duplicate id", "api load_drafter layout mismatch",
               "api speculative prefill past max_len", "api speculative max_rounds too small",
               "api speculative prompt bucket past max_len", "api init_drafter num_layers 0", "api TrainConfig steps -1",
               "api DataConfig top_p 0", "api SpecConfig top_p 0", "api bench decode breakdown past the context"]


@pytest.mark.parametrize("row_id", API_ROW_IDS)
def test_api_row(row_id, env):
    row = {r.id: r for r in _api_rows()}[row_id]
    with pytest.raises(row.error, match=row.match):
        row.build(env)()


def test_table_size():
    assert len(CLI_ROWS) + len(API_ROW_IDS) >= 30
    assert len(API_ROW_IDS) == len(_api_rows())
    commands = {"generate", "prepare", "train", "export", "init-drafter", "convert", "eval"}
    assert {a for r in CLI_ROWS for a in commands if r.id.startswith(a)} == commands


# ---- fault rows ----------------------------------------------------------------------------------------
def _train_cfg(e: Env, out: Path, **kw):
    from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig

    base = dict(
        target=str(e.target),
        drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=3, num_layers=1, target_layer_ids=(0, 1),
                            mask_token_id=4),
        data=DataConfig(store=str(e.store), max_len=32, min_loss_tokens=2),
        out_dir=str(out), batch_size=8, num_anchors=4, steps=8, log_every=1, save_every=2, keep_checkpoints=5,
        async_checkpointing=False, lr=3e-3,
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def reference_run(base, compile_cache, tmp_path_factory):
    """An uninterrupted tiny training run: the losses the interrupted ones must reproduce."""
    from carryover_jax.train.loop import train

    out = tmp_path_factory.mktemp("reference") / "run"
    summary = train(_train_cfg(base, out), progress=False)
    assert summary["finished"]
    return _losses(out)


def _driver(e: Env, body: str, argv: list[str], timeout: int = 240, cache: str | None = None
            ) -> subprocess.CompletedProcess:
    """Run `carryover <argv>` in a subprocess after `body` (Python that arranges a fault) ran there."""
    script = e.tmp / "driver.py"
    script.write_text(textwrap.dedent(body) + textwrap.dedent(f"""
        from carryover_jax.cli import main
        sys.exit(main({argv!r}))
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", CARRYOVER_CACHE=str(e.tmp / "cache"))
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), env=env)


def test_fault_sigterm_saves_and_resumes_to_the_same_losses(env, reference_run, compile_cache):
    """SIGTERM (SLURM's preemption notice) after step 3: a checkpoint of step 3, a clean exit 0 with a
    one-line notice; the re-run resumes from it and logs the uninterrupted run's losses."""
    from carryover_jax.train.loop import train

    out = env.tmp / "run"
    cfg_file = env.tmp / "cfg.py"
    cfg_file.write_text(
        "from carryover_jax.config import *\n"
        f"CONFIG = {_train_cfg(env, out)!r}\n"
    )
    # a real SIGTERM sent to the process by the kernel, timed deterministically: right after step 3
    proc = _driver(env, """
        import os, signal, sys
        import carryover_jax.train.faults as faults
        _record = faults.FiniteGuard.record
        def record(self, step, metrics):
            _record(self, step, metrics)
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        faults.FiniteGuard.record = record
    """, ["train", "--config", str(cfg_file), "--quiet"], cache=compile_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "stopped by SIGTERM after step 3" in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["finished"] is False and summary["steps"] == 3 and summary["stopped_by"] == "SIGTERM"
    assert max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == 3
    assert not (out / "drafter").exists()

    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # and a metrics line half-written by a kill must not break the resume
    resumed = train(_train_cfg(env, out), progress=False)  # the resubmitted job
    assert resumed["finished"]
    got = _losses(out)
    assert sorted(got) == sorted(reference_run)
    for step, loss in reference_run.items():
        assert got[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step


def test_fault_nan_stops_naming_the_step_and_keeps_the_last_good_checkpoint(env, monkeypatch, compile_cache):
    """A state that turns NaN at step 5: the run stops with the step named, nothing from step 5 on is
    saved, and the newest checkpoint (step 4) restores with finite values."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    import carryover_jax.train.loop as loop

    real = loop.compile_step

    def poisoned(*a, **kw):
        fn = real(*a, **kw)
        calls = {"n": 0}

        def step(state, target_params, batch):
            calls["n"] += 1
            if calls["n"] == 5:  # step 5 of a fresh run: the loss and gradients come out NaN
                state = state.replace(params=jax.tree_util.tree_map(lambda x: x * jnp.nan, state.params))
            return fn(state, target_params, batch)

        return step

    monkeypatch.setattr(loop, "compile_step", poisoned)
    out = env.tmp / "run"
    with pytest.raises(TrainingError, match=r"non-finite loss and gradient norm at step 5 \(loss nan.*"
                                            r"the last good checkpoint is step 4"):
        loop.train(_train_cfg(env, out, log_every=3), progress=False)
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and max(steps) == 4
    assert not (out / "drafter").exists()
    restored = ocp.StandardCheckpointer().restore((out / "checkpoints" / "4" / "state").absolute())
    leaves = jax.tree_util.tree_leaves(restored)
    assert leaves and all(np.all(np.isfinite(np.asarray(x))) for x in leaves if np.asarray(x).dtype.kind == "f")


def test_fault_full_disk_fails_before_training(env, monkeypatch, capsys):
    import carryover_jax.train.faults as faults

    monkeypatch.setattr(faults.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))
    rc, err = _run_cli(train_args(env, "--set", "batch_size=8"), capsys)  # 8 sequences split over 8 devices
    assert rc == 2 and "Traceback" not in err
    assert re.search(r"carryover train: error: the output folder .*run has 1\.0 MiB free; checkpoints of this run "
                     r"need about [\d.]+ MiB", err), err
    assert not (env.tmp / "run" / "checkpoints").exists()  # nothing started


_KILL_AFTER_WEIGHTS = """
    import os, signal, sys
    import carryover_jax.io as io
    _fsync = io._fsync
    def fsync_then_die(path):
        _fsync(path)
        if path.name == "model.safetensors":  # weights written into the temporary folder: die now
            os.kill(os.getpid(), signal.SIGKILL)
    io._fsync = fsync_then_die
"""


def test_fault_sigkill_during_export_keeps_the_previous_export(env):
    from carryover_jax.loading import load_drafter

    out = env.tmp / "export"
    prev = _driver(env, "import sys\n", ["export", "--drafter", str(env.drafter), "--format", "zlab",
                                         "--dtype", "float32", "--out", str(out)])
    assert prev.returncode == 0, prev.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    killed = _driver(env, _KILL_AFTER_WEIGHTS, ["export", "--drafter", str(env.drafter), "--format", "zlab",
                                                "--dtype", "bfloat16", "--out", str(out)])
    assert killed.returncode == -signal.SIGKILL
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous complete export, untouched
    assert [p for p in env.tmp.iterdir() if p.name.startswith(".export.tmp-")]  # the killed writer's leftovers
    load_drafter(out)
    again = _driver(env, "import sys\n", ["export", "--drafter", str(env.drafter), "--format", "zlab",
                                          "--dtype", "bfloat16", "--out", str(out)])
    assert again.returncode == 0, again.stderr[-2000:]
    assert not [p for p in env.tmp.iterdir() if p.name.startswith(".export.")]  # cleaned by the next writer
    assert load_drafter(out).cfg.backbone.dtype  # loads


def test_fault_sigkill_during_init_drafter_leaves_nothing_that_looks_complete(env, capsys):
    out = env.tmp / "fresh"
    killed = _driver(env, _KILL_AFTER_WEIGHTS, ["init-drafter", "--target", str(env.target), "--layers", "1",
                                                "--proposals", "3", "--layer-ids", "0,1", "--out", str(out)])
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists()
    rc, err = _run_cli(GEN + ["--target", str(env.target), "--drafter", str(out)], capsys)
    assert rc == 2 and re.search(r"no such drafter folder: .*fresh", err), err


def test_fault_half_written_conversion_is_not_trusted(env, monkeypatch):
    """A GGUF cache entry without the completion marker (a killed conversion, or a copied partial folder)
    is converted again; a finished one is reused."""
    import carryover_jax.weights.registry as registry
    from carryover_jax.io import atomic_dir
    from carryover_jax.weights.gguf import SOURCE_FILE, is_converted, source_info

    gguf = Path(write(env, "m.gguf", b"GGUF" + b"\0" * 60))
    calls = []

    def fake_convert(src, out):
        calls.append(out)

        def fill(tmp):
            for f in env.target.iterdir():
                shutil.copy(f, tmp / f.name)
            (tmp / SOURCE_FILE).write_text(json.dumps(source_info(Path(src))))

        atomic_dir(out, fill)

    monkeypatch.setattr(registry, "convert_gguf", fake_convert)
    first = registry.resolve_target(gguf)
    assert len(calls) == 1 and is_converted(gguf, first)
    assert registry.resolve_target(gguf) == first and len(calls) == 1  # complete: reused
    truncate(first / "model.safetensors")  # a half-written entry, as a non-atomic writer would leave it
    (first / ".complete").unlink()
    assert not is_converted(gguf, first)
    registry.resolve_target(gguf)
    assert len(calls) == 2 and is_converted(gguf, first)


def test_fault_sigkill_during_the_final_drafter_save(env, reference_run, compile_cache):
    """Killed while writing out_dir/drafter at the end of training: no drafter folder appears; the re-run
    restores the final checkpoint, trains nothing and writes the drafter."""
    from carryover_jax.loading import load_drafter
    from carryover_jax.train.loop import train

    out = env.tmp / "run"
    cfg_file = env.tmp / "cfg.py"
    cfg_file.write_text("from carryover_jax.config import *\n" f"CONFIG = {_train_cfg(env, out)!r}\n")
    killed = _driver(env, _KILL_AFTER_WEIGHTS, ["train", "--config", str(cfg_file), "--quiet"], cache=compile_cache)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (out / "drafter").exists()
    assert max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == 8
    again = train(_train_cfg(env, out), progress=False)
    assert again["finished"] and again["drafter"] == str(out / "drafter")
    assert load_drafter(out / "drafter").cfg.num_proposals == 3
    assert not [p for p in out.iterdir() if p.name.startswith(".drafter.")]  # the dead writer's folder is gone
    assert _losses(out) == pytest.approx(reference_run, rel=1e-5, abs=1e-6)
