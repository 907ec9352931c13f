"""Programs lowered for CUDA from this CPU host (`lower(lowering_platforms=("cuda",))`): what a GPU would
compile. A round on a GPU holds no loop with a data-dependent trip count (each iteration of one costs a
device-to-host handshake there): the AR step, `draft_parts` and `verify_step` of tiny Llama, Qwen3,
Gemma 3 and Gemma 4 targets with DFlash and Markov drafters, with and without carried rows. The same
programs lowered for CPU still hold such loops (the live-length cache read that makes CPU decode cost
follow the live length), so the check cannot pass vacuously. The attention kernels lower to Triton at
head dims 64-512, forward and backward, alone and inside whole programs.

The same rounds lowered for TPU (under abstract v5e / v6e / v7x meshes) read the caches through the Mosaic
kernel (`models/tpu_attention.py`), with no data-dependent loop either; DVD and baseline training steps
lower for TPU too (training attention is einsum there). Compiling them for TPU needs libtpu:
tests/test_tpu_lowering.py."""

import functools

import jax
import jax.numpy as jnp
import pytest

from carryover_jax.config import PRESETS, DrafterConfig
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.models import cpu_attention, kernels
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.target import abstract_params
from carryover_jax.numerics import Numerics
from tests.lowering import (TPU_CALL, TPU_DEVICE_KINDS, TRITON_CALL, cuda_mesh, data_dependent_whiles, lower_text,
                            tpu_mesh)

SMALL = dict(num_layers=3, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16,
             vocab_size=256)
_SLIDING = ("sliding_attention", "sliding_attention", "full_attention")
TARGETS = {
    "llama": PRESETS["smollm2-135m"].replace(**SMALL),
    "qwen3": PRESETS["qwen3-4b"].replace(**SMALL),
    "gemma3": PRESETS["gemma3-270m"].replace(**SMALL, layer_types=_SLIDING, sliding_window=8),
    "gemma4": PRESETS["gemma4-12b"].replace(**SMALL, layer_types=_SLIDING, sliding_window=8, global_head_dim=32,
                                            num_global_kv_heads=1),
}
PROPOSALS, PROMPT, MAX_LEN = 3, 12, 128


def gpu_numerics(backend="auto") -> Numerics:
    """What a GPU run uses: the platform default for cuda (bf16, attention "auto"), or another backend."""
    return Numerics.platform_default("cuda").replace(attention_backend=backend)


def _configs(name: str, kind: str, backend: str):
    tc = TARGETS[name].with_numerics(gpu_numerics(backend))
    dc = DrafterConfig.for_target(tc, kind=kind, layout="zlab" if kind == "dflash" else "deepspec",
                                  num_proposals=PROPOSALS, num_layers=1, mask_token_id=0, target_layer_ids=(0, 1),
                                  markov_rank=8 if kind == "markov" else 0)
    return tc, dc.with_numerics(gpu_numerics(backend))


@functools.lru_cache(maxsize=None)
def _abstract_state(name: str, kind: str):
    """Params and the state after prefill, as shapes (traced with einsum: the shapes do not depend on
    the backend, nor on attend_carried)."""
    tc, dc = _configs(name, kind, "einsum")
    tp = abstract_params(tc)
    dp = jax.eval_shape(lambda: init_drafter_params(dc, jax.random.key(0)))
    b = 2
    state = jax.eval_shape(functools.partial(sp.prefill_jit, sp.SpecConfig(target=tc, drafter=dc), max_len=MAX_LEN,
                                             out_size=32, max_rounds=8),
                           tp, dp, jnp.zeros((b, PROMPT), jnp.int32), jnp.full((b,), PROMPT, jnp.int32),
                           jnp.full((b,), 16, jnp.int32), jnp.zeros((b,)), jnp.full((2,), -1, jnp.int32),
                           jax.random.key(0))
    return tp, dp, state


def _programs(name: str, kind: str, carried: bool, backend: str, platform: str = "cuda"):
    """Traced (not lowered) AR step, draft_parts and verify_step on abstract inputs: nothing runs. Programs for
    cuda are traced under an abstract H100 (what the Triton kernel needs from jax 0.11 on), those for tpu as is
    (the Mosaic kernel reads the chip when lowered, under the test's TPU mesh)."""
    _abstract_state(name, kind)  # outside the abstract mesh: initialising params runs on the host
    if platform != "cuda":
        return _traced(name, kind, carried, backend)
    with jax.sharding.use_abstract_mesh(cuda_mesh()):
        return _traced(name, kind, carried, backend, "cuda")


@functools.lru_cache(maxsize=None)
def _traced(name: str, kind: str, carried: bool, backend: str, under: str = ""):
    tc, dc = _configs(name, kind, backend)
    tp, dp, state = _abstract_state(name, kind)
    sc = sp.SpecConfig(target=tc, drafter=dc, attend_carried=carried)
    toks = jax.ShapeDtypeStruct((state.anchor.shape[0], PROPOSALS), jnp.int32)
    out = {"draft_parts": sp.draft_parts.trace(sc, tp, dp, state),
           "verify_step": sp.verify_step.trace(sc, tp, dp, state, toks, None)}
    if kind == "dflash" and carried:  # the AR step does not depend on the drafter
        out["ar_step"] = ar.step.trace(tc, tp, state.target_cache, jax.ShapeDtypeStruct(state.anchor.shape, jnp.int32))
    return out


# The default tier lowers 8 of the 16 rounds, chosen so that every pair of values appears: each target with
# both drafter kinds and with and without carried rows, each kind with and without carried rows (the other 8
# are `heavy`: ~3.5 s of tracing each here)
_PAIRWISE = {(n, k, c) for i, n in enumerate(TARGETS) for k, c in
             ((("dflash", True), ("markov", False)) if i % 2 == 0 else (("dflash", False), ("markov", True)))}
ROUNDS = [pytest.param(n, k, c, id=f"{n}-{k}-{'carried' if c else 'no-carried'}",
                       marks=() if (n, k, c) in _PAIRWISE else pytest.mark.heavy)
          for n in TARGETS for k in ("dflash", "markov") for c in (True, False)]


@pytest.mark.parametrize("name,kind,carried", ROUNDS)
def test_a_round_lowered_for_cuda_has_no_data_dependent_loop(name, kind, carried):
    """The GPU numerics ("auto": the fused kernels) lowered for cuda: every program of a round is free of
    data-dependent `while`s and reads the caches through the Triton kernel; lowered for cpu ("auto" = "cpu"
    there), every one of them reads its caches through the CPU kernel (the live-length loop without it)."""
    for prog, traced in _programs(name, kind, carried, "auto").items():
        cuda, cpu = lower_text(traced, "cuda"), lower_text(traced, "cpu")
        assert data_dependent_whiles(cuda) == 0, f"{name}/{kind} {prog}: a data-dependent loop lowered for cuda"
        assert cuda.count(TRITON_CALL) >= (TARGETS[name].num_layers if prog != "draft_parts" else 1), prog
        if cpu_attention.available():
            assert any(t in cpu for t in cpu_attention.TARGETS.values()), f"{name}/{kind} {prog}: no CPU kernel"
        else:
            assert data_dependent_whiles(cpu) >= 1, f"{name}/{kind} {prog}: the CPU lowering lost its live-length loop"
        assert TRITON_CALL not in cpu


@pytest.mark.parametrize("backend", ["einsum", "pallas"])
def test_every_backend_lowered_for_cuda_has_no_data_dependent_loop(backend):
    """Explicit backends on the target with every kind of layer (Gemma 4: sliding windows, global layers
    of another head dim): einsum reads the whole cache with a mask on cuda, pallas through Triton."""
    for prog, traced in _programs("gemma4", "dflash", True, backend).items():
        cuda = lower_text(traced, "cuda")
        assert data_dependent_whiles(cuda) == 0, f"{backend} {prog}"
        assert (TRITON_CALL in cuda) == (backend == "pallas"), prog
        assert data_dependent_whiles(lower_text(traced, "cpu")) >= 1, prog  # interpreter or live-length loop


HEAD_DIMS = (64, 128, 256, 512)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_kernels_lower_to_triton_at_every_head_dim(d):
    """Forward (split over the keys for a decode-sized grid, one program per query tile for a training-
    sized one) and both backward kernels lower to Triton for cuda with the head dim's tiles."""
    tiles = kernels.tile_sizes(d)
    assert tiles.block_q * (d + tiles.block_k) <= 32 * 1024 and 8 * tiles.block_k * d <= 96 * 1024

    def f(q, k, v, limit, lower):
        o, lse = kernels.prefix_attention(q, k, v, limit, lower, scale=0.1)
        return jnp.sum(o) + jnp.sum(jnp.where(lse > -1e29, lse, 0.0))

    for b, h, t, s in ((1, 8, 4, 4096), (2, 8, 192, 300)):  # decode (folded heads), training-like (GQA)
        q = jax.ShapeDtypeStruct((b, h, t, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((b, 2, s, d), jnp.bfloat16)
        lim = jax.ShapeDtypeStruct((b, t), jnp.int32)
        with jax.sharding.use_abstract_mesh(cuda_mesh()):
            fwd = jax.jit(f).trace(q, k, k, lim, lim)
            bwd = jax.jit(jax.grad(f, argnums=(0, 1, 2))).trace(q, k, k, lim, lim)
        text = lower_text(fwd, "cuda")
        assert text.count(TRITON_CALL) == 1 and data_dependent_whiles(text) == 0
        text = lower_text(bwd, "cuda")
        assert text.count(TRITON_CALL) == 3 and data_dependent_whiles(text) == 0
    # batch-1 decode (8 programs) splits its keys; a training grid of 256 programs does not
    assert kernels.key_splits(1 * 8 * 1, 4096 // tiles.block_k) > 1 and kernels.key_splits(256, 64) == 1


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_whole_programs_lower_at_every_head_dim(d):
    """AR step and verification of a Qwen3-shaped target with head dim d, pallas, lowered for cuda: one
    Triton call per layer, no data-dependent loop."""
    tc = TARGETS["qwen3"].replace(head_dim=d, num_layers=2).with_numerics(gpu_numerics("pallas"))
    tp = abstract_params(tc)
    cache, _ = jax.eval_shape(functools.partial(ar.prefill, tc, max_len=MAX_LEN), tp, jnp.zeros((1, PROMPT), jnp.int32),
                              jnp.full((1,), PROMPT, jnp.int32))
    for t in (1, PROPOSALS + 1):
        tok = jax.ShapeDtypeStruct((1, t), jnp.int32)
        with jax.sharding.use_abstract_mesh(cuda_mesh()):
            traced = jax.jit(functools.partial(_target_chunk, tc)).trace(tp, cache, tok)
        text = lower_text(traced, "cuda")
        assert text.count(TRITON_CALL) == tc.num_layers and data_dependent_whiles(text) == 0


def test_a_long_prefill_with_auto_lowers_for_cuda():
    """A 4,096-token prompt chunk through the default "auto" backend lowers for cuda. Auto's TPU branch is
    traced there too: it splits the chunk's 16,384 folded query rows (G = 4) into row blocks that fit VMEM
    rather than refusing the shape, which failed the whole program on an H200 (2026-12-04)."""
    tc = PRESETS["qwen3-4b"].replace(num_layers=1, vocab_size=512).with_numerics(gpu_numerics("auto"))
    assert tc.num_heads // tc.num_kv_heads == 4 and tc.head_dim == 128
    tp = abstract_params(tc)
    t = 4096
    cache, _ = jax.eval_shape(functools.partial(ar.prefill, tc, max_len=t + 16), tp, jnp.zeros((1, 8), jnp.int32),
                              jnp.full((1,), 8, jnp.int32))
    with jax.sharding.use_abstract_mesh(cuda_mesh()):
        traced = jax.jit(functools.partial(_target_chunk, tc)).trace(tp, cache, jax.ShapeDtypeStruct((1, t), jnp.int32))
    assert data_dependent_whiles(lower_text(traced, "cuda")) == 0


def _target_chunk(tc, params, cache, tokens):
    from carryover_jax.models.target import TargetLM

    return TargetLM(tc).apply({"params": params}, tokens, cache=cache)[:2]


def test_the_triton_kernel_does_not_lower_for_tpu():
    """The Triton-style kernel has no TPU branch: lowering it for TPU fails instead of running the
    interpreter there silently (on TPU, "auto" runs the Mosaic kernel instead)."""
    q = jax.ShapeDtypeStruct((1, 2, 16, 64), jnp.float32)
    lim = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    traced = jax.jit(lambda q, lim: kernels.prefix_attention(q, q, q, lim, scale=0.1)[0]).trace(q, lim)
    with pytest.raises(Exception, match="tpu"):
        traced.lower(lowering_platforms=("tpu",))


TPU_ROUNDS = [p for p in ROUNDS if p.values[2]]  # carried rows on: every target with both drafter kinds


@pytest.mark.parametrize("name,kind,carried", TPU_ROUNDS)
def test_a_round_lowered_for_tpu_reads_the_cache_through_the_mosaic_kernel(name, kind, carried):
    """What a TPU runs ("auto" in the accelerator numerics) lowered for TPU under v5e, v6e and v7x meshes:
    the AR step and verification read every layer's cache through the Mosaic kernel, the drafter its
    context; no Triton call and no data-dependent loop (the kernel's clamped index map replaces the CPU's
    live-length loop)."""
    for chip in TPU_DEVICE_KINDS:
        with jax.sharding.use_abstract_mesh(tpu_mesh(chip)):
            for prog, traced in _programs(name, kind, carried, "auto", "tpu").items():
                text = lower_text(traced, "tpu")
                assert data_dependent_whiles(text) == 0, f"{chip} {name}/{kind} {prog}: a data-dependent loop"
                want = TARGETS[name].num_layers if prog != "draft_parts" else 1
                assert text.count(TPU_CALL) >= want and TRITON_CALL not in text, f"{chip} {name}/{kind} {prog}"


@pytest.mark.parametrize("mode", ["baseline", "dvd"])
def test_a_training_step_lowers_for_tpu(mode):
    """A baseline and a DVD training step of the Gemma 4 shaped target (sliding and global layers) with a
    Markov drafter, in TPU numerics, lower for TPU with no data-dependent loop; their attention (`Prefix`
    and block masks, differentiated) is einsum there, so no Mosaic call."""
    from carryover_jax.config import LossConfig, TrainConfig
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    tc, dc = _configs("gemma4", "markov", "auto")
    cfg = TrainConfig(loss=LossConfig(mode=mode), num_anchors=3, steps=2)
    sc = step_config(cfg, tc, dc, numerics=cfg.run_numerics("tpu"))
    assert sc.target.attention_backend == "auto"
    opt = make_optimizer(cfg, 2)
    state = jax.eval_shape(lambda: init_state(init_drafter_params(sc.drafter, jax.random.key(0)), opt, 0))
    batch = {k: jax.ShapeDtypeStruct((2, 32), jnp.int32) for k in ("input_ids", "loss_mask")}
    traced = jax.jit(train_step, static_argnums=(0, 1)).trace(sc, opt, state, abstract_params(sc.target), batch)
    with jax.sharding.use_abstract_mesh(tpu_mesh("v6e")):
        text = lower_text(traced, "tpu")
    assert data_dependent_whiles(text) == 0 and TPU_CALL not in text and TRITON_CALL not in text
