"""Drafter folders and training checkpoints written before numerics became a runtime choice still load:
tests/fixtures/drafter_v1 was written by that code (`tests/fixtures/make_drafter_v1.py`, run from a git
worktree of commit 24bcaa5): a tiny target, a 2-step training run (orbax checkpoint at step 2, the native
drafter folder with a version-1 `drafter_config.json` whose backbone holds `dtype`/`param_dtype`/
`attention_backend`) and what that code computed and decoded with it."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from carryover_jax import generate, load_drafter, load_target
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import Drafter, frozen_from_target
from carryover_jax.numerics import Numerics
from carryover_jax.weights.drafter_formats import DRAFTER_CONFIG_VERSION, save_drafter
from tests.fixtures.make_drafter_v1 import run_config
from tests.synthetic import synthetic_store
from tests.jitted import jit_apply

FIX = Path(__file__).parent / "fixtures" / "drafter_v1"
EXPECTED = json.loads((FIX / "expected.json").read_text())


def _forward(target, drafter):
    f = EXPECTED["drafter_forward"]["inputs"]
    a = {k: np.asarray(v, np.float32 if k in ("features", "carried") else None) for k, v in f.items()}
    t, s = a["tokens"].shape[1], a["features"].shape[1]
    return np.asarray(jit_apply(Drafter(drafter.cfg))(
        {"params": drafter.params}, a["tokens"], a["positions"], frozen_from_target(target.params, target.cfg),
        a["features"], a["feature_positions"], np.ones((1, t, s), bool), a["carried"], a["carried_positions"],
        a["carried_valid"], method=Drafter.init_all))


def _leaves(params):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


def test_a_v1_drafter_folder_loads_computes_and_decodes_alike(tmp_path):
    raw = json.loads((FIX / "run" / "drafter" / "drafter_config.json").read_text())
    assert "config_version" not in raw and {"dtype", "param_dtype", "attention_backend"} <= set(raw["backbone"])
    target = load_target(FIX / "target", tokenizer=False)
    drafter = load_drafter(FIX / "run" / "drafter", target=target)
    assert drafter.cfg.numerics == target.cfg.numerics.drafter_view()  # the v1 numerics are ignored
    assert (drafter.cfg.kind, drafter.cfg.layout, drafter.cfg.carryover) == ("markov", "deepspec", True)
    np.testing.assert_allclose(_forward(target, drafter), np.asarray(EXPECTED["drafter_forward"]["logits"]),
                               atol=2e-5, rtol=1e-5)
    prompts, n = EXPECTED["prompts"], EXPECTED["max_new_tokens"]
    ar = generate(target, prompts, max_new_tokens=n, stop_token_ids=[])
    spec, stats = speculative_generate(target, (drafter.cfg, drafter.params), prompts, max_new_tokens=n,
                                       stop_token_ids=[], carryover=True)
    assert [r.token_ids for r in ar] == EXPECTED["ar_tokens"]
    assert [r.token_ids for r in spec] == EXPECTED["speculative_tokens"] == EXPECTED["ar_tokens"]
    assert stats["rounds"] == EXPECTED["rounds"]
    # written again it is a version-2 folder (no numerics) that loads to the same drafter; under bf16
    # numerics the same folder loads with float32 drafter params and bf16 compute
    out = save_drafter(drafter.cfg, drafter.params, tmp_path / "v2")
    raw2 = json.loads((out / "drafter_config.json").read_text())
    assert raw2["config_version"] == DRAFTER_CONFIG_VERSION and "numerics" not in raw2["backbone"]
    again = load_drafter(out, target=target)
    assert again.cfg == drafter.cfg
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(again.params), _leaves(drafter.params)))
    bf = load_drafter(FIX / "run" / "drafter", numerics=Numerics.for_platform("cpu", dtype="bfloat16"))
    assert bf.cfg.backbone.dtype == "bfloat16" and {x.dtype.name for x in _leaves(bf.params)} == {"float32"}


@pytest.mark.heavy  # minutes here: outside the CI budget (CARRYOVER_TEST_HEAVY=1)
def test_a_v1_training_checkpoint_restores_and_resumes(tmp_path):
    """The old run, re-run to its end, restores the step-2 checkpoint and exports the same drafter; one more
    step resumes training from it. (Two `train` calls: ~1 min here, most of it the step's compile.) The old
    run had one device; here 8 host devices hold the batch of 2 as data=2 x tensor=4 (orbax reshards)."""
    from carryover_jax.config import MeshConfig
    from carryover_jax.train.loop import train

    mesh = MeshConfig(data=2, fsdp=1, tensor=4)

    run = tmp_path / "run"
    shutil.copytree(FIX / "run", run)
    store = synthetic_store(tmp_path / "store", n=24, seed=0, vocab=97)  # the fixture's store, rebuilt
    old = load_drafter(FIX / "run" / "drafter")
    done = train(run_config(FIX / "target", store, run, steps=2).replace(mesh=mesh), progress=False)
    assert done["finished"] and done["steps"] == 2
    exported = load_drafter(run / "drafter")
    assert json.loads((run / "drafter" / "drafter_config.json").read_text())["config_version"] == 2
    assert exported.cfg == old.cfg
    assert all(np.array_equal(a, b) for a, b in zip(_leaves(exported.params), _leaves(old.params)))
    more = train(run_config(FIX / "target", store, run, steps=3).replace(mesh=mesh), progress=False)
    assert more["finished"] and more["steps"] == 3
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    resumed = load_drafter(run / "drafter")
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(resumed.params), _leaves(old.params)))
