"""Weight priors shared by the catalogue's models: a Gaussian on the weights and the scale it takes.

Every model puts an isotropic Gaussian on its Bayesian weights and differs only in how the
scale of that Gaussian is held (``prior=`` of :data:`pyro_invariance.models.base.PRIORS`)::

    "fixed"         σ                                  a constant (a buffer)
    "closed-form"   σ                                  a buffer that a type-II update sets
                                                       (:mod:`pyro_invariance.infer.prior_update`)
    "learned"       σ                                  a positive ``PyroParam`` (type-II maximum likelihood)
    "hierarchical"  σ ~ LogNormal(log σ₀, s)           a latent sample site (its median is σ₀)
    weights         θ ~ N(0, σ² I)                     :func:`normal_prior`

σ is a standard deviation (the invariant MLP's read-out, the symmetrised HNN's layers) or a
precision δ = σ⁻² (the layer-wise networks' pathways); :func:`add_prior_scale` declares either on a
``PyroModule`` under the name the model reads, :func:`scale_hyperprior` is the hierarchical
hyperprior, and :func:`normal_prior` the weights' Gaussian, which also takes a scale batched over
vectorised ELBO particles (a hierarchical σ under ``vectorize_particles=True`` has shape ``(P, 1)``).

Not to be confused with :mod:`pyro_invariance.symmetry.priors`: the priors over the symmetry
parameters η.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch import Tensor

__all__ = ["add_prior_scale", "normal_prior", "scale_hyperprior"]


def normal_prior(scale: Tensor | float, shape: Sequence[int], loc: Tensor | float = 0.0) -> dist.TorchDistribution:
    """``Normal(loc, scale).expand(shape).to_event(len(shape))``: the prior of a weight tensor of ``shape``.

    A ``scale`` batched over particles (``(*P, 1)``, a hierarchical prior scale under vectorised
    particles) gives batch shape ``scale.shape`` and event shape ``shape``; a scalar ``scale`` gives
    exactly the unbatched distribution.
    """
    shape = list(shape)
    if not isinstance(scale, Tensor) or scale.dim() == 0:
        return dist.Normal(loc, scale).expand(shape).to_event(len(shape))
    scale_b = scale.reshape(scale.shape + (1,) * len(shape))
    return dist.Normal(loc, scale_b).expand(list(scale.shape) + shape).to_event(len(shape))


def scale_hyperprior(loc: Tensor, scale: Tensor | float = 1.0) -> dist.LogNormal:
    """The hierarchical prior's hyperprior ``LogNormal(loc, scale)`` on a prior scale or precision
    (``loc`` is the log of its median)."""
    return dist.LogNormal(loc, scale)


def add_prior_scale(
    module: PyroModule,
    name: str,
    prior: str,
    init: float,
    *,
    hyperprior_scale: float = 1.0,
    log_init: float | None = None,
    hyperprior_buffer: bool = True,
) -> None:
    """Give ``module`` the prior scale (or precision) ``name``, held as ``prior`` says.

    ``"learned"``: a positive ``PyroParam`` starting at ``init``; ``"hierarchical"``: the sample
    site ``name ~ LogNormal(log init, hyperprior_scale)`` (:func:`scale_hyperprior`) with its
    location in the buffer ``{name}_loc``; ``"fixed"`` / ``"closed-form"``: the buffer ``name``
    (which a closed-form update may overwrite).

    Args:
        log_init: the hyperprior's location as a Python float (log taken in double precision,
            then stored as a float32 tensor); default: the log of the float32 ``init``.
        hyperprior_buffer: store ``hyperprior_scale`` in the buffer ``{name}_hyperscale`` (moved
            and saved with the module); ``False`` keeps it a constant, so the module's buffers and
            state dict hold only the location.
    """
    value = torch.tensor(float(init))
    if prior == "learned":
        setattr(module, name, PyroParam(value, constraint=constraints.positive))
    elif prior == "hierarchical":
        loc_name, hyper_name = f"{name}_loc", f"{name}_hyperscale"
        module.register_buffer(loc_name, value.log() if log_init is None else torch.tensor(log_init))
        if hyperprior_buffer:
            module.register_buffer(hyper_name, torch.tensor(float(hyperprior_scale)))
            setattr(module, name, PyroSample(lambda m: scale_hyperprior(getattr(m, loc_name), getattr(m, hyper_name))))
        else:
            hyper = float(hyperprior_scale)
            setattr(module, name, PyroSample(lambda m: scale_hyperprior(getattr(m, loc_name), hyper)))
    else:
        module.register_buffer(name, value)
