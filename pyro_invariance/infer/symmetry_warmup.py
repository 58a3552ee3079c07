"""Train q(θ | η) across a wide q(η) before the joint fit (issue 15).

The ELBO trains a guide's q(θ | η) only at the η that q(η) draws. Started from scratch, q(η)
narrows within a few hundred steps, and from then on the conditional learns about that neighbourhood
only: the fitted guide's own bound at fixed η, ``IWAE_K(η)`` (the amortisation profile,
:func:`pyro_invariance.diagnostics.symmetry_posterior.guide_evidence_profile`), falls off away from
it, so q(η) — whose ELBO optimum is ∝ p(η) exp(ELBO(η)) of that same conditional — stays there
(measured: ``benchmarks/results/uncertain_symmetry_iwae_steps4000.md``, upright digits).

:func:`warm_up_conditional` is the first of two ``fit`` calls:

1. **warm-up** — q(η)'s own parameters (:meth:`~pyro_invariance.guides.base.CatalogueGuide.symmetry_guide_parameters`)
   are held where they start; everything else (q(θ | η), the model's point estimates) trains by the
   configured ELBO. With q(η) fixed at r(η), the objective is E_r(η)[ELBO(θ | η)] + const: the
   conditional is fitted across r's whole range (amortised over η), not only where q(η) will end;
2. **joint fit** — an ordinary :func:`~pyro_invariance.fit` of the same guide, q(η) free.

A conditional that can hold a different weight location per region of η (the symmetry-conditional
guide's ``symmetry_dependence="rbf"``) makes the most of step 1; a mean-field guide learns one q(θ)
averaged over r(η). ``r`` is the guide's starting q(η) (e.g. ``symmetry_init_scale=π/√3``: as wide as
a U(0, π) prior in the logit coordinate).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pyro_invariance.infer.training import FitResult, fit
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.infer.warm_start import set_up_guide_on

__all__ = ["warm_up_conditional"]


@pyro_scope()
def warm_up_conditional(model: nn.Module, guide: Any, data: Any, **fit_settings: Any) -> FitResult:
    """Step 1 of the module docstring: :func:`~pyro_invariance.fit` (``fit_settings`` as there) with
    q(η)'s own parameters held at their current values; they train again afterwards.

    Refused in one line: a model without latent symmetry sites (``symmetry_prior`` unset), a guide that
    is not a catalogue guide or draws η jointly with the weights (full-rank, low-rank)."""
    from pyro_invariance.guides.base import CatalogueGuide
    from pyro_invariance.models.base import symmetry_sites

    sites = symmetry_sites(model)
    if not sites:
        raise ValueError(f"{type(model).__name__} has no latent symmetry sites to hold fixed: set symmetry_prior "
                         "(a point-estimated η has no q(η))")  # fmt: skip
    if not isinstance(guide, CatalogueGuide):
        raise ValueError(f"warm_up_conditional needs a catalogue guide (pyro_invariance.guides.get), got "
                         f"{type(guide).__name__}")  # fmt: skip
    if not any(True for _ in guide.parameters()):
        set_up_guide_on(model, guide, data)
    held = guide.symmetry_guide_parameters(sites)
    flags = [p.requires_grad for p in held]
    for p in held:
        p.requires_grad_(False)
    try:
        return fit(model, guide, data, **fit_settings)
    finally:
        for p, flag in zip(held, flags):
            p.requires_grad_(flag)
