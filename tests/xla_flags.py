"""XLA settings for the test processes on a CPU-only machine, shared by conftest (this process) and the tests
that start `jax` in subprocesses (multi-host, sharded prepare). The tiny models' tests are bound by XLA
compile time (~55% of the suite's in-process time, tracing and lowering another ~25%), so the CPU compiler is
set for compile speed; XLA's HLO passes, and with them what a program computes, are unchanged (results move
in the last float32 bits only). Measured as `jax.jit(train_step, static_argnums=(0, 1)).lower(...).compile()`
time of test_dvd's TCFG / `_dc()` step (loss.mode baseline / dvd), a fresh process without the persistent
cache each, 2 cores:
- LLVM at -O0 without its expensive passes: compile 57 / 21 s (timed with the suite running beside it: an
  upper bound) -> 6 / 11 s, the step runs ~2x slower;
- the loop emitters instead of the MLIR fusion emitters: compile a further 3.6 / 6.3 s -> 2.0 / 3.2 s, the
  step ~20% slower.
A flag the installed jaxlib does not know aborts XLA at start-up ("Unknown flag in XLA_FLAGS"; jaxlib 0.12
dropped --xla_cpu_use_fusion_emitters, whose name is still in its library), so the flags are tried once per jaxlib
in a child process and only those it accepts are passed; the answer is kept beside the test cache."""

import functools
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                "--xla_cpu_use_fusion_emitters=false")
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")


def _probe(flags: list[str]) -> list[str]:
    """The flags a fresh CPU jax process starts with: each one XLA calls unknown is dropped and the rest
    tried again."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    while flags:
        env["XLA_FLAGS"] = " ".join(flags)
        r = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env, capture_output=True,
                           text=True, timeout=300)
        if r.returncode == 0:
            return flags
        named = {f.split("=")[0] for m in _UNKNOWN.finditer(r.stderr) for f in m.group(1).split()}
        kept = [f for f in flags if f.split("=")[0] not in named]
        # an abort naming no flag of ours: none of them is trusted
        flags = kept if len(kept) < len(flags) else []
    return flags


@functools.cache
def accepted_flags() -> tuple[str, ...]:
    """FAST_COMPILE's flags the installed jaxlib accepts (probed once per jaxlib build and Python)."""
    try:
        version = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return ()
    key = hashlib.sha1(f"{sys.prefix}|{version}|{FAST_COMPILE}".encode()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("CARRYOVER_CACHE") or os.path.expanduser("~/.cache/carryover_jax"),
                         f"xla-flags-{key}.txt")
    try:
        with open(cache) as f:
            return tuple(f.read().split())
    except OSError:
        pass
    flags = tuple(_probe(list(FAST_COMPILE)))
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(" ".join(flags))
        os.replace(tmp, cache)  # pytest-xdist workers may probe at once: whole files only
    except OSError:
        pass
    return flags


def cpu_xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a CPU-only jax process with `devices` host devices (None: XLA's default, one)."""
    flags = list(accepted_flags())
    if devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)
