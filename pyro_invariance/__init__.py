"""pyro_invariance: Pyro models that learn their own symmetries by Bayesian model selection.

Importing the package sets Pyro's ``module_local_params`` so that each model and guide keeps
its own parameters (several models can be trained in one process without sharing names in the
global param store).
"""

import pyro

pyro.settings.set(module_local_params=True)

from pyro_invariance.registry import DATASETS, GUIDES, MODELS  # noqa: E402
from pyro_invariance.training import FitConfig, FitResult, fit  # noqa: E402
from pyro_invariance.evaluation import evaluate  # noqa: E402
from pyro_invariance.diagnostics import to_inference_data  # noqa: E402
from pyro_invariance.compare import GuideComparison, compare_guides  # noqa: E402
from pyro_invariance.laplace import fit_laplace  # noqa: E402
from pyro_invariance import models  # noqa: E402
from pyro_invariance import datasets  # noqa: E402,F401  (registers the DATASETS entries)

__version__ = "0.1.0"

__all__ = ["fit", "fit_laplace", "evaluate", "to_inference_data", "compare_guides", "GuideComparison", "FitConfig", "FitResult", "MODELS", "GUIDES", "DATASETS", "models"]
