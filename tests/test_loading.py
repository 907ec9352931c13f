"""Checkpoint loading: round trip, name/shape checks, and one-line errors for bad input."""

import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from carryover_jax import CheckpointError, ConfigError, load_target
from carryover_jax.weights.hf import save_params, target_hf_name
from carryover_jax.weights.hf_config import target_config_to_hf


def test_save_then_load_round_trip(tiny_qwen3, tmp_path):
    t = load_target(tiny_qwen3.path, tokenizer=False)
    out = save_params(t.params, tmp_path / "copy", target_config_to_hf(t.cfg))
    back = load_target(out, tokenizer=False)
    assert back.cfg == t.cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, t.params, back.params)
    # the exported folder loads in transformers and gives the same logits
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 11, 3]])
    with torch.no_grad():
        np.testing.assert_allclose(hf(ids).logits.numpy(), tiny_qwen3.hf(ids).logits.numpy(), atol=1e-6)


def test_sharded_index_checkpoint(tiny_llama, tmp_path):
    tensors = load_file(tiny_llama.path / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / fname)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    shutil.copy(tiny_llama.path / "config.json", tmp_path / "config.json")
    a = load_target(tiny_llama.path, tokenizer=False)
    b = load_target(tmp_path, tokenizer=False)
    jax.tree_util.tree_map(np.testing.assert_array_equal, a.params, b.params)


def test_name_table_is_mechanical():
    assert target_hf_name(("layers", "3", "self_attn", "q_proj", "kernel")) == (
        "model.layers.3.self_attn.q_proj.weight", True)
    assert target_hf_name(("embed_tokens", "embedding")) == ("model.embed_tokens.weight", False)
    assert target_hf_name(("lm_head", "kernel")) == ("lm_head.weight", True)
    assert target_hf_name(("layers", "0", "self_attn", "k_norm", "weight")) == (
        "model.layers.0.self_attn.k_norm.weight", False)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_path(tmp_path):
    with pytest.raises(CheckpointError, match="no such target"):
        load_target(tmp_path / "nope")


def test_folder_without_weights(tiny_llama, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    shutil.copy(tiny_llama.path / "config.json", d / "config.json")
    with pytest.raises(CheckpointError, match="holds no weights"):
        load_target(d, tokenizer=False)
    with pytest.raises(CheckpointError, match="no config.json"):
        load_target(tmp_path, tokenizer=False)


def test_unsupported_architecture(tiny_llama, tmp_path):
    d = _copy(tiny_llama.path, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(architectures=["MambaForCausalLM"], model_type="mamba")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="unsupported architecture MambaForCausalLM"):
        load_target(d, tokenizer=False)


def test_wrong_shape_and_missing_tensor(tiny_llama, tmp_path):
    d = _copy(tiny_llama.path, tmp_path / "m")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((5, 64), np.float32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.layers.1.mlp.up_proj.weight: shape \(5, 64\) .* \(112, 64\)"):
        load_target(d, tokenizer=False)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError, match="up_proj.weight' is missing"):
        load_target(d, tokenizer=False)


def test_cli_bad_input_is_one_line_and_nonzero(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "carryover_jax.cli", "generate", "--target", str(tmp_path / "missing"),
         "--prompt", "hi"], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines == [f"carryover generate: error: no such target: '{tmp_path / 'missing'}' "
                     "(not a path, and known aliases are smollm2, gemma3-270m)"]


def test_atomic_dir_keeps_the_previous_folder_and_cleans_dead_writers(tmp_path):
    from carryover_jax.io import _owner, atomic_dir, is_complete

    out = tmp_path / "out"
    atomic_dir(out, lambda d: (d / "a").write_text("1"))
    assert (out / "a").read_text() == "1" and is_complete(out)

    def fail(d):
        (d / "a").write_text("2")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):  # the writer's own error, not a cleanup error
        atomic_dir(out, fail)
    assert (out / "a").read_text() == "1"  # the previous complete folder, untouched
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary leftovers
    host = _owner().split(".")[1]
    dead = tmp_path / f".out.tmp-999999999.{host}-abcd1234"  # a killed writer's folder on this host
    other = tmp_path / ".out.tmp-999999999.0000beef-abcd1234"  # another host's: maybe still writing
    dead.mkdir()
    other.mkdir()
    atomic_dir(out, lambda d: (d / "a").write_text("3"))
    assert (out / "a").read_text() == "3" and not dead.exists() and other.exists()


def _zlab_rule(num_target_layers: int, n: int) -> list[int]:
    """z-lab's `build_target_layer_ids` as its README states it: n layers evenly spaced from 1 to L-3."""
    if n == 1:
        return [num_target_layers // 2]
    return [int(round(1 + i * (num_target_layers - 4) / (n - 1))) for i in range(n)]


def test_default_feature_layers_are_zlabs_or_distinct_on_shallow_targets():
    from carryover_jax.config import zlab_layer_ids

    for depth in range(1, 49):
        for n in range(1, 7):
            ids = zlab_layer_ids(depth, n)
            ref = _zlab_rule(depth, n)
            if all(a < b for a, b in zip(ref, ref[1:])) and 0 <= ref[0] and ref[-1] < depth:
                assert list(ids) == ref, (depth, n)  # z-lab's checkpoints tap these: kept exactly
            else:  # too shallow for n distinct layers by z-lab's rule
                assert len(ids) == max(1, min(n, depth - 1)) and ids[0] == 0, (depth, n, ids)
            assert all(a < b for a, b in zip(ids, ids[1:])) and 0 <= ids[0] and ids[-1] < depth, (depth, n, ids)


def test_init_drafter_defaults_on_a_three_layer_target(tiny_llama, tmp_path):
    from carryover_jax.cli import main
    from carryover_jax.weights.drafter_formats import load_drafter
    from tests.hf_models import add_word_tokenizer

    shutil.copytree(tiny_llama.path, tmp_path / "t")
    add_word_tokenizer(tmp_path / "t")
    assert main(["init-drafter", "--target", str(tmp_path / "t"), "--mask-token-id", "0",
                 "--out", str(tmp_path / "d")]) == 0
    cfg, _ = load_drafter(tmp_path / "d")
    assert cfg.target_layer_ids == (0, 1)  # 3 layers: every layer but the last, not z-lab's (1, 1, 0, 0, 0)
