"""`carryover bench roofline` on the tiny target (untimed: it produces its table), and the FLOP / byte
accounting of bench/flops.py against a count by hand for the tiny Llama (3 layers, d 64, ffn 112, 4 query
heads and 2 K/V heads of 16, vocabulary 97, untied head)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest


# per token, per target layer: q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x112, down 112x64
LAYER_MACS = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 112  # 33,792
TOKEN_FLOPS = 2 * 3 * LAYER_MACS  # 3 layers: 202,752
HEAD_FLOPS = 2 * 64 * 97  # 12,416
ATTN_PER_KEY = 3 * 4 * 4 * 16  # scores + values: 2 x 2 x heads x head dim, 3 layers = 768
# every target weight but the untied input embedding: kernels, 2 norms per layer, the final norm, the head
TARGET_WEIGHTS = 3 * (LAYER_MACS + 2 * 64) + 64 + 64 * 97


@pytest.fixture(scope="module")
def tiny(tiny_llama_worded):
    from carryover_jax.loading import load_target

    return load_target(tiny_llama_worded)


def test_decode_and_feature_costs_match_a_hand_count(tiny):
    from carryover_jax.bench import flops as F

    c = F.decode_cost(tiny.cfg, tiny.params, batch=1, rows=1, context=100)
    assert c.flops == TOKEN_FLOPS + HEAD_FLOPS + ATTN_PER_KEY * 101  # 100 cached keys + itself
    kv = 3 * 2 * 2 * 16 * 101 * 4  # layers x (K, V) x K/V heads x head dim x slots x float32
    assert c.bytes == 4 * TARGET_WEIGHTS + kv

    v = F.decode_cost(tiny.cfg, tiny.params, batch=2, rows=4, context=100)  # verification of 4 rows, 2 sequences
    assert v.flops == 8 * (TOKEN_FLOPS + HEAD_FLOPS) + ATTN_PER_KEY * 8 * (100 + 2.5)  # causal in the block
    assert v.bytes == 4 * TARGET_WEIGHTS + 2 * 3 * 2 * 2 * 16 * 104 * 4

    f = F.feature_pass_cost(tiny.cfg, tiny.params, rows=4, seq=96)
    # the head at every token (the stored log-sum-exp); causal: (96 + 1) / 2 keys
    assert f.flops == 384 * (TOKEN_FLOPS + HEAD_FLOPS) + ATTN_PER_KEY * 384 * 48.5
    assert f.bytes == 4 * (3 * (LAYER_MACS + 2 * 64) + 64 * 97)

    pre, steps = F.generation_costs(tiny.cfg, tiny.params, batch=16, prompt_len=100, new_tokens=5)
    assert pre.flops == 1600 * TOKEN_FLOPS + 16 * HEAD_FLOPS + ATTN_PER_KEY * 1600 * 50.5
    # 4 AR steps at contexts 100..103: the mean 101.5, each row attending to it and itself
    assert steps.flops == 4 * (16 * (TOKEN_FLOPS + HEAD_FLOPS) + ATTN_PER_KEY * 16 * 102.5)
    assert steps.bytes == 4 * (4 * TARGET_WEIGHTS + 16 * 3 * 2 * 2 * 16 * 102.5 * 4)


def test_greedy_decode_costs_read_the_screened_head_as_bf16(tiny, tiny_qwen3):
    """Where the head's screen serves a greedy call (a float32 tied head, at most `MAX_ROWS` rows), its bound reads
    the bf16 copy once per 8 rows and the norms, priced in bf16; the untied tiny Llama and calls of more rows keep
    the one float32 cost, and a greedy generation's steps are priced as such calls."""
    from carryover_jax.bench import flops as F
    from carryover_jax.loading import load_target
    from carryover_jax.models import greedy_head

    assert F.greedy_decode_costs(tiny.cfg, tiny.params, batch=1, rows=1, context=100) == [
        F.decode_cost(tiny.cfg, tiny.params, batch=1, rows=1, context=100)]
    tied = load_target(tiny_qwen3.path, tokenizer=False)
    if not greedy_head.applies(tied.cfg):
        pytest.skip("no screen on this CPU (avx512_bf16)")
    v, d = tied.cfg.vocab_size, tied.cfg.hidden_size
    for batch, rows, passes in ((1, 1, 1), (2, 4, 1), (3, 4, 2), (16, 8, 16)):
        whole = F.decode_cost(tied.cfg, tied.params, batch=batch, rows=rows, context=100)
        layers, head = F.greedy_decode_costs(tied.cfg, tied.params, batch=batch, rows=rows, context=100)
        assert head == F.Cost(batch * rows * 2 * d * v, passes * v * d * 2 + v * 4, "bfloat16")
        assert (layers.flops + head.flops, layers.bytes) == (whole.flops, whole.bytes - 4 * v * d)
        assert layers.dtype is None
    assert len(F.greedy_decode_costs(tied.cfg, tied.params, batch=129, rows=1, context=100)) == 1  # > MAX_ROWS
    assert greedy_head.MAX_ROWS == 128
    pre, layers, head = F.generation_costs(tied.cfg, tied.params, batch=16, prompt_len=100, new_tokens=5, greedy=True)
    assert [layers, head] == [c.scaled(4) for c in F.greedy_decode_costs(tied.cfg, tied.params, batch=16, rows=1,
                                                                          context=101.5)]


def test_train_costs_match_a_hand_count(tiny):
    from carryover_jax.bench import flops as F
    from carryover_jax.loading import init_drafter

    d = init_drafter(tiny, kind="dflash", layout="zlab", num_proposals=3, num_layers=1, target_layer_ids=(0, 1),
                     mask_token_id=4)
    b, s, n = 2, 32, 4
    q, r, tq = b * n * 4, b * n * 3, b * s  # block of 4 (anchor + 3 proposals), 3 proposal rows per block
    features = TOKEN_FLOPS * tq + ATTN_PER_KEY * tq * 16.5
    # the drafter: one layer of the target's shapes (+ q/k norms), fc from 2 taps, K/V of the context rows,
    # attention of each block to the context prefix (S/2) + its block (4), one layer
    body = 2 * LAYER_MACS * q + 2 * (2 * 64 * 64 + 2 * 64 * 32) * tq + 4 * 4 * 16 * q * (16 + 4)
    head = HEAD_FLOPS * r  # the whole vocabulary: the target's frozen head, forward + input gradient
    baseline = features + 3 * body + 2 * head + head  # + the teacher logits of the same rows
    # the 3 proposals of each block: the prefix through the anchor (S/2 + 1) + 1..3 of the block's own keys
    verify = TOKEN_FLOPS * b * n * 3 + ATTN_PER_KEY * b * n * 3 * (16 + 3)
    kw = dict(batch=b, seq=s, anchors=n)
    t = lambda mode, stored, kv=False: F.train_flops(tiny.cfg, d.cfg, tiny.params, d.params, mode=mode,  # noqa: E731
                                                     stored_features=stored, stored_kv=kv, **kw)["total"]
    assert t("baseline", False) == baseline
    assert t("baseline", True) == baseline - features
    assert t("control", False) == baseline + body + head  # + draft 1
    assert t("control", True) == baseline - features + body + head
    assert t("dvd", True) == t("dvd", False) == baseline + body + head + verify  # DVD runs the target for its K/V
    assert t("dvd", True, kv=True) == baseline - features + body + head + verify  # unless the store holds them

    drafter_params = LAYER_MACS + 2 * 64 + 2 * 16 + 2 * 64 * 64 + 3 * 64  # its layer (q/k norms), fc, 2 norms, e_rej
    # a draft vocabulary of K ids with stored features: the teacher's head over its K columns (the stored
    # log-sum-exp), the drafter's own head over K, trained
    dk = dataclasses.replace(d.cfg, draft_vocab=tuple(range(5, 45)))
    assert (F.train_flops(tiny.cfg, dk, tiny.params, d.params, stored_features=True, **kw)["target_head"]
            == HEAD_FLOPS * r * 40 / 97)
    assert F.train_flops(tiny.cfg, dk, tiny.params, d.params, **kw)["target_head"] == HEAD_FLOPS * r
    c = F.train_cost(tiny.cfg, d.cfg, tiny.params, d.params, mode="baseline", stored_features=True, **kw)
    assert c.bytes == 4 * (64 * 97 + 3 * drafter_params)  # the head, the drafter's params + 2 Adam moments
    c = F.train_cost(tiny.cfg, d.cfg, tiny.params, d.params, mode="dvd", stored_features=True, **kw)
    assert c.bytes == 4 * (64 * 97 + 3 * drafter_params + 3 * (LAYER_MACS + 2 * 64))  # + the target's layers


def test_the_bound_is_the_slower_side_at_the_best_measured_rates():
    from carryover_jax.bench.flops import Cost
    from carryover_jax.bench.roofline import bound
    from carryover_jax.config import preset

    machine = {"stream_gbs": {"float32": {"sum": 20.0, "matvec": 25.0}, "bfloat16": {"sum": 40.0, "matvec": 1.0}},
               "matmul_gflops": {"float32/mlp/1": 10.0, "float32/head/1": 5.0, "float32/mlp/16": 80.0,
                                 "float32/head/16": 90.0, "bfloat16/mlp/16": 300.0, "bfloat16/head/16": 20.0}}
    f32 = preset("smollm2-135m")  # float32 on this CPU
    b = bound(Cost(flops=9e9, bytes=5e8), machine, f32)  # 0.1 s of matmul at 90 GFLOP/s vs 0.02 s of streaming
    assert b["s"] == pytest.approx(0.1) and b["by"] == "matmul 90 GFLOP/s (float32)"
    b = bound(Cost(flops=9e9, bytes=5e9), machine, f32)
    assert b["s"] == pytest.approx(0.2) and b["by"] == "bandwidth 25.0 GB/s (float32)"
    bf16 = f32.replace(dtype="bfloat16", param_dtype="bfloat16")
    b = bound(Cost(flops=9e9, bytes=1e9), machine, bf16)  # 0.03 s of matmul vs 0.025 s of streaming
    assert b["s"] == pytest.approx(0.03) and b["by"] == "matmul 300 GFLOP/s (bfloat16)"
    # a bf16 run also against what float32 arithmetic could do at best (same bytes, float32's rates)
    assert bound(Cost(flops=9e9, bytes=1e9), machine, bf16, "float32")["s"] == pytest.approx(0.1)
    from carryover_jax.bench.roofline import _bound_of, _row
    machine["dtypes"] = ["float32", "bfloat16"]
    row = _row("gen", "gen", 0.05, _bound_of([Cost(flops=9e9, bytes=1e9)], machine, bf16))
    assert row["fraction"] == pytest.approx(0.6) and row["fraction_of_f32_bound"] == pytest.approx(2.0)
    assert "fraction_of_f32_bound" not in _row("gen", "gen", 0.05, _bound_of([Cost(9e9, 1e9)], machine, f32))


def test_roofline_produces_its_table_on_the_tiny_target(tiny, capsys):
    """Untimed: every row is there with a finite, positive fraction of its bound, in the JSON and the table."""
    from carryover_jax import cli
    from carryover_jax.bench import roofline

    assert cli._ROOFLINE_ROWS == roofline.ROWS
    rc = cli.main(["bench", "roofline", "--config", "tiny", "--target", str(tiny.path), "--repeats", "1",
                   "--max-new-tokens", "3", "--stream-mb", "4", "--matmul-rows", "1", "16", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    result = json.loads(out.out)
    assert [r["row"] for r in result["rows"]] == list(roofline.ROWS)
    for r in result["rows"]:
        assert math.isfinite(r["fraction"]) and r["fraction"] > 0, r
        assert r["gflop"] > 0 and r["gb"] > 0, r
        assert r["path"] in out.err  # the table, on stderr with --json
        if r["row"].startswith("verify"):  # a paired ratio over rotated rounds, its interval and the AR step's A/A
            lo, hi = r["measured_ratio_ci"]
            assert lo <= r["measured_ratio"] <= hi and r["aa_ratio"][1] <= r["aa_ratio"][0] <= r["aa_ratio"][2], r
            assert f"verify({int(r['row'][6:]) + 1}) ÷ AR step, batch 1 | {r['measured_ratio']:.3f} [" in out.err
    assert all(v > 0 for v in result["machine"]["matmul_gflops"].values())
    assert len(result["machine"]["matmul_gflops"]) == 2 * 2 * 2  # float32, bf16 x mlp, head x 2 row counts
    assert "| machine (best of 1) |" in out.err


def test_roofline_runs_a_subset_of_rows(tiny, capsys):
    from carryover_jax import cli

    rc = cli.main(["bench", "roofline", "--config", "tiny", "--target", str(tiny.path), "--repeats", "1",
                   "--stream-mb", "4", "--matmul-rows", "1", "--rows", "verify3", "ar"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    paths = [l for l in out.out.splitlines() if l.startswith("| AR step") or l.startswith("| verify")]
    assert len(paths) == 2 and paths[0].startswith("| AR step, batch 1") and paths[1].startswith("| verify(4)")


def test_roofline_dvd_row_reads_stored_kv_where_the_config_stores_them(tiny, capsys):
    from carryover_jax import cli

    rc = cli.main(["bench", "roofline", "--config", "tiny", "--target", str(tiny.path), "--repeats", "1",
                   "--stream-mb", "4", "--matmul-rows", "1", "--rows", "dvd", "control", "--json", "--set",
                   "features=store", "--set", "data.store_features=true", "--set", "data.store_kv=float32"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rows = {r["row"]: r for r in json.loads(out.out)["rows"]}
    assert rows["dvd"]["path"].endswith("stored features and K/V") and rows["control"]["path"].endswith("features")
    assert math.isfinite(rows["dvd"]["fraction"]) and rows["dvd"]["fraction"] > 0
