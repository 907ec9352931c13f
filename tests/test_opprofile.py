"""`bench decode --breakdown --profile`: each call's window split by XLA op kind. The split is checked against a
hand count on made-up events (threads that overlap, an op nested in a loop, a host event, gaps), and the whole
path runs on the tiny target (untimed: every step kind gets a row whose parts add up to its window, and the
real trace holds the CPU kernels: products and cache attention)."""

from __future__ import annotations

import pytest

from carryover_jax.bench.opprofile import KINDS, OTHER, kind_of, split_windows

MS = 1_000_000  # ns


def test_op_names_map_to_kinds():
    assert kind_of("dot.3") == kind_of("ynn_fusion") == kind_of("xnn_fusion.12") == "matmul"
    assert kind_of("while.2") == "attention loop"
    assert kind_of("ffi_call.5") == "CPU kernels"
    assert kind_of("select_dynamic-update-slice_fusion.4") == "cache write"
    assert kind_of("dynamic-slice_bitcast_fusion") == "cache read"
    assert kind_of("iota_reduce_fusion") == "reduce / sort"
    assert kind_of("add_rsqrt_fusion.1") == OTHER


def test_windows_split_exclusively_by_a_hand_count():
    events = [
        # window 1: [0, 10) ms
        ("ynn_fusion.1", 1 * MS, 4 * MS), ("ynn_fusion.1", 2 * MS, 5 * MS),  # two threads: [1, 5) once
        ("while.1", 6 * MS, 9 * MS), ("dynamic-slice_fusion", 7 * MS, 8 * MS),  # nested in the loop: the loop's
        ("ThunkExecutor::Execute", 0, 10 * MS), ("$api.py:1 block_until_ready", 0, 10 * MS),  # host: not ops
        ("copy.2", 9 * MS, 12 * MS),  # runs past the window: only [9, 10) counts
        # window 2: [20, 30) ms
        ("dot.7", 20 * MS, 26 * MS), ("select_dynamic-update-slice_fusion", 27 * MS, 28 * MS),
    ]
    got = split_windows(events, [(0, 10 * MS), (20 * MS, 30 * MS)])
    assert got["window_ms"] == 10.0
    k = got["kinds_ms"]
    assert k["matmul"] == (4 + 6) / 2 and k["attention loop"] == 3 / 2 and k["cache read"] == 0.0
    assert k["cache write"] == 1 / 2 and k[OTHER] == 1 / 2 and k["reduce / sort"] == 0.0
    assert got["idle_ms"] == pytest.approx(((10 - 8) + (10 - 7)) / 2)  # busy 8 of window 1, 7 of window 2
    assert set(k) == {name for name, _ in KINDS} | {OTHER}
    assert got["top_ops_ms"]["dot"] == 3.0 and got["top_ops_ms"]["ynn_fusion"] == 2.0


def test_the_breakdown_profiles_every_step_on_the_tiny_target(tiny_llama_worded, capsys):
    from carryover_jax.bench import decode
    from carryover_jax.loading import init_drafter, load_target

    target = load_target(tiny_llama_worded)
    drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                           target_layer_ids=(0, 1), mask_token_id=4)
    r = decode.breakdown(target, drafter, max_lens=(256,), prompt_len=20, repeats=2, progress=False, profile=3)
    assert set(r["profile"]) == {f"{k} @ 256" for k in ("ar", "draft", "verify", "round")}
    for name, p in r["profile"].items():
        parts = sum(p["kinds_ms"].values()) + p["idle_ms"]
        assert p["window_ms"] > 0 and abs(parts - p["window_ms"]) < 1e-2, name
        assert p["idle_ms"] >= -1e-2, name
    for name in ("ar @ 256", "verify @ 256"):  # the CPU kernels ran: the target's products and cache reads
        assert r["profile"][name]["kinds_ms"]["CPU kernels"] > 0
    row = r["rows"][0]  # the same steps timed inside a compiled loop, as the decode loops run them
    assert all(row[f"loop_{k}_ms"] > 0 for k in ("ar", "verify", "round"))
    table = decode.format_breakdown(r)
    assert "where each call's time goes" in table and "| verify @ 256 |" in table
    assert "inside a compiled loop" in table
