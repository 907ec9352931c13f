"""More prompts from the same conversations (`data.prompt_turns`) and training on several stores at once
(`data.extra_stores`, `StoreMix`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DataConfig, TrainConfig, apply_overrides
from carryover_jax.errors import CarryoverError, ConfigError, DataError
from carryover_jax.train.pipeline import make_train_iter
from carryover_jax.train.responses import prepare_responses
from carryover_jax.train.sources import conversations, is_heldout
from carryover_jax.train.store import ResponseStore, open_store

U, A, S = "user", "assistant", "system"


def _msg(role, text):
    return {"role": role, "content": text}


ROWS = [
    {"id": "a", "messages": [_msg(U, "w5 w6"), _msg(A, "w10 w11 w12"), _msg(U, "w20"), _msg(A, "w21 w22"),
                             _msg(U, "w30 w31")]},
    {"id": "b", "messages": [_msg(S, "w40"), _msg(U, "w8"), _msg(A, "w50 w51"), _msg(U, "w9"), _msg(A, "w60")]},
    {"id": "c", "messages": [_msg(U, "w7"), _msg(A, "w70")]},  # one user turn: no later prompt
]


def _source(tmp_path, rows=ROWS):
    path = tmp_path / "src.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_prompt_turns_pick_user_turns_with_the_source_context(tmp_path):
    src = _source(tmp_path)
    first = list(conversations(DataConfig(source=src, heldout_per_mille=0)))
    later = list(conversations(DataConfig(source=src, heldout_per_mille=0, prompt_turns="later")))
    both = list(conversations(DataConfig(source=src, heldout_per_mille=0, prompt_turns="all")))
    assert [c.id for c in first] == ["a", "b", "c"]
    assert [c.id for c in later] == ["a#2", "a#3", "b#2"]
    assert [c.id for c in both] == ["a", "a#2", "a#3", "b", "b#2", "c"]
    # a prompt is the source's conversation up to and including its user turn, replies verbatim
    a = ROWS[0]["messages"]
    assert first[0].prompt == a[:1] and first[0].user_turns == ["w5 w6", "w20", "w30 w31"]
    assert later[0].prompt == a[:3] and later[0].user_turns == ["w20", "w30 w31"]
    assert later[1].prompt == a[:5] and later[1].user_turns == ["w30 w31"]
    assert later[2].prompt == ROWS[1]["messages"][:4] and later[2].system == ROWS[1]["messages"][0]
    assert first[1].prompt == ROWS[1]["messages"][:2]
    with pytest.raises(ConfigError, match="prompt_turns"):
        DataConfig(prompt_turns="second")


def test_prompt_turns_split_by_conversation(tmp_path):
    """A held-out conversation gives no prompt of any turn to training (the split is by conversation id)."""
    rows = [{"id": f"conv-{i}", "messages": [_msg(U, "q"), _msg(A, "r"), _msg(U, "q2"), _msg(A, "r2"), _msg(U, "q3")]}
            for i in range(300)]
    src = _source(tmp_path, rows)
    train = [c.id for c in conversations(DataConfig(source=src, heldout_per_mille=100, prompt_turns="all"))]
    held = [c.id for c in conversations(DataConfig(source=src, heldout_per_mille=100, prompt_turns="all",
                                                   split="heldout"))]
    assert len(train) + len(held) == 900 and 10 < len(held) // 3 < 60
    assert not any(is_heldout(i.split("#")[0], 100) for i in train)
    assert all(is_heldout(i.split("#")[0], 100) for i in held)


def _worded_target(tiny_llama_worded):
    return load_target(tiny_llama_worded)


def test_prepare_later_turns_regenerates_each_reply(tiny_llama_worded, tmp_path):
    """A later-turn record is the encoded conversation up to that user turn (the source's replies as
    context) followed by the target's own greedy reply to it."""
    target = _worded_target(tiny_llama_worded)
    cfg = DataConfig(source=_source(tmp_path), store=str(tmp_path / "later"), heldout_per_mille=0,
                     prompt_turns="later", max_new_tokens=6, min_loss_tokens=2, max_prompt_tokens=64)
    store = prepare_responses(cfg, target, progress=False)
    assert sorted(store.ids()) == ["a#2", "a#3", "b#2"]
    expect = {"a#2": ROWS[0]["messages"][:3], "a#3": ROWS[0]["messages"][:5], "b#2": ROWS[1]["messages"][:4]}
    for i, cid in enumerate(store.ids()):
        rec = store[i]
        head = target.encode(expect[cid])
        ids, mask = rec["input_ids"].tolist(), rec["loss_mask"].tolist()
        assert ids[: len(head)] == head and mask[: len(head)] == [0] * len(head)
        assert ids[len(head):] == generate(target, [head], max_new_tokens=6)[0].token_ids
        assert mask[len(head):] == [1] * (len(ids) - len(head))
    # the source's own reply to a later turn (responses="source")
    src_cfg = DataConfig(source=cfg.source, store=str(tmp_path / "src"), heldout_per_mille=0, prompt_turns="later",
                         responses="source", max_new_tokens=6, min_loss_tokens=2, max_prompt_tokens=64)
    st = prepare_responses(src_cfg, target, progress=False)
    rec = st[st.ids().index("a#2")]
    assert rec["input_ids"].tolist() == target.encode(expect["a#2"]) + [21, 22, target.stop_token_ids[0]]
    # one store holds one kind of prompts: reopening it for the first turns is refused
    with pytest.raises(CarryoverError, match="prompt_turns"):
        prepare_responses(DataConfig(**{**cfg.__dict__, "prompt_turns": "first"}), target, progress=False)


# ---- several stores ----------------------------------------------------------------------------------
def _store(path, ids, *, seed, feature_dim=4, meta=None, split="train"):
    rng = np.random.default_rng(seed)
    meta = meta or {"target": "t", "feature_layer_ids": [1], "data": {"source": str(path), "split": split}}
    s = ResponseStore.create_or_open(path, feature_dim=feature_dim, hidden=2, meta=meta)
    recs = []
    for n, cid in enumerate(ids):
        L = int(rng.integers(4, 12))
        recs.append({"id": cid, "input_ids": np.full(L, seed * 100 + n), "loss_mask": np.ones(L, np.uint8),
                     "features": rng.standard_normal((L, feature_dim)).astype(np.float32),
                     "last_hidden": rng.standard_normal((L, 2)).astype(np.float32)})
    s.append(recs)
    s.commit()
    return recs


def test_sampled_replies_to_the_same_prompts_train_beside_the_greedy_ones(tiny_llama_worded, tmp_path):
    """The same prompts with the target's sampled replies are other records: a greedy store and a sampled one
    (or two sampling seeds) train together; two stores of the same draw would train each record twice."""
    target = _worded_target(tiny_llama_worded)
    base = dict(source=_source(tmp_path), heldout_per_mille=0, max_new_tokens=8, min_loss_tokens=2,
                max_prompt_tokens=64)
    greedy = prepare_responses(DataConfig(store=str(tmp_path / "greedy"), **base), target, progress=False)
    hot = dict(base, temperature=1.5)
    s1 = prepare_responses(DataConfig(store=str(tmp_path / "s1"), seed=1, **hot), target, progress=False)
    prepare_responses(DataConfig(store=str(tmp_path / "s2"), seed=2, **hot), target, progress=False)
    prepare_responses(DataConfig(store=str(tmp_path / "greedy2"), **dict(base, max_new_tokens=6)), target,
                      progress=False)
    prepare_responses(DataConfig(store=str(tmp_path / "s1b"), seed=1, **dict(hot, max_new_tokens=6)), target,
                      progress=False)
    assert sorted(greedy.ids()) == sorted(s1.ids()) == ["a", "b", "c"]
    reply = {cid: greedy[i]["input_ids"].tolist() for i, cid in enumerate(greedy.ids())}
    assert any(s1[i]["input_ids"].tolist() != reply[cid] for i, cid in enumerate(s1.ids()))  # a draw, not greedy
    mix = open_store(tmp_path / "greedy", [tmp_path / "s1", tmp_path / "s2"])
    assert sorted(mix.ids()) == sorted(["a", "b", "c"] * 3) and len(mix) == 9
    with pytest.raises(CarryoverError, match="data.temperature"):  # one store holds one kind of replies
        prepare_responses(DataConfig(store=str(tmp_path / "greedy"), seed=1, **hot), target, progress=False)
    for twice in ("greedy2", "s1b"):  # the greedy chain, or seed 1's draw, again at another reply length
        first = "greedy" if twice == "greedy2" else "s1"
        with pytest.raises(DataError, match="both hold conversation 'a' with the same replies"):
            open_store(tmp_path / first, [tmp_path / twice])


def test_store_mix_reads_every_store_in_turn(tmp_path):
    one = _store(tmp_path / "one", ["a", "b", "c"], seed=1)
    two = _store(tmp_path / "two", ["a#2", "b#2"], seed=2)  # another source: allowed to differ
    mix = open_store(tmp_path / "one", [tmp_path / "two"])
    assert len(mix) == 5 and mix.ids() == ["a", "b", "c", "a#2", "b#2"]
    for i, rec in enumerate(one + two):
        got = mix.get(i)
        np.testing.assert_array_equal(got["input_ids"], rec["input_ids"])
        np.testing.assert_allclose(got["features"].astype(np.float32), rec["features"], atol=2e-2)
    np.testing.assert_array_equal(mix.loss_counts(), [len(r["input_ids"]) for r in one + two])
    assert mix.num_tokens == sum(len(r["input_ids"]) for r in one + two)
    assert sum(len(t) for t, _ in mix.token_chunks()) == mix.num_tokens
    with pytest.raises(IndexError):
        mix.get(5)
    # training batches draw from both stores: one epoch is every record once
    cfg = DataConfig(max_len=16, min_loss_tokens=2)
    it = make_train_iter(cfg, mix, batch_size=1, seed=0, num_epochs=1, with_features=True)
    assert sorted(int(b["input_ids"][0, 0]) for b in it) == [100, 101, 102, 200, 201]


def test_store_mix_refuses_stores_that_cannot_train_together(tmp_path):
    _store(tmp_path / "one", ["a", "b"], seed=1)
    _store(tmp_path / "dup", ["c", "a"], seed=2)
    _store(tmp_path / "held", ["x"], seed=3, split="heldout")
    _store(tmp_path / "wide", ["y"], seed=4, feature_dim=6)
    _store(tmp_path / "layers", ["z"], seed=5, meta={"target": "t", "feature_layer_ids": [2], "data": {}})
    with pytest.raises(DataError, match="both hold conversation 'a'"):
        open_store(tmp_path / "one", [tmp_path / "dup"])
    with pytest.raises(DataError, match="data.split"):
        open_store(tmp_path / "one", [tmp_path / "held"])
    with pytest.raises(DataError, match="feature_dim"):
        open_store(tmp_path / "one", [tmp_path / "wide"])
    with pytest.raises(DataError, match="feature_layer_ids"):
        open_store(tmp_path / "one", [tmp_path / "layers"])
    with pytest.raises(CarryoverError, match="no such|meta.json|not a response store"):
        open_store(tmp_path / "one", [tmp_path / "missing"])


def test_extra_stores_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = apply_overrides(TrainConfig(), ["data.store=s1", "data.extra_stores=s2"])
    assert c.data.extra_stores == (str(tmp_path / "s2"),) and c.data.store == str(tmp_path / "s1")
    c = apply_overrides(TrainConfig(), ["data.extra_stores=['s2', 's3']"])
    assert c.data.extra_stores == (str(tmp_path / "s2"), str(tmp_path / "s3"))
    with pytest.raises(ConfigError, match="repeats a store"):
        apply_overrides(TrainConfig(), ["data.store=s1", "data.extra_stores=['s2', 's1']"])
    with pytest.raises(ConfigError, match="repeats a store"):
        DataConfig(extra_stores=("x", "x"))
    with pytest.raises(ConfigError, match="store folders"):
        DataConfig(extra_stores=("",))


def test_later_turns_refuse_a_prompt_pack(tmp_path, monkeypatch):
    """A prompt pack keeps user turns only: later turns from it would lose their context, so they are refused."""
    (tmp_path / "sharegpt.jsonl").write_text(json.dumps({"id": "a", "messages": [_msg(U, "q"), _msg(U, "q2")]}) + "\n")
    monkeypatch.setenv("CARRYOVER_PROMPTS", str(tmp_path))
    assert [c.id for c in conversations(DataConfig(heldout_per_mille=0))] == ["a"]
    with pytest.raises(DataError, match="keeps user turns only"):
        next(conversations(DataConfig(heldout_per_mille=0, prompt_turns="later")))
