"""Numerics as a runtime choice (carryover_jax/numerics.py): per-platform defaults resolvable for a platform
other than this process's, one home that target and drafter configs receive, the config and CLI settings that
reach it, and float32 LM-head logits in bfloat16 runs."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from carryover_jax.config import DataConfig, DrafterConfig, TargetConfig, TrainConfig, apply_overrides
from carryover_jax.errors import ConfigError
from carryover_jax.models.target import TargetLM, init_params, new_cache
from carryover_jax.numerics import REFERENCE, Numerics, lm_head_logits
from carryover_jax.weights.hf_config import target_config_from_hf, target_config_to_hf

TINY = dict(family="qwen3", vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=8, qk_norm=True)


def test_cuda_numerics_resolve_from_a_cpu_process():
    assert jax.default_backend() == "cpu"
    cuda = Numerics.for_platform("cuda")
    assert (cuda.param_dtype, cuda.dtype, cuda.cache_dtype, cuda.attention_backend, cuda.lm_head) == \
        ("bfloat16", "bfloat16", "bfloat16", "auto", "plain")
    assert cuda.drafter_param_dtype == "float32"  # the trained master copy
    assert Numerics.for_platform("gpu") == cuda and Numerics.for_platform("tpu").dtype == "bfloat16"
    cpu = Numerics.for_platform()  # this process: CPU
    assert cpu == REFERENCE == Numerics.for_platform("cpu")
    assert (cpu.param_dtype, cpu.dtype, cpu.attention_backend, cpu.lm_head) == ("float32", "float32", "cpu",
                                                                                 "vocab_major")
    # an explicit compute dtype carries the target's params and caches (on CPU a bf16 cache only, stored as
    # bits unless cache_bits=False; test_bf16_cpu); the drafter's params stay float32
    bf = Numerics.for_platform("cpu", dtype="bfloat16")
    assert (bf.param_dtype, bf.cache_dtype, bf.drafter_param_dtype, bf.cache_bits) == ("bfloat16", "bfloat16",
                                                                                     "float32", True)
    assert Numerics.for_platform("cpu", dtype="bfloat16", cache_bits=False).cache_dtype == "float32"
    # the drafter computes in the run's dtype unless drafter_dtype says otherwise; its context cache follows it
    assert (cpu.drafter_dtype, bf.drafter_dtype, cuda.drafter_dtype) == ("float32", "bfloat16", "bfloat16")
    mixed = Numerics.for_platform("cpu", drafter_dtype="bfloat16")
    assert (mixed.dtype, mixed.param_dtype, mixed.cache_dtype) == ("float32", "float32", "float32")
    view = mixed.drafter_view()
    assert (view.dtype, view.cache_dtype, view.param_dtype) == ("bfloat16", "bfloat16", "float32")
    assert bf.drafter_view().cache_dtype == bf.cache_dtype and cpu.drafter_view() == cpu
    assert "compute float32 (drafter bfloat16)" in mixed.describe()
    with pytest.raises(ConfigError, match="numerics.drafter_dtype must be one of"):
        Numerics(drafter_dtype="bf16")
    assert Numerics.for_platform("cpu", dtype="float16").cache_dtype == "float32"
    assert not Numerics.for_platform("cuda").cache_bits
    assert Numerics.for_platform("cuda", dtype="float32").param_dtype == "float32"
    assert Numerics.for_platform("cuda", cache_dtype="float32").dtype == "bfloat16"
    with pytest.raises(ConfigError, match="unknown platform 'metal'"):
        Numerics.for_platform("metal")
    with pytest.raises(ConfigError, match="numerics.dtype must be one of"):
        Numerics(dtype="int8")
    with pytest.raises(ConfigError, match="attention_backend must be one of"):
        Numerics(attention_backend="flash")


def test_a_cuda_program_is_built_and_lowered_from_the_cpu():
    """The target under CUDA numerics lowers for CUDA here: bf16 params and activations, float32 logits."""
    num = Numerics.for_platform("cuda", attention_backend="einsum")
    cfg = TargetConfig(**TINY, tie_word_embeddings=True).with_numerics(num)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    fwd = jax.jit(lambda p, t: TargetLM(cfg).apply({"params": p}, t)[0])
    lowered = fwd.trace(params, tokens).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "bf16" in text and "tensor<1x8x97xf32>" in text
    cache = new_cache(cfg, 1, 16)
    assert all(k.dtype == jnp.bfloat16 for k in cache.k)


def test_model_configs_hold_numerics_and_serializers_leave_them_out():
    cfg = TargetConfig(**TINY)
    assert cfg.numerics == REFERENCE and cfg.dtype == "float32" and cfg.attention_backend == "cpu"
    # the older call sites: replace(dtype=...) moves compute and cache, param_dtype/attention_backend their own
    bf = cfg.replace(dtype="bfloat16", attention_backend="pallas")
    assert (bf.dtype, bf.cache_dtype, bf.param_dtype, bf.attention_backend) == ("bfloat16", "bfloat16", "float32",
                                                                                "pallas")
    assert hash(bf) != hash(cfg) and bf != cfg  # a jit static argument: another program
    assert target_config_from_hf(target_config_to_hf(cfg), dtype="bfloat16").numerics.dtype == "bfloat16"
    # an unresolved numerics in a model config takes the CPU reference for its unset fields
    assert TargetConfig(**TINY, numerics=Numerics(dtype="bfloat16")).numerics == Numerics.for_platform(
        "cpu", dtype="bfloat16")
    # the drafter's backbone carries the drafter's view: the run's compute, the drafter's params
    run = Numerics.for_platform("cuda")
    d = DrafterConfig.for_target(cfg.with_numerics(run), num_layers=1, mask_token_id=4, target_layer_ids=(0,))
    assert d.numerics == run.drafter_view() and d.backbone.param_dtype == "float32" and d.backbone.dtype == "bfloat16"
    assert d.with_numerics(REFERENCE).backbone.numerics == REFERENCE
    from carryover_jax.train.responses import store_meta
    from carryover_jax.weights.drafter_formats import drafter_config_from_dict, drafter_config_to_dict

    saved = drafter_config_to_dict(d)
    assert saved["config_version"] == 2
    assert not {"numerics", "dtype", "param_dtype", "attention_backend"} & set(saved["backbone"])
    assert drafter_config_from_dict(saved) == d.with_numerics(REFERENCE)

    class _T:
        path, tokenizer, stop_token_ids = None, None, (2,)

    metas = []
    for numerics in (REFERENCE, run):
        _T.cfg = cfg.with_numerics(numerics)
        metas.append(store_meta(DataConfig(), _T))
    assert "numerics" not in metas[0]["target_config"] and "dtype" not in metas[0]["target_config"]
    assert metas[0] == metas[1]  # a store prepared in bf16 is extended / read in float32 alike


def test_train_and_prepare_numerics_from_configs_and_overrides():
    cfg = TrainConfig()
    assert cfg.run_numerics("cpu") == REFERENCE and cfg.run_numerics("cuda") == Numerics.for_platform("cuda")
    # the older shorthands are numerics fields
    old = TrainConfig(compute_dtype="bfloat16", attention_backend="pallas")
    assert old.run_numerics("cpu") == Numerics.for_platform("cpu", dtype="bfloat16", attention_backend="pallas")
    with pytest.raises(ConfigError, match="compute_dtype='bfloat16' contradicts numerics.dtype='float32'"):
        TrainConfig(compute_dtype="bfloat16", numerics=Numerics(dtype="float32"))
    c = apply_overrides(cfg, ["numerics.dtype=bfloat16", "numerics.attention_backend=pallas",
                              "data.numerics.cache_dtype=float32"])
    assert c.run_numerics("cuda").dtype == "bfloat16" and c.run_numerics("cuda").cache_dtype == "bfloat16"
    prep = c.run_numerics("cuda", prepare=True)  # prepare: data.numerics over the run's
    assert (prep.dtype, prep.cache_dtype, prep.attention_backend) == ("bfloat16", "float32", "pallas")
    with pytest.raises(ConfigError, match="numerics.dtype must be one of"):
        apply_overrides(cfg, ["numerics.dtype=fp8"])
    # the step builds the CUDA program's configs when asked, whatever this process runs on
    from carryover_jax.train.step import step_config

    tcfg = TargetConfig(**TINY)
    dcfg = DrafterConfig.for_target(tcfg, num_layers=1, mask_token_id=4, target_layer_ids=(0,))
    sc = step_config(cfg, tcfg, dcfg, numerics=Numerics.for_platform("cuda"))
    assert (sc.target.param_dtype, sc.target.dtype, sc.target.attention_backend) == ("bfloat16", "bfloat16", "auto")
    assert (sc.drafter.backbone.param_dtype, sc.drafter.backbone.dtype) == ("float32", "bfloat16")
    assert step_config(cfg, tcfg, dcfg).target.numerics == REFERENCE


def test_cli_numerics_flags():
    from carryover_jax.cli import _run_numerics, _train_config, build_parser

    p = build_parser()
    a = p.parse_args(["generate", "--prompt", "x", "--dtype", "bfloat16", "--attention-backend", "pallas",
                      "--lm-head", "plain"])
    assert _run_numerics(a) == Numerics.for_platform("cpu", dtype="bfloat16", attention_backend="pallas",
                                                     lm_head="plain")
    assert _run_numerics(p.parse_args(["bench", "ar"])) == REFERENCE
    e = _run_numerics(p.parse_args(["eval", "--drafter", "a=d", "--out", "o", "--drafter-dtype", "bfloat16"]))
    assert (e.dtype, e.drafter_dtype) == ("float32", "bfloat16")
    # prepare / train: the flags are numerics.* of the config and win over its shorthands
    t = _train_config(p.parse_args(["train", "--config", "qwen3_4b", "--dtype", "float32",
                                    "--cache-dtype", "bfloat16"]))
    assert t.compute_dtype is None and t.numerics.dtype == "float32" and t.numerics.cache_dtype == "bfloat16"
    assert _train_config(p.parse_args(["prepare", "--config", "qwen3_4b"])).run_numerics("cpu").dtype == "bfloat16"
    with pytest.raises(SystemExit):
        p.parse_args(["generate", "--dtype", "int8"])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 80])  # decode step, verification, training-sized
def test_target_heads_accumulate_and_return_float32_logits(tied, rows):
    """bf16 hidden states and weights: the logits are the float32 dot of the bf16 values (an independent
    numpy float64 reference), not bf16-rounded, for the tied head (plain and vocabulary-major) and the Dense."""
    cfg = TargetConfig(**TINY, tie_word_embeddings=tied).with_numerics(Numerics.for_platform("cpu", dtype="bfloat16"))
    params = init_params(cfg, jax.random.key(1))
    h = jax.random.normal(jax.random.key(2), (1, rows, cfg.hidden_size), jnp.float32).astype(jnp.bfloat16)
    w = params["embed_tokens"]["embedding"].T if tied else params["lm_head"]["kernel"]
    want = np.asarray(h.astype(jnp.float32), np.float64) @ np.asarray(w.astype(jnp.float32), np.float64)
    for impl in ("plain", "vocab_major"):
        c = cfg.replace(numerics=cfg.numerics.replace(lm_head=impl))
        got = TargetLM(c).apply({"params": params}, h, method=TargetLM.head)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # what bf16 rounding of the logits would have been: visibly off the reference
    rounded = np.asarray(want.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.max(np.abs(rounded - want)) > 1e-4


def test_lm_head_forms_agree():
    h = jax.random.normal(jax.random.key(0), (2, 7, 32), jnp.bfloat16)
    e = jax.random.normal(jax.random.key(1), (97, 32), jnp.bfloat16)
    a = lm_head_logits(h, e, vocab_major_weight=True, impl="vocab_major")
    b = lm_head_logits(h, e, vocab_major_weight=True, impl="plain")
    c = lm_head_logits(h, e.T, vocab_major_weight=False)
    assert a.dtype == b.dtype == c.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(np.asarray(c), np.asarray(b), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_argmax_is_jnp_argmax(dtype):
    """`numerics.argmax` (two plain reductions on CPU, XLA's variadic reduce there being a scalar loop) against
    numpy's argmax: random rows, ties (the first index wins), rows of -inf and of zeros, a middle axis, under
    jit; a row with NaNs gets an index of a NaN or of its largest other value. The CPU program holds no
    variadic (value, index) reduce; other platforms keep jnp.argmax."""
    from carryover_jax.numerics import argmax

    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7, 300)).astype(np.float32)
    x[0, 0, [3, 200]] = 9.0  # a tie
    x[2, 3, :] = -np.inf
    x[3, 4, :] = 0.0
    xs = jnp.asarray(x, jnp.dtype(dtype))
    want = np.argmax(np.asarray(xs, np.float32), axis=-1)  # numpy: the first max
    got = jax.jit(argmax)(xs)
    assert got.dtype == jnp.int32 and got.shape == (5, 7)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(xs, -1)))
    np.testing.assert_array_equal(np.asarray(argmax(xs, axis=1)), np.argmax(np.asarray(xs, np.float32), axis=1))
    x[1, 2, [10, 250]] = np.nan
    i = int(jax.jit(argmax)(jnp.asarray(x, jnp.dtype(dtype)))[1, 2])
    row = np.asarray(jnp.asarray(x[1, 2], jnp.dtype(dtype)), np.float32)
    assert i in (10, 250) or row[i] == np.nanmax(row)
    traced = jax.jit(argmax).trace(jax.ShapeDtypeStruct((4, 300), jnp.float32))
    variadic = re.compile(r"stablehlo\.reduce\(%\w+ init: %\w+\), \(")  # a (value, index) reduce
    assert not variadic.search(traced.lower(lowering_platforms=("cpu",)).as_text())
    assert variadic.search(traced.lower(lowering_platforms=("cuda",)).as_text())  # other platforms: jnp.argmax


def test_categorical_and_sample_draw_what_jax_random_draws():
    """`numerics.categorical` gives jax.random.categorical's draws key for key, and `sampling.sample` (on CPU a
    batch with no sampling row skips the draw) gives the tokens of the plain formula: the draw where the
    temperature is above 0, the argmax elsewhere, with top-k / top-p, for mixed and all-greedy batches."""
    from carryover_jax.decode.sampling import process_logits, sample
    from carryover_jax.numerics import categorical

    logits = jax.random.normal(jax.random.key(3), (6, 500)) * 3
    for seed in range(8):
        k = jax.random.key(seed)
        np.testing.assert_array_equal(np.asarray(categorical(k, logits)),
                                      np.asarray(jax.random.categorical(k, logits, axis=-1)))
    for temps in ([0.0, 1.0, 0.0, 0.7, 0.0, 2.0], [0.0] * 6, [1.0] * 6):
        t = jnp.asarray(temps)
        for top_k, top_p in ((0, 1.0), (20, 1.0), (0, 0.9)):
            for seed in range(4):
                k = jax.random.key(seed)
                plain = jnp.where(t > 0, jax.random.categorical(k, process_logits(logits, t, top_k, top_p), axis=-1),
                                  jnp.argmax(logits, -1))
                got = jax.jit(sample, static_argnums=(3, 4))(k, logits, t, top_k, top_p)
                assert got.dtype == jnp.int32
                np.testing.assert_array_equal(np.asarray(got), np.asarray(plain))


def test_sub_batched_runs_large_batches_in_passes_on_cpu():
    """`numerics.sub_batched` on CPU: a batch over `max_tokens` token rows runs as a loop over equal sub-batches
    (of a divisor of the batch near the limit, else padded to a multiple and the padding dropped) and returns what
    one pass returns, pytrees included; within the limit, and lowered for cuda, it is the plain call."""
    from carryover_jax.numerics import sub_batched

    def fn(x, lens):  # row-wise: a running sum, a per-row length mask, a dict output
        c = jnp.cumsum(x, axis=1)
        return {"sum": c, "masked": jnp.where(jnp.arange(x.shape[1])[None] < lens[:, None], c, -1.0)}, lens * 2

    x = jnp.asarray(np.random.default_rng(0).standard_normal((7, 3)), jnp.float32)
    lens = jnp.asarray([0, 1, 2, 3, 1, 2, 3], jnp.int32)
    ref = fn(x, lens)
    for max_tokens in (3, 6, 9, 12, 21, 1000):  # 7, 7, 3, 2, 1 and 1 passes (9 and 12: 7 has no divisor near 3
        # or 4 prompts a pass, so the batch is padded to 9 and 8)
        f = jax.jit(lambda x, lens, m=max_tokens: sub_batched(fn, x, lens, tokens_per_row=3, max_tokens=m))
        jax.tree.map(np.testing.assert_array_equal, f(x, lens), ref)
        loops = "while" in f.lower(x, lens).as_text()
        assert loops == (max_tokens < 21), max_tokens
    cuda = jax.jit(lambda x, lens: sub_batched(fn, x, lens, tokens_per_row=3, max_tokens=3)).trace(x, lens).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "while" not in cuda

    def passes(b, max_tokens):  # the loop's trip count and the rows of one pass, from the traced program
        xb, lb = jnp.zeros((b, 3)), jnp.zeros((b,), jnp.int32)
        text = str(jax.make_jaxpr(lambda x, l: sub_batched(fn, x, l, tokens_per_row=3, max_tokens=max_tokens))(xb, lb))
        return int(re.search(r"length=(\d+)", text).group(1)), "concatenate" in text

    assert passes(8, 9) == (4, False)  # 3 prompts a pass: 8's divisor 2, no padding
    assert passes(12, 12) == (3, False)  # 4 a pass: 12 divides
    assert passes(7, 9) == (3, True)  # 3 a pass, 7 has no divisor but 1: padded to 9
    assert passes(64, 9) == (32, False)  # like 64 prompts of 320 tokens at 1,024: 2 a pass, not 20 of 4 padded to 80
