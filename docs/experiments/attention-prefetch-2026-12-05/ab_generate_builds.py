"""AR generation's decode loop (SmolLM2, greedy, 64 new tokens after a batch of random prompts) with this checkout's
cache attention kernel ("current") against another build of `cpu_attention.cc` ("other"), both compiled ahead of
time in one process and their calls alternated.

    python ab_generate_builds.py OTHER.so REPS BxPROMPTxMAX_LEN[,...] [float32|bfloat16]

OTHER.so: a library built from another `cpu_attention.cc`, e.g. the one before 2026-12-05 (063a36b):
    mkdir -p /tmp/oldattn && git show 063a36b:carryover_jax/models/cpu_attention.cc > /tmp/oldattn/cpu_attention.cc
    cp carryover_jax/models/cpu_common.h /tmp/oldattn/
    g++ -O3 -std=c++17 -shared -fPIC -march=native -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \\
        -I /tmp/oldattn /tmp/oldattn/cpu_attention.cc -o /tmp/oldattn/old.so
registered under its own target names (`current` as OTHER.so: an A/A). Both arms must give the same tokens; each
arm's compiled loop is checked for the kernel names it calls. Prints tokens per second of the decode loop (the
prefill is shared and untimed) and the per-pair time ratio current / other."""
import ctypes, sys
import jax, numpy as np
from carryover_jax.loading import load_target
from gen_ab import alternated, compile_loop, prefilled
from carryover_jax.models import cpu_attention as ca, cpu_kernels
from carryover_jax.numerics import Numerics

so, REPS, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
NEW = 64
assert ca.available()
lib = ctypes.cdll.LoadLibrary(str(cpu_kernels.build()) if so == "current" else so)
current = dict(ca.TARGETS)
other = {key: f"other_{name}" for key, name in current.items()}
for key, symbol in ca.SYMBOLS.items():
    jax.ffi.register_ffi_target(other[key], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype=dtype))
cfg, params = target.cfg, target.params
print(cfg.numerics.describe(), flush=True)
for spec in specs.split(","):
    b, plen, max_len = map(int, spec.split("x"))
    args = prefilled(cfg, params, b, plen, max_len, NEW)
    comp = {}
    for label, names in (("current", current), ("other", other)):
        jax.clear_caches()
        ca.TARGETS.clear(); ca.TARGETS.update(names)
        comp[label] = compile_loop(cfg, params, args, NEW)
        text, rest = comp[label].as_text(), other if label == "current" else current
        assert any(t in text for t in names.values()) and not any(f'"{t}"' in text for t in rest.values()), label
    ca.TARGETS.clear(); ca.TARGETS.update(current)
    outs = {k: np.asarray(c(params, *args()).out) for k, c in comp.items()}
    same = bool(np.array_equal(outs["current"], outs["other"]))
    t = alternated(comp, params, args, REPS)
    ratio = np.array(t["current"]) / np.array(t["other"])
    print(f"batch {b}, prompts {plen // 2}-{plen}, max_len {max_len}, {dtype}: "
          + ", ".join(f"{k} {b * NEW / np.median(v):.1f} tok/s" for k, v in t.items())
          + f"; current/other time per pair median {np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f},"
          f" {REPS} pairs); the same tokens: {same}", flush=True)
