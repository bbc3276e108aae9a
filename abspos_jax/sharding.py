"""Meshes and sharding rules (pjit semantics through ``jax.jit`` + ``NamedSharding``).

Parameters carry logical axis names (``logical_axes`` metadata, e.g.
``("embed", "mlp")``). ``config.mesh.rules`` maps each logical name to mesh
axes, maxtext style; mesh axes absent from the mesh, or that do not divide the
dimension, are dropped (that dimension is replicated instead).
"""

from collections.abc import Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from abspos_jax.config import resolve_mesh_shape


def make_mesh(config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The mesh of ``config.mesh`` over ``devices`` (default: all devices, every process)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_mesh_shape(config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), tuple(config.mesh.axes))


def logical_to_spec(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Sequence[tuple[str, object]]) -> PartitionSpec:
  """PartitionSpec for an array of ``shape`` whose axes have logical names ``logical_axes``."""
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for name, size in zip(logical_axes, shape):
    target = table.get(name) if name is not None else None
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    kept, n = [], 1
    for axis in targets:
      if axis in mesh.shape and axis not in used and size % (n * mesh.shape[axis]) == 0:
        kept.append(axis)
        n *= mesh.shape[axis]
    used.update(kept)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*spec)


def tree_shardings(tree, mesh: Mesh, rules) -> object:
  """NamedShardings for a pytree holding ``nnx.Variable`` nodes (params, optimizer moments).

  Variables with ``logical_axes`` metadata follow the rules; every other leaf
  (step counters, scalars) is replicated. The result is a tree prefix of ``tree``.
  """
  def one(x):
    if isinstance(x, nnx.Variable):
      axes = x.get_metadata().get("logical_axes")
      if axes is not None:
        return NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules))
    return NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Sharding of a ``[batch, ...]`` array: batch split over the rule for ``batch``."""
  return NamedSharding(mesh, logical_to_spec(("batch",), (mesh.size,), mesh, rules))


def stacked(shardings):
  """The shardings of a tree stacked on a new leading axis (one copy per seed), that axis replicated.

  ``PartitionSpec(a, b)`` becomes ``PartitionSpec(None, a, b)``: every device
  holds the same slices of all copies it held of one.
  """
  return jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(None, *s.spec)), shardings)
