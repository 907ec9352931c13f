"""Helpers of the cross-platform lowering tests: lower a jitted program for CUDA or TPU from this CPU host
and read its StableHLO text (loops with a data-dependent trip count, Triton and Mosaic custom calls)."""

from __future__ import annotations

import re


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


# the GPU abstract meshes CUDA programs are traced under: Pallas's Triton lowering reads the compute capability at
# trace time, which jax >= 0.11 takes from the mesh's abstract device when no GPU is attached
CUDA_DEVICE_KIND = "NVIDIA H100 80GB HBM3"


def cuda_mesh():
    """A one-device abstract mesh of an H100, for `jax.sharding.use_abstract_mesh` around tracing for cuda."""
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType

    # Auto, not jax 0.12's default Explicit axes: sharding-in-types would check the Triton kernel's CPU
    # fallback (the Pallas interpreter) against a sharding it has no rule for
    return AbstractMesh((1,), ("data",), axis_types=(AxisType.Auto,),
                        abstract_device=AbstractDevice(device_kind=CUDA_DEVICE_KIND, num_cores=132, platform="cuda"))


_WHILE = re.compile(r"stablehlo\.while\((?P<init>[^)]*)\)")
_ALIAS = re.compile(r"(%\w+) = sdy\.sharding_constraint (%\w+) ")
_CONST = re.compile(r"^%c(st)?(_\d+)?$")  # MLIR's printer names constants %c, %c_N (int) and %cst, %cst_N


def lower_text(traced, platform: str) -> str:
    """StableHLO of a traced program lowered for `platform`.

    A Pallas Triton kernel lowered for cuda from this CPU host reads the GPU's compute capability: jax 0.10
    lowers it without a GPU; jax >= 0.11 takes it from an abstract CUDA device the program was TRACED under
    (`cuda_mesh`; entering it only around `lower` is not enough), not from the CUDA plugin."""
    return traced.lower(lowering_platforms=(platform,)).as_text()


def data_dependent_whiles(text: str) -> int:
    """How many `stablehlo.while` loops of the module have a trip count that is not a constant.

    A loop counts as constant when its condition is one `compare LT` of a loop-carried counter with a
    constant defined in the condition region and that counter starts at a constant: the form
    `lax.scan` and a `fori_loop` with Python-int bounds lower to. A `fori_loop` with traced bounds
    carries its upper bound as a loop argument, and a `while_loop` tests arbitrary state: both count.
    Traced under an abstract mesh (jax >= 0.11), the condition's values pass through replicated
    `sdy.sharding_constraint`s first: those are read through."""
    n = 0
    for m in _WHILE.finditer(text):
        inits = dict(p.split(" = ") for p in (s.strip() for s in m.group("init").split(",")) if " = " in p)
        rest = text[m.end():]
        cond = rest[rest.index("cond {") + len("cond {"):rest.index("} do {")]
        alias = dict(_ALIAS.findall(cond))
        consts = set(re.findall(r"(%c(?:st)?(?:_\d+)?) = stablehlo\.constant", cond))
        cmp = [tuple(alias.get(v, v) for v in c) for c in re.findall(r"stablehlo\.compare\s+LT,\s*(%\w+),\s*(%\w+)", cond)]
        lines = [ln for ln in cond.strip().splitlines() if ln.strip() and "sdy.sharding_constraint" not in ln]
        constant = (len(cmp) == 1 and len(lines) <= 3 and cmp[0][1] in consts
                    and bool(_CONST.match(inits.get(cmp[0][0], ""))))
        n += not constant
    return n
