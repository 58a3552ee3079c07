"""Train q(θ | η) across a wide q(η) before the joint fit.

The ELBO trains a guide's q(θ | η) only at the η that q(η) draws. Started from scratch, q(η)
narrows within a few hundred steps, and from then on the conditional learns about that neighbourhood
only: the fitted guide's own bound at fixed η, ``IWAE_K(η)`` (the amortisation profile,
:func:`research.uncertain_symmetry.evidence_profile.guide_evidence_profile`), falls off away from
it, so q(η) — whose ELBO optimum is ∝ p(η) exp(ELBO(η)) of that same conditional — stays there
(measured: ``research/uncertain_symmetry/results/uncertain_symmetry_iwae_steps4000.md``, upright digits).

:func:`warm_up_conditional` is the first of two ``fit`` calls:

1. **warm-up** — q(η)'s own parameters (:meth:`~pyro_invariance.guides.base.CatalogueGuide.symmetry_guide_parameters`)
   are held where they start; everything else (q(θ | η), the model's point estimates) trains by the
   configured ELBO. With q(η) fixed at r(η), the objective is E_r(η)[ELBO(θ | η)] + const: the
   conditional is fitted across r's whole range (amortised over η), not only where q(η) will end;
2. **joint fit** — an ordinary :func:`~pyro_invariance.fit` of the same guide, q(η) free.

**Widening** (``widen=w``): q(η) is held at its current location with its scale multiplied by ``w`` (in η's
unconstrained coordinate), and its own values come back afterwards. After a joint fit this re-trains the
conditional across a neighbourhood wider than the narrow q(η) it ended with — the region a posterior over η
with the evidence's width would cover — without moving q(η), e.g. before
:func:`~research.uncertain_symmetry.collapsed_symmetry.collapse_symmetry`, whose q* is set by the conditional alone.

A conditional that can hold a different weight location per region of η (the symmetry-conditional
guide's ``symmetry_dependence="rbf"``) makes the most of step 1; a mean-field guide learns one q(θ)
averaged over r(η). ``r`` is the guide's starting q(η) (e.g. ``symmetry_init_scale=π/√3``: as wide as
a U(0, π) prior in the logit coordinate).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import biject_to

from pyro_invariance import pyro_scope
from pyro_invariance.guides.base import CatalogueGuide
from pyro_invariance.infer.training import FitResult, fit
from pyro_invariance.infer.warm_start import set_up_guide_on
from pyro_invariance.models.base import symmetry_sites

__all__ = ["symmetry_scales", "warm_up_conditional"]


def symmetry_scales(guide: nn.Module, sites: list[str]) -> list[tuple[nn.Module, str]]:
    """(module, name) of q(η)'s scale for each of ``sites``: the Normal scale ``scales.<site>`` (mean-field,
    symmetry-conditional) or the spline's ``conds.<site>.scale``, both Pyro constrained parameters. A site
    without one is refused in one line."""
    named = {n for n, _ in guide.named_parameters()}
    out = []
    for site in sites:
        for path in (f"scales.{site}", f"conds.{site}.scale"):
            if f"{path}_unconstrained" in named:
                *owner, leaf = path.split(".")
                out.append((guide.get_submodule(".".join(owner)), leaf))
                break
        else:
            raise ValueError(
                f"{type(guide).__name__} has no scale of q({site}) to widen (it needs a Normal or spline "
                "q(η) of its own: mean-field, symmetry-conditional)"
            )
    return out


def _scaled(module: nn.Module, leaf: str, factor: float) -> Tensor:
    """``module``'s constrained parameter ``leaf`` times ``factor``, as the unconstrained value that gives it."""
    constraint = module._pyro_params[leaf][0]
    return biject_to(constraint).inv(getattr(module, leaf) * factor)


@pyro_scope()
def warm_up_conditional(
    model: nn.Module, guide: Any, data: Any, *, widen: float = 1.0, **fit_settings: Any
) -> FitResult:
    """Step 1 of the module docstring: :func:`~pyro_invariance.fit` (``fit_settings`` as there) with
    q(η)'s own parameters held at their current values; they train again afterwards.

    ``widen``: hold q(η) with its scale multiplied by this factor (module docstring, widening); q(η)'s own
    values are restored afterwards, so only the rest of the guide (and the model's point estimates) change.

    Refused in one line: a model without latent symmetry sites (``symmetry_prior`` unset), a guide that
    is not a catalogue guide or draws η jointly with the weights (full-rank, low-rank), a ``widen`` that is not
    a positive finite number."""
    if isinstance(widen, bool) or not isinstance(widen, (int, float)) or not math.isfinite(widen) or widen <= 0:
        raise ValueError(f"widen must be a positive finite number (the factor on q(η)'s scale), got {widen!r}")
    sites = symmetry_sites(model)
    if not sites:
        raise ValueError(
            f"{type(model).__name__} has no latent symmetry sites to hold fixed: set symmetry_prior "
            "(a point-estimated η has no q(η))"
        )
    if not isinstance(guide, CatalogueGuide):
        raise ValueError(
            f"warm_up_conditional needs a catalogue guide (pyro_invariance.guides.get), got {type(guide).__name__}"
        )
    if not any(True for _ in guide.parameters()):
        set_up_guide_on(model, guide, data)
    held = guide.symmetry_guide_parameters(sites)
    scales = symmetry_scales(guide, sites) if widen != 1.0 else []
    saved = [p.detach().clone() for p in held]
    flags = [p.requires_grad for p in held]
    with torch.no_grad():
        for module, leaf in scales:
            getattr(module, f"{leaf}_unconstrained").copy_(_scaled(module, leaf, float(widen)))
    for p in held:
        p.requires_grad_(False)
    try:
        return fit(model, guide, data, **fit_settings)
    finally:
        with torch.no_grad():
            for p, value in zip(held, saved):
                p.copy_(value)
        for p, flag in zip(held, flags):
            p.requires_grad_(flag)
