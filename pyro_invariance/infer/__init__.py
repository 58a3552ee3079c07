"""Inference: fitting guides and symmetry parameters, and keeping runs safe.

* :mod:`.training` — :func:`fit`: SVI on the ELBO with minibatches, learning-rate groups for η,
  checkpoints that resume bit-for-bit.
* :mod:`.laplace` — :func:`fit_laplace`: MAP weights with Laplace-evidence prior precisions (paper 004).
* :mod:`.kfac` — Kronecker-factored GGN of FC layers and the KFAC-Laplace log marginal likelihood
  (the core; layer-wise factors in :mod:`.kfac_layers`).
* :mod:`.prior_update` — closed-form prior-variance updates (Noether's razor), also as a ``fit`` callback.
* :mod:`.warm_start` — start a fit from a finished run's guide means (the 3-body recipe's warm-up HNN).
* :mod:`.fast_step` — the lean training step: ELBOs without host reads (and the IWAE bound), capture,
  compilation, CUDA graphs.
* :mod:`.bounds` — evidence bounds: ELBO, IWAE_K, PSIS k̂ (:mod:`.psis`, the package's one PSIS).
* :mod:`.checkpoint`, :mod:`.fingerprint`, :mod:`.runlock`, :mod:`.interrupts`, :mod:`.divergence`,
  :mod:`.rescue` — safe and verified checkpoints, what defines a run, one writer per run, clean stops
  on signals, naming what diverged, and a checked checkpoint to continue a diverged run from.
"""

from pyro_invariance.infer.laplace import fit_laplace
from pyro_invariance.infer.training import FitConfig, FitResult, fit

__all__ = ["FitConfig", "FitResult", "fit", "fit_laplace"]
