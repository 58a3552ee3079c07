"""Guides (variational families) of the catalogue, by name.

For example::

    from pyro_invariance import guides
    guide = guides.get("matrix-normal", model, init_scale=1.0)
    guides.names()
    # ['block-cholesky', 'full-rank', 'low-rank', 'map', 'matrix-normal', 'mean-field',
    #  'symmetry-conditional']

A guide is "a callable that takes the model": every entry is ``factory(model, **kwargs)``
returning a Pyro autoguide-style :class:`~pyro.nn.PyroModule` that works with ``SVI``,
``Trace_ELBO``, ``TraceMeanField_ELBO`` and ``Predictive``.

Site rules (all guides): observed and plate/subsample sites are skipped. The matrix-normal and
block-Cholesky guides structure each *weight-matrix site* -- a real ``(rows, cols)`` value with
event dim 2 outside any plate (:func:`~.base.is_matrix_site`) -- and give every other latent site
(biases, positive prior scales, sites inside plates) a mean-field Normal in unconstrained space.

A guide is tied to the model it was built for: ``fit``, ``evaluate``, ``to_inference_data`` and the
evidence bounds refuse it, before any step, with a model of another class or with other latent sites
(names, shapes, dtypes); a copy of the same model is accepted (:func:`~.base.check_guide_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyro_invariance.models.base import CatalogueModel
from pyro_invariance.registry import GUIDES

from . import autoguides, block_cholesky, matrix_normal, symmetry_conditional  # noqa: F401  (register the entries)
from .base import MeanFieldNormal, StructuredGuide, check_guide_for, is_matrix_site, num_guide_parameters
from .block_cholesky import BlockCholeskyGuide
from .matrix_normal import MatrixNormalGuide

__all__ = [
    "BlockCholeskyGuide",
    "MatrixNormalGuide",
    "MeanFieldNormal",
    "StructuredGuide",
    "check_guide_for",
    "get",
    "is_matrix_site",
    "names",
    "num_guide_parameters",
]


def get(name: str, model: Callable, **kwargs: Any) -> Any:
    """Build guide ``name`` for ``model``; an unknown name raises
    :class:`~pyro_invariance.registry.UnknownNameError` listing the known ones.

    A catalogue model recommends settings by ``model.guide_defaults(name)``
    (:class:`~pyro_invariance.models.base.CatalogueModel`; e.g. the layer-wise networks'
    initialisation); explicit ``kwargs`` override them. Any other model gets none."""
    GUIDES.entry(name)  # unknown names fail here, before the model is asked
    if isinstance(model, CatalogueModel):
        kwargs = {**model.guide_defaults(name), **kwargs}
    return GUIDES.get(name, model, **kwargs)


def names() -> list[str]:
    """Registered guide names, sorted."""
    return GUIDES.names()
