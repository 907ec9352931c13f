"""The README.md `carryover export` writes into an export folder: what the drafter is, which target and
feature layers it needs in each engine's convention, how it was trained and how well it drafts (when the
run's files say so), and how to load it — in vLLM, SGLang and z-lab's loop as a baseline drafter, and in
`carryover_jax.export.speculative` with Carryover.

Feature-layer conventions (checked against the loaders: z-lab `dflash/model.py` and DeepSpec
`deepspec/modeling/dspark/common.py` read `hidden_states[id + 1]`; SGLang's DFlash worker captures
"before layer i" and adds the +1 itself; the speculators format stores `aux_hidden_state_layer_ids`
= id + 1): the checkpoint's field is the same in both formats, the capture point is one higher.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from carryover_jax.config import DrafterConfig


def layer_conventions(ids) -> dict[str, list[int]]:
    """Feature-layer ids in each convention, from ours (id l = output of decoder layer l, -1 = embedding)."""
    ids = [int(i) for i in ids]
    return {
        "config": ids,  # z-lab dflash_config.target_layer_ids, DeepSpec target_layer_ids
        "hf_hidden_states": [i + 1 for i in ids],  # transformers output_hidden_states index
        "capture_before_layer": [i + 1 for i in ids],  # vLLM / SGLang aux-hidden-state hook, speculators
    }


def _last_json_line(path: Path) -> dict | None:
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def training_facts(source: Path | None) -> dict[str, Any]:
    """What the run that wrote the native drafter folder `source` (its parent: train_config.json,
    metrics.jsonl) and any eval of it (a results.json beside the run naming this folder) tell."""
    if source is None:
        return {}
    source = Path(source).resolve()
    run = source.parent
    out: dict[str, Any] = {}
    tc = _read(run / "train_config.json")
    if isinstance(tc, dict):
        data = tc.get("data") or {}
        loss = tc.get("loss") if isinstance(tc.get("loss"), dict) else tc  # runs before LossConfig: flat
        out["config"] = {k: tc.get(k) for k in ("name", "target", "steps", "lr", "batch_size", "num_anchors",
                                                 "init_from") if tc.get(k) is not None}
        out["config"].update({k: loss.get(k) for k in ("mode", "kl_weight") if loss.get(k) is not None})
        out["config"].update({f"data.{k}": data.get(k) for k in ("source", "responses", "max_prompts")
                              if isinstance(data, dict) and data.get(k) is not None})
    last = _last_json_line(run / "metrics.jsonl")
    if isinstance(last, dict):
        out["last_step"] = {k: last[k] for k in ("step", "loss", "tau_estimate", "draft1/tau") if k in last}
    evals = []
    for results in sorted({*run.glob("*/results.json"), *run.parent.glob("*/results.json"),
                           *run.parent.parent.glob("*/results.json")}):
        r = _read(results)
        if not isinstance(r, dict):
            continue
        for arm in r.get("drafters") or []:
            p = arm.get("path") if isinstance(arm, dict) else None
            if not p:
                continue
            base = results.parent.parent
            if source not in {Path(p).resolve(), (base / p).resolve(), (Path.cwd() / p).resolve()}:
                continue
            temps = ((r.get("summary") or {}).get("temperatures") or {})
            for t, tv in temps.items():
                for ds, dv in ((tv or {}).get("datasets") or {}).items():
                    v = (dv or {}).get(arm.get("label"))
                    if isinstance(v, dict) and v.get("tau") is not None:
                        evals.append({"results": str(results), "label": arm.get("label"), "temperature": t,
                                      "dataset": ds, "tau": v["tau"], "speedup": v.get("speedup")})
    if evals:
        out["eval"] = evals
    return out


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def _carryover_cell(cfg: DrafterConfig, has_e_rej: bool) -> str:
    if not has_e_rej:
        return "no e_rej (a baseline drafter)"
    if cfg.carry_module == "projection":
        return ("yes: e_rej and the projection module carry_proj (a residual SwiGLU on the fused carried rows) in "
                "carryover.safetensors")
    return "yes: e_rej in carryover.safetensors"


def model_card(cfg: DrafterConfig, config: dict, fmt: str, *, has_e_rej: bool, target: str | None = None,
               source: str | None = None) -> str:
    """README.md text for an export folder; `config` is the config.json written beside it."""
    P, B = cfg.num_proposals, cfg.block_size
    conv = layer_conventions(cfg.target_layer_ids)
    bc = cfg.backbone
    arch = (config.get("architectures") or ["?"])[0]
    what = "DFlash block drafter" if cfg.kind == "dflash" else "DSpark-derived Markov drafter (vanilla Markov head, rank " \
        f"{cfg.markov_rank})"
    layout = ("z-lab layout: block [anchor, MASK x P], slot k >= 1 proposes the token at its own position"
              if cfg.layout == "zlab" else
              "DeepSpec layout: block [anchor, MASK x (P-1)], slot k proposes the token after its position")
    facts = training_facts(Path(source)) if source else {}
    target_name = target or (facts.get("config") or {}).get("target") or "the target it was trained for"
    field = "dflash_config.target_layer_ids" if fmt == "zlab" else "target_layer_ids"
    mask_field = "dflash_config.mask_token_id" if fmt == "zlab" else "mask_token_id"
    lines = [
        f"# {what} for {target_name} ({fmt} format, `{arch}`)",
        "",
        "Written by `carryover export` (carryover-jax). Speculative decoding: the drafter proposes "
        f"{P} tokens per round from the target's hidden states, the target verifies them in one forward.",
        "",
        "## The drafter",
        "",
        "| | |",
        "|---|---|",
        f"| kind | {cfg.kind} ({what}) |",
        f"| block | {layout}; block_size {B}, **{P} proposals per round** |",
        f"| draft layers | {bc.num_layers} Qwen3-style layers (q/k norms), hidden {bc.hidden_size}, {bc.num_heads} heads, "
        f"{bc.num_kv_heads} K/V heads, head_dim {bc.head_dim} |",
        f"| target | {target_name}: {cfg.num_target_layers} decoder layers, hidden {bc.hidden_size}, vocabulary "
        f"{bc.vocab_size} |",
        f"| MASK token id | {cfg.mask_token_id} (`{mask_field}`; a frozen row of the target's embedding) |",
        f"| draft vocabulary | {'none: proposals come from the target head over all ' + str(bc.vocab_size) + ' tokens' if not cfg.draft_vocab else str(len(cfg.draft_vocab)) + ' ids (native folder only)'} |",
        f"| embedding / LM head | {'not stored: the target' + chr(39) + 's are used' if fmt == 'zlab' else 'frozen copies of the target' + chr(39) + 's (embed_tokens, lm_head)'} |",
        f"| Carryover | {_carryover_cell(cfg, has_e_rej)} |",
        "",
        "## Feature layers (the one thing engines disagree on)",
        "",
        "The drafter reads the target's residual stream after these decoder layers. The same layers in each "
        "convention — pass the checkpoint as it is; each engine applies its own offset:",
        "",
        "| convention | ids |",
        "|---|---|",
        f"| this config's `{field}` = output of decoder layer l (z-lab `DFlashDraftModel`, DeepSpec "
        f"`Qwen3DSparkModel`, vLLM and SGLang read this field; -1 = the embedding output) | {conv['config']} |",
        f"| transformers `output_hidden_states` index (`hidden_states[l + 1]`, what z-lab's and DeepSpec's "
        f"loops index) | {conv['hf_hidden_states']} |",
        f"| capture point \"before decoder layer i\" (vLLM / SGLang aux-hidden-state hooks add the +1 internally; "
        f"the speculators format stores it as `aux_hidden_state_layer_ids`) | {conv['capture_before_layer']} |",
        "",
        "Never store the capture-point ids in this config: an engine adds the +1 again and the drafter reads the "
        "wrong layers without any error (τ just collapses).",
        "",
    ]
    lines += ["## Training and τ", ""]
    if facts.get("config"):
        lines.append("Run settings (`train_config.json`): " + ", ".join(f"{k} = {_fmt(v)}" for k, v in
                                                                         facts["config"].items()) + ".")
    if facts.get("last_step"):
        lines.append("Last logged step (`metrics.jsonl`; τ estimate is teacher-forced, not measured decoding): "
                     + ", ".join(f"{k} = {_fmt(v)}" for k, v in facts["last_step"].items()) + ".")
    if facts.get("eval"):
        lines += ["", "Measured by `carryover eval` (τ = mean accepted + 1 per round):", "",
                  "| results | arm | T | dataset | τ | speedup over AR |", "|---|---|---|---|---|---|"]
        lines += [f"| {e['results']} | {e['label']} | {e['temperature']} | {e['dataset']} | {_fmt(e['tau'])} | "
                  f"{_fmt(e['speedup']) if e['speedup'] is not None else '-'} |" for e in facts["eval"]]
    if not facts:
        lines.append("Unknown: the exported folder did not sit in a training run folder (no train_config.json / "
                     "metrics.jsonl beside it) and no eval results name it.")
    mode = (facts.get("config") or {}).get("mode")
    if mode == "dvd":
        lines.append("Trained with Carryover (DVD: draft-verify-draft), so e_rej and the carried rows are trained.")
    elif has_e_rej and mode in (None, "baseline", "control"):
        lines.append("Baseline/control training never shows the drafter a carried row: e_rej is untrained here.")
    lines += ["", "## Loading it", ""]
    if fmt == "zlab":
        lines += [
            "**vLLM** (baseline drafter; the carried rows are not used):",
            "```bash",
            f"vllm serve TARGET --speculative-config '{{\"method\": \"dflash\", \"model\": \"THIS_DIR\", "
            f"\"num_speculative_tokens\": {P}}}' --attention-backend flash_attn",
            "```",
            "**SGLang**:",
            "```bash",
            "python -m sglang.launch_server --model-path TARGET --speculative-algorithm DFLASH "
            f"--speculative-draft-model-path THIS_DIR --speculative-num-draft-tokens {B}",
            "```",
            "**z-lab's loop** (`github.com/z-lab/dflash`, `dflash/model.py`):",
            "```python",
            "from dflash.model import DFlashDraftModel, dflash_generate",
            "draft = DFlashDraftModel.from_pretrained(\"THIS_DIR\").eval()   # ignores carryover.safetensors",
            "out = dflash_generate(draft, target, input_ids, max_new_tokens=256, stop_token_ids=[...], temperature=0.0)",
            "```",
        ]
    else:
        lines += [
            "**vLLM** (`qwen3_dspark.py`; baseline drafter, the carried rows are not used):",
            "```bash",
            f"vllm serve TARGET --speculative-config '{{\"method\": \"dspark\", \"model\": \"THIS_DIR\", "
            f"\"num_speculative_tokens\": {P}}}'",
            "```",
            "**SGLang** (DSpark, `Qwen3DSparkModel`, SGLang PR #30204): `--speculative-algorithm DSPARK "
            "--speculative-draft-model-path THIS_DIR`.",
            "**DeepSpec** (`github.com/deepseek-ai/DeepSpec`): `Qwen3DSparkModel.from_pretrained(\"THIS_DIR\")`, "
            "evaluated by its `eval.py`.",
            "**z-lab's loop** does not run this format (its drafter class and block layout are DFlash's "
            "z-lab layout; the layouts are not interchangeable).",
        ]
    lines += [
        "",
        "`carryover.safetensors` (e_rej) is not listed in `model.safetensors.index.json`, so loaders that follow "
        "the index see exactly the format they know; loaders that glob `*.safetensors` get one unknown tensor "
        "they can drop by name.",
        "",
        "**With Carryover** (the rejected positions' target states kept for one more round), in PyTorch, no JAX:",
        "```bash",
        "python -m carryover_jax.export.speculative --target TARGET_HF_DIR --drafter THIS_DIR --prompt \"...\" "
        "--max-new-tokens 128 --json      # --no-carryover: the baseline loop",
        "```",
        "```python",
        "from carryover_jax.export.speculative import SpeculativeDecoder, load_target",
        "model, tok, stops = load_target(\"TARGET_HF_DIR\")",
        "dec = SpeculativeDecoder(model, \"THIS_DIR\", tokenizer=tok, stop_token_ids=stops)",
        "g = dec.generate(tok(\"...\")[\"input_ids\"], max_new_tokens=128, carryover=True, temperature=0.0)",
        "print(g.text, g.tau, g.accepted)",
        "```",
        "or in JAX: `carryover generate --target TARGET --drafter THIS_DIR --prompt \"...\"`.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(folder: Path, cfg: DrafterConfig, config: dict, fmt: str, *, has_e_rej: bool,
                     target: str | None = None, source: str | None = None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(model_card(cfg, config, fmt, has_e_rej=has_e_rej, target=target, source=source))
    return path
