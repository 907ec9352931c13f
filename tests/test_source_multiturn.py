"""`data.responses="source"` on multi-turn conversations (the JSONL a user brings, e.g. regenerated with
vLLM/SGLang): every assistant turn is kept with the loss mask on each reply (and its stop token), the user
turns between them masked; the record is the chat template's rendering of the conversation."""

import json

import pytest

from carryover_jax import load_target
from carryover_jax.config import DataConfig
from carryover_jax.train.responses import prepare_responses


def _w(*ids):
    return " ".join(f"w{i}" for i in ids)


CONVS = [
    {"id": "three", "messages": [
        {"role": "system", "content": _w(40)}, {"role": "user", "content": _w(5, 6, 7)},
        {"role": "assistant", "content": _w(10, 11, 12, 13)}, {"role": "user", "content": _w(20)},
        {"role": "assistant", "content": _w(21, 22, 23)}, {"role": "user", "content": _w(30, 31)},
        {"role": "assistant", "content": _w(32, 33, 34, 35, 36, 37, 38, 39, 41, 42)}]},  # cut at max_new_tokens
    {"id": "two-users", "messages": [  # the turns stop alternating: kept up to the first reply
        {"role": "user", "content": _w(8)}, {"role": "assistant", "content": _w(50, 51, 52, 53)},
        {"role": "user", "content": _w(54)}, {"role": "user", "content": _w(55)},
        {"role": "assistant", "content": _w(56, 57)}]},
    {"id": "no-last-reply", "messages": [  # ends on a user turn: that prompt is not kept
        {"role": "user", "content": _w(9)}, {"role": "assistant", "content": _w(60, 61, 62)},
        {"role": "user", "content": _w(63)}, {"role": "assistant", "content": _w(64, 65)},
        {"role": "user", "content": _w(66)}]},
]


@pytest.fixture(scope="module")
def target(tiny_llama_worded):
    return load_target(tiny_llama_worded)


def _store(target, tmp_path, **kw):
    src = tmp_path / "convs.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    cfg = DataConfig(source=str(src), store=str(tmp_path / "st"), heldout_per_mille=0, responses="source",
                     max_new_tokens=8, min_loss_tokens=3, max_prompt_tokens=64, **kw)
    store = prepare_responses(cfg, target, progress=False)
    return {cid: store[store.ids().index(cid)] for cid in store.ids()}


def _rendered(target, messages):
    """The chat template's own token ids of a whole conversation (an independent reference)."""
    text = target.tokenizer.apply_chat_template(messages, tokenize=False)
    return target.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_every_assistant_turn_is_kept_with_the_loss_on_each_reply(target, tmp_path):
    recs = _store(target, tmp_path, max_turns=8)
    stop = target.stop_token_ids[0]
    r = recs["three"]
    ids, mask = r["input_ids"].tolist(), r["loss_mask"].tolist()
    # the supervised spans are exactly the three replies: the first two ended by the stop token, the third
    # cut at max_new_tokens (no stop); everything else (system, user turns) is masked
    spans, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    spans.append(cur) if cur else None
    assert spans == [[10, 11, 12, 13, stop], [21, 22, 23, stop], [32, 33, 34, 35, 36, 37, 38, 39]]
    # without the stop tokens the record is the template's rendering of the conversation (the last reply cut)
    msgs = CONVS[0]["messages"][:-1] + [{"role": "assistant", "content": _w(32, 33, 34, 35, 36, 37, 38, 39)}]
    assert [t for t in ids if t != stop] == _rendered(target, msgs)
    assert ids[: len(target.encode(CONVS[0]["messages"][:2]))] == target.encode(CONVS[0]["messages"][:2])
    assert mask[: len(target.encode(CONVS[0]["messages"][:2]))] == [0] * len(target.encode(CONVS[0]["messages"][:2]))
    # two user turns in a row: the conversation stops after the last reply that answers one user turn
    two = recs["two-users"]
    assert two["input_ids"].tolist() == target.encode(CONVS[1]["messages"][:1]) + [50, 51, 52, 53, stop]
    # a trailing user turn without a reply adds nothing
    last = recs["no-last-reply"]
    assert last["input_ids"].tolist()[-3:] == [64, 65, stop] and last["loss_mask"].tolist()[-3:] == [1, 1, 1]
    assert sum(last["loss_mask"].tolist()) == 3 + 1 + 2 + 1


def test_max_turns_caps_the_kept_exchanges(target, tmp_path):
    recs = _store(target, tmp_path, max_turns=2)
    stop = target.stop_token_ids[0]
    r = recs["three"]
    assert r["input_ids"].tolist()[-4:] == [21, 22, 23, stop] and sum(r["loss_mask"].tolist()) == 5 + 4
