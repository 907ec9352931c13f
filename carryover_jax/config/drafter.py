"""What a drafter is: `DrafterConfig` (DFlash or the DSpark-derived Markov drafter, for one target) and
`DrafterSpec`, the few choices a run makes to build a fresh one (`DrafterConfig.for_target`)."""

from __future__ import annotations

import dataclasses

from carryover_jax import bounds as B
from carryover_jax.config.target import TargetConfig
from carryover_jax.errors import ConfigError
from carryover_jax.numerics import Numerics

DRAFTER_KINDS = ("dflash", "markov")
LAYOUTS = ("zlab", "deepspec")
# How carried rows enter the draft layers' k/v projections (models/drafter.py `Drafter.mark_carried`):
# "embedding" `fused + e_rej` (the paper's Carryover), "projection" `fused + carry_proj(fused) + e_rej` (the
# appendix's projection-module interface: a residual SwiGLU module whose down_proj starts at zero).
CARRY_MODULES = ("embedding", "projection")
# Per-target MASK token: a frozen row of the target embedding that never occurs in chat data.
# Qwen3: 151669, the first unused row (DeepSpec / z-lab). SmolLM2's 49152 rows are all real tokens, so
# `loading.default_mask_token_id` takes `<empty_output>` (16) from its tokenizer, a StarCoder-era
# Jupyter marker that ChatML conversations never contain.
MASK_TOKEN_IDS = {"qwen3": 151669, "gemma": 4}  # Gemma: `<mask>`, DeepSpec's MASK id


def zlab_layer_ids(num_target_layers: int, n: int = 5) -> tuple[int, ...]:
    """z-lab's default feature layers: evenly spaced from layer 1 to L-3 (Python round). A target too shallow
    for n distinct layers that way (L < n + 3: z-lab's rule repeats layers, which a drafter cannot tap twice)
    gets min(n, L-1) distinct layers evenly spaced from 0 to L-2 instead (at least layer 0)."""
    if n == 1:
        return (num_target_layers // 2,)
    ids = tuple(int(round(1 + i * (num_target_layers - 4) / (n - 1))) for i in range(n))
    if all(a < b for a, b in zip(ids, ids[1:])):
        return ids
    k = max(1, min(n, num_target_layers - 1))
    return tuple(int(round(i * (num_target_layers - 2) / max(1, k - 1))) for i in range(k))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterSpec:
    """The choices that build a fresh drafter for a target (`DrafterConfig.for_target`; a run ignores it when
    `init_from` names a checkpoint). Defaults: the paper's setting, 15 proposals, 5 draft layers, z-lab
    feature layers."""

    kind: str = "dflash"
    layout: str = "zlab"
    num_proposals: int = 15
    num_layers: int = 5
    target_layer_ids: tuple[int, ...] | None = None  # None: z-lab spacing
    mask_token_id: int | None = None  # None: the target's default (see loading.default_mask_token_id)
    markov_rank: int | None = None  # None: 256 for markov
    carryover: bool = True
    # None: "embedding" for a fresh drafter, the checkpoint's own when continuing one (`init_from`);
    # "projection" adds the learned module (`DrafterConfig.carry_module`), zero at the start
    carry_module: str | None = None
    # > 0: propose from the K most frequent target tokens of the training responses (EAGLE-3's draft
    # vocabulary; `DrafterConfig.draft_vocab`), chosen from the response store when the drafter is built
    draft_vocab_size: int = 0

    def __post_init__(self):
        B.check_fields(self, dict(num_proposals=B.size(), num_layers=B.size(), mask_token_id=B.count(0, optional=True),
                                  markov_rank=B.size(0, optional=True), draft_vocab_size=B.count(0)), "drafter.")
        if self.draft_vocab_size == 1:
            raise ConfigError("drafter.draft_vocab_size must be 0 (the whole vocabulary) or >= 2, got 1")
        if self.carry_module is not None:
            check_carry_module(self.carry_module, self.carryover, "drafter.")
        if self.target_layer_ids is not None:
            if not isinstance(self.target_layer_ids, tuple):
                object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
            B.check_ids("drafter.target_layer_ids", self.target_layer_ids, low=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """A block drafter (DFlash, or the DSpark-derived Markov drafter) for one target.

    `backbone` holds the draft layers' shapes: the target's width, `num_layers` draft layers, and
    Qwen3-style q/k norms (the DFlash layer) whatever the target family.
    """

    kind: str = "dflash"
    layout: str = "zlab"
    block_size: int = 16
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    mask_token_id: int
    backbone: TargetConfig
    markov_rank: int = 0
    carryover: bool = True  # owns the learned e_rej embedding
    carry_module: str = "embedding"  # CARRY_MODULES; "projection" also owns `carry_proj` (needs carryover)
    # EAGLE-3's draft vocabulary: target token ids (sorted) the drafter proposes from, through its own
    # `lm_head` over these rows (initialised from the target's); () = the target's whole frozen head.
    # Verification is unchanged, so decoding stays lossless; only proposals outside the set are lost.
    draft_vocab: tuple[int, ...] = ()

    def __post_init__(self):
        B.check_fields(self, dict(block_size=B.size(), num_target_layers=B.size(), mask_token_id=B.count(0),
                                  markov_rank=B.size(0)))
        B.check_ids("target_layer_ids", self.target_layer_ids, low=-B.INT32_MAX)  # the range: below, per target
        B.check_ids("draft_vocab", self.draft_vocab)
        check_carry_module(self.carry_module, self.carryover)
        if self.kind not in DRAFTER_KINDS:
            raise ConfigError(f"unknown drafter kind {self.kind!r}; supported: {', '.join(DRAFTER_KINDS)}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"unknown block layout {self.layout!r}; supported: {', '.join(LAYOUTS)}")
        if self.kind == "markov" and self.markov_rank <= 0:
            raise ConfigError("the markov drafter needs markov_rank > 0")
        if self.kind == "dflash" and self.markov_rank:
            raise ConfigError("a dflash drafter has no Markov head (markov_rank must be 0)")
        if self.num_proposals < 1:
            raise ConfigError(f"block_size {self.block_size} gives no proposals in the {self.layout} layout")
        ids = self.target_layer_ids
        if not ids or list(ids) != sorted(set(ids)):
            raise ConfigError(f"target_layer_ids must be non-empty and strictly increasing, got {list(ids)}")
        last = self.num_target_layers - 1
        for l in ids:
            if l == last:
                raise ConfigError(
                    f"target layer {l} is the target's final layer: HF exposes it only after the final norm, "
                    "so it cannot be a drafter feature"
                )
            if not -1 <= l < last:
                raise ConfigError(f"target layer id {l} out of range [-1, {last - 1}]")
        if not 0 <= self.mask_token_id < self.backbone.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        v = self.draft_vocab
        if v:
            if len(v) < 2 or list(v) != sorted(set(v)) or v[0] < 0 or v[-1] >= self.backbone.vocab_size:
                raise ConfigError(f"draft_vocab must hold >= 2 strictly increasing target ids in "
                                  f"[0, {self.backbone.vocab_size}), got {len(v)} ids")

    @property
    def num_proposals(self) -> int:
        """Draft tokens per round: B-1 in the z-lab layout (slot 0 is the anchor), B in DeepSpec's."""
        return self.block_size - 1 if self.layout == "zlab" else self.block_size

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def draft_vocab_size(self) -> int:
        return len(self.draft_vocab) or self.backbone.vocab_size

    @property
    def feature_dim(self) -> int:
        return len(self.target_layer_ids) * self.backbone.hidden_size

    def replace(self, **kw) -> "DrafterConfig":
        return dataclasses.replace(self, **kw)

    @property
    def numerics(self) -> Numerics:
        """What the draft layers run with (`Numerics.drafter_view`: param_dtype is the drafter's)."""
        return self.backbone.numerics

    def with_numerics(self, numerics: Numerics) -> "DrafterConfig":
        """This drafter under a run's numerics (its backbone gets the drafter's view of them)."""
        return dataclasses.replace(self, backbone=self.backbone.with_numerics(numerics.drafter_view()))

    @classmethod
    def for_target(cls, target: TargetConfig, spec: DrafterSpec | None = None, *,
                   default_mask_token_id: int | None = None, draft_vocab: tuple[int, ...] = (),
                   **fields) -> "DrafterConfig":
        """The drafter `spec` describes for `target` (`fields`: DrafterSpec fields set over it, e.g.
        `for_target(t, kind="markov", num_layers=1)`). The MASK id: the spec's, else `default_mask_token_id`,
        else the family's (`MASK_TOKEN_IDS`). `draft_vocab`: the chosen draft-vocabulary ids, if any."""
        spec = dataclasses.replace(spec or DrafterSpec(), **fields)
        mask_token_id = spec.mask_token_id if spec.mask_token_id is not None else default_mask_token_id
        if mask_token_id is None:
            if target.family not in ("qwen3", "gemma3", "gemma4"):
                raise ConfigError("give mask_token_id for this target (an unused special-token row)")
            mask_token_id = MASK_TOKEN_IDS["qwen3" if target.family == "qwen3" else "gemma"]
        if target.family in ("gemma3", "gemma4"):
            backbone = gemma_draft_backbone(target, spec.num_layers)
        else:
            backbone = target.replace(
                family="qwen3", num_layers=spec.num_layers, qk_norm=True, tie_word_embeddings=False,
                attention_bias=False, mlp_bias=False,
            )
        backbone = backbone.with_numerics(target.numerics.drafter_view())  # the target's run, drafter params
        return cls(
            kind=spec.kind, layout=spec.layout,
            block_size=spec.num_proposals + 1 if spec.layout == "zlab" else spec.num_proposals,
            target_layer_ids=tuple(spec.target_layer_ids or zlab_layer_ids(target.num_layers)),
            num_target_layers=target.num_layers, mask_token_id=mask_token_id, backbone=backbone,
            markov_rank=(256 if spec.kind == "markov" else 0) if spec.markov_rank is None else spec.markov_rank,
            carryover=spec.carryover, carry_module=spec.carry_module or "embedding",
            draft_vocab=tuple(int(i) for i in draft_vocab),
        )


def check_carry_module(value, carryover: bool, prefix: str = "") -> None:
    if value not in CARRY_MODULES:
        raise ConfigError(f"unknown {prefix}carry_module {value!r}; supported: {', '.join(CARRY_MODULES)}")
    if value == "projection" and not carryover:
        raise ConfigError(f"{prefix}carry_module=projection maps carried rows, so it needs {prefix}carryover=true")


def gemma_draft_backbone(target: TargetConfig, num_layers: int) -> TargetConfig:
    """DeepSpec's Gemma drafter layers: a copy of the target's text config with `num_layers` layers,
    every one a full-attention layer in the target's global geometry (head dim `global_head_dim`,
    K/V heads of the global layers, K = V, v_norm, attention scale, the full-attention RoPE incl.
    Gemma 4's proportional partial RoPE), with the target's norms, sandwich norms, layer scalar,
    GeGLU, sqrt(d)-scaled embeddings (anchor, MASK) and soft-capped logits (the Markov bias is
    added after capping)."""
    g = next((i for i in range(target.num_layers) if not target.is_sliding(i)), 0)
    return target.replace(
        num_layers=num_layers, layer_types=(), head_dim=target.layer_head_dim(g),
        num_kv_heads=target.layer_kv_heads(g), global_head_dim=None, num_global_kv_heads=None,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )
