"""pyro_invariance: Pyro models that learn their own symmetries by Bayesian model selection.

The package is laid out by concern (see ``ARCHITECTURE.md``)::

    data/         datasets (registered by name) and the checks that turn them into tensors
    models/       the catalogue's Pyro models          guides/   variational families
    symmetry/     groups, conserved quantities, equivariant layers
    infer/        fit (SVI), fit_laplace, evidence bounds, checkpoints
    diagnostics/  evaluation, guide comparison, ArviZ, reference posteriors, plots

Importing the package registers every model, guide and dataset. It also sets Pyro's
``module_local_params`` so that each model and guide keeps its own parameters (several models
can be trained in one process without sharing names in the global param store).
"""

import pyro

pyro.settings.set(module_local_params=True)

from pyro_invariance.registry import DATASETS, GUIDES, MODELS  # noqa: E402
from pyro_invariance import data, guides, models  # noqa: E402  (each registers its entries)
from pyro_invariance.infer import FitConfig, FitResult, fit, fit_laplace  # noqa: E402
from pyro_invariance.diagnostics import GuideComparison, compare_guides, evaluate, to_inference_data  # noqa: E402
from pyro_invariance.data import load_dataset  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DATASETS", "GUIDES", "MODELS", "FitConfig", "FitResult", "GuideComparison", "compare_guides", "data",
    "evaluate", "fit", "fit_laplace", "guides", "load_dataset", "models", "to_inference_data",
]  # fmt: skip
