"""The CPU kernels: XLA FFI custom calls in C++ (`cpu_products.cc`, `cpu_attention.cc`, `cpu_logsumexp.cc`,
sharing `cpu_common.h`), built into one library once per machine with the system's C++ compiler, cached in
`$CARRYOVER_CACHE/cpu-kernels`, and registered with XLA once per process.

Where the library cannot be built (no C++ compiler) each user falls back to XLA's own ops with one warning
line (`register`); `CARRYOVER_CPU_KERNELS=0` turns the kernels off.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import jax

from carryover_jax.numerics import warn_once
from carryover_jax.paths import cache_dir

SOURCES = tuple(Path(__file__).with_name(n) for n in ("cpu_products.cc", "cpu_attention.cc", "cpu_logsumexp.cc"))
HEADERS = (Path(__file__).with_name("cpu_common.h"),)
_REGISTERED: set[str] = set()  # the custom calls this process has registered
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")


def _cpu_identity() -> str:
    """What `-march=native` compiles for: the CPU's model and feature flags (a cache folder shared between
    machines must not hand one CPU's build to another)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return platform.processor() or platform.machine()


def _compile(cxx: str, out: Path, native: bool) -> str | None:
    """Build the library into `out` (atomically: a temporary file, then a rename); None or the error."""
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    cmd = [cxx, *_FLAGS, *(["-march=native"] if native else []), "-I", jax.ffi.include_dir(), "-I",
           str(HEADERS[0].parent), *map(str, SOURCES), "-o", str(tmp)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = r.stderr.strip().splitlines() or [f"exit {r.returncode}"]
        return next((ln for ln in lines if "error" in ln), lines[-1])
    os.replace(tmp, out)
    return None


def build() -> Path:
    """The built library (compiled on first use, then reused). Raises RuntimeError saying why it cannot be."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler (set CXX, or install g++)")
    import jaxlib

    key = hashlib.sha256("\n".join([*(p.read_text() for p in (*SOURCES, *HEADERS)), jaxlib.__version__, cxx,
                                    " ".join(_FLAGS), platform.machine(), _cpu_identity()]).encode()).hexdigest()[:16]
    out = cache_dir() / "cpu-kernels" / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    err = _compile(cxx, out, native=True)
    if err is not None and _compile(cxx, out, native=False) is not None:  # a compiler without -march=native
        raise RuntimeError(f"{cxx} failed: {err}")
    return out


def library():
    """The built library, loaded (ctypes), for the plain C functions it exports beside the custom calls."""
    import ctypes

    return ctypes.cdll.LoadLibrary(str(build()))


def register(symbols: dict[str, str], fallback: str) -> bool:
    """Register the custom calls {target name: library symbol} with XLA (once per process); False where the
    kernels are off or cannot be built, with one warning line "`fallback` (why)"."""
    if os.environ.get("CARRYOVER_CPU_KERNELS", "1") == "0":
        return False
    try:
        lib = library()
        for target, symbol in symbols.items():
            if target not in _REGISTERED:
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
                _REGISTERED.add(target)
    except (RuntimeError, OSError, AttributeError) as e:
        warn_once(f"{fallback}: the CPU kernel is unavailable ({' '.join(str(e).split())})")
        return False
    return True
