"""Closed-form (empirical-Bayes) update of per-layer prior variances (docs/methods.md §4).

For a weight matrix W with D entries, prior N(0, v I) and guide q(W) with mean m and covariance Σ,
the ELBO is maximised over v at::

    v* = (tr Σ + ‖m‖²) / D = E_q‖W‖² / D.

For the matrix-normal guide tr Σ = ‖L_U‖²_F ‖L_V‖²_F. The reference damps the update in the
precision λ = 1/v:  λ ← (1 − ρ) λ + ρ · D / E_q‖W‖²  with ρ = ½ (used for the 3-body system).

Three ways to use it:

* ``fit(..., callbacks=[ClosedFormPriorUpdate(damping=0.5, warmup=100)])`` (the reference's 3-body
  recipe: after every optimiser step): the variances are model buffers, so checkpoints carry them and
  a resumed run continues bit-for-bit (the callback keys on ``fit``'s global step);
* call :func:`update_prior_variance` yourself after each optimiser step in your own loop, or
* wrap the guide, ``guide = PriorUpdatingGuide(guide, model)``, and pass it to ``fit``: before
  every guide evaluation with gradients enabled (one per SVI step and particle), the model's prior
  variances are updated from the guide's current parameters, i.e. after the previous step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from pyro_invariance.models.base import CatalogueModel


def expected_sq_norm(guide: Any, site: str) -> Tensor:
    """``E_q‖W‖² = tr Σ + ‖m‖²`` of ``site`` from the guide's distribution (needs ``get_distribution``)."""
    if not hasattr(guide, "get_distribution"):
        raise TypeError(f"{type(guide).__name__} has no get_distribution(site); use a catalogue guide")
    q = guide.get_distribution(site)
    return (q.variance + q.mean**2).sum()


@torch.no_grad()
def update_prior_variance(model: nn.Module, guide: Any, damping: float = 0.5) -> Tensor:
    """Set ``model.prior_var[i]`` for every ``weight_i`` site from the guide; returns the new ``(L,)``.

    Args:
        model: a model with a ``prior_var`` buffer ``(L,)`` and ``weight_site_names()``
            (e.g. :class:`~pyro_invariance.models.symmetrised_hnn.SymmetrisedHNN` with
            ``prior="closed-form"``).
        guide: a catalogue guide already set up (called once).
        damping: ρ ∈ (0, 1]; 1 sets v = v* exactly.
    """
    if not (0 < damping <= 1):
        raise ValueError(f"damping must lie in (0, 1], got {damping}")
    _check_closed_form(model)
    names = model.weight_site_names()
    for i, name in enumerate(names):
        q = guide.get_distribution(name)
        d = q.mean.numel()
        lam_star = d / expected_sq_norm(guide, name).clamp_min(1e-30)
        lam = 1.0 / model.prior_var[i]
        model.prior_var[i] = 1.0 / ((1 - damping) * lam + damping * lam_star)
    return model.prior_var.clone()


def _check_closed_form(model: Any) -> None:
    """The closed-form update sets the prior-variance buffers of a model built for it."""
    if not isinstance(model, CatalogueModel) or model.prior != "closed-form":
        prior = model.prior if isinstance(model, CatalogueModel) else f"a {type(model).__name__}"
        raise ValueError(
            f"the closed-form prior update needs a catalogue model built with prior='closed-form', got {prior!r}"
        )


class PriorUpdatingGuide(nn.Module):
    """A guide that applies :func:`update_prior_variance` before each gradient-enabled call.

    Parameters, ``median()`` and ``get_distribution()`` are those of the wrapped guide.
    ``warmup``: number of gradient-enabled calls (≈ SVI steps) before the first update. Starting
    the updates at once from a narrow guide (e.g. ``init_scale=0.01``) sets v* ≈ init_scale² and
    the prior collapses before the data have moved the means (seen on the 3-body system).

    Within ``fit`` the checkpoint-safe route is a callback after each optimiser step:
    ``fit(..., callbacks=[lambda step, m, g: step > warmup and update_prior_variance(m, g)])``
    (this wrapper's call counter is not part of a checkpoint).
    """

    def __init__(self, guide: nn.Module, model: nn.Module, damping: float = 0.5, warmup: int = 0) -> None:
        super().__init__()
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
        self.warmup = warmup
        self.calls = 0
        _check_closed_form(model)
        self.guide = guide
        self.damping = float(damping)
        object.__setattr__(self, "_model", model)  # not a submodule: its parameters belong to the model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and getattr(self.guide, "prototype_trace", None) is not None:
            self.calls += 1
            if self.calls > self.warmup:
                update_prior_variance(self._model, self.guide, self.damping)
        return self.guide(*args, **kwargs)

    def get_distribution(self, name: str) -> Any:
        return self.guide.get_distribution(name)

    def median(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        return self.guide.median(*args, **kwargs)


class ClosedFormPriorUpdate:
    """A ``fit`` callback: :func:`update_prior_variance` after every optimiser step past ``warmup``.

    Stateless apart from the model's ``prior_var`` buffer (in every checkpoint), and keyed on
    ``fit``'s global step, so a run resumed from a checkpoint repeats the updates of an
    uninterrupted one bit-for-bit."""

    def __init__(self, damping: float = 0.5, warmup: int = 0) -> None:
        if not (0 < damping <= 1):
            raise ValueError(f"damping must lie in (0, 1], got {damping}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
        self.damping, self.warmup = float(damping), warmup

    def __call__(self, step: int, model: nn.Module, guide: Any) -> None:
        if step > self.warmup:
            update_prior_variance(model, guide, self.damping)
