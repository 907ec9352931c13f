"""The prepared device check (`launch/device_check.sh`): one call of at most ~4 minutes on a lent GPU, or
unchanged on a TPU VM (there the kernel backends are "mosaic" and "auto", the memory is the TPU program's
and the device tests are tests/test_tpu_lowering.py: the TPU compiler on the VM's own libtpu).

Parts, in order of priority, each skipped (and said so) once the budget is spent:
1. kernel checks on the device: each backend (pallas, auto, cudnn) against einsum — training's
   anchor-prefix attention, output and gradients, and a live-length decode read — at head dims 128,
   256 and 512 (`bench.steps.kernel_check`);
2. `carryover bench steps` (`bench.steps.run`) at Qwen3-4B shapes, bf16, context 4096, 15 proposals:
   AR step / its weight-read floor, draft / verify / round / AR for "auto" and "einsum", the baseline
   and DVD training steps' time and MFU (FLOPs counted: `bench.flops.TRAIN_FLOPS_DOC`), and a
   `jax.profiler` trace of one round (compressed into the output);
3. compiled per-device memory of the paper configs' micro-step with the device's own compiler
   (`bench.train.compiled_memory`): one GPU compiles one device's program of a data-parallel node at
   the configs' micro-batch per device (what the CPU proxy of `bench train --memory` can be held against);
4. the `gpu`-marked tests on the device (tests/test_gpu.py), then, if time remains, the fast test
   suite on the device's jax / Python, CPU platform, `-x`, capped.

Everything goes to `--out` as `device-check.json`, `device-check.md`, `trace-round.tar.gz` and
`tests.txt` (<= 8 files). `--dry-run` runs every part at toy scale on this machine, with grain and
gguf made unimportable (the device image lacks them; the check must not need them), and prints the
carry set of the device call (the wheels the test suite needs) and its size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# what the device image lacks (/work/shared/spec/device.md): the check itself must not import them
NOT_ON_DEVICE = ("grain", "gguf")
WHEELS = ".whl"  # wheels of what the test suite needs and the image lacks (grain and its deps, gguf)
CARRY_LIMIT = 64 * 2 ** 20  # one device call's transfer (working tree + carry)


class _Blocked:
    """A meta-path finder that makes `names` unimportable, as on the device image."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"{name} is not on the device image (dry run)")
        return None


def _tree_bytes(root: Path) -> int:
    """Bytes of the working tree a device call copies: tracked + untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True)
    if out.returncode:
        return -1
    total = 0
    for name in out.stdout.decode().split("\0"):
        p = root / name
        if name and p.is_file():
            total += p.stat().st_size
    return total


def carry_set(root: Path) -> dict[str, Any]:
    """The `carry` paths of the device call and their size: the wheels folder if it is there."""
    whl = root / WHEELS
    files = sorted(whl.glob("*.whl")) if whl.is_dir() else []
    size = sum(f.stat().st_size for f in files)
    tree = _tree_bytes(root)
    return {"carry": [WHEELS] if files else [], "carry_bytes": size, "wheels": [f.name for f in files],
            "tree_bytes": tree, "fits": tree >= 0 and tree + size <= CARRY_LIMIT}


def _numerics(dtype: str):
    """This platform's numerics (cuda on the device: attention "auto", the plain LM head) in `dtype`."""
    from carryover_jax.numerics import Numerics

    return Numerics.for_platform(None, dtype=dtype)


def _qwen3_4b():
    from carryover_jax.config import preset

    return preset("qwen3-4b").with_numerics(_numerics("bfloat16"))


def _toy_target():
    from carryover_jax.config import preset

    return preset("qwen3-4b").replace(num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4,
                                      num_kv_heads=2, head_dim=32, vocab_size=1024).with_numerics(_numerics("float32"))


_AS_TPU = []  # --tpu: a dry run takes the TPU VM's parts (the Mosaic kernel interpreted, the TPU numerics)


def _on_tpu() -> bool:
    """On a TPU VM the kernels are Mosaic's ("mosaic", and "auto" takes it), the memory is the TPU program's."""
    import jax

    return jax.default_backend() == "tpu" or bool(_AS_TPU)


def _kernels(res: dict, dry: bool, deadline: float):
    from carryover_jax.bench import steps

    tcfg = _toy_target() if dry else _qwen3_4b()
    shape = dict(queries=2 * 16, keys=64, block=16, context=40, decode_queries=4) if dry else \
        dict(queries=64 * 16, keys=2048, block=16, context=4096, decode_queries=16)
    rows = []
    for d in (128, 256, 512):
        if time.monotonic() > deadline:
            rows.append({"head_dim": d, "skipped": "budget spent"})
            continue
        backends = ("mosaic", "auto") if _on_tpu() else ("pallas", "auto") + (("cudnn",) if d == 128 else ())
        rows += steps.kernel_check(tcfg.replace(head_dim=d), backends, **shape)
    res["kernel_check"] = rows


def _steps(res: dict, dry: bool, deadline: float, trace_dir: str, save):
    from carryover_jax.bench import steps

    if dry:
        tcfg = _toy_target()
        kw = dict(proposals=3, draft_layers=1, context=48, train_len=64, anchors=4, repeats=2)
    else:
        tcfg = _qwen3_4b()
        kw = dict(proposals=15, draft_layers=5, context=4096, train_len=4096, anchors=512, repeats=10)
    res["steps"] = steps.run(tcfg, kind="dflash", layout="zlab", batch=1, train_batch=1,
                             backends=("auto", "einsum"), train_modes=("baseline", "dvd"), train_backends=("auto",),
                             kernel_backends=(), trace_dir=trace_dir, deadline=deadline,
                             on_row=lambda rows: (res.__setitem__("steps_partial", list(rows)), save()), **kw)
    res.pop("steps_partial", None)


def _memory(res: dict, dry: bool, deadline: float):
    import dataclasses

    from carryover_jax.bench.train import compiled_memory
    from carryover_jax.config import DrafterConfig, MeshConfig, preset
    from carryover_jax.configs import load_config

    rows = []
    for name, pre, mode in (("qwen3_4b", "qwen3-4b", None), ("gemma4_12b", "gemma4-12b", None),
                            ("qwen3_4b", "qwen3-4b", "dvd")):
        if time.monotonic() > deadline:
            rows.append({"config": name, "skipped": "budget spent"})
            continue
        cfg = load_config(name)
        cfg = cfg.with_loss(mode=mode) if mode else cfg
        cfg = cfg.replace(mesh=MeshConfig(data=-1))  # one node, data parallel: one device's program here
        tcfg = preset(pre)
        if dry:  # the same function on toy shapes: a 2-layer target, short sequences, few anchors
            tcfg = _toy_target() if pre == "qwen3-4b" else tcfg.replace(
                num_layers=2, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32,
                global_head_dim=64, num_global_kv_heads=1, vocab_size=1024,
                layer_types=("sliding_attention", "full_attention")).with_numerics(_numerics("float32"))
            cfg = cfg.replace(batch_size=2, grad_accum_steps=1, num_anchors=4,
                              data=dataclasses.replace(cfg.data, max_len=64),
                              drafter=dataclasses.replace(cfg.drafter, num_layers=1, target_layer_ids=(0,),
                                                          mask_token_id=0, markov_rank=8))
        try:
            dcfg = DrafterConfig.for_target(tcfg, cfg.drafter)
            rows.append({"config": name, **compiled_memory(cfg, tcfg, dcfg, devices=2 if dry else 8, backend="auto",
                                                           platform="tpu" if _on_tpu() else "cuda")})
        except Exception as e:  # noqa: BLE001 - the check reports every part
            rows.append({"config": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"})
    res["memory"] = rows


def _pytest(args: list[str], env: dict, timeout: float, root: Path) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=max(int(timeout), 1))
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
    return {"rc": rc, "seconds": round(time.monotonic() - t, 1), "summary": tail[0][:300],
            "command": "python -m pytest " + " ".join(cmd[3:])}, text


def _tests(res: dict, out: Path, dry: bool, deadline: float, root: Path):
    """The `gpu`-marked tests on the device (tests/test_gpu.py: compiled kernels, bf16 speculative == AR),
    then the fast suite on the device's jax / Python on the CPU platform, `-x`, capped at the time left
    (dry run: the gpu tests skip here, and one file of the suite is only collected: the command line
    and the marker expression are what it checks)."""
    texts = []
    device_tests = (("tpu_tests", ["-x", "tests/test_tpu_lowering.py"]) if _on_tpu() else
                    ("gpu_tests", ["-x", "-m", "gpu", "tests/test_gpu.py"]))
    for name, args, env in (
            (*device_tests, dict(os.environ)),
            ("tests", ["-x", "-n", "0", "-m", "not slow and not gpu"] + (["--collect-only", "tests/test_lowering.py"]
                                                                           if dry else []),
             dict(os.environ, JAX_PLATFORMS="cpu"))):
        left = deadline - time.monotonic()
        if left < 30 and not dry:
            res[name] = {"skipped": f"{max(int(left), 0)} s left"}
            continue
        res[name], text = _pytest(args, env, 600 if dry else left, root)
        texts.append(f"==== {res[name]['command']}\n{text[-200_000:]}")
    if texts:
        (out / "tests.txt").write_text("\n".join(texts))


def _pack_trace(trace_dir: str, out: Path):
    """The profiler trace of one round, compressed (xplane protobufs shrink ~5-10x)."""
    if any(p.is_file() for p in Path(trace_dir).rglob("*")):
        with tarfile.open(out / "trace-round.tar.gz", "w:gz") as tar:
            tar.add(trace_dir, arcname="trace-round")


def _markdown(res: dict) -> str:
    from carryover_jax.bench import steps

    lines = ["# Device check", "", f"- command: `{res['command']}`", f"- device: {res['env'].get('device')}",
             f"- jax {res['env'].get('jax')}, Python {res['env'].get('python')}", f"- wall: {res['wall_s']} s", ""]
    if "kernel_check" in res:
        lines += ["## Kernels vs einsum (max abs diff / max abs)", "", "| backend | head dim | train out | grads | "
                  "decode out | error |", "|---|---|---|---|---|---|"]
        for c in res["kernel_check"]:
            lines.append(f"| {c.get('backend', '-')} | {c.get('head_dim')} | {c.get('train_out_rel', '-')} | "
                         f"{c.get('train_grad_rel', '-')} | {c.get('decode_out_rel', '-')} | "
                         f"{c.get('error', c.get('skipped', ''))} |")
    if "steps" in res:
        lines += ["", "## bench steps", "", steps.format_table(res["steps"])]
    if "memory" in res:
        lines += ["", "## Compiled memory per device (data parallel)", "", "| config | mode | devices | total GB | "
                  "temp GB | method / error |", "|---|---|---|---|---|---|"]
        for r in res["memory"]:
            lines.append(f"| {r['config']} | {r.get('mode', '-')} | {r.get('devices', '-')} | {r.get('total_gb', '-')} | "
                         f"{r.get('temp_gb', '-')} | {r.get('error', r.get('skipped', r.get('method', '')))} |")
    for key, title in (("gpu_tests", "gpu-marked tests on the device"),
                       ("tpu_tests", "TPU compile tests on the device"), ("tests", "Fast test suite (CPU platform)")):
        if key in res:
            lines += ["", f"## {title}", "", f"`{res[key]}`"]
    for k, v in res.get("errors", {}).items():
        lines.append(f"\n**{k} failed**: {v}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="device_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/device-check"))
    ap.add_argument("--dry-run", action="store_true", help="every part at toy scale here, the image's imports")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for all parts (default 180 on the "
                    "device: a part started before it may run ~60 s past it, so the call's timeout_s is 240; none "
                    "in a dry run, which runs every part)")
    ap.add_argument("--no-tests", action="store_true", help="skip the test suite part")
    ap.add_argument("--tpu", action="store_true", help="with --dry-run: the parts a TPU VM runs")
    args = ap.parse_args(argv)
    if args.tpu and not args.dry_run:
        ap.error("--tpu goes with --dry-run (on a TPU VM the check finds the TPU itself)")
    _AS_TPU[:] = [True] if args.tpu else []
    root = Path(__file__).resolve().parents[2]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    deadline = t0 + (args.budget_s if args.budget_s is not None else 1e9 if args.dry_run else 180.0)
    if args.dry_run:
        sys.meta_path.insert(0, _Blocked(NOT_ON_DEVICE))
        for name in NOT_ON_DEVICE:
            sys.modules.pop(name, None)
    import jax

    dev = jax.devices()[0]
    res: dict[str, Any] = {
        "command": " ".join(["bash launch/device_check.sh"] + ["--dry-run"] * args.dry_run + ["--tpu"] * args.tpu),
        "dry_run": args.dry_run,
        "env": {"jax": jax.__version__, "python": platform.python_version(), "backend": jax.default_backend(),
                "device": f"{dev.platform}: {getattr(dev, 'device_kind', dev)}", "devices": jax.device_count()},
        "errors": {},
    }
    print(json.dumps(res["env"]), flush=True)
    trace_dir = tempfile.mkdtemp(prefix="carryover-trace-")
    parts = [("kernel_check", lambda: _kernels(res, args.dry_run, deadline)),
             ("steps", lambda: _steps(res, args.dry_run, deadline, trace_dir, lambda: _write(res, out, t0))),
             ("trace", lambda: _pack_trace(trace_dir, out)),
             ("memory", lambda: _memory(res, args.dry_run, deadline))]
    for name, fn in parts:
        if time.monotonic() > deadline and name != "trace":
            res["errors"][name] = "skipped: budget spent"
            continue
        t = time.monotonic()
        print(f"device check: {name} ...", file=sys.stderr, flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failing part must not lose the others' results
            res["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        res.setdefault("part_s", {})[name] = round(time.monotonic() - t, 1)
        _write(res, out, t0)  # after every part: a call cut short keeps what was done
    if not args.no_tests:
        if args.dry_run:  # the wheels stand in for the image's missing packages
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Blocked)]
        _tests(res, out, args.dry_run, deadline, root)
    _write(res, out, t0)
    if args.dry_run:
        c = carry_set(root)
        print(f"carry set: {json.dumps(c['carry'])} ({c['carry_bytes'] / 2 ** 20:.1f} MiB: {', '.join(c['wheels']) or '-'}); "
              f"working tree {c['tree_bytes'] / 2 ** 20:.1f} MiB; within the 64 MiB of one call: {c['fits']}")
        files = sorted(p.name for p in out.iterdir())
        print(f"output files ({len(files)}): {', '.join(files)}")
    return 0


def _write(res: dict, out: Path, t0: float):
    res["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "device-check.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "device-check.md").write_text(_markdown(res))


if __name__ == "__main__":
    sys.exit(main())
