"""The equal-compute control (train/compute_match.py): its step count follows the stated rule from the
measured step times, the measurement is taken once per stage, and DVD and both controls see the same
batches for the steps they share while the longer control continues the same order."""

import json

import numpy as np
import pytest

from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig
from carryover_jax.configs import ComputeMatched
from carryover_jax.errors import TrainingError
from carryover_jax.train.compute_match import compute_control_config, matched_steps, resolve_compute_control
from tests.synthetic import synthetic_store


def test_matched_steps_follow_the_rule_from_fake_step_times():
    assert matched_steps(360, 4.0, 1.3) == round(360 * 4.0 / 1.3) == 1108
    assert matched_steps(360, 3.0, 1.0) == 1080
    assert matched_steps(7, 1.0, 1.0) == 7
    assert matched_steps(10, 1.04, 1.0) == 10  # rounds to the nearest step
    assert matched_steps(10, 1.06, 1.0) == 11
    assert matched_steps(10, 1.0, 2.0) == 10  # a control slower than DVD still gets DVD's steps
    for bad in ((0, 1.0, 1.0), (5, 0.0, 1.0), (5, 1.0, -1.0), (5, float("nan"), 1.0)):
        with pytest.raises(TrainingError):
            matched_steps(*bad)


def _cfgs(store, out, target="t", **kw):
    base = TrainConfig(target=str(target), init_from=None, seed=7, steps=3, batch_size=8, num_anchors=4,
                       drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                           target_layer_ids=(0, 1), mask_token_id=4),
                       data=DataConfig(store=str(store), max_len=32, min_loss_tokens=2), log_every=1, save_every=2,
                       async_checkpointing=False, **kw)
    return (base.replace(out_dir=str(out / "dvd")).with_loss(mode="dvd"),
            base.replace(out_dir=str(out / "control")).with_loss(mode="control"))


def test_the_stage_measures_once_and_resumes_with_the_same_steps(tmp_path):
    dvd, control = _cfgs(tmp_path / "store", tmp_path)
    calls = []

    def fake_probe(d, c):
        calls.append((d.loss.mode, c.loss.mode, d.loss.off_metrics))
        return {"dvd_s": 2.5, "control_s": 1.0, "ratio": 2.5, "steps_timed": 4, "rule": "fake"}

    stage = ComputeMatched(control, dvd, str(tmp_path / "cc"))
    cfg = stage.resolve(probe=fake_probe, log=lambda m: None)
    assert cfg.steps == matched_steps(3, 2.5, 1.0) == 8 and cfg.loss.mode == "control" and cfg.epochs is None
    assert (cfg.seed, cfg.data, cfg.init_from, cfg.num_anchors) == (control.seed, control.data, control.init_from,
                                                                   control.num_anchors)
    assert cfg.out_dir == str(tmp_path / "cc") and cfg.name.endswith("-compute")
    assert calls == [("dvd", "control", False)]  # DVD is timed without its carried-withheld diagnostic
    assert json.loads((tmp_path / "cc" / "probe.json").read_text())["dvd_s"] == 2.5
    # a resumed stage reads the kept times: no second measurement, the same step count (and lr schedule)
    assert stage.resolve(probe=fake_probe, log=lambda m: None).steps == 8 and len(calls) == 1
    # other settings are measured again
    other = resolve_compute_control(control.replace(num_anchors=8), dvd.replace(num_anchors=8), tmp_path / "cc",
                                    probe=fake_probe, log=lambda m: None)
    assert len(calls) == 2 and other.num_anchors == 8


def test_dvd_and_both_controls_share_batches_and_the_longer_control_continues(tiny_llama, tmp_path):
    """`train` draws step k's batch as the k-th batch of the grain iterator seeded by the run's seed over its
    store (`make_train_iter`), whatever the mode: so the configs must agree on everything that iterator
    reads, and a real run of the longer control must walk that order past DVD's steps. (One training run:
    a DVD and a second control run would add two step compilations, ~1 min here, for the same check.)"""
    from carryover_jax.train.loop import train
    from carryover_jax.train.pipeline import make_train_iter
    from carryover_jax.train.store import ResponseStore

    store = synthetic_store(tmp_path / "store", n=48)
    dvd, control = _cfgs(store, tmp_path, target=tiny_llama.path)
    compute = compute_control_config(control, dvd.steps, {"dvd_s": 5.0, "control_s": 3.0},
                                     out_dir=str(tmp_path / "compute"))
    assert compute.steps == 5
    order_of = lambda c: (c.data, c.seed, c.batch_size, c.features, c.init_from, c.num_anchors)  # noqa: E731
    assert order_of(dvd) == order_of(control) == order_of(compute)
    seen = {}
    assert train(compute, progress=False, on_batch=lambda step, b: seen.__setitem__(step, b["input_ids"]))["finished"]
    assert sorted(seen) == [1, 2, 3, 4, 5]
    it = make_train_iter(dvd.data, ResponseStore.open(str(store)), batch_size=dvd.batch_size, seed=dvd.seed)
    order = [np.asarray(next(it)["input_ids"]) for _ in range(5)]
    for step in (1, 2, 3, 4, 5):  # DVD's three batches (and the equal-steps control's), then the next two
        assert np.array_equal(seen[step], order[step - 1])
    assert not np.array_equal(order[3], order[0])  # 48 records, batch 8: step 4 is new data
