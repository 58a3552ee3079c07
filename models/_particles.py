"""Vectorised ELBO particles: the shapes a batched model call sees (:attr:`CatalogueModel.vectorizable_particles`).

Under ``Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)`` Pyro runs the
model and the guide inside a plate of size P at dim ``-max_plate_nesting - 1 = -2``, left of the data
plate (dim -1). Every global site (weights, prior scales, a latent η) then has the value shape
``(P, 1, *event)``: the particle dim, then a 1 where the data plate sits. ``Predictive(parallel=True)``
and the bounds' ``vectorize=True`` (:mod:`pyro_invariance.infer.bounds`) use the same layout. A
model that supports it computes ``(*P, B, ...)`` outputs, one slice per particle.

The helpers here read that layout: :func:`plate_particle_shape` from the plates active around a
model call (before any site is sampled, so that a model keeps its order of sites and random draws),
:func:`site_particle_shape` from a sampled value; :func:`drop_data_dim` removes the data plate's 1.
A weight prior whose scale is itself batched over particles (a hierarchical prior scale) is
:func:`pyro_invariance.weight_priors.normal_prior`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pyro.poutine.runtime import get_plates
from torch import Tensor

__all__ = ["drop_data_dim", "num_particles", "plate_particle_shape", "site_particle_shape"]


def plate_particle_shape() -> torch.Size:
    """The particle shape of the vectorised plates active around this model call: the batch shape
    they give a global site, without its last dim (the data plate's, dim -1). ``()`` outside any
    plate (one sequential particle); ``(P,)`` under ``vectorize_particles=True`` with
    ``max_plate_nesting=1``."""
    frames = [f for f in get_plates() if f.vectorized and f.dim is not None]
    if not frames:
        return torch.Size()
    shape = [1] * max(-f.dim for f in frames)
    for f in frames:
        shape[f.dim] = f.size
    if shape[-1] != 1:
        raise ValueError(
            f"a plate occupies dim -1 around the model ({[(f.name, f.dim) for f in frames]}); dim -1 is the "
            "data plate's: put particle plates left of it (max_plate_nesting=1)"
        )
    return torch.Size(shape[:-1])


def site_particle_shape(value: Tensor, event_dim: int) -> torch.Size:
    """The particle shape of a global site's ``value`` with ``event_dim`` event dims: its batch shape
    without the trailing data-plate dim, which must be 1 (``()`` for an unbatched value)."""
    batch = value.shape[: value.dim() - event_dim]
    if not batch:
        return torch.Size()
    if batch[-1] != 1:
        raise ValueError(
            f"a batched global site must have shape (..., 1, *event) (the 1 at the data plate's dim -1), "
            f"got {tuple(value.shape)} with {event_dim} event dims"
        )
    return torch.Size(batch[:-1])


def drop_data_dim(value: Tensor, event_dim: int) -> Tensor:
    """``value`` ``(*P, 1, *event)`` → ``(*P, *event)``; an unbatched value is returned as is."""
    if value.dim() == event_dim:
        return value
    site_particle_shape(value, event_dim)  # checks the 1
    return value.squeeze(value.dim() - event_dim - 1)


def num_particles(shape: Sequence[int]) -> int:
    """Number of particles of a particle shape (1 for ``()``)."""
    return math.prod(shape)
