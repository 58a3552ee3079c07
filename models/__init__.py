"""The catalogue's Pyro models. ``get(name, **kwargs)`` builds one by name.

Each entry is one file that registers itself with :data:`pyro_invariance.registry.MODELS` and
inherits :class:`~.base.CatalogueModel`, the protocol every model follows (``models/base.py``).
"""

from typing import Any

from pyro_invariance.registry import MODELS

from . import (  # noqa: F401  (each registers itself)
    basis_regression,
    invariant_mlp,
    layerwise,  # noqa: F401  (layerwise-* entries, paper 004)
    symmetrised_hnn,  # noqa: F401
    toy2d,  # noqa: F401
)
from .base import PRIORS, CatalogueModel
from .basis_regression import BasisRegression
from .invariant_mlp import InvariantMLP


def get(name: str, **kwargs: Any) -> CatalogueModel:
    """Build the catalogue model ``name`` (see :func:`names`)."""
    return MODELS.get(name, **kwargs)


def names() -> list[str]:
    return MODELS.names()


__all__ = ["get", "names", "BasisRegression", "CatalogueModel", "InvariantMLP", "PRIORS"]
