"""Priors over symmetry parameters, for models that treat η as a latent variable (full Bayes).

Every catalogue model with symmetry parameters η takes ``symmetry_prior`` (``docs/catalogue.md``,
"Model arguments"). ``None`` (default) keeps η a point estimate chosen by the bound — type-II maximum
likelihood, ``η* = argmax_η log p(D | η)`` (paper 003, Sec. 3; paper 004, Eq. 9). A prior name makes
η a latent *sample site* instead, so that the guide carries ``q(η)`` and the bound is an ELBO on the
evidence of the whole hierarchy::

    log p(D) = log ∫ p(D | θ, η) p(θ) p(η) dθ dη  ≥  E_q[log p(D | θ, η)] − KL(q(θ, η) ‖ p(θ) p(η)).

Priors (shapes are η's own; all are Pyro distributions with the event dims of η):

* ``"uniform"`` — bounded η ∈ [0, η_max]: ``η ~ U(0, η_max)`` per coordinate; the non-committal
  choice ("any amount of invariance up to the full group is equally likely a priori").
* ``"logit-normal"`` — bounded η: ``η = η_max · sigmoid(z)``, ``z ~ N(0, 1.5²)``; close to uniform
  in the middle of the range, lighter at both ends (less mass on η ≈ 0 and η ≈ η_max exactly).
* ``"normal"`` — unbounded η (the symmetrised HNN's generator parameters): ``η ~ N(0, 1)`` per
  entry. Such a prior is invariant to the sign of each conserved quantity and to rotations of the
  K-dimensional span of the generators, so the posterior over η is multi-modal and only the span
  (or the learned quantities' level sets) is identified — compare spans (principal angles), not
  coordinates.

A guide sees the site's support (``constraints.interval(0, η_max)`` for bounded priors) and
builds ``q(η)`` in unconstrained space through ``biject_to`` (a logit-normal ``q`` for bounded η).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch import Tensor
from torch.distributions.transforms import AffineTransform, SigmoidTransform

__all__ = [
    "BOUNDED_PRIORS",
    "SYMMETRY_PRIORS",
    "UNBOUNDED_PRIORS",
    "LOGIT_NORMAL_SCALE",
    "ScaledLogitNormal",
    "bounded_prior",
    "check_symmetry_prior",
    "unbounded_prior",
]

#: Priors for symmetry parameters with a range [0, η_max] (invariance ranges, λ of basis regression).
BOUNDED_PRIORS: tuple[str, ...] = ("uniform", "logit-normal")
#: Priors for real-valued symmetry parameters (generators of conserved quantities).
UNBOUNDED_PRIORS: tuple[str, ...] = ("normal",)
#: Every prior name ``symmetry_prior`` takes (each model takes the subset in its ``symmetry_priors``).
SYMMETRY_PRIORS: tuple[str, ...] = BOUNDED_PRIORS + UNBOUNDED_PRIORS
#: Standard deviation of the logit of η/η_max under ``"logit-normal"``.
LOGIT_NORMAL_SCALE = 1.5


class ScaledLogitNormal(dist.TransformedDistribution):
    """``η = upper · sigmoid(z)``, ``z ~ N(loc, scale)``, with support ``interval(0, upper)``.

    ``upper``, ``loc`` and ``scale`` broadcast to the batch shape. (A plain
    ``TransformedDistribution`` would report the affine map's codomain, the real line, as its
    support; guides need the interval to build ``q`` through ``biject_to``.)
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive, "upper": constraints.positive}

    def __init__(
        self, loc: Tensor | float, scale: Tensor | float, upper: Tensor | float, validate_args: bool | None = None
    ) -> None:
        self.loc, self.scale, self.upper = torch.broadcast_tensors(
            torch.as_tensor(loc), torch.as_tensor(scale), torch.as_tensor(upper)
        )
        base = dist.Normal(self.loc, self.scale)
        super().__init__(base, [SigmoidTransform(), AffineTransform(0.0, self.upper)], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self) -> constraints.Constraint:
        return constraints.interval(torch.zeros_like(self.upper), self.upper)

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> ScaledLogitNormal:
        shape = torch.Size(batch_shape)
        return ScaledLogitNormal(self.loc.expand(shape), self.scale.expand(shape), self.upper.expand(shape))


def check_symmetry_prior(symmetry_prior: str | None, allowed: Sequence[str], owner: str) -> str | None:
    """``symmetry_prior`` if it is ``None`` or one of ``allowed``; else a one-line ``ValueError``."""
    if symmetry_prior is None or symmetry_prior in allowed:
        return symmetry_prior
    raise ValueError(
        f"unknown symmetry_prior {symmetry_prior!r} for {owner}; use None (point estimate) or one of {tuple(allowed)}"
    )


def bounded_prior(kind: str, upper: Tensor) -> dist.TorchDistribution:
    """Prior of η ∈ [0, upper] with event shape ``upper.shape`` (``"uniform"`` or ``"logit-normal"``)."""
    event_dim = upper.dim()
    if kind == "uniform":
        fn: dist.TorchDistribution = dist.Uniform(torch.zeros_like(upper), upper)
    elif kind == "logit-normal":
        fn = ScaledLogitNormal(torch.zeros_like(upper), torch.full_like(upper, LOGIT_NORMAL_SCALE), upper)
    else:
        raise ValueError(f"unknown bounded symmetry prior {kind!r}; use one of {BOUNDED_PRIORS}")
    return fn.to_event(event_dim) if event_dim else fn


def unbounded_prior(kind: str, shape: Sequence[int], like: Tensor) -> dist.TorchDistribution:
    """Prior of real η of ``shape`` (``"normal"``: N(0, 1) per entry), dtype and device of ``like``."""
    if kind != "normal":
        raise ValueError(f"unknown unbounded symmetry prior {kind!r}; use one of {UNBOUNDED_PRIORS}")
    zero = like.new_zeros(())
    return dist.Normal(zero, torch.ones_like(zero)).expand(list(shape)).to_event(len(shape))
