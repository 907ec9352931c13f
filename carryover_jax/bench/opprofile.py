"""Where a jitted step's wall-clock time goes, from a `jax.profiler` trace: each timed call's window (dispatch
to `block_until_ready`) split into the XLA ops that ran in it, grouped by kind, and the idle rest.

Every op event of the trace is attributed exclusively: events of all threads are swept in start order and each
instant of the window goes to the op that covers it first, so a matmul run by two threads at once counts once
and the kinds and the idle time add up to the window. What counts as "idle" is the host's part of the call
(dispatching the arguments, waiting for the executor) and gaps between ops; a `lax.while_loop` of a whole
decode has no per-step dispatch, so on the host backends the op kinds are what a step costs there.

`bench decode --breakdown --profile` prints one row per step kind (AR step, draft, verify, round)."""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections import Counter
from typing import Any, Callable

import jax

# op kinds by event name (XLA's CPU thunks: a dot runs as `dot` or inside a library fusion; an `ffi_call` is one
# of the CPU kernels of models/cpu_*.cc, the few-row products or the cache attention (a trace does not say
# which); einsum's live-length cache read of `attention_core` is a `while`)
KINDS = (("matmul", re.compile(r"^(dot|convolution|[xy]nn_fusion|onednn|custom-call)")),
         ("CPU kernels", re.compile(r"^ffi_call")),
         ("attention loop", re.compile(r"^while")),
         ("cache write", re.compile(r"dynamic-update-slice|scatter")),
         ("cache read", re.compile(r"dynamic-slice|gather")),
         ("reduce / sort", re.compile(r"reduce|sort|argmax|top-?k")))
OTHER = "other ops"
# an XLA op event: a lower-case HLO instruction name, optionally numbered (`ynn_fusion.12`); host events have
# spaces, `::`, `$` or parentheses
_OP = re.compile(r"^[a-z][a-z0-9_\-]*(\.\d+)?$")
_MARK = "carryover: timed call"  # not an op name (_OP)


def kind_of(name: str) -> str:
    base = re.sub(r"\.\d+$", "", name)
    return next((k for k, pat in KINDS if pat.search(base)), OTHER)


def _events(trace_dir: str) -> list[tuple[str, int, int]]:
    """(name, start ns, end ns) of every event of the newest trace under `trace_dir`."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    data = jax.profiler.ProfileData.from_file(files[-1])
    return [(ev.name, ev.start_ns, ev.end_ns) for plane in data.planes for line in plane.lines for ev in line.events]


def split_windows(events: list[tuple[str, int, int]], windows: list[tuple[int, int]]) -> dict[str, Any]:
    """Mean exclusive time (ms) per window of each op kind, of the six costliest ops (by name, numbering dropped)
    and of idle time."""
    ops = sorted((s, e, n) for n, s, e in events if _OP.match(n))
    kinds, names, total = Counter(), Counter(), 0
    for w0, w1 in windows:
        cur = w0
        for s, e, n in ops:
            if s >= w1:
                break
            if e <= cur:
                continue
            t = min(e, w1) - max(s, cur)
            kinds[kind_of(n)] += t
            names[re.sub(r"\.\d+$", "", n)] += t
            cur = min(e, w1)
        total += w1 - w0
    k = max(len(windows), 1)
    window = total / k / 1e6
    out = {"window_ms": round(window, 3),
           "kinds_ms": {name: round(kinds[name] / k / 1e6, 3) for name, _ in KINDS + ((OTHER, None),)},
           "top_ops_ms": {n: round(v / k / 1e6, 3) for n, v in names.most_common(6)}}
    out["idle_ms"] = round(window - sum(out["kinds_ms"].values()), 3)
    return out


def profile_calls(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, Any]]:
    """Trace `repeats` calls of each function (after one untraced call) and split each call's window."""
    out = {}
    for name, fn in fns.items():
        jax.block_until_ready(fn())
        with tempfile.TemporaryDirectory(prefix="carryover-profile-") as d:
            jax.profiler.start_trace(d)
            try:
                for _ in range(repeats):
                    with jax.profiler.TraceAnnotation(_MARK):
                        jax.block_until_ready(fn())
            finally:
                jax.profiler.stop_trace()
            events = _events(d)
        windows = sorted((s, e) for n, s, e in events if n == _MARK)
        if len(windows) != repeats:
            raise RuntimeError(f"the trace holds {len(windows)} of {repeats} call markers")
        out[name] = split_windows(events, windows[1:] if repeats > 1 else windows)  # the first call warms the trace
    return out


def format_profile(prof: dict[str, dict[str, Any]]) -> str:
    kinds = [k for k, _ in KINDS] + [OTHER]
    lines = ["| step | window ms | " + " | ".join(kinds) + " | idle (host, gaps) | top ops |",
             "|---" * (len(kinds) + 4) + "|"]
    for name, p in prof.items():
        top = ", ".join(f"{n} {v}" for n, v in list(p["top_ops_ms"].items())[:3])
        lines.append(f"| {name} | {p['window_ms']} | " + " | ".join(str(p["kinds_ms"][k]) for k in kinds)
                     + f" | {p['idle_ms']} | {top} |")
    return "\n".join(lines)
