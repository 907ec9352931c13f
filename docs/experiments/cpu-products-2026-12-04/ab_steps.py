"""AR step, draft and verify(P + 1) at batch 1 on SmolLM2 (float32, 1024-slot caches, 100-token prompt): XLA's
dots ("xla") against the few-row kernel (`numerics.decode_products` "stream"), every program compiled side by
side (`jax.clear_caches()` between the two), calls alternated in one process.
`python ab_steps.py P REPS`; DRAFTER=folder for a trained drafter (its P), else a random 2-layer DFlash drafter
with an 8,192-token draft vocabulary and P proposals; DTYPE=bfloat16 for a bf16 target (params, compute, cache);
AA=1 compiles "stream" for both arms (an A/A: the spread that timing alone gives). FIELD=attention_backend
ARMS=einsum,cpu compares another numerics field's two values the same way (the labels "xla" / "stream" then stand
for the first / second value)."""
import os, sys, time, jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target, load_drafter, init_drafter
from carryover_jax.decode import autoregressive as ar, speculative as sp
from carryover_jax.decode.buckets import next_bucket

P = int(sys.argv[1]) if len(sys.argv) > 1 else 3
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
target = load_target("smollm2", dtype=os.environ.get("DTYPE"))
drafter = (load_drafter(os.environ["DRAFTER"], target=target, carryover=True) if os.environ.get("DRAFTER") else
           init_drafter(target, kind="dflash", layout="zlab", num_proposals=P, num_layers=2,
                        draft_vocab=tuple(range(8192))))
P = drafter.cfg.num_proposals
tp, dp = target.params, drafter.params
prompt_len, L, batch = 100, 1024, 1
rng = np.random.default_rng(0)
tokens = np.zeros((batch, next_bucket(prompt_len)), np.int32)
tokens[:, :prompt_len] = rng.integers(10, target.cfg.vocab_size, (batch, prompt_len))
tokens, lens = jnp.asarray(tokens), jnp.full((batch,), prompt_len, jnp.int32)
n = P + 2


def reset(s):
    return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                     draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                     rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))


progs, state, outs = {}, {}, {}
FIELD = os.environ.get("FIELD", "decode_products")
A, B = os.environ.get("ARMS", "xla,stream").split(",")
ARMS = {"xla": B if os.environ.get("AA") == "1" else A, "stream": B}
for name, products in ARMS.items():
    tcfg = target.cfg.replace(numerics=target.cfg.numerics.replace(**{FIELD: products}))
    dcfg = drafter.cfg.with_numerics(drafter.cfg.numerics.replace(**{FIELD: products}))
    sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=dcfg.carryover)
    cache, logits = ar.prefill(tcfg, tp, tokens, lens, max_len=L)
    s = sp.prefill(sc, tp, dp, tokens, lens, jnp.full((batch,), n, jnp.int32), jnp.zeros((batch,)),
                   jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=L, out_size=n)
    tok = jnp.argmax(logits, -1).astype(jnp.int32)
    toks, q, _ = sp.draft_parts(sc, tp, dp, reset(s))
    jax.clear_caches()
    progs[("ar", name)] = ar.step.lower(tcfg, tp, cache.with_lengths(lens + 0), tok).compile()
    progs[("verify", name)] = sp.verify_step.lower(sc, tp, dp, reset(s), toks, q).compile()
    progs[("draft", name)] = sp.draft_parts.lower(sc, tp, dp, reset(s)).compile()
    state[name] = dict(cache=cache, s=s, tok=tok, toks=toks, q=q)


def call(kind, name):
    st, p = state[name], progs[(kind, name)]
    if kind == "ar":
        lg, st["cache"] = p(tp, st["cache"].with_lengths(lens + 0), st["tok"])
        return lg
    if kind == "verify":
        st["s"] = p(tp, dp, reset(st["s"]), st["toks"], st["q"])
        return st["s"].num_out
    return p(tp, dp, reset(st["s"]))[0]


for k in progs:
    outs[k] = np.asarray(jax.block_until_ready(call(*k)))
for kind in ("ar", "verify", "draft"):  # the same tokens / logits from both
    a, b = outs[(kind, "xla")], outs[(kind, "stream")]
    same = np.array_equal(a, b) if a.dtype.kind == "i" else float(np.abs(a - b).max())
    print(f"{kind}: xla vs stream {'identical' if same is True else 'max |diff| ' + str(same)}")
ts = {k: [] for k in progs}
for _ in range(REPS):
    for k in progs:
        t = time.perf_counter(); jax.block_until_ready(call(*k)); ts[k].append(time.perf_counter() - t)
med = {k: 1e3 * float(np.median(v)) for k, v in ts.items()}
print(f"P={P} batch 1, cache {L}, prompt {prompt_len}, {target.cfg.numerics.dtype}, {REPS} alternated calls"
      f"; {FIELD} xla = {ARMS['xla']}, stream = {ARMS['stream']}; median ms:")
for k, v in med.items():
    print(f"  {k[0]:7s} {k[1]:6s} {v:7.2f}")
for name in ("xla", "stream"):
    print(f"  {name}: verify/AR {med[('verify', name)] / med[('ar', name)]:.3f}  draft/AR "
          f"{med[('draft', name)] / med[('ar', name)]:.3f}  round/AR "
          f"{(med[('verify', name)] + med[('draft', name)]) / med[('ar', name)]:.3f}")
for kind in ("ar", "verify", "draft"):
    r = np.array(ts[(kind, "stream")]) / np.array(ts[(kind, "xla")])
    print(f"  {kind} stream/xla per pair: median {np.median(r):.3f}, range {r.min():.2f}-{r.max():.2f}")
print("  round(stream) / AR(xla):",
      round((med[("verify", "stream")] + med[("draft", "stream")]) / med[("ar", "xla")], 3))
