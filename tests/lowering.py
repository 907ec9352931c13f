"""Helpers of the cross-platform lowering tests: lower a jitted program for CUDA or TPU from this CPU host
and read its StableHLO text (loops with a data-dependent trip count, Triton and Mosaic custom calls)."""

from __future__ import annotations

import re

import jax
import pytest

TRITON_CALL = "__gpu$xla.gpu.triton"
TPU_CALL = "@tpu_custom_call"  # a Mosaic kernel
# device kinds of the abstract meshes TPU programs are lowered under (what Pallas's TPU lowering reads
# for chip-specific layouts when no TPU is attached)
TPU_DEVICE_KINDS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v7x": "TPU7x"}


def tpu_mesh(chip: str):
    """A one-device abstract mesh of a TPU chip ("v5e", "v6e", "v7x"), for `jax.sharding.use_abstract_mesh`."""
    from jax.sharding import AbstractDevice, AbstractMesh

    return AbstractMesh((1,), ("data",), abstract_device=AbstractDevice(device_kind=TPU_DEVICE_KINDS[chip],
                                                                        num_cores=1, platform="tpu"))
_WHILE = re.compile(r"stablehlo\.while\((?P<init>[^)]*)\)")
_CONST = re.compile(r"^%c(st)?(_\d+)?$")  # MLIR's printer names constants %c, %c_N (int) and %cst, %cst_N


def lower_text(traced, platform: str) -> str:
    """StableHLO of a traced program lowered for `platform`.

    A Pallas Triton kernel lowered for cuda from this CPU host reads the GPU's compute capability: jax 0.10
    lowers it without a GPU; jax >= 0.11 needs an abstract CUDA device while the program is TRACED (trace
    and lower under `jax.sharding.use_abstract_mesh(AbstractMesh(..., abstract_device=AbstractDevice(
    platform="cuda", device_kind="NVIDIA H100 80GB HBM3", num_cores=132)))`; entering it only around
    `lower` is not enough), not the CUDA plugin. That failure skips the test, saying so; any other raises."""
    try:
        return traced.lower(lowering_platforms=(platform,)).as_text()
    except Exception as e:  # noqa: BLE001 - only the known missing-device failure is turned into a skip
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if platform == "cuda" and jax.__version_info__ >= (0, 11) and "AbstractDevice" in msg:
            pytest.skip(f"lowering a Pallas Triton kernel for cuda from a CPU host with jax {jax.__version__} needs an "
                        "abstract CUDA device at trace time (jax.sharding.use_abstract_mesh with an AbstractMesh of "
                        f"AbstractDevice(platform='cuda'); jax 0.10 needs none): {msg}")
        raise


def data_dependent_whiles(text: str) -> int:
    """How many `stablehlo.while` loops of the module have a trip count that is not a constant.

    A loop counts as constant when its condition is one `compare LT` of a loop-carried counter with a
    constant defined in the condition region and that counter starts at a constant: the form
    `lax.scan` and a `fori_loop` with Python-int bounds lower to. A `fori_loop` with traced bounds
    carries its upper bound as a loop argument, and a `while_loop` tests arbitrary state: both count."""
    n = 0
    for m in _WHILE.finditer(text):
        inits = dict(p.split(" = ") for p in (s.strip() for s in m.group("init").split(",")) if " = " in p)
        rest = text[m.end():]
        cond = rest[rest.index("cond {") + len("cond {"):rest.index("} do {")]
        consts = set(re.findall(r"(%c(?:st)?(?:_\d+)?) = stablehlo\.constant", cond))
        cmp = re.findall(r"stablehlo\.compare\s+LT,\s*(%\w+),\s*(%\w+)", cond)
        lines = [ln for ln in cond.strip().splitlines() if ln.strip()]
        constant = (len(cmp) == 1 and len(lines) <= 3 and cmp[0][1] in consts
                    and bool(_CONST.match(inits.get(cmp[0][0], ""))))
        n += not constant
    return n
