"""XLA's ops by name in a profiled batch-1 AR step ("ar") and the target's pass over P + 1 verify rows ("t4"), each in
a compiled 32-step loop (SmolLM2, 1,024-slot cache, 100-token prompt), ms per step from a `jax.profiler` trace (the
profiler's own cost rides on every op), the 25 ops whose time grows most at P + 1 rows.

    python op_split.py P [DTYPE]"""
import collections, os, re, sys, tempfile
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verify-rows-2026-12-05"))
import jax
from carryover_jax.bench.opprofile import _events, _OP
from batch1 import ar_and_rows_calls, prefilled, setup
P = int(sys.argv[1]); dtype = sys.argv[2] if len(sys.argv) > 2 else None
N, L = 32, 1024
b = setup(P, dtype); bx = prefilled(b, L)
calls = ar_and_rows_calls(b, bx, N)
per = {}
for k, f in calls.items():
    jax.block_until_ready(f()); jax.block_until_ready(f())
    d = tempfile.mkdtemp(); jax.profiler.start_trace(d)
    for _ in range(5): jax.block_until_ready(f())
    jax.profiler.stop_trace()
    agg = collections.defaultdict(float)
    for n, s0, e in _events(d):
        if _OP.match(n): agg[re.sub(r"\.\d+$", "", n)] += (e - s0) / 1e6 / (5 * N)
    per[k] = agg
names = sorted(set(per["ar"]) | set(per["t4"]), key=lambda n: -(per["t4"].get(n, 0) - per["ar"].get(n, 0)))
print(f"{'op':40s} {'ar ms':>8s} {'t4 ms':>8s} {'extra':>8s}")
for n in names[:25]:
    print(f"{n:40s} {per['ar'].get(n,0):8.3f} {per['t4'].get(n,0):8.3f} {per['t4'].get(n,0)-per['ar'].get(n,0):+8.3f}")
print("total", sum(per["ar"].values()), sum(per["t4"].values()))
