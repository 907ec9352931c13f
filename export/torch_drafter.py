"""A drafter for PyTorch decoding: any folder `carryover export` or training writes (z-lab DFlash, DeepSpec
DFlash/Markov, or the native folder with its draft vocabulary), with its own committed-context K/V cache
and the Carryover rows.

Imports no JAX module: the folder is read with safetensors and json, the RoPE tables come from
transformers' Qwen3 rotary embedding. The draft layers follow the published DFlash layer (z-lab
`dflash/model.py`): context rows `hidden_norm(fc(features))` are projected by each layer's own
k/v projections (+ k_norm, RoPE at their positions) and never pass through the layers; the block
`[anchor, MASK, ...]` attends non-causally to [committed context ; carried rows ; block]. Carried rows are
`hidden_norm(fc(rejected features)) + e_rej` (with the projection module, `u + carry_proj(u) + e_rej` for
`u` = the fused rows) at positions anchor_pos + j; they are projected for one round and never enter the
cache. `torch_reference.py` is the cache-free reference this is tested against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from carryover_jax.errors import CheckpointError, ConfigError, RequestError

Tensor = torch.Tensor
CARRYOVER_FILE = "carryover.safetensors"  # the layout `carryover export` writes (weights/drafter_formats.py)
_FORMATS = {"DFlashDraftModel": "zlab", "Qwen3DSparkModel": "deepspec"}


@dataclass(frozen=True)
class DrafterSpec:
    """What the loop needs to know about a drafter folder."""

    fmt: str  # "native" | "zlab" | "deepspec"
    kind: str  # "dflash" | "markov"
    layout: str  # "zlab": slot k >= 1 predicts its own position; "deepspec": slot k predicts the next one
    block_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    mask_token_id: int
    hf: dict  # Qwen3-style fields of the draft layers (hidden_size, heads, rope_parameters, ...)
    has_e_rej: bool
    draft_vocab: tuple[int, ...] = ()
    carry_module: str = "embedding"  # "projection": carried rows pass `carry_proj` (models/drafter.py)

    @property
    def num_proposals(self) -> int:
        return self.block_size - 1 if self.layout == "zlab" else self.block_size


def _read_json(path: Path, what: str) -> dict:
    try:
        out = json.loads(path.read_text())
    except OSError:
        raise CheckpointError(f"cannot read {what} {path}") from None
    except ValueError as e:
        raise CheckpointError(f"{what} {path} is not valid JSON ({e})") from None
    if not isinstance(out, dict):
        raise CheckpointError(f"{what} {path} must be a JSON object")
    return out


def read_spec(folder: Path) -> DrafterSpec:
    """The drafter's format, block layout and shapes, from its config file (a clear error otherwise)."""
    if not folder.is_dir():
        raise CheckpointError(f"no such drafter folder: {folder}")
    try:
        if (folder / "drafter_config.json").is_file():
            return _native_spec(folder, _read_json(folder / "drafter_config.json", "drafter config"))
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"{folder} is not a drafter checkpoint (no drafter_config.json or config.json)")
        return _export_spec(folder, _read_json(folder / "config.json", "drafter config"))
    except KeyError as e:
        raise CheckpointError(f"missing field {e.args[0]!r} in the drafter config of {folder}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"invalid drafter config in {folder} ({e})") from None


def _native_spec(folder: Path, d: dict) -> DrafterSpec:
    bb = d["backbone"]  # our TargetConfig's fields (read by name: the loop needs only these)
    if bb.get("family", "qwen3") != "qwen3":
        raise ConfigError(f"the PyTorch loop runs Qwen3-style draft layers; this drafter's are {bb['family']} "
                          "(Gemma drafters decode in the JAX engine)")
    rope = {"rope_type": bb.get("rope_type", "default"), "rope_theta": float(bb.get("rope_theta", 10000.0))}
    if rope["rope_type"] == "llama3":
        rope.update(factor=bb["rope_factor"], low_freq_factor=bb["rope_low_freq_factor"],
                    high_freq_factor=bb["rope_high_freq_factor"],
                    original_max_position_embeddings=bb["rope_original_max_position"])
    elif rope["rope_type"] != "default":
        rope.update(factor=bb["rope_factor"])
    hf = {"hidden_size": bb["hidden_size"], "num_hidden_layers": bb["num_layers"], "num_attention_heads": bb["num_heads"],
          "num_key_value_heads": bb["num_kv_heads"], "head_dim": bb["head_dim"], "rms_norm_eps": bb["rms_norm_eps"],
          "vocab_size": bb["vocab_size"], "intermediate_size": bb["intermediate_size"],
          "max_position_embeddings": bb.get("max_position_embeddings", 32768), "rope_parameters": rope}
    return DrafterSpec(
        fmt="native", kind=d["kind"], layout=d["layout"], block_size=int(d["block_size"]),
        target_layer_ids=tuple(int(i) for i in d["target_layer_ids"]), num_target_layers=int(d["num_target_layers"]),
        mask_token_id=int(d["mask_token_id"]), hf=hf, has_e_rej=bool(d.get("carryover")),
        draft_vocab=tuple(int(i) for i in d.get("draft_vocab") or ()),
        carry_module=_carry_module(d.get("carry_module", "embedding")),
    )


def _export_spec(folder: Path, hf: dict) -> DrafterSpec:
    archs = hf.get("architectures") or []
    fmt = next((_FORMATS[a] for a in archs if a in _FORMATS), None)
    if fmt is None:
        gemma = "Gemma4DSparkModel" in archs
        raise CheckpointError(
            f"{folder}: architecture {', '.join(map(str, archs)) or 'unknown'} is not a drafter the PyTorch loop "
            + ("runs (Gemma drafters decode in the JAX engine)" if gemma else
               "reads (DFlashDraftModel, Qwen3DSparkModel, or a native carryover-jax drafter folder)"))
    if fmt == "zlab":
        dc = hf.get("dflash_config") or {}
        ids, mask, kind = dc.get("target_layer_ids"), dc.get("mask_token_id"), "dflash"
    else:
        ids, mask = hf.get("target_layer_ids"), hf.get("mask_token_id")
        kind = "markov" if int(hf.get("markov_rank") or 0) else "dflash"
        if kind == "markov" and hf.get("markov_head_type", "vanilla") != "vanilla":
            raise CheckpointError(f"markov_head_type {hf['markov_head_type']!r} is not supported (vanilla only)")
    if ids is None or mask is None:
        raise CheckpointError(f"the drafter config of {folder} lacks target_layer_ids or mask_token_id")
    return DrafterSpec(
        fmt=fmt, kind=kind, layout=fmt, block_size=int(hf["block_size"]), target_layer_ids=tuple(int(i) for i in ids),
        num_target_layers=int(hf["num_target_layers"]), mask_token_id=int(mask), hf=hf,
        has_e_rej=bool(hf.get("carryover")) and (folder / CARRYOVER_FILE).is_file(),
        carry_module=_carry_module(hf["carryover"].get("module", "embedding")
                                   if isinstance(hf.get("carryover"), dict) else "embedding"),
    )


def _carry_module(value) -> str:
    if value not in ("embedding", "projection"):
        raise CheckpointError(f"unknown carried-row module {value!r} (this loop runs embedding, projection)")
    return value


def _load_tensors(folder: Path, fmt: str) -> dict[str, Tensor]:
    files = ([folder / "model.safetensors"] if fmt == "native" else
             sorted(p for p in folder.glob("*.safetensors") if p.name != CARRYOVER_FILE))
    if fmt != "native" and (folder / CARRYOVER_FILE).is_file():
        files.append(folder / CARRYOVER_FILE)
    if not files or not files[0].is_file():
        raise CheckpointError(f"{folder} has no model.safetensors")
    out: dict[str, Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    out[k] = fh.get_tensor(k)
        except Exception as e:  # truncated or not a safetensors file
            raise CheckpointError(f"cannot read {f} ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    return out


class TorchDrafter:
    """Weights of one drafter, cast once to `dtype` on `device`, with the forward pieces the loop uses."""

    def __init__(self, folder, *, embed: Tensor, head: Tensor, dtype=torch.float32, device="cpu"):
        """`embed` [V, d] / `head` [V, d]: the target's input embedding and LM head (the drafter's own
        frozen copies are used instead when the folder holds them, as in the DeepSpec format)."""
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

        self.folder = Path(folder)
        self.spec = s = read_spec(self.folder)
        w = _load_tensors(self.folder, s.fmt)
        hf = s.hf
        self.n_layers = int(hf["num_hidden_layers"])
        self.d = int(hf["hidden_size"])
        self.n_heads, self.n_kv = int(hf["num_attention_heads"]), int(hf["num_key_value_heads"])
        self.head_dim = int(hf.get("head_dim") or self.d // self.n_heads)
        self.eps = float(hf["rms_norm_eps"])
        self.dtype, self.device = dtype, torch.device(device)

        def get(name, shape=None):
            if name not in w:
                raise CheckpointError(f"{self.folder}: tensor {name} is missing")
            t = w[name]
            if shape is not None and tuple(t.shape) != tuple(shape):
                raise CheckpointError(f"{self.folder}: tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
            return t.to(device=self.device, dtype=dtype)

        m = len(s.target_layer_ids)
        d, hq, hk = self.d, self.n_heads * self.head_dim, self.n_kv * self.head_dim
        self.fc = get("fc.weight", (d, m * d))
        self.hidden_norm, self.norm = get("hidden_norm.weight", (d,)), get("norm.weight", (d,))
        self.layers = []
        for i in range(self.n_layers):
            p = f"layers.{i}."
            self.layers.append({
                "in_ln": get(p + "input_layernorm.weight", (d,)), "post_ln": get(p + "post_attention_layernorm.weight", (d,)),
                "q": get(p + "self_attn.q_proj.weight", (hq, d)), "k": get(p + "self_attn.k_proj.weight", (hk, d)),
                "v": get(p + "self_attn.v_proj.weight", (hk, d)), "o": get(p + "self_attn.o_proj.weight", (d, hq)),
                "q_norm": get(p + "self_attn.q_norm.weight", (self.head_dim,)),
                "k_norm": get(p + "self_attn.k_norm.weight", (self.head_dim,)),
                "gate": get(p + "mlp.gate_proj.weight"), "up": get(p + "mlp.up_proj.weight"),
                "down": get(p + "mlp.down_proj.weight"),
            })
        # Context and carried rows are projected by every layer's k/v at once: one GEMM per round.
        self.kv_all = torch.cat([torch.cat([L["k"], L["v"]]) for L in self.layers])
        self.e_rej = get("e_rej", (d,)) if s.has_e_rej else None
        self.carry_proj = (tuple(get(f"carry_proj.{n}_proj.weight", (d, d)) for n in ("gate", "up", "down"))
                           if s.has_e_rej and s.carry_module == "projection" else None)
        v = int(hf["vocab_size"])
        self.embed = (get("embed_tokens.weight", (v, d)) if "embed_tokens.weight" in w
                      else embed.to(device=self.device, dtype=dtype))
        if s.draft_vocab:
            self.head = get("lm_head.weight", (len(s.draft_vocab), d))
            self.draft_ids = torch.tensor(s.draft_vocab, dtype=torch.long, device=self.device)
        else:
            self.head = (get("lm_head.weight", (v, d)) if "lm_head.weight" in w
                         else head.to(device=self.device, dtype=dtype))
            self.draft_ids = None
        if tuple(self.embed.shape) != (v, d) or tuple(self.head.shape)[1] != d:
            raise ConfigError(f"drafter/target mismatch: the drafter expects a [{v}, {d}] embedding, the target's is "
                              f"{list(self.embed.shape)}")
        if s.kind == "markov":
            self.markov_w1 = get("markov_head.markov_w1.weight")
            self.markov_w2 = get("markov_head.markov_w2.weight")
        rope_cfg = {k: hf[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                         "max_position_embeddings") if k in hf}
        rope_cfg.update(head_dim=self.head_dim, rope_parameters=dict(hf.get("rope_parameters") or {
            "rope_type": "default", "rope_theta": hf.get("rope_theta", 10000.0)}))
        self.rotary = Qwen3RotaryEmbedding(Qwen3Config(**rope_cfg)).to(self.device)
        self.mask_id = s.mask_token_id
        self.k_cache: list[Tensor] = []
        self.v_cache: list[Tensor] = []
        self.length = 0

    # -- building blocks ----------------------------------------------------------------------------
    def _norm(self, x: Tensor, w: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """x [1, heads, L, D] with cos/sin [1, L, D] (HF rotate-half layout)."""
        cos, sin = cos[:, None], sin[:, None]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def _cos_sin(self, positions: Tensor):
        cos, sin = self.rotary(self.embed[:1][None], positions[None])
        return cos.to(self.dtype), sin.to(self.dtype)

    def fuse(self, features: Tensor) -> Tensor:
        """Target features [1, R, m*d] -> fused rows [1, R, d] (`fc` + `hidden_norm`), once per row."""
        return self._norm(F.linear(features.to(self.dtype), self.fc), self.hidden_norm)

    def mark_carried(self, fused: Tensor) -> Tensor:
        if self.e_rej is None:
            raise ConfigError("this drafter has no Carryover embedding e_rej (decode with carryover off)")
        if self.carry_proj is not None:  # the projection module: a residual SwiGLU on the fused rows
            gate, up, down = self.carry_proj
            fused = fused + F.linear(F.silu(F.linear(fused, gate)) * F.linear(fused, up), down)
        return fused + self.e_rej

    def _project(self, rows: Tensor, start: int) -> list[tuple[Tensor, Tensor]]:
        """Fused rows [1, R, d] at positions start.. -> per layer (k, v) [1, Hkv, R, D], RoPE'd."""
        r = rows.shape[1]
        kv = F.linear(rows, self.kv_all).view(1, r, self.n_layers, 2, self.n_kv, self.head_dim)
        cos, sin = self._cos_sin(torch.arange(start, start + r, device=self.device))
        out = []
        for i, L in enumerate(self.layers):
            k = self._norm(kv[:, :, i, 0], L["k_norm"]).transpose(1, 2)
            out.append((self._rope(k, cos, sin), kv[:, :, i, 1].transpose(1, 2)))
        return out

    # -- the committed-context cache ----------------------------------------------------------------
    def reset(self, max_len: int) -> None:
        shape = (1, self.n_kv, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.length = 0

    def commit(self, fused: Tensor) -> None:
        """Append committed rows [1, R, d] at positions length.. to the cache (projected once, here)."""
        r = fused.shape[1]
        if self.length + r > self.k_cache[0].shape[2]:
            raise RequestError(f"the drafter cache holds {self.k_cache[0].shape[2]} positions; "
                               f"{self.length + r} are needed")
        for i, (k, v) in enumerate(self._project(fused, self.length)):
            self.k_cache[i][:, :, self.length:self.length + r] = k
            self.v_cache[i][:, :, self.length:self.length + r] = v
        self.length += r

    # -- one drafting round ---------------------------------------------------------------------------
    def block_logits(self, anchor: int, carried: Tensor | None = None) -> Tensor:
        """Backbone logits [P, K] of the proposal slots (K = the draft vocabulary's size, else V) for the
        block [anchor, MASK...] at position `length` (the anchor's). `carried` [1, r, d]: this round's
        carried rows (fused, marked with e_rej), at positions length + j; None or r = 0 = the plain drafter."""
        t, pos = self.spec.block_size, self.length
        tokens = torch.full((t,), self.mask_id, dtype=torch.long, device=self.device)
        tokens[0] = anchor
        h = self.embed[tokens][None]  # [1, T, d]
        cos, sin = self._cos_sin(torch.arange(pos, pos + t, device=self.device))
        extra = self._project(carried, pos) if carried is not None and carried.shape[1] else None
        for i, L in enumerate(self.layers):
            a = self._norm(h, L["in_ln"])
            q = self._norm(F.linear(a, L["q"]).view(1, t, self.n_heads, self.head_dim), L["q_norm"]).transpose(1, 2)
            k = self._norm(F.linear(a, L["k"]).view(1, t, self.n_kv, self.head_dim), L["k_norm"]).transpose(1, 2)
            v = F.linear(a, L["v"]).view(1, t, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            ks = [self.k_cache[i][:, :, :pos], k]
            vs = [self.v_cache[i][:, :, :pos], v]
            if extra is not None:
                ks.insert(1, extra[i][0])
                vs.insert(1, extra[i][1])
            o = _attention(q, torch.cat(ks, 2), torch.cat(vs, 2), self.n_heads // self.n_kv)
            h = h + F.linear(o.transpose(1, 2).reshape(1, t, -1), L["o"])
            x = self._norm(h, L["post_ln"])
            h = h + F.linear(F.silu(F.linear(x, L["gate"])) * F.linear(x, L["up"]), L["down"])
        h = self._norm(h[0, 1:] if self.spec.layout == "zlab" else h[0], self.norm)
        return F.linear(h, self.head).float()

    def markov_bias(self, prev: int) -> Tensor:
        """DSpark's vanilla transition bias W2(W1[prev]) [V] for the token chosen at the previous slot."""
        return F.linear(self.markov_w1[prev], self.markov_w2).float()


def _attention(q: Tensor, k: Tensor, v: Tensor, groups: int) -> Tensor:
    """Non-causal attention of the block queries over every key given (no mask: batch 1 and
    exactly the valid rows are passed)."""
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v)
