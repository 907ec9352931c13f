"""`carryover bench train --memory --json`: one JSON object per line per (config, stage, mesh, backend). One
real compile of a paper stage at toy size over 2 CPU devices (the real ones take minutes each), then the
command's output for several rows."""

import dataclasses
import json

import pytest

from carryover_jax.bench import train as bench_train
from carryover_jax.config import TargetConfig
from carryover_jax.configs import load_config

TOY = TargetConfig(family="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, qk_norm=True)
FIELDS = ("config", "stage", "devices", "mesh", "backend", "per_device_gb", "micro_batch", "accum", "fits_h200",
          "fits_h100")


@pytest.fixture(scope="module")
def toy_row():
    """The qwen3_4b baseline stage at toy size (8 sequences in 2 micro-steps) on 2 devices."""
    cfg = load_config("qwen3_4b")
    cfg = cfg.replace(batch_size=8, grad_accum_steps=2, num_anchors=4, loss=cfg.loss.replace(chunk_rows=16),
                      mesh=dataclasses.replace(cfg.mesh, data=2, fsdp=1, tensor=1),
                      data=dataclasses.replace(cfg.data, max_len=32),
                      drafter=dataclasses.replace(cfg.drafter, num_layers=1, target_layer_ids=(0,), mask_token_id=0,
                                                  markov_rank=8))
    (row,) = bench_train.memory_rows([("qwen3_4b", "baseline", cfg, TOY)], devices=2, backends=("einsum",),
                                     progress=False)
    return row


def test_a_compiled_row_has_the_fields(toy_row):
    rec = json.loads(bench_train.memory_json(toy_row))
    assert set(FIELDS) <= set(rec)
    assert rec["config"] == "qwen3_4b" and rec["stage"] == "baseline" and rec["backend"] == "einsum"
    assert rec["devices"] == 2 and rec["mesh"] == "data=2,fsdp=1,tensor=1"
    assert rec["micro_batch"] == 2 and rec["accum"] == 2  # 2 sequences per device per micro-step
    assert rec["micro_batch_global"] == 4 and rec["global_batch"] == 8
    assert isinstance(rec["per_device_gb"], float) and rec["per_device_gb"] > 0 and "compiled" in rec["method"]
    for node, limit in bench_train.NODE_LIMITS_GB.items():
        assert rec[f"fits_{node}"] == (rec["per_device_gb"] <= limit)


def test_the_command_prints_one_object_per_line(toy_row, monkeypatch, capsys):
    from carryover_jax.cli import main

    seen = {}

    def rows(entries, *, devices, backends, progress=True, device_list=None, platform="cuda"):  # the toy row
        seen.update(entries=entries, devices=devices, backends=backends, platform=platform)
        for (name, stage, cfg, _), bk in [(e, b) for e in entries for b in backends]:
            yield {**toy_row, "config": name, "stage": stage, "backend": bk, "mode": cfg.loss.mode}

    monkeypatch.setattr(bench_train, "memory_rows", rows)
    assert main(["bench", "train", "--memory", "--json", "--backend", "auto", "einsum"]) == 0
    lines = capsys.readouterr().out.splitlines()
    recs = [json.loads(line) for line in lines]
    stages = ("baseline", "dvd", "control")
    assert [(r["config"], r["stage"], r["backend"]) for r in recs] == [
        (c, s, b) for c in ("qwen3_4b", "gemma4_12b") for s in stages for b in ("auto", "einsum")]
    assert all(set(FIELDS) <= set(r) for r in recs)
    assert seen["devices"] == 8 and seen["platform"] == "cuda"  # one GPU node unless --devices / --tpu-topology
    assert [cfg.loss.mode for _, _, cfg, _ in seen["entries"]] == ["baseline", "dvd", "control"] * 2


def test_bench_steps_refuses_a_target_that_cannot_fit_before_drawing_weights():
    """`carryover bench steps` with its full-size default preset on a 24 GB CPU machine was killed by the
    kernel's OOM killer; it now refuses with the size it needs, which counts every weight."""
    import jax
    import jax.numpy as jnp

    from carryover_jax.bench.steps import check_fits, memory_needed
    from carryover_jax.config import preset
    from carryover_jax.errors import ConfigError
    from carryover_jax.models.target import abstract_params

    cfg = preset("qwen3-4b")
    weights = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(abstract_params(cfg)))
    assert memory_needed(cfg) >= weights > 3e9  # ~4B parameters
    with pytest.raises(ConfigError, match=r"needs at least .* GB for its weights here, 2\.0 GB are free: cut it"):
        check_fits(cfg, int(2e9))
    check_fits(cfg.replace(num_layers=1), int(2e9))  # cut down (--layers 1) it fits
    check_fits(cfg, None)  # nothing known about the memory: no refusal


def test_a_tpu_topology_the_compiler_cannot_give_is_one_line(capsys):
    """--tpu-topology without the TPU compiler (or with a name it does not know) ends in one line naming it."""
    from carryover_jax.cli import main

    assert main(["bench", "train", "--memory", "--tpu-topology", "v9x:1x1"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TPU topology 'v9x:1x1'" in err[0]
