"""AR generation's decode loop (SmolLM2, greedy, 64 new tokens after a batch of random prompts) with a batch's float32
products by the products kernel ("kernel": `cpu_products.F32_ROWS`, Dense products of up to 64 rows and a tied
head of up to 24) against XLA's dots ("xla": at most 8 rows, the program before), the kernel's Dense products only
("dense": the tied head XLA's above 8 rows), all compiled ahead of time in one process, calls alternated, and a
second "kernel" program as an A/A.

    python ab_generate.py REPS BxPROMPTxMAX_LEN[,...] [OTHER.so]

OTHER.so: another build of `cpu_products.cc` (its compile command: `cpu_kernels.py`), registered under its own
target names and timed as one more arm ("other", with F32_ROWS as this checkout's).

Each arm's compiled loop is checked for the kernel calls it should (and should not) make. Prints tokens per second
of the decode loop (the prefill is shared and untimed), the per-pair time ratios, and how many generated tokens the
kernel and XLA's dots share (their sums differ in order, so a near-tie may flip a greedy token). `ab_generate.txt`
ran before the head's rows (arms "kernel" = Dense products of up to 128 rows, "xla", "kernel_again")."""
import ctypes, os, sys
import jax, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp
from carryover_jax.numerics import Numerics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "attention-prefetch-2026-12-05"))
from gen_ab import alternated, compile_loop, prefilled  # noqa: E402

REPS, specs = int(sys.argv[1]), sys.argv[2]
NEW = 64
assert cp.available()
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype="float32"))
cfg, params = target.cfg, target.params
print(cfg.numerics.describe(), flush=True)
most = dict(cp.F32_ROWS)
current = dict(cp.TARGETS)
arms = [("kernel", most, current), ("xla", {"kn": 8, "nk": 8}, current), ("dense", {**most, "nk": 8}, current),
        ("kernel_again", most, current)]
if len(sys.argv) > 3:
    lib = ctypes.cdll.LoadLibrary(sys.argv[3])
    other = {key: f"other_{name}" for key, name in current.items()}
    for key, symbol in cp.SYMBOLS.items():
        jax.ffi.register_ffi_target(other[key], jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    arms.append(("other", most, other))
for spec in specs.split(","):
    b, plen, max_len = map(int, spec.split("x"))
    args = prefilled(cfg, params, b, plen, max_len, NEW)
    comp = {}
    for label, rows, names in arms:
        jax.clear_caches()
        cp.F32_ROWS.update(rows)
        cp.TARGETS.clear(); cp.TARGETS.update(names)
        comp[label] = compile_loop(cfg, params, args, NEW)
        text = comp[label].as_text()
        for layout in ("kn", "nk"):
            assert (f'"{names[layout, "float32"]}"' in text) == (rows[layout] >= b), (label, layout)
    cp.F32_ROWS.update(most)
    cp.TARGETS.clear(); cp.TARGETS.update(current)
    outs = {k: np.asarray(c(params, *args()).out) for k, c in comp.items()}
    assert np.array_equal(outs["kernel"], outs["kernel_again"])
    same = float(np.mean(outs["kernel"] == outs["xla"]))
    assert "other" not in outs or np.array_equal(outs["kernel"], outs["other"])
    t = alternated(comp, params, args, REPS)
    ratio = np.array(t["kernel"]) / np.array(t["xla"])
    aa = np.array(t["kernel_again"]) / np.array(t["kernel"])
    head = np.array(t["kernel"]) / np.array(t["dense"])
    print(f"batch {b}, prompts {plen // 2}-{plen}, max_len {max_len}, float32: "
          + ", ".join(f"{k} {b * NEW / np.median(v):.1f} tok/s" for k, v in t.items())
          + f"; kernel/xla time per pair median {np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f}),"
          f" A/A {np.median(aa):.3f} ({aa.min():.3f}-{aa.max():.3f}), kernel/dense {np.median(head):.3f}"
          f" ({head.min():.3f}-{head.max():.3f}), {REPS} pairs; tokens equal: {same:.1%}"
          + (f"; kernel/other {np.median(np.array(t['kernel']) / np.array(t['other'])):.3f}" if "other" in t else ""),
          flush=True)
