"""verify(P+1) and AR step at batch 1: XLA CPU's YNN fusions (default) against plain `dot` thunks
(`xla_cpu_experimental_ynn_fusion_type=""`), each program compiled side by side, calls alternated.
`python verify_kernels.py P REPS`; DRAFTER=folder (default runs/ab-timing/ce_kl/drafter, the edr_ab-size CE + KL
drafter) for P = 3, a random 2-layer drafter with an 8,192-token draft vocabulary otherwise."""
import os, sys, time, jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target, load_drafter, init_drafter
from carryover_jax.decode import autoregressive as ar, speculative as sp
from carryover_jax.decode.buckets import next_bucket

P = int(sys.argv[1]) if len(sys.argv) > 1 else 3
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
target = load_target("smollm2")
drafter = (load_drafter(os.environ.get("DRAFTER", "runs/ab-timing/ce_kl/drafter"), target=target, carryover=True) if P == 3 else
           init_drafter(target, kind="dflash", layout="zlab", num_proposals=P, num_layers=2,
                        draft_vocab=tuple(range(8192))))
tcfg, tp, dcfg, dp = target.cfg, target.params, drafter.cfg, drafter.params
sc = sp.SpecConfig(target=tcfg, drafter=dcfg, attend_carried=dcfg.carryover)
prompt_len, L, batch = 100, 256, 1
rng = np.random.default_rng(0)
tokens = np.zeros((batch, next_bucket(prompt_len)), np.int32)
tokens[:, :prompt_len] = rng.integers(10, tcfg.vocab_size, (batch, prompt_len))
tokens, lens = jnp.asarray(tokens), jnp.full((batch,), prompt_len, jnp.int32)
n = dcfg.num_proposals + 2
cache, logits = ar.prefill(tcfg, tp, tokens, lens, max_len=L)
s = sp.prefill(sc, tp, dp, tokens, lens, jnp.full((batch,), n, jnp.int32), jnp.zeros((batch,)),
               jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=L, out_size=n)
tok = jnp.argmax(logits, -1).astype(jnp.int32)
def reset(s):
    return s.replace(target_cache=s.target_cache.with_lengths(lens + 0),
                     draft_cache=s.draft_cache.with_lengths(lens + 0), num_out=jnp.ones_like(s.num_out),
                     rounds=jnp.zeros_like(s.rounds), done=jnp.zeros_like(s.done))
toks, q, _ = sp.draft_parts(sc, tp, dp, reset(s))
OPT = {"ynn": None, "dot": {"xla_cpu_experimental_ynn_fusion_type": ""}}
progs = {}
for name, opt in OPT.items():
    jax.clear_caches()
    progs[("ar", name)] = ar.step.lower(tcfg, tp, cache.with_lengths(lens + 0), tok).compile(opt)
    progs[("verify", name)] = sp.verify_step.lower(sc, tp, dp, reset(s), toks, q).compile(opt)
    progs[("draft", name)] = sp.draft_parts.lower(sc, tp, dp, reset(s)).compile(opt)
def call(kind, name):
    global cache, s
    p = progs[(kind, name)]
    if kind == "ar":
        lg, cache = p(tp, cache.with_lengths(lens + 0), tok); return lg
    if kind == "verify":
        s = p(tp, dp, reset(s), toks, q); return s.num_out
    out = p(tp, dp, reset(s)); return out[0]
for k in progs: jax.block_until_ready(call(*k))
ts = {k: [] for k in progs}
for _ in range(REPS):
    for k in progs:
        t = time.perf_counter(); jax.block_until_ready(call(*k)); ts[k].append(time.perf_counter() - t)
med = {k: 1e3 * float(np.median(v)) for k, v in ts.items()}
print(f"P={P} batch 1, cache {L}, prompt {prompt_len}, {REPS} alternated calls; median ms:")
for k, v in med.items(): print(f"  {k[0]:7s} {k[1]:4s} {v:7.2f}")
for name in OPT:
    print(f"  {name}: verify/AR {med[('verify', name)] / med[('ar', name)]:.3f}  draft/AR {med[('draft', name)] / med[('ar', name)]:.3f}"
          f"  round/AR {(med[('verify', name)] + med[('draft', name)]) / med[('ar', name)]:.3f}")
print("  verify dot/ynn per call:", np.round(np.array(ts[("verify", "dot")]) / np.array(ts[("verify", "ynn")]), 2).tolist())
print("  AR(ynn) round(dot)/AR(ynn):", round((med[("verify", "dot")] + med[("draft", "dot")]) / med[("ar", "ynn")], 3))
