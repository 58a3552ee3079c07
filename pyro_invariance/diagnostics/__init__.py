"""Diagnostics: what a fitted model and guide say, and how good the fit is.

* :mod:`.evaluation` — held-out metrics (:func:`evaluate`), posterior predictive logits.
* :mod:`.compare` — :func:`compare_guides`: several guides alike, with bounds, η and metrics.
* :mod:`.inference_data` / :mod:`.arviz_compat` — ArviZ export (``to_inference_data``) and LOO.
* :mod:`.reference` — NUTS reference posteriors and scoring guides against them.
* :mod:`.symmetry_posterior`, :mod:`.annealed_evidence`, :mod:`.laplace_evidence` — posteriors over a symmetry
  parameter η and their references (grid posteriors; ``log p(D | η)`` of an invariant MLP by annealed importance
  sampling, and by a Laplace approximation of its read-out, which also gives a latent η's grid posterior and the
  predictive with η integrated out over it).
* :mod:`.hnn_metrics`, :mod:`.layerwise_analysis` — family-specific analyses.
* :mod:`.plots` — figures.
"""

from pyro_invariance.diagnostics.compare import GuideComparison, compare_guides
from pyro_invariance.diagnostics.evaluation import evaluate
from pyro_invariance.diagnostics.inference_data import to_inference_data

__all__ = ["GuideComparison", "compare_guides", "evaluate", "to_inference_data"]
