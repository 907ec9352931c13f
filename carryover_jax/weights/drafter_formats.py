"""Drafter checkpoints: our native folder, the z-lab DFlash format (A) and the DeepSpec format (B).

- native: `drafter_config.json` (our `DrafterConfig`) + `model.safetensors` (PyTorch names, e_rej
  included). Training writes it; `carryover export` reads it.
- zlab (Format A, `DFlashDraftModel`): z-lab / vLLM / SGLang "DFlash". DFlash kind, zlab layout only.
  No `embed_tokens` / `lm_head` (the target's are used).
- deepspec (Format B, `Qwen3DSparkModel`): DeepSpec DFlash/DSpark, vLLM `dspark`, sglang-jax. deepspec
  layout only; includes frozen copies of the target's `embed_tokens` and `lm_head`, and
  `markov_head.markov_w{1,2}.weight` for the Markov drafter.

Carryover in A and B travels as one extra tensor `e_rej` [hidden] in a separate `carryover.safetensors`,
flagged by the `carryover` key of config.json; a drafter with the projection module
(`carry_module="projection"`) adds its `carry_proj.{gate,up,down}_proj.weight` there, and
`carryover.module = "projection"`. `model.safetensors.index.json` lists only the standard
tensors, so loaders that follow the index (vLLM, SGLang, transformers) see exactly the format they
know; loaders that glob `*.safetensors` get unknown tensors they can drop by name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors.numpy import save_file

from carryover_jax.config import LEGACY_NUMERICS_FIELDS, DrafterConfig, TargetConfig, gemma_draft_backbone
from carryover_jax.errors import CarryoverError, CheckpointError, ConfigError, first_line
from carryover_jax.io import atomic_dir, read_json
from carryover_jax.weights.hf import hf_name, load_params, to_tensors
from carryover_jax.weights.hf_config import target_config_from_hf, target_config_to_hf

FORMATS = ("native", "zlab", "deepspec")
CARRYOVER_FILE = "carryover.safetensors"
CARRYOVER_TENSOR = "e_rej"
CARRY_MODULE_PARAMS = "carry_proj"  # the projection module's params (and tensor-name prefix)
_ARCH = {"DFlashDraftModel": "zlab", "Qwen3DSparkModel": "deepspec", "Gemma4DSparkModel": "deepspec"}
# drafter_config.json versions: 1 (no "config_version" key) kept the run's numerics in the backbone
# (`dtype`, `param_dtype`, `attention_backend`); 2 holds none (numerics are a runtime choice,
# carryover_jax/numerics.py). A v1 file's numerics are ignored: the params on disk are cast to the
# dtypes of the run that loads them.
DRAFTER_CONFIG_VERSION = 2


def drafter_hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """Our drafter param path -> (PyTorch tensor name, transposed?). No `model.` prefix (both formats)."""
    if path == ("e_rej",):
        return CARRYOVER_TENSOR, False
    return hf_name(path)


# ---- config (de)serialisation ---------------------------------------------------------------------
def drafter_config_to_dict(cfg: DrafterConfig) -> dict:
    """The native `drafter_config.json`: the drafter's architecture, no numerics, versioned."""
    d = {"config_version": DRAFTER_CONFIG_VERSION, **dataclasses.asdict(cfg)}
    d["backbone"].pop("numerics", None)
    d["target_layer_ids"] = list(cfg.target_layer_ids)
    d["draft_vocab"] = list(cfg.draft_vocab)
    if cfg.carry_module == "embedding":  # the default: written only when set, so earlier readers read the rest
        d.pop("carry_module")
    return d


def drafter_config_from_dict(d: dict) -> DrafterConfig:
    """A `drafter_config.json` of any version so far -> DrafterConfig (under the float32 reference
    numerics; the loader sets the run's)."""
    d = dict(d)
    version = d.pop("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= DRAFTER_CONFIG_VERSION:
        raise ConfigError(f"drafter config version {version!r} is not one this carryover-jax reads "
                              f"(1..{DRAFTER_CONFIG_VERSION}; a newer version needs a newer carryover-jax)")
    if not isinstance(d["backbone"], dict):
        raise ConfigError("\"backbone\" must be an object")
    backbone = dict(d["backbone"])
    for k in (*LEGACY_NUMERICS_FIELDS, "numerics"):  # v1: the run's numerics, a runtime choice now
        backbone.pop(k, None)
    d["backbone"] = TargetConfig(**backbone)
    d["target_layer_ids"] = tuple(d["target_layer_ids"])
    d["draft_vocab"] = tuple(d.get("draft_vocab", ()))
    return DrafterConfig(**d)


def _backbone_fields(cfg: DrafterConfig) -> dict:
    bc = cfg.backbone
    hf = target_config_to_hf(bc)
    if bc.family == "gemma4":  # DeepSpec's Gemma4DSparkModel: the target's text config, full-attention layers
        hf.update(
            num_hidden_layers=bc.num_layers, layer_types=["full_attention"] * bc.num_layers, tie_word_embeddings=False,
            global_head_dim=bc.head_dim, num_global_key_value_heads=bc.num_kv_heads, hidden_size_per_layer_input=0,
            num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False,
            num_target_layers=cfg.num_target_layers, block_size=cfg.block_size,
        )
        return hf
    hf.update(
        model_type="qwen3", num_hidden_layers=bc.num_layers, layer_types=["full_attention"] * bc.num_layers,
        tie_word_embeddings=False, attention_bias=False, sliding_window=None, use_sliding_window=False,
        rope_theta=bc.rope_theta, num_target_layers=cfg.num_target_layers, block_size=cfg.block_size,
    )
    hf.pop("mlp_bias", None)
    return hf


def _carryover_field(cfg: DrafterConfig) -> dict:
    if cfg.carry_module == "projection":
        return {
            "tensor": CARRYOVER_TENSOR, "file": CARRYOVER_FILE, "max_carried_rows": cfg.num_proposals,
            "module": "projection",
            "module_tensors": [f"{CARRY_MODULE_PARAMS}.{n}_proj.weight" for n in ("gate", "up", "down")],
            "rows": "u = hidden_norm(fc(rejected verify features)); u + carry_proj.down_proj("
                    "silu(carry_proj.gate_proj(u)) * carry_proj.up_proj(u)) + e_rej at positions next_anchor + i, "
                    "for one round",
        }
    return {
        "tensor": CARRYOVER_TENSOR, "file": CARRYOVER_FILE, "max_carried_rows": cfg.num_proposals,
        "rows": "hidden_norm(fc(rejected verify features)) + e_rej at positions next_anchor + i, for one round",
    }


def export_carry_module(hf: dict) -> str:
    """The carried-row module an export's config.json records ("embedding" when it records none)."""
    field = hf.get("carryover")
    return field.get("module", "embedding") if isinstance(field, dict) else "embedding"


# DeepSpec's config carries its training anchors per sequence (`num_anchors`, a training setting that
# inference ignores); 512 is DeepSpec's default, written when the drafter's own value is not recorded.
DEEPSPEC_DEFAULT_ANCHORS = 512


def recorded_num_anchors(folder: str | os.PathLike) -> tuple[int, str] | None:
    """(anchors per sequence the drafter in `folder` was trained with, where that was read) when
    recorded: a DeepSpec folder's own config.json, or the `train_config.json` of the training run that
    wrote it (`<run>/drafter`, `<run>/snapshots/step_N`); None otherwise."""
    folder = Path(folder)
    candidates = [folder / "config.json"]
    if folder.name == "drafter":
        candidates.append(folder.parent / "train_config.json")
    if folder.parent.name == "snapshots":
        candidates.append(folder.parent.parent / "train_config.json")
    for path in candidates:
        try:
            n = json.loads(path.read_text()).get("num_anchors")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return n, str(path)
    return None


def export_config(cfg: DrafterConfig, fmt: str, num_anchors: int | None = None) -> dict:
    """The export's config.json; `num_anchors`: the training anchors per sequence (DeepSpec's field),
    None when not known (DeepSpec's default is written and a `num_anchors_note` says so)."""
    if cfg.draft_vocab:
        raise ConfigError(f"the {fmt} format has no draft vocabulary (this drafter proposes from "
                          f"{len(cfg.draft_vocab)} target tokens through its own lm_head); keep the native folder")
    out = _backbone_fields(cfg)
    if fmt == "zlab":
        if cfg.kind != "dflash" or cfg.layout != "zlab":
            raise ConfigError(
                f"the z-lab format holds DFlash drafters in the zlab layout; this is {cfg.kind}/{cfg.layout} "
                "(use --format deepspec)"
            )
        if cfg.backbone.family.startswith("gemma"):
            raise ConfigError("the z-lab format holds Qwen3-style drafters; a Gemma drafter exports as --format deepspec")
        out.update(
            architectures=["DFlashDraftModel"],
            dflash_config={"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        )
    elif fmt == "deepspec":
        if cfg.layout != "deepspec":
            raise ConfigError(
                "the DeepSpec format holds drafters in the deepspec layout (slot k predicts the next token); "
                "this drafter uses the zlab layout (use --format zlab)"
            )
        if cfg.backbone.family == "gemma3":
            raise ConfigError("DeepSpec has no Gemma 3 drafter format (its Gemma drafter is Gemma 4's); keep the "
                              "native folder")
        out.update(
            architectures=["Gemma4DSparkModel" if cfg.backbone.family == "gemma4" else "Qwen3DSparkModel"],
            target_layer_ids=list(cfg.target_layer_ids),
            mask_token_id=cfg.mask_token_id, num_anchors=num_anchors or DEEPSPEC_DEFAULT_ANCHORS,
            enable_confidence_head=False, confidence_head_with_markov=False, markov_rank=cfg.markov_rank,
            markov_head_type="vanilla",
        )
        if num_anchors is None:
            out["num_anchors_note"] = (f"{DEEPSPEC_DEFAULT_ANCHORS} is DeepSpec's default: the anchors per sequence "
                                       "this drafter was trained with are not recorded (a training setting; "
                                       "inference does not read it)")
    else:
        raise ConfigError(f"unknown export format {fmt!r}; supported: zlab, deepspec")
    if cfg.carryover:
        out["carryover"] = _carryover_field(cfg)
    return out


# ---- writing ----------------------------------------------------------------------------------------
def save_drafter(cfg: DrafterConfig, params, folder: str | os.PathLike) -> Path:
    """Native folder (exact dtypes, e_rej inline): what training writes and `load_drafter` reads."""
    def write(tmp: Path):
        save_file(to_tensors(params, drafter_hf_name), tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "drafter_config.json").write_text(json.dumps(drafter_config_to_dict(cfg), indent=2) + "\n")

    return atomic_dir(Path(folder), write, replaces=is_drafter_folder)


def is_drafter_folder(folder: Path) -> bool:
    """Whether `folder` holds a drafter (native, z-lab or DeepSpec), so writing a drafter may replace it;
    a target checkpoint or any other folder is never replaced."""
    if (folder / "drafter_config.json").is_file():
        return True
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(a in _ARCH for a in archs)


def export_drafter(cfg: DrafterConfig, params, folder: str | os.PathLike, fmt: str, *, frozen=None,
                   dtype: Any = "bfloat16", num_anchors: int | None = None, card: dict | None = None) -> Path:
    """Write `params` as a PyTorch checkpoint in format `fmt` ("zlab" | "deepspec"), atomically.

    `frozen` (target embedding/head, see `frozen_from_target`) is required for deepspec, which stores
    copies of them. `dtype` None keeps the params' dtype (tests use float32). `num_anchors`: the
    training anchors per sequence DeepSpec's config records (`recorded_num_anchors`), None if unknown.
    """
    config = export_config(cfg, fmt, num_anchors)
    np_dtype = None if dtype is None else np.dtype(jax.numpy.dtype(dtype))
    tensors = to_tensors(params, drafter_hf_name, np_dtype)
    # e_rej and the projection module's tensors go to carryover.safetensors, outside the index
    carry = {k: tensors.pop(k) for k in list(tensors)
             if k == CARRYOVER_TENSOR or k.startswith(CARRY_MODULE_PARAMS + ".")}
    e_rej = carry.get(CARRYOVER_TENSOR)
    if fmt == "deepspec":
        if frozen is None:
            raise ConfigError("the DeepSpec format stores the target's embed_tokens and lm_head: pass the target")
        head = frozen["embed"] if frozen.get("head") is None else np.asarray(frozen["head"]).T
        for name, arr in (("embed_tokens.weight", frozen["embed"]), ("lm_head.weight", head)):
            a = np.asarray(jax.device_get(arr))
            tensors[name] = np.ascontiguousarray(a.astype(np_dtype) if np_dtype is not None else a)
    config["torch_dtype"] = str(next(iter(tensors.values())).dtype)

    def write(tmp: Path):
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        index = {"metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))},
                 "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        if e_rej is not None:
            save_file(carry, tmp / CARRYOVER_FILE, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # README.md: what the drafter is and how each engine loads it (`card`: target=, source= for the text)
        from carryover_jax.weights.model_card import write_model_card

        write_model_card(tmp, cfg, config, fmt, has_e_rej=e_rej is not None, **(card or {}))

    return atomic_dir(Path(folder), write, replaces=is_drafter_folder)


# ---- reading ----------------------------------------------------------------------------------------
def detect_format(folder: Path) -> str:
    if (folder / "drafter_config.json").exists():
        return "native"
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{folder} is not a drafter checkpoint (no drafter_config.json or config.json)")
    archs = read_json(cfg_path, "drafter config", error=CheckpointError).get("architectures") or []
    if not isinstance(archs, list):
        raise CheckpointError(f"\"architectures\" must be a list in drafter config {cfg_path}")
    for a in archs:
        if a in _ARCH:
            return _ARCH[a]
    raise CheckpointError(
        f"{folder}: architecture {', '.join(archs) or 'unknown'} is not a drafter format we read "
        "(DFlashDraftModel, Qwen3DSparkModel, or a native carryover-jax drafter)"
    )


def config_from_export(hf: dict, fmt: str, *, carryover: bool, carry_module: str = "embedding") -> DrafterConfig:
    n = hf["num_hidden_layers"]
    if "Gemma4DSparkModel" in (hf.get("architectures") or []):
        text = target_config_from_hf({**hf, "architectures": ["Gemma4ForCausalLM"]}, num_layers=n)
        backbone = gemma_draft_backbone(text, n)
    else:
        backbone = target_config_from_hf({**hf, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
                                        tie_word_embeddings=False, num_layers=n)
    if fmt == "zlab":
        dc = hf.get("dflash_config") or {}
        ids, mask = dc.get("target_layer_ids"), dc.get("mask_token_id")
        kind, rank = "dflash", 0
    else:
        ids, mask = hf.get("target_layer_ids"), hf.get("mask_token_id")
        rank = int(hf.get("markov_rank") or 0)
        kind = "markov" if rank else "dflash"
        if rank and hf.get("markov_head_type", "vanilla") != "vanilla":
            raise CheckpointError(f"markov_head_type {hf['markov_head_type']!r} is not supported (vanilla only)")
    if ids is None or mask is None:
        raise CheckpointError("drafter config lacks target_layer_ids or mask_token_id")
    return DrafterConfig(
        kind=kind, layout=fmt, block_size=int(hf["block_size"]), target_layer_ids=tuple(ids),
        num_target_layers=int(hf["num_target_layers"]), mask_token_id=int(mask), backbone=backbone,
        markov_rank=rank, carryover=carryover, carry_module=carry_module,
    )


def load_drafter(folder: str | os.PathLike, *, layout: str | None = None, fmt: str | None = None,
                 carryover: bool | None = None, carry_module: str | None = None, dtype: str | None = None,
                 numerics=None):
    """Read a native, z-lab or DeepSpec drafter folder -> (DrafterConfig, params) under `numerics`
    (a resolved `Numerics`; None: the float32 reference); `dtype` puts params and compute in that dtype.
    Params of any float dtype on disk are cast to the numerics' drafter param dtype.

    `layout`/`fmt`, when given, must match the checkpoint (a format/layout mismatch is an error, not a
    silent relabel). `carryover=True` on a checkpoint without `e_rej` starts it at zero (continuing a
    released drafter with Carryover); `carryover=False` drops it (and any projection module).
    `carry_module` None keeps the checkpoint's; "projection" on a checkpoint without the module starts
    it as `init_carry_projection` does (down_proj zero: exactly the embedding form); "embedding" drops it.
    """
    from carryover_jax.models.drafter import init_carry_projection, init_drafter_params

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"no such drafter folder: {folder}")
    found = detect_format(folder)
    if fmt is not None and fmt != found:
        raise CheckpointError(f"{folder} is in the {found} format, not {fmt}")
    cfg_file = folder / ("drafter_config.json" if found == "native" else "config.json")
    raw = read_json(cfg_file, "drafter config", error=CheckpointError)
    try:
        if found == "native":
            cfg = drafter_config_from_dict(raw)
            has_e_rej = cfg.carryover
        else:
            has_e_rej = bool(raw.get("carryover")) and (folder / CARRYOVER_FILE).exists()
            cfg = config_from_export(raw, found, carryover=has_e_rej,
                                     carry_module=export_carry_module(raw) if has_e_rej else "embedding")
        has_module = cfg.carry_module == "projection"
    except KeyError as e:
        raise CheckpointError(f"missing field {e.args[0]!r} in drafter config {cfg_file}") from None
    except ConfigError as e:
        raise CheckpointError(f"{e} (in drafter config {cfg_file})") from None
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, CarryoverError):
            raise
        raise CheckpointError(f"invalid drafter config {cfg_file} ({first_line(e)})") from None
    if carryover is not None or carry_module is not None:
        on = cfg.carryover if carryover is None else carryover
        cfg = cfg.replace(carryover=on, carry_module=carry_module or (cfg.carry_module if on else "embedding"))
    if numerics is not None:
        cfg = cfg.with_numerics(numerics)
    if dtype:
        cfg = cfg.replace(backbone=cfg.backbone.replace(dtype=dtype, param_dtype=dtype))
    if layout is not None and layout != cfg.layout:
        raise CheckpointError(
            f"{folder} holds a drafter in the {cfg.layout} layout ({found} format), not {layout}: "
            "the layouts predict different positions and are not interchangeable"
        )
    abstract = jax.eval_shape(lambda: init_drafter_params(cfg, jax.random.key(0)))
    carry_abstract = {k: abstract.pop(k) for k in ("e_rej", CARRY_MODULE_PARAMS) if k in abstract}
    params = load_params(folder, abstract, drafter_hf_name)
    src = "model.safetensors" if found == "native" else CARRYOVER_FILE  # exports: outside the index
    dt = abstract["norm"]["weight"].dtype
    if "e_rej" in carry_abstract:
        if has_e_rej:
            spec = {"e_rej": carry_abstract["e_rej"]}
            params["e_rej"] = load_params(folder, spec, drafter_hf_name, file=src)["e_rej"]
        else:
            params["e_rej"] = jax.numpy.zeros((cfg.hidden_size,), dt)
    if CARRY_MODULE_PARAMS in carry_abstract:
        if has_module:
            spec = {CARRY_MODULE_PARAMS: carry_abstract[CARRY_MODULE_PARAMS]}
            params[CARRY_MODULE_PARAMS] = load_params(folder, spec, drafter_hf_name, file=src)[CARRY_MODULE_PARAMS]
        else:  # continuing a drafter without the module: it starts as the identity (the embedding form)
            params[CARRY_MODULE_PARAMS] = init_carry_projection(cfg, jax.random.key(0))
    return cfg, params
