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
A flag the installed jaxlib does not know would abort XLA at start-up, so each is passed only where the
library registers it."""

import functools
import glob
import importlib.util
import mmap
import os

FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                "--xla_cpu_use_fusion_emitters=false")


@functools.cache
def _registered(name: str) -> bool:
    """Whether jaxlib's shared libraries hold the flag's name (XLA registers flags by name)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.origin:
        return False
    for lib in glob.glob(os.path.join(os.path.dirname(spec.origin), "*.so")):
        with open(lib, "rb") as f:
            try:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    if m.find(name.encode()) >= 0:
                        return True
            except ValueError:  # an empty file cannot be mapped
                continue
    return False


def cpu_xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a CPU-only jax process with `devices` host devices (None: XLA's default, one)."""
    flags = [f for f in FAST_COMPILE if _registered(f[2:].split("=")[0])]
    if devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)
