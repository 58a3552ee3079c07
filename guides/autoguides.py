"""Pyro's autoguides under catalogue names.

========== ===================================================== ======================= ==============
name       guide                                                 init_loc_fn default     init_scale
========== ===================================================== ======================= ==============
mean-field :class:`~.base.MeanFieldNormal` (an ``AutoNormal``)   ``init_to_feasible``    0.1
full-rank  ``AutoMultivariateNormal`` (all sites packed)         ``init_to_median``      0.1
low-rank   ``AutoLowRankMultivariateNormal`` (kwarg ``rank``)    ``init_to_median``      0.1
map        ``AutoDelta`` (point estimates)                       ``init_to_median``      --
========== ===================================================== ======================= ==============

``init_scale`` defaults to Pyro's 0.1 (:data:`~.base.DEFAULT_INIT_SCALE`, where the reason is
measured), in the factories as in the classes; a catalogue model may recommend another start
through ``guide_defaults`` (the invariant MLP and the 2-D rotation toy keep 1.0, with their measured reasons).
The ``init_loc_fn`` defaults are Pyro's: ``init_to_median`` (median of 15 prior draws) breaks the
symmetry between hidden units, which a point-estimate guide needs; zero means are harmless for
the Gaussian guides, whose noise breaks it.

Under :class:`~pyro.infer.TraceMeanField_ELBO` the packed guides (full-rank, low-rank) give Monte
Carlo KLs (docs/methods.md §5). They put the package's
:class:`~pyro_invariance.distributions.DensityDelta` at each site where Pyro's put a ``Delta``: its KL
keeps the log-Jacobian of a constrained site, which Pyro 1.9's ``KL(Delta ‖ ·)`` drops, so the bound
is valid in a plain ``pyro.infer.SVI`` loop too, not only inside the package's calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pyro.infer.autoguide import AutoDelta, AutoLowRankMultivariateNormal, AutoMultivariateNormal
from pyro.infer.autoguide.initialization import init_to_feasible, init_to_median
from torch import Tensor

from pyro_invariance.distributions import DensityDeltaMessenger
from pyro_invariance.registry import GUIDES

from .base import DEFAULT_INIT_SCALE, CatalogueGuide, InitLocFn, MeanFieldNormal, check_init_scale

__all__ = ["FullRankNormal", "LowRankNormal", "PointMass", "mean_field", "full_rank", "low_rank", "map_guide"]


class _DensityDeltaSites:
    """Mixin for Pyro's packed autoguides: each site's ``Delta`` becomes a ``DensityDelta`` (module docstring)."""

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        with DensityDeltaMessenger():
            return super().forward(*args, **kwargs)  # type: ignore[misc]


#: The largest dense covariance factor the full-rank guide builds (float32 bytes): training holds
#: it four times over (the factor, its gradient, Adam's two moments), so 1 GiB is 4 GiB in use.
DENSE_FACTOR_BYTES = 2**30


def _check_dense_factor(guide: Any) -> None:
    """Refuse, before any allocation, a full-rank guide whose ``D×D`` factor exceeds
    :data:`DENSE_FACTOR_BYTES` (D: the latent dimensions the guide recorded of its model)."""
    built = guide.__dict__.get("_built_for")
    if built is None:  # a model whose sites cannot be read without data: Pyro allocates as it goes
        return
    dims = sum(math.prod(shape) for shape, _ in built.sites.values())
    need = dims * dims * 4
    if need > DENSE_FACTOR_BYTES:
        raise ValueError(
            f"full-rank needs a dense {dims}×{dims} covariance factor ({need / 2**30:.0f} GiB in float32, "
            f"four times that to train) for this model's {dims} latent dimensions, over the "
            f"{DENSE_FACTOR_BYTES // 2**30} GiB limit: use 'low-rank' or 'block-cholesky', or a smaller model"
        )


class FullRankNormal(_DensityDeltaSites, CatalogueGuide, AutoMultivariateNormal):
    """Pyro's ``AutoMultivariateNormal`` as a catalogue guide.

    Its covariance factor is the whole posterior correlation, so it trains at the means' rate
    (``factor_lr = lr = 0.05``): the library's ``factor_lr = 1e-3``, chosen to tame the many
    per-class blocks of the block-Cholesky guide, left it 13.70 ± 0.13 nats below the exact log evidence
    on basis regression after 500 steps, 3.96 ± 0.60 at 0.05 (seeds 0-2, one particle;
    ``benchmarks/results/full_rank_defaults.md``).
    """

    fit_defaults = {"factor_lr": 0.05}
    catalogue_name = "full-rank"

    def __init__(
        self, model: Callable, *, init_loc_fn: InitLocFn = init_to_median, init_scale: float = DEFAULT_INIT_SCALE
    ) -> None:
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=init_scale)
        _check_dense_factor(self)


class LowRankNormal(_DensityDeltaSites, CatalogueGuide, AutoLowRankMultivariateNormal):
    """Pyro's ``AutoLowRankMultivariateNormal`` as a catalogue guide (library fit settings)."""

    catalogue_name = "low-rank"


class PointMass(CatalogueGuide, AutoDelta):
    """Pyro's ``AutoDelta`` (MAP) as a catalogue guide (library fit settings)."""

    catalogue_name = "map"


@GUIDES.register("mean-field", summary="independent Normal per latent coordinate (AutoNormal)")
def mean_field(
    model: Callable, *, init_loc_fn: InitLocFn = init_to_feasible, init_scale: float = DEFAULT_INIT_SCALE
) -> MeanFieldNormal:
    """Mean-field Normal guide (AutoNormal sampling each site directly; analytic KLs)."""
    return MeanFieldNormal(model, init_loc_fn=init_loc_fn, init_scale=check_init_scale(init_scale))


@GUIDES.register("full-rank", summary="one full-covariance Gaussian over all latents (AutoMultivariateNormal)")
def full_rank(
    model: Callable, *, init_loc_fn: InitLocFn = init_to_median, init_scale: float = DEFAULT_INIT_SCALE
) -> FullRankNormal:
    """Full-covariance Gaussian over all (unconstrained, packed) latent coordinates."""
    return FullRankNormal(model, init_loc_fn=init_loc_fn, init_scale=check_init_scale(init_scale))


@GUIDES.register("low-rank", summary="low-rank-plus-diagonal Gaussian over all latents (AutoLowRankMultivariateNormal)")
def low_rank(
    model: Callable,
    *,
    rank: int | None = None,
    init_loc_fn: InitLocFn = init_to_median,
    init_scale: float = DEFAULT_INIT_SCALE,
) -> LowRankNormal:
    """Gaussian with covariance ``D + F Fᵀ``, ``F`` of shape (latent dim, ``rank``).

    ``rank=None`` uses Pyro's default ``round(sqrt(latent dim))``; otherwise a positive int.
    """
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0):
        raise ValueError(f"rank must be a positive int or None, got {rank!r}")
    return LowRankNormal(model, init_loc_fn=init_loc_fn, init_scale=check_init_scale(init_scale), rank=rank)


@GUIDES.register("map", summary="point estimates (AutoDelta): MAP, no posterior width")
def map_guide(model: Callable, *, init_loc_fn: InitLocFn = init_to_median) -> PointMass:
    """MAP guide; it has no scale, so it takes no ``init_scale``."""
    return PointMass(model, init_loc_fn=init_loc_fn)
