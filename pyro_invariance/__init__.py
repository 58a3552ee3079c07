"""pyro_invariance: Pyro models that learn their own symmetries by Bayesian model selection.

The package is laid out by concern, in layers that import only downwards (``ARCHITECTURE.md``;
the contract is ``[tool.importlinter]`` in ``pyproject.toml``), from the top::

    cli           the pyro-invariance command
    diagnostics/  evaluation, guide comparison, ArviZ, reference posteriors, plots
    catalogue     building models, guides and datasets from names; rebuilding saved runs
    infer/        fit (SVI), fit_laplace, evidence bounds, checkpoints
    guides/       variational families               models/   the catalogue's Pyro models
    data/         datasets (registered by name) and the checks that turn them into tensors
    symmetry/     groups, conserved quantities, equivariant layers
    core          tasks, registries, input checks, distributions, the Pyro scope

Importing the package registers every model, guide and dataset in the package's own registries,
and changes nothing in Pyro or torch (``pyro.settings``, the param store and torch's KL registry are
left as they were, apart from KL rules for the package's own distribution types). The package's
calls switch on what they need -- Pyro's ``module_local_params`` (each model and guide keeps its
own parameters, so several models train in one process without sharing names in the global param
store) and a corrected ``KL(Delta ‖ ·)`` -- for their duration only: :func:`pyro_scope`.
"""

from pyro_invariance import data, guides, models  # (each registers its entries)
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data import load_dataset
from pyro_invariance.diagnostics import GuideComparison, compare_guides, evaluate, to_inference_data
from pyro_invariance.infer import FitConfig, FitResult, fit, fit_laplace
from pyro_invariance.registry import DATASETS, GUIDES, MODELS

__version__ = "0.1.0"

__all__ = [
    "DATASETS",
    "GUIDES",
    "MODELS",
    "FitConfig",
    "FitResult",
    "GuideComparison",
    "compare_guides",
    "data",
    "evaluate",
    "fit",
    "fit_laplace",
    "guides",
    "load_dataset",
    "models",
    "pyro_scope",
    "to_inference_data",
]
