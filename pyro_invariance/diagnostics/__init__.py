"""Diagnostics: what a fitted model and guide say, and how good the fit is.

* :mod:`.evaluation` — held-out metrics: :func:`evaluate`, the one entry point, with each task's metric
  function (the tasks and their posterior predictive: :mod:`pyro_invariance.tasks`).
* :mod:`.compare` — :func:`compare_guides`: several guides alike, with bounds, η and metrics.
* :mod:`.inference_data` / :mod:`.arviz_compat` — ArviZ export (``to_inference_data``) and LOO.
* :mod:`.reference` — NUTS reference posteriors and scoring guides against them.
* :mod:`.symmetry_posterior` — posteriors over a symmetry parameter η: the guide's draws of it, grid
  posteriors, and the exact posterior of basis regression's λ.
* :mod:`.hnn_metrics`, :mod:`.layerwise_analysis` — family-specific analyses.
* :mod:`.plots` — figures.
"""

from pyro_invariance.diagnostics.compare import GuideComparison, compare_guides
from pyro_invariance.diagnostics.evaluation import evaluate
from pyro_invariance.diagnostics.inference_data import to_inference_data

__all__ = ["GuideComparison", "compare_guides", "evaluate", "to_inference_data"]
