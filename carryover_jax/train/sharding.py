"""One mesh helper and one table of logical-axis rules.

Meshes use Auto axes: linen's `with_logical_constraint` asserts under Explicit axes. A mesh axis that
does not divide a dimension is dropped for that dimension (replicated), so real models with odd head
counts (SmolLM2: 9 heads) still shard what they can.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from carryover_jax.config import MeshConfig
from carryover_jax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")
BATCH = ("data", "fsdp")
LOGICAL_RULES = (
    ("activation_batch", BATCH),
    ("activation_length", None),
    ("activation_embed", None),
    ("batch", BATCH),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("features", "fsdp"),
    ("rank", None),
    ("norm", None),
    ("head_dim", None),
    ("layers", None),
)


def mesh_sizes(cfg: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) of `cfg` on `num_devices` devices, its one -1 axis filled in."""
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    if sizes.count(-1) > 1:
        raise ConfigError("at most one mesh axis may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if num_devices % known:
            raise ConfigError(f"{num_devices} devices do not split into mesh axes {sizes}")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ConfigError(f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
    return tuple(sizes)


def make_mesh(cfg: MeshConfig = MeshConfig(), devices=None) -> jax.sharding.Mesh:
    devices = list(devices if devices is not None else jax.devices())
    return jax.make_mesh(mesh_sizes(cfg, len(devices)), AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def _fit(spec: P, shape, mesh) -> P:
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        if axes is None:
            out.append(None)
            continue
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        kept = []
        for a in names:
            if dim % (mesh.shape[a] * math.prod(mesh.shape[k] for k in kept)) == 0:
                kept.append(a)
        out.append(tuple(kept) if len(kept) > 1 else (kept[0] if kept else None))
    return P(*out)


def unbox_plain(tree):
    """Strip flax partitioning boxes without applying sharding constraints (safe under a set mesh)."""
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    return jax.tree_util.tree_map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, tree,
                                  is_leaf=is_box)


def shardings_from_boxed(boxed_abstract, mesh, rules=LOGICAL_RULES):
    """Boxed (logically partitioned) abstract params -> NamedSharding tree of the unboxed params."""
    specs = nn.get_partition_spec(boxed_abstract)
    shapes = unbox_plain(boxed_abstract)

    def one(spec, shaped):
        mesh_spec = nn.logical_to_mesh_axes(spec, rules) if isinstance(spec, P) else P()
        return NamedSharding(mesh, _fit(mesh_spec, shaped.shape, mesh))

    return jax.tree_util.tree_map(one, specs, shapes, is_leaf=lambda x: isinstance(x, P))


def replicated(tree, mesh):
    return jax.tree_util.tree_map(lambda _: NamedSharding(mesh, P()), tree)


def batch_sharding(mesh, ndim: int) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH, *([None] * (ndim - 1))))


def put_batch(batch: dict, mesh) -> dict:
    """Host-local numpy batch -> global arrays sharded over (data, fsdp). Each process passes its own
    slice; with one process this is a plain sharded device_put."""
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        out[k] = jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v)
    return out
