"""Huge pages for the weights, in one process: a copy of the target's weights collapsed into transparent huge pages
(madvise MADV_COLLAPSE, Linux 6.1+) against the plain weights, batch-1 AR loops alternated with an A/A.

    python huge_pages.py ROUNDS"""
import ctypes, functools, os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "verify-rows-2026-12-05"))
import jax, numpy as np
from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.eval.paired import speed_ratio
from batch1 import ar_body, looped, prefilled, setup
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
H = 2 << 20
def collapse(tree):
    done = 0
    for x in jax.tree.leaves(tree):
        if x.nbytes < H // 4: continue
        p = x.unsafe_buffer_pointer(); a = p // H * H; e = (p + x.nbytes + H - 1) // H * H
        r = libc.madvise(a, e - a, 25)
        if r != 0: print("errno", ctypes.get_errno(), x.shape)
        done += e - a
    return done
def rss():
    return [l.split()[1] for l in open("/proc/self/smaps_rollup") if "AnonHuge" in l][0]
R = int(sys.argv[1]); N, L = 32, 1024
b = setup(3); bx = prefilled(b, L)
tp2 = jax.tree.map(lambda x: x + 0, b.tp); jax.block_until_ready(tp2)
print("huge before", rss()); t = time.perf_counter(); n = collapse(tp2)
print(f"collapsed {n/2**20:.0f} MiB in {time.perf_counter()-t:.2f} s; huge after", rss())
f = looped(ar_body(b), N)
calls = {"plain": functools.partial(f, b.tp, (bx["cache"], bx["tok"])),
         "huge": functools.partial(f, tp2, (bx["cache"], bx["tok"]))}
calls["plain again"] = calls["plain"]
outs = {k: np.asarray(jax.block_until_ready(c())[1]) for k, c in calls.items()}
assert all((o == outs["plain"]).all() for o in outs.values())
secs = rotated_seconds(calls, R)
for k in calls:
    r = speed_ratio(secs[k], secs["plain"])
    print(f"{k:12s} {1e3*np.median(secs[k])/N:7.2f} ms  /plain {r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]")
