"""Inference: fitting guides and symmetry parameters, and keeping runs safe.

* :mod:`.training` — :func:`fit`: SVI on the ELBO with minibatches, learning-rate groups for η,
  checkpoints that resume bit-for-bit.
* :mod:`.laplace` — :func:`fit_laplace`: MAP weights with Laplace-evidence prior precisions (paper 004).
* :mod:`.prior_update` — closed-form prior-variance updates (Noether's razor).
* :mod:`.bounds` — evidence bounds: ELBO, IWAE_K, PSIS k̂.
* :mod:`.checkpoint`, :mod:`.fingerprint`, :mod:`.runlock`, :mod:`.interrupts`, :mod:`.divergence` —
  safe and verified checkpoints, what defines a run, one writer per run, clean stops on signals,
  naming what diverged.
"""

from pyro_invariance.infer.laplace import fit_laplace
from pyro_invariance.infer.training import FitConfig, FitResult, fit

__all__ = ["FitConfig", "FitResult", "fit", "fit_laplace"]
