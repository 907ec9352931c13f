"""DeepSpec's config.json records the training anchors per sequence (`num_anchors`): the export takes the
drafter's own value from the training run that wrote it, and says so when it is not recorded."""

import json

from carryover_jax.weights.drafter_formats import (DEEPSPEC_DEFAULT_ANCHORS, export_drafter, recorded_num_anchors,
                                                   save_drafter)
from tests.drafter_fixtures import tiny_drafter, tiny_frozen


def _export(cfg, params, src, out):
    found = recorded_num_anchors(src)
    folder = export_drafter(cfg, params, out, "deepspec", frozen=tiny_frozen(), dtype=None,
                            num_anchors=found[0] if found else None)
    return found, json.loads((folder / "config.json").read_text())


def test_deepspec_export_takes_num_anchors_from_the_training_run(tmp_path):
    cfg, params = tiny_drafter("markov", "deepspec")
    run = tmp_path / "run"
    save_drafter(cfg, params, run / "drafter")
    save_drafter(cfg, params, run / "snapshots" / "step_000100")
    (run / "train_config.json").write_text(json.dumps({"num_anchors": 37, "steps": 100}))
    for src in (run / "drafter", run / "snapshots" / "step_000100"):
        found, config = _export(cfg, params, src, tmp_path / f"out-{src.name}")
        assert found == (37, str(run / "train_config.json"))
        assert config["num_anchors"] == 37 and "num_anchors_note" not in config
    # a DeepSpec folder re-exported keeps its own value
    found, config = _export(cfg, params, tmp_path / "out-drafter", tmp_path / "again")
    assert found[0] == 37 and config["num_anchors"] == 37

    save_drafter(cfg, params, tmp_path / "loose")  # no training run beside it
    found, config = _export(cfg, params, tmp_path / "loose", tmp_path / "out-loose")
    assert found is None and config["num_anchors"] == DEEPSPEC_DEFAULT_ANCHORS
    assert "not recorded" in config["num_anchors_note"]
