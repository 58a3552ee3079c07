"""A guide in which the weights' distribution depends on the symmetry: ``q(η) q(θ | η)``.

For a model with a latent η (``symmetry_prior``, :mod:`pyro_invariance.symmetry.priors`) the
mean-field guide ``q(θ) q(η)`` cannot express that the weights that explain the data change with
the amount of invariance (e.g. basis regression: the posterior mean of the weights is a function
of λ). This guide is Pyro's :class:`~pyro.infer.autoguide.AutoStructured` with

* a diagonal Normal (``"normal"``) for every latent site, in unconstrained space;
* a **linear** dependency of every non-symmetry site on every symmetry site
  (``model.symmetry_sites()``)::

      u_η = m_η + s_η ⊙ ε_η,          u_θ = m_θ + s_θ ⊙ ε_θ + B (u_η − m_η),

  where ``u`` are unconstrained coordinates and ``B`` (``numel(θ) × numel(η)``, initialised at 0,
  so the guide starts as the mean-field one) is learned — a linear-Gaussian ``q(θ | η)``.

The dependencies are set from the model's prototype trace (``_auto_config``), so the guide needs
no site names; a model without latent symmetry sites gets a plain diagonal ``AutoStructured``
(equal to the mean-field guide in distribution).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Sequence

import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoStructured
from pyro.infer.autoguide.initialization import init_to_feasible

from torch import Tensor
from torch.distributions import biject_to

from pyro_invariance.registry import GUIDES

from .base import CatalogueGuide, InitLocFn, check_init_scale

__all__ = ["SymmetryConditional", "symmetry_conditional"]


class SymmetryConditional(CatalogueGuide, AutoStructured):
    """``AutoStructured`` with ``q(θ | η)`` linear in η (see the module docstring).

    ``fit_defaults``: ``elbo="trace"`` — ``TraceMeanField_ELBO`` assumes independent sites and asks
    that the guide samples them in the model's order; this guide samples η before θ in dependency
    order, and its KL terms are Monte-Carlo estimates either way.
    """

    fit_defaults = {"elbo": "trace"}

    def __init__(self, model: Callable, *, init_loc_fn: InitLocFn = init_to_feasible, init_scale: float = 1.0) -> None:
        from pyro_invariance.models.base import CatalogueModel

        self._symmetry_sites = list(model.symmetry_sites()) if isinstance(model, CatalogueModel) else []
        super().__init__(model, conditionals="normal", dependencies={}, init_loc_fn=init_loc_fn,
                         init_scale=check_init_scale(init_scale))  # fmt: skip

    def _auto_config(self, sample_sites: dict[str, Any], args: tuple, kwargs: dict) -> None:
        """Every latent site that is not a symmetry site depends linearly on every symmetry site."""
        missing = [s for s in self._symmetry_sites if s not in sample_sites]
        if missing:
            raise ValueError(f"the model declares symmetry sites {missing} that its trace does not sample")
        self.dependencies = {
            name: {s: "linear" for s in self._symmetry_sites}
            for name in sample_sites
            if name not in self._symmetry_sites
        }
        super()._auto_config(sample_sites, args, kwargs)

    def _setup_prototype(self, *args: Any, **kwargs: Any) -> None:
        super()._setup_prototype(*args, **kwargs)
        # Pyro builds the "linear" dependencies as nn.Linear in the default dtype: follow the model's
        # (a float64 model would otherwise mix dtypes in B (u_η − m_η)).
        dtype = next(iter(self.locs.parameters())).dtype
        self.deps.to(dtype)

    @torch.no_grad()
    def quantiles(self, quantiles: Sequence[float] | Tensor, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Marginal quantiles per site, ``{site: (len(quantiles), *site_shape)}``.

        Each unconstrained coordinate is Gaussian with mean ``m`` and variance
        ``s² + Σ_j (B_ij s_ηj)²`` (its own scale plus what it inherits from η through ``B``); the
        quantiles are mapped through the site's ``biject_to`` (monotone per coordinate)."""
        if not hasattr(self, "_sorted_sites"):
            self._setup_prototype(*args, **kwargs)
        q = torch.as_tensor(quantiles)
        scales = {name: attrgetter(name)(self.scales) for name, _ in self._sorted_sites}
        out = {}
        for name, site in self._sorted_sites:
            loc = attrgetter(name)(self.locs)
            var = scales[name] ** 2
            deps = attrgetter(name)(self.deps)
            for upstream in self.dependencies.get(name, {}):
                weight = attrgetter(upstream)(deps).weight  # (numel θ, numel η)
                var = var + (weight * scales[upstream]).pow(2).sum(-1)
            normal = dist.Normal(loc, var.sqrt())
            values = torch.stack([normal.icdf(torch.as_tensor(v, dtype=loc.dtype)) for v in q])
            shape = self._batch_shapes[name] + self._unconstrained_event_shapes[name]
            out[name] = biject_to(site["fn"].support)(values.reshape((len(q),) + shape))
        return out


@GUIDES.register("symmetry-conditional", summary="q(η) q(θ | η): weights linear-Gaussian in a latent η (AutoStructured)")
def symmetry_conditional(
    model: Callable, *, init_loc_fn: InitLocFn = init_to_feasible, init_scale: float = 1.0
) -> SymmetryConditional:
    """Diagonal Normal per site, with every weight site's location linear in the latent η's coordinates."""
    return SymmetryConditional(model, init_loc_fn=init_loc_fn, init_scale=init_scale)
