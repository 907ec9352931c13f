"""The Python API's loaders: `load_target` (alias / HF folder / GGUF file -> a ready-to-run `Target`:
config, params, tokenizer) and `load_drafter` / `init_drafter` (-> a `DraftModel` paired with a target)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import jax

from carryover_jax.config import MASK_TOKEN_IDS, DrafterConfig, TargetConfig
from carryover_jax.errors import CarryoverError, CheckpointError, RequestError, first_line
from carryover_jax.io import read_json
from carryover_jax.models.drafter import check_pair, frozen_from_target, init_drafter_params, with_draft_head
from carryover_jax.models.greedy_head import HeadScreen, head_screen
from carryover_jax.models.target import TargetLM, abstract_params
from carryover_jax.numerics import Numerics
from carryover_jax.weights import drafter_formats
from carryover_jax.weights.hf import load_params, read_config
from carryover_jax.weights.hf_config import target_config_from_hf
from carryover_jax.weights.registry import resolve_target


@dataclasses.dataclass
class Target:
    """A loaded target LM. `params` is a plain pytree; `model.apply({"params": params}, ...)` runs it."""

    cfg: TargetConfig
    params: Any
    tokenizer: Any = None
    path: Path | None = None
    stop_token_ids: tuple[int, ...] = ()
    # (params, cfg, screen): `greedy_screen`'s, built for the params object and config it holds
    _screen: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def model(self) -> TargetLM:
        return TargetLM(self.cfg)

    def greedy_screen(self) -> HeadScreen | None:
        """The screen of the head's greedy tokens (`models/greedy_head.py`; None where it does not apply), built
        once for these params and config, and again if either is replaced."""
        if self._screen is None or self._screen[0] is not self.params or self._screen[1] != self.cfg:
            self._screen = (self.params, self.cfg, head_screen(self.cfg, self.params))
        return self._screen[2]

    def encode(self, prompt: str | Sequence[dict], *, chat: bool = True) -> list[int]:
        """A prompt (or a list of chat messages) -> token ids, through the chat template if any."""
        tok = self._tok()
        if chat and getattr(tok, "chat_template", None):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in messages):
                raise RequestError("chat messages must be {\"role\": str, \"content\": str} objects")
            try:
                text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            except Exception as e:  # jinja errors: a role order the template rejects, ...
                raise RequestError(f"the target's chat template rejects these messages ({first_line(e)})") from None
            return list(tok(text, add_special_tokens=False)["input_ids"])
        if not isinstance(prompt, str):
            raise CarryoverError("chat messages need a tokenizer with a chat template")
        return list(tok(prompt)["input_ids"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok().decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _tok(self):
        if self.tokenizer is None:
            raise CarryoverError("this target has no tokenizer; pass token ids instead of text")
        return self.tokenizer


def _stop_ids(folder: Path, hf_cfg: dict, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []

    def add(x):
        if x is None:
            return
        for i in x if isinstance(x, (list, tuple)) else [x]:
            if int(i) not in ids:
                ids.append(int(i))

    gen = folder / "generation_config.json"
    try:
        if gen.exists():
            add(read_json(gen, "generation config", error=CheckpointError).get("eos_token_id"))
        add(hf_cfg.get("eos_token_id"))
    except (TypeError, ValueError):
        raise CheckpointError(f"eos_token_id must be an integer or a list of integers in {folder}") from None
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
    return tuple(ids)


def run_numerics(numerics: Numerics | None = None, *, platform: str | None = None, **fields) -> Numerics:
    """`numerics` (default: all unset) with the given fields (None = unset) resolved for `platform`
    (None: this process's default backend): what `load_target` runs a target with."""
    base = numerics if numerics is not None else Numerics()
    return base.replace(**{k: v for k, v in fields.items() if v is not None}).resolve(platform)


def load_target(
    spec: str | os.PathLike,
    *,
    numerics: Numerics | None = None,
    dtype: str | None = None,
    param_dtype: str | None = None,
    attention_backend: str | None = None,
    platform: str | None = None,
    tokenizer: bool = True,
    shardings: Any = None,
) -> Target:
    """Load a target by alias (`smollm2`), HF checkpoint folder, or `.gguf` file, with `numerics`
    (`carryover_jax.numerics`; unset fields: `platform`'s defaults, float32 on CPU, bf16 on accelerators).
    `dtype` / `param_dtype` / `attention_backend` set those fields (`dtype` alone: params too). A
    checkpoint of any float dtype (HF ships bf16) is cast to the param dtype as it is read."""
    folder = resolve_target(spec)
    hf_cfg = read_config(folder)
    num = run_numerics(numerics, platform=platform, dtype=dtype, param_dtype=param_dtype,
                       attention_backend=attention_backend)
    cfg = target_config(folder, hf_cfg).with_numerics(num)
    params = load_params(folder, abstract_params(cfg), shardings=shardings)
    tok = None
    if tokenizer:
        try:  # transformers is slow to import: only when a tokenizer is asked for
            import transformers
            from transformers import AutoTokenizer

            transformers.logging.set_verbosity_error()
            tok = AutoTokenizer.from_pretrained(str(folder))
        except Exception as e:
            raise CheckpointError(f"{folder}: cannot load the tokenizer ({str(e).splitlines()[0]})") from None
    return Target(cfg=cfg, params=params, tokenizer=tok, path=folder, stop_token_ids=_stop_ids(folder, hf_cfg, tok))


def target_config(folder: Path, hf_cfg: dict, **overrides) -> TargetConfig:
    """`target_config_from_hf` with a missing or mistyped field reported in one line naming the file."""
    try:
        cfg = target_config_from_hf(hf_cfg, **overrides)
    except KeyError as e:
        raise CheckpointError(f"missing field {e.args[0]!r} in config {Path(folder) / 'config.json'}") from None
    except CarryoverError as e:  # TargetConfig's checks (numbers in range, known switches): name the file
        raise type(e)(f"{e} (in config {Path(folder) / 'config.json'})") from None
    except (TypeError, ValueError, AttributeError, ArithmeticError) as e:
        raise CheckpointError(f"invalid field in config {Path(folder) / 'config.json'} ({first_line(e)})") from None
    return cfg


@dataclasses.dataclass
class DraftModel:
    """A drafter ready to decode: config, params (plain pytree) and where it came from."""

    cfg: Any  # DrafterConfig
    params: Any
    path: Path | None = None


def default_mask_token_id(target: Target) -> int:
    """The frozen MASK row for a target: Qwen3's unused 151669, else a documented unused special token."""
    if target.cfg.family == "qwen3":
        return MASK_TOKEN_IDS["qwen3"]
    if target.cfg.family in ("gemma3", "gemma4"):  # `<mask>`, as DeepSpec's Gemma drafters use it
        return MASK_TOKEN_IDS["gemma"]
    tok = target.tokenizer
    if tok is not None:
        tid = tok.convert_tokens_to_ids("<empty_output>")  # SmolLM2 / StarCoder-family vocabularies
        if isinstance(tid, int) and tid != tok.unk_token_id and tid is not None and tid >= 0:
            return tid
    raise CarryoverError("no default MASK token for this target: pass mask_token_id (an unused special-token row)")


def init_drafter(target: Target, *, seed: int = 0, mask_token_id: int | None = None, **kw) -> DraftModel:
    """A randomly initialised drafter for `target` (kw: kind, layout, num_proposals, num_layers,
    draft_vocab, ...); a draft vocabulary's `lm_head` starts as the target head's rows."""
    if mask_token_id is None:
        mask_token_id = default_mask_token_id(target)
    cfg = DrafterConfig.for_target(target.cfg, mask_token_id=mask_token_id, **kw)
    params = init_drafter_params(cfg, jax.random.key(seed))
    return DraftModel(cfg, with_draft_head(cfg, params, frozen_from_target(target.params, target.cfg)))


def load_drafter(path: str | os.PathLike, *, carryover: bool | None = None, layout: str | None = None,
                 dtype: str | None = None, target: Target | None = None, numerics: Numerics | None = None,
                 carry_module: str | None = None) -> DraftModel:
    """A native, z-lab (DFlashDraftModel) or DeepSpec (Qwen3DSparkModel) drafter folder, run with
    `numerics` (default: the target's when given, else this platform's defaults); `dtype` also puts the
    drafter's params in that dtype. `carryover` / `carry_module`: see `drafter_formats.load_drafter`."""
    if numerics is None:
        numerics = target.cfg.numerics if target is not None else run_numerics()
    elif not numerics.is_resolved:
        numerics = numerics.resolve()
    cfg, params = drafter_formats.load_drafter(path, carryover=carryover, carry_module=carry_module, layout=layout,
                                               dtype=dtype, numerics=numerics)
    if target is not None:
        check_pair(cfg, target.cfg)
    return DraftModel(cfg, params, Path(path))
