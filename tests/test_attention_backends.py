"""Attention backends (models/layers.py ATTENTION_BACKENDS) against the einsum reference: values and
gradients for causal prefixes, per-row lengths, training's anchor mask (both layouts), DVD's prefix,
carried segments with every rejected count, and a backend-switched train step. The Pallas kernel runs
in interpret mode here (CPU); its GPU compilation and speed are checked by `carryover bench steps`."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.models.drafter import carried_segment_mask, init_drafter_params
from carryover_jax.models.kernels import prefix_attention
from carryover_jax.models.layers import Blockwise, Prefix, attention_core, resolve_backend
from carryover_jax.models.target import init_params
from carryover_jax.train import anchors as A
from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

BACKENDS = ("xla", "cudnn", "pallas")  # cudnn off GPU: its one-segment path through XLA's dpa
B, H, HKV, D = 2, 4, 2, 16


def _qkv(rng, t, s, b=B):
    q = jnp.asarray(rng.normal(size=(b, t, H, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, HKV, s, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, HKV, s, D)), jnp.float32)
    return q, k, v


@functools.lru_cache(maxsize=None)
def _grads(segments_of, backend):
    def loss(q, kvs, extra):
        out = attention_core(q, segments_of(kvs, *extra), 0.37, backend)
        return jnp.sum(jnp.sin(out) * out), out

    def run(q, kvs, extra):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(q, kvs, extra)
        return out, grads
    return jax.jit(run)


def _check(segments_of, q, kvs, backend, extra=(), atol=2e-5):
    """attention_core(backend) == einsum for the output and for d/d(q, every k, every v) of a
    nonlinear functional of it; `segments_of(kvs, *extra)` (one compiled program per function)."""
    want, gw = _grads(segments_of, "einsum")(q, kvs, extra)
    got, gg = _grads(segments_of, backend)(q, kvs, extra)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=1e-5)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol,
                                                                   rtol=1e-4), gg, gw)
    return got


def _one(kv, mask):
    return [(kv[0], kv[1], mask)]


def test_kernel_alone_matches_masked_softmax_with_lse():
    rng = np.random.default_rng(0)
    t, s = 20, 37  # neither a multiple of the tiles: padded queries and keys
    q = jnp.asarray(rng.normal(size=(B, H, t, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(B, HKV, s, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(B, HKV, s, D)), jnp.float32)
    limit = jnp.asarray(rng.integers(0, s + 1, (B, t)), jnp.int32)
    lower = jnp.asarray(rng.integers(0, 12, (B, t)), jnp.int32)
    out, lse = prefix_attention(q, k, v, limit, lower, scale=0.3, block_q=16, block_k=16)
    kk, vv = jnp.repeat(k, H // HKV, 1), jnp.repeat(v, H // HKV, 1)
    m = Prefix(limit, lower).dense(s)[:, None]
    sc = jnp.einsum("bhtd,bhsd->bhts", q, kk) * 0.3
    p = jnp.where(m, jax.nn.softmax(jnp.where(m, sc, -jnp.inf), axis=-1), 0.0)
    any_ = jnp.any(m, -1)
    np.testing.assert_allclose(out, jnp.where(any_[..., None], jnp.einsum("bhts,bhsd->bhtd", p, vv), 0), atol=2e-6)
    want_lse = jax.nn.logsumexp(jnp.where(m, sc, -jnp.inf), axis=-1)
    np.testing.assert_allclose(jnp.where(any_, lse, 0), jnp.where(any_, want_lse, 0), atol=2e-6)
    empty = ~np.broadcast_to(np.asarray(any_), lse.shape)
    assert empty.any() and np.all(np.asarray(lse)[empty] <= -1e29) and np.all(np.asarray(out)[empty] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_prefix_and_per_row_lengths(backend):
    rng = np.random.default_rng(1)
    t = s = 24
    q, k, v = _qkv(rng, t, s)
    causal = Prefix(jnp.broadcast_to(jnp.arange(1, t + 1)[None], (B, t)).astype(jnp.int32))
    _check(_one, q, (k, v), backend, (causal,))
    lengths = jnp.asarray([0, 17], jnp.int32)  # a row with no visible key returns zeros
    rows = Prefix(jnp.broadcast_to(lengths[:, None], (B, t)))
    out = _check(_one, q, (k, v), backend, (rows,))
    assert np.all(np.asarray(out)[0] == 0)
    window = Prefix(causal.limit, lower=causal.limit - 5)  # a sliding window as the lower bound
    _check(_one, q, (k, v), backend, (window,))


def _anchor_blocks(layout, rng, s=23, n=3, proposals=3):
    tc = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4,
                      num_heads=H, num_kv_heads=HKV, head_dim=D, qk_norm=True)
    dc = DrafterConfig.for_target(tc, kind="dflash", layout=layout, num_proposals=proposals, num_layers=1,
                                  mask_token_id=0, target_layer_ids=(0, 2))
    ids = jnp.asarray(rng.integers(1, 32, (B, s)), jnp.int32)
    lm = np.zeros((B, s), np.int32)
    lm[0, 3:] = 1
    lm[1, 15:17] = 1  # one candidate anchor: the other slots are unused (limit 0)
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(3), jnp.asarray(lm), n)
    return dc, A.build_blocks(dc, ids, jnp.asarray(lm), anchors, keep, nvalid)


# several segments: "cudnn" runs `Prefix` through the kernel like "pallas", "xla" runs einsum
@pytest.mark.parametrize("layout,backend", [("zlab", "pallas"), ("deepspec", "pallas"), ("zlab", "xla"),
                                            ("deepspec", "cudnn")])
def test_training_anchor_mask_with_carried_rows(layout, backend):
    """The drafter's training attention: [context (anchor prefix) ; carried (per block, valid below
    the rejected count) ; block (block-diagonal)], as `proposal_hidden` builds it."""
    rng = np.random.default_rng(2)
    s = 23
    dc, blk = _anchor_blocks(layout, rng, s)
    t, p, n = dc.block_size, dc.num_proposals, blk.anchors.shape[1]
    limit = A.context_limit(blk, t)
    # a block's queries see the context strictly before its anchor (none for unused slots)
    anchor = np.repeat(np.asarray(blk.anchors), t, axis=1)
    keep = np.repeat(np.asarray(blk.keep), t, axis=1)
    want = (np.arange(s)[None, None] < anchor[..., None]) & keep[..., None]
    np.testing.assert_array_equal(Prefix(limit).dense(s), want)
    q, k, v = _qkv(rng, n * t, s)
    kc, vc = _qkv(rng, n * p, n * p)[1:]
    kb, vb = _qkv(rng, n * t, n * t)[1:]
    count = jnp.asarray(rng.integers(0, p + 1, (B, n)))
    valid = (jnp.arange(p)[None, None] < count[..., None]).reshape(B, n * p)
    cmask = carried_segment_mask(valid, n * t, t)
    # Blockwise(n): what the int block size t stands for (an int would be traced under jit here)
    _check(_training_segments, q, (k, v, kc, vc, kb, vb), backend, (Prefix(limit), cmask, Blockwise(n)))


def _training_segments(kv, ctx, carried, block):
    return [(kv[0], kv[1], ctx), (kv[2], kv[3], carried), (kv[4], kv[5], block)]


@pytest.mark.parametrize("backend", ("einsum", "pallas"))
def test_carried_rows_with_count_zero_contribute_exactly_nothing(backend):
    """Decoding's one block: context prefix + carried rows j < count for count 0..P + the block. Count 0
    gives bit for bit the attention without the carried segment; every count matches einsum."""
    rng = np.random.default_rng(4)
    t, s, p = 5, 19, 4
    q, k, v = _qkv(rng, t, s)
    kc, vc = _qkv(rng, p, p)[1:]
    kb, vb = _qkv(rng, t, t)[1:]
    ctx = Prefix(jnp.broadcast_to(jnp.asarray([7, 19])[:, None], (B, t)).astype(jnp.int32))
    full = jnp.ones((B, t, t), bool)
    without = attention_core(q, [(k, v, ctx), (kb, vb, full)], 0.37, backend)
    for count in range(p + 1):
        valid = jnp.broadcast_to(jnp.arange(p)[None] < count, (B, p))
        extra = (ctx, Blockwise(1, key_valid=valid), full)
        if backend != "einsum":
            _check(_training_segments, q, (k, v, kc, vc, kb, vb), backend, extra)
        if count == 0:  # (both op by op: one compiled program may fuse differently from another)
            got = attention_core(q, _training_segments((k, v, kc, vc, kb, vb), *extra), 0.37, backend)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(without))


def test_dense_segments_and_auto():
    rng = np.random.default_rng(5)
    t, s = 6, 11
    q, k, v = _qkv(rng, t, s)
    m = jnp.asarray(rng.random((B, t, s)) < 0.5).at[0, 2].set(False)
    for backend in BACKENDS:
        _check(_one, q, (k, v), backend, (m,))
    # "auto" is resolved where the program is lowered: einsum here (the same numbers), pallas on cuda
    # (tests/test_lowering.py)
    _check(_one, q, (k, v), "auto", (m,), atol=0)
    with pytest.raises(ConfigError, match="unknown attention backend"):
        resolve_backend("flash")
    for make in (lambda: TCFG.replace(attention_backend="flash"), lambda: TrainConfig(attention_backend="flash")):
        with pytest.raises(ConfigError, match="attention_backend must be one of"):
            make()


TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True)


def test_backend_switched_train_step_equals_the_reference():
    """Two DVD optimizer steps of the tiny config with the pallas backend: loss, gradient norm and params
    equal the einsum run. The drafter's context attention (draft 1 and the trained draft 2) and
    verification's prefix of the recorded sequence go through the kernel."""
    mode = "dvd"
    tc = TCFG.replace(num_layers=3)
    dc = DrafterConfig.for_target(tc, kind="markov", layout="zlab", num_proposals=3, num_layers=1,
                                  mask_token_id=0, target_layer_ids=(0, 1), markov_rank=8)
    tp = init_params(tc, jax.random.key(0))
    rng = np.random.default_rng(6)
    ids = rng.integers(0, 32, (2, 16)).astype(np.int32)
    lm = np.zeros((2, 16), np.int32)
    lm[0, 3:] = 1
    lm[1, 9:] = 1
    batch = {"input_ids": ids, "loss_mask": lm}
    out = {}
    for bk in ("einsum", "pallas"):
        cfg = TrainConfig(loss=LossConfig(mode=mode, off_metrics=False), num_anchors=3, steps=2, attention_backend=bk)
        sc = step_config(cfg, tc, dc)
        assert sc.drafter.backbone.attention_backend == bk == sc.target.attention_backend
        opt = make_optimizer(cfg, cfg.steps)
        state = init_state(init_drafter_params(dc, jax.random.key(1)), opt, 3)
        step = jax.jit(train_step, static_argnums=(0, 1))
        losses = []
        for _ in range(2):
            state, m = step(sc, opt, state, tp, batch)
            losses.append(float(m["loss"]))
        out[bk] = (losses, state.params, float(m["grad_norm"]))
    l0, p0, g0 = out["einsum"]
    l1, p1, g1 = out["pallas"]
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    np.testing.assert_allclose(g1, g0, rtol=1e-4)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), p1, p0)


@pytest.mark.parametrize("backend", ["pallas"])  # (xla's one-segment path: test_causal_prefix_and_per_row_lengths)
def test_target_feature_forward_through_the_backend(backend):
    """The target's cache-free forward (training features, DVD's prefix K/V): causal as a `Prefix`, a
    sliding window as its lower bound; taps and final hidden equal the einsum forward."""
    from carryover_jax.models.target import TargetLM

    tc = TCFG.replace(layer_types=("sliding_attention", "full_attention") * 2, sliding_window=5)
    params = init_params(tc, jax.random.key(2))
    ids = jnp.asarray(np.random.default_rng(7).integers(0, 32, (2, 19)), jnp.int32)
    out = {}
    for bk in ("einsum", backend):
        out[bk] = jax.jit(lambda p, x, bk=bk: TargetLM(tc.replace(attention_backend=bk)).apply(
            {"params": p}, x, (0, 2), method=TargetLM.features))(params, ids)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5),
                           out[backend], out["einsum"])


def _live(kv, ctx, block):
    return [(kv[0], kv[1], ctx), (kv[2], kv[3], block)]


@pytest.mark.parametrize("lower", [False, True])
def test_live_length_cache_reads_through_the_kernel(lower):
    """Decode's cache segment (`LiveMask`: per-row live lengths, causal within the chunk, a sliding
    window's lower bound) + a carried/block segment: pallas (flash decoding, heads folded into the
    query axis) == the chunked einsum loop."""
    from carryover_jax.models.layers import LiveMask

    rng = np.random.default_rng(8)
    t, s = 5, 70
    q, k, v = _qkv(rng, t, s)
    kb, vb = _qkv(rng, t, t)[1:]
    lengths = jnp.asarray([3, 61])
    limit = (lengths[:, None] + jnp.arange(1, t + 1)[None]).astype(jnp.int32)
    mask = LiveMask(limit, chunk=16, lower=(limit - 9) if lower else None)
    segs = _live((k, v, kb, vb), mask, jnp.ones((B, t, t), bool))
    want = jax.jit(lambda q, segs: attention_core(q, segs, 0.37, "einsum"))(q, segs)
    got = jax.jit(lambda q, segs: attention_core(q, segs, 0.37, "pallas"))(q, segs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["pallas", "mosaic"])
def test_speculative_decoding_with_a_kernel_backend_equals_ar(tiny_llama, backend):
    """Greedy speculative decoding with target and drafter on a kernel backend (cache reads through the
    Triton-style kernel, or the TPU one in TPU interpret mode) reproduces einsum AR decoding token for
    token."""
    from carryover_jax import generate, load_target
    from carryover_jax.decode.generate import speculative_generate

    target = load_target(tiny_llama.path, tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1))
    params = init_drafter_params(cfg, jax.random.key(0))
    prompts = [list(range(3, 9)), list(range(20, 33))]
    ref = generate(target, prompts, max_new_tokens=[9, 6], stop_token_ids=[])
    target.cfg = target.cfg.replace(attention_backend=backend)
    drafter = (cfg.replace(backbone=cfg.backbone.replace(attention_backend=backend)), params)
    out, _ = speculative_generate(target, drafter, prompts, max_new_tokens=[9, 6], stop_token_ids=[])
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]


def test_kernel_runs_per_shard_under_a_mesh():
    """Under `jax.set_mesh` (training) the Pallas call runs per shard (batch over data/fsdp, K/V heads
    over tensor, through shard_map); values and gradients equal the unsharded einsum reference."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from carryover_jax.config import MeshConfig
    from carryover_jax.train.sharding import make_mesh

    assert jax.device_count() == 8
    rng = np.random.default_rng(9)
    b, t, s = 4, 12, 21
    q, k, v = _qkv(rng, t, s, b=b)
    limit = jnp.asarray(rng.integers(0, s + 1, (b, t)), jnp.int32)

    def loss(q, k, v, limit, backend):
        out = attention_core(q, [(k, v, Prefix(limit))], 0.37, backend)
        return jnp.sum(jnp.sin(out) * out), out

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
    (_, want), gw = jax.jit(grad, static_argnums=4)(q, k, v, limit, "einsum")
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(mesh):
        put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
        args = (put(q, P(("data", "fsdp"))), put(k, P(("data", "fsdp"), "tensor")),
                put(v, P(("data", "fsdp"), "tensor")), put(limit, P(("data", "fsdp"))))
        fn = jax.jit(grad, static_argnums=4)
        assert "shard_map" in str(fn.trace(*args, "pallas").jaxpr)
        (_, got), gg = fn(*args, "pallas")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
    jax.tree_util.tree_map(lambda a, c: np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=2e-5,
                                                                   rtol=1e-4), gg, gw)


@pytest.mark.parametrize("dtype,t,s,d", [("bfloat16", 192, 300, 128), ("float32", 4 * 16, 4100, 64)])
def test_kernels_lower_to_triton_for_gpu(dtype, t, s, d):
    """The forward and both backward kernels lower to Triton for CUDA from this CPU-only machine
    (cross-platform lowering: the JAX -> Triton step of a GPU compile; PTX generation and the run are
    the device check's). Shapes: training-like (padded tiles, GQA) and decode-like (folded heads)."""
    from carryover_jax.models import kernels

    q = jax.ShapeDtypeStruct((2, 8, t, d), jnp.dtype(dtype))
    k = jax.ShapeDtypeStruct((2, 2, s, d), jnp.dtype(dtype))
    lim = jax.ShapeDtypeStruct((2, t), jnp.int32)

    def f(q, k, v, limit, lower):
        o, lse = kernels.prefix_attention(q, k, v, limit, lower, scale=0.1, interpret=False)
        return jnp.sum(o) + jnp.sum(jnp.where(lse > -1e29, lse, 0.0))

    from tests.lowering import cuda_mesh, lower_text

    for fn, calls in ((f, 1), (jax.grad(f, argnums=(0, 1, 2)), 3)):
        with jax.sharding.use_abstract_mesh(cuda_mesh()):  # jax >= 0.11 reads the GPU from it (tests/lowering.py)
            traced = jax.jit(fn).trace(q, k, k, lim, lim)
        text = lower_text(traced, "cuda")
        assert text.count("__gpu$xla.gpu.triton") == calls


def test_the_kernel_is_refused_on_tpu(monkeypatch):
    """Where this process runs on a TPU, the Triton-style kernel (pallas, and cudnn's kernel segments) is
    refused in one line before tracing; einsum and auto stay available."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    for name in ("pallas", "cudnn"):
        with pytest.raises(ConfigError, match=f"attention backend '{name}' .* untested on TPU"):
            resolve_backend(name)
    assert resolve_backend("auto") == "auto" and resolve_backend("einsum") == "einsum"


@pytest.mark.parametrize("d", [64, 256, 512])
def test_interpreted_kernel_equals_einsum_at_every_head_dim(d):
    """The kernel with the head dim's own tiles (`tile_sizes`: 64 x 64, 64 x 32 and 32 x 16 in bf16)
    against einsum, interpreted: values and gradients of a causal + window `Prefix` segment over
    several key tiles, and (d = 512, Gemma 4's global layers) a live-length cache read."""
    from carryover_jax.models.kernels import tile_sizes
    from carryover_jax.models.layers import LiveMask

    rng = np.random.default_rng(20 + d)
    t, s = 24, 72
    rnd = lambda *shape: jnp.asarray(rng.normal(size=shape) / np.sqrt(np.sqrt(d)), jnp.float32)  # noqa: E731
    q, k, v = rnd(1, t, H, d), rnd(1, HKV, s, d), rnd(1, HKV, s, d)
    causal = jnp.arange(1, t + 1, dtype=jnp.int32)[None] + 40
    tiles = tile_sizes(d, itemsize=4)  # float32 here: half the bf16 key tile at the same shared memory
    assert tiles.block_k < s and tiles.block_q <= 64
    _check(_one, q, (k, v), "pallas", (Prefix(causal, lower=causal - 37),), atol=1e-4)
    if d == 512:
        live = LiveMask(jnp.asarray([[50, 51, 52, 53]], jnp.int32), lower=jnp.asarray([[9, 10, 11, 12]], jnp.int32))
        got, want = (jax.jit(lambda q, k, v, bk=bk: attention_core(q, [(k, v, live)], 0.3, bk))(q[:, :4], k, v)
                     for bk in ("pallas", "einsum"))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


def test_split_k_equals_the_unsplit_kernel():
    """Flash-decoding: the keys of every query tile split over 1 or 3 programs, partial softmaxes
    merged, give the one-program output and lse (rows that see nothing: 0 and NEG_INF in every split);
    the gradient through the split forward equals the unsplit one. Batch-1 decode picks > 1 split."""
    from carryover_jax.models import kernels

    rng = np.random.default_rng(21)
    t, s = 8, 300
    q = jnp.asarray(rng.normal(size=(1, H, t, D)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, HKV, s, D)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, HKV, s, D)), jnp.float32)
    limit = jnp.asarray([[0, 5, 40, 120, 230, 299, 300, 300]], jnp.int32)
    lower = jnp.asarray([[0, 0, 3, 60, 0, 100, 290, 0]], jnp.int32)

    def run(splits):
        def f(q, k, v):
            o, lse = kernels.prefix_attention(q, k, v, limit, lower, scale=0.3, block_k=16, splits=splits)
            return jnp.sum(jnp.sin(o) * o) + jnp.sum(jnp.where(lse > -1e29, lse, 0.0) ** 2), (o, lse)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    (_, (o1, l1)), g1 = run(1)
    for n in (3,):  # the backward kernels are the same for any split: one split count suffices
        (_, (o, lse)), g = run(n)
        np.testing.assert_allclose(np.asarray(o), np.asarray(o1), atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(lse), np.asarray(l1), atol=2e-5, rtol=1e-6)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5), g, g1)
    assert np.all(np.asarray(o1)[:, :, 0] == 0) and np.all(np.asarray(l1)[:, :, 0] <= -1e29)
    assert kernels.key_splits(1 * HKV, 8192 // 64) > 1


def test_dkv_kernel_skips_only_query_tiles_that_see_nothing():
    """Gradients with 16-row tiles where whole query tiles see no key of a key tile (windows far apart,
    a row that sees nothing, padded queries): the dk/dv kernel skips them and still equals einsum."""
    rng = np.random.default_rng(22)
    t, s = 48, 80
    q, k, v = _qkv(rng, t, s)
    lim = np.concatenate([np.arange(1, 17) + 0, np.full(16, 0), np.arange(65, 81)])
    limit = jnp.asarray(np.stack([lim, np.minimum(lim + 3, s)]), jnp.int32)
    lower = jnp.maximum(limit - 6, 0)
    from carryover_jax.models import kernels

    def f(backend):
        def loss(q, k, v):
            if backend == "einsum":
                out = attention_core(q, [(k, v, Prefix(limit, lower))], 0.37, "einsum")
                return jnp.sum(jnp.sin(out) * out)
            qh = jnp.swapaxes(q, 1, 2)
            o, _ = kernels.prefix_attention(qh, k, v, limit, lower, scale=0.37, block_q=16, block_k=16)
            out = jnp.swapaxes(o, 1, 2)
            return jnp.sum(jnp.sin(out) * out)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4), f("pallas"),
                           f("einsum"))
