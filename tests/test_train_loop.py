"""The training loop: kill-and-resume exactness, corrupt-checkpoint fallback, outputs, feature store."""

import json

import numpy as np
import pytest

from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig
from carryover_jax.train.loop import train
from tests.synthetic import synthetic_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return synthetic_store(tmp_path_factory.mktemp("store") / "responses")


def _cfg(tiny_llama, store, out, **kw):
    base = dict(
        target=str(tiny_llama.path),
        drafter=DrafterSpec(kind="markov", layout="deepspec", num_proposals=3, num_layers=1, target_layer_ids=(0, 1),
                            mask_token_id=4, markov_rank=4),
        data=DataConfig(store=str(store), max_len=32, min_loss_tokens=2),
        out_dir=str(out), batch_size=8, num_anchors=4, steps=8, log_every=1, save_every=2, keep_checkpoints=5,
        async_checkpointing=False, lr=3e-3,
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(out):
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def full_run(tiny_llama, store, tmp_path_factory):
    """One uninterrupted 8-step run: the losses the killed, resumed and fallback runs must reproduce."""
    out = tmp_path_factory.mktemp("full") / "a"
    return train(_cfg(tiny_llama, store, out), progress=False), out


def test_kill_and_resume_continue_exactly(tiny_llama, store, full_run, tmp_path):
    full, a = full_run
    assert full["finished"] and (a / "metrics.png").is_file()
    want = _losses(a)
    assert sorted(want) == list(range(1, 9))

    part = train(_cfg(tiny_llama, store, tmp_path / "b"), progress=False, stop_at_step=5)  # "killed" after step 5
    assert not part["finished"]
    train(_cfg(tiny_llama, store, tmp_path / "b"), progress=False)  # resumes from the step-4 checkpoint
    got = _losses(tmp_path / "b")
    assert sorted(got) == list(range(1, 9))  # step 5 was redone, not logged twice
    for s in range(1, 9):
        assert got[s] == pytest.approx(want[s], rel=1e-5, abs=1e-6), s

    # the exported drafter loads and matches the final params
    from carryover_jax import load_drafter

    d = load_drafter(a / "drafter")
    assert d.cfg.kind == "markov" and d.cfg.carryover


def test_corrupt_checkpoint_falls_back_to_the_last_good_one(tiny_llama, store, full_run, tmp_path, capsys):
    cfg = _cfg(tiny_llama, store, tmp_path / "c")
    train(cfg, progress=False, stop_at_step=5)
    ckpts = tmp_path / "c" / "checkpoints"
    assert (ckpts / "4").is_dir()
    for f in (ckpts / "4").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"\0" * 7)  # corrupt every file of the newest checkpoint
    out = train(cfg, progress=False)
    assert out["finished"]
    assert "checkpoint step 4" in capsys.readouterr().err
    want = _losses(tmp_path / "c")
    ref, ref_out = full_run  # the same config run uninterrupted
    assert ref["finished"]
    assert _losses(ref_out)[8] == pytest.approx(want[8], rel=1e-5, abs=1e-6)


def test_bad_store_is_a_clear_error(tiny_llama, tmp_path):
    from carryover_jax import CarryoverError

    with pytest.raises(CarryoverError, match=r"no such response store .*missing.*carryover prepare"):
        train(_cfg(tiny_llama, tmp_path / "missing", tmp_path / "x"), progress=False)


def test_snapshots_are_written_every_n_steps(tiny_llama, store, tmp_path):
    from carryover_jax import load_drafter

    train(_cfg(tiny_llama, store, tmp_path / "s", snapshot_every=3), progress=False)
    snaps = sorted(p.name for p in (tmp_path / "s" / "snapshots").iterdir())
    assert snaps == ["step_000003", "step_000006"]  # the last step is the final drafter itself
    params = [load_drafter(tmp_path / "s" / "snapshots" / s).params for s in snaps]
    params.append(load_drafter(tmp_path / "s" / "drafter").params)
    fc = [np.asarray(p["fc"]["kernel"]) for p in params]
    assert not np.array_equal(fc[0], fc[1]) and not np.array_equal(fc[1], fc[2])  # training moved on between them
