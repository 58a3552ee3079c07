"""Posteriors over symmetry parameters: the guide's ``q(η)`` and grid references for it.

A model built with ``symmetry_prior`` (:mod:`pyro_invariance.symmetry.priors`) has η as latent
sample sites (``model.symmetry_sites()``); after ``fit`` the guide carries ``q(η)``.

* :func:`symmetry_draws` — draws of the symmetry sites from the guide, ``{site: (num_samples, *shape)}``.
* :class:`GridPosterior` — a 1-D posterior on a grid, ``p(η_j | D) ∝ exp(ℓ_j) p(η_j)`` from log
  evidences ``ℓ_j = log p(D | η_j)`` (exact, or estimated by fixed-η bounds) and the prior density,
  normalised by the trapezoidal rule; mean, sd, mode, CDF, quantiles, interval masses.
* :func:`grid_posterior` — builds one from ``(grid, log_evidence, log_prior)``.
* :func:`exact_symmetry_posterior` — the exact ``p(λ | D)`` of a basis regression with a latent λ
  (closed-form evidence at each grid point, 1-D quadrature): the reference for ``q(λ)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyro import poutine
from torch import Tensor

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.models.basis_regression import BasisRegression

__all__ = ["GridPosterior", "exact_symmetry_posterior", "grid_posterior", "symmetry_draws"]


@dataclass(frozen=True)
class GridPosterior:
    """A normalised density of a scalar η on an increasing grid (numpy float64 arrays).

    Attributes:
        grid: ``(G,)`` increasing η values.
        density: ``(G,)`` ``p(η_j | D)``, integrating to 1 by the trapezoidal rule.
        log_evidence: ``(G,)`` the ``log p(D | η_j)`` it was built from.
        log_marginal: ``log p(D) ≈ log ∫ p(D | η) p(η) dη`` (trapezoidal rule).
    """

    grid: np.ndarray
    density: np.ndarray
    log_evidence: np.ndarray
    log_marginal: float

    def _moments(self) -> tuple[float, float]:
        """Exact first and second moments of the piecewise-linear density (the same density the CDF,
        quantiles and masses use): per cell [a, b] with end densities p_a, p_b,
        ∫x p = h(p_a(2a+b) + p_b(a+2b))/6 and ∫x² p = h(p_a(3a²+2ab+b²) + p_b(a²+2ab+3b²))/12."""
        a, b = self.grid[:-1], self.grid[1:]
        pa, pb = self.density[:-1], self.density[1:]
        h = b - a
        m1 = np.sum(h * (pa * (2 * a + b) + pb * (a + 2 * b)) / 6.0)
        m2 = np.sum(h * (pa * (3 * a * a + 2 * a * b + b * b) + pb * (a * a + 2 * a * b + 3 * b * b)) / 12.0)
        return float(m1), float(m2)

    @property
    def mean(self) -> float:
        return self._moments()[0]

    @property
    def sd(self) -> float:
        m1, m2 = self._moments()
        return float(np.sqrt(max(m2 - m1 * m1, 0.0)))

    @property
    def mode(self) -> float:
        return float(self.grid[int(np.argmax(self.density))])

    def cdf(self, value: float) -> float:
        """``P(η ≤ value | D)`` (trapezoidal rule, linear inside a grid cell)."""
        cum = self.cumulative()
        return float(np.interp(value, self.grid, cum))

    def cumulative(self) -> np.ndarray:
        """The CDF at the grid points, ``(G,)``, from 0 to 1."""
        cells = 0.5 * (self.density[1:] + self.density[:-1]) * np.diff(self.grid)
        return np.concatenate([[0.0], np.cumsum(cells)])

    def mass(self, low: float = -np.inf, high: float = np.inf) -> float:
        """``P(low < η ≤ high | D)``."""
        return self.cdf(high) - self.cdf(low)

    def quantile(self, level: float) -> float:
        """The ``level`` quantile (inverse of the piecewise-linear CDF)."""
        cum = self.cumulative()
        return float(np.interp(level, cum, self.grid))


def _float64(values: Sequence[float] | np.ndarray | Tensor) -> np.ndarray:
    """A float64 numpy copy (tensors detached and moved to the CPU; any strides)."""
    if isinstance(values, Tensor):
        return values.detach().to("cpu", torch.float64).numpy().copy()
    return np.array(values, dtype=np.float64)


def grid_posterior(
    grid: Sequence[float] | np.ndarray | Tensor,
    log_evidence: Sequence[float] | np.ndarray | Tensor,
    log_prior: Sequence[float] | np.ndarray | Tensor,
) -> GridPosterior:
    """``p(η_j | D) = exp(ℓ_j + log p(η_j)) / Z`` on ``grid``, with ``Z`` by the trapezoidal rule.

    Args:
        grid: ``(G,)`` strictly increasing η values (G ≥ 2).
        log_evidence: ``(G,)`` ``log p(D | η_j)`` (exact, or a bound / estimate at each η_j).
        log_prior: ``(G,)`` the prior log density at each η_j.

    Raises:
        ValueError: shapes differ, fewer than 2 points, a grid that is not increasing, non-finite values.
    """
    g, le, lp = (_float64(v) for v in (grid, log_evidence, log_prior))
    if g.ndim != 1 or g.shape != le.shape or g.shape != lp.shape or g.size < 2:
        raise ValueError(
            f"grid, log_evidence and log_prior must be 1-D of one length >= 2, got {g.shape}, {le.shape}, {lp.shape}"
        )
    if not np.all(np.diff(g) > 0):
        raise ValueError("grid must be strictly increasing")
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(le)) and np.all(np.isfinite(lp))):
        raise ValueError("grid, log_evidence and log_prior must be finite")
    joint = le + lp
    top = joint.max()
    unnorm = np.exp(joint - top)
    z = float(np.trapezoid(unnorm, g))
    return GridPosterior(g, unnorm / z, le, float(top + np.log(z)))


def exact_symmetry_posterior(model: Any, x: Tensor, y: Tensor, num_points: int = 2001) -> GridPosterior:
    r"""The exact posterior of λ for a :class:`~pyro_invariance.models.basis_regression.BasisRegression`
    built with ``symmetry_prior`` (λ the latent site ``"lam"``), by quadrature::

        p(λ | D) = p(D | λ) p(λ) / p(D),      p(D) = ∫_0^2 p(D | λ) p(λ) dλ,

    with the closed-form evidence ``log p(D | λ) = model.log_evidence(x, y, lam=λ)`` (the weights
    integrated out, float64) and the model's own prior ``p(λ)``
    (``bounded_prior(model.symmetry_prior, 2)``: ``"uniform"`` or ``"logit-normal"`` on ``[0, 2]``),
    both on the ``num_points`` interior points of an even grid on ``[0, 2]``
    (:meth:`~pyro_invariance.models.basis_regression.BasisRegression.log_evidence_grid`: spacing
    ``2 / (num_points + 1)``; a logit-normal's log density is −∞ at the end points), normalised by
    the trapezoidal rule (:func:`grid_posterior`). The two end cells left out hold at most
    ``2 / (num_points + 1) · max(p(0 | D), p(2 | D))`` of the mass (``model.log_marginal_evidence``
    adds them to its ``log p(D)``; ``log_marginal`` here leaves them out).

    The evidence is even about λ = 1 (``p(D | λ) = p(D | 2 − λ)``, see the model's docstring), and so
    are both priors and the grid: the posterior is symmetric about λ = 1 and its mean is 1.

    Raises:
        ValueError: ``model`` is not a basis regression with a latent λ, or ``num_points < 3``.
    """
    if not isinstance(model, BasisRegression) or model.symmetry_sites() != ["lam"]:
        raise ValueError(
            "exact_symmetry_posterior needs a BasisRegression with a latent λ (symmetry_prior='uniform' or "
            f"'logit-normal'), got {type(model).__name__} "
            f"with symmetry_prior={getattr(model, 'symmetry_prior', None)!r}"
        )
    grid, log_evidence, log_prior = model.log_evidence_grid(x, y, num_points)
    return grid_posterior(grid.cpu(), log_evidence.cpu(), log_prior.cpu())


def symmetry_draws(
    model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int = 1000, seed: int = 0
) -> dict[str, Tensor]:
    """Draws of ``model.symmetry_sites()`` from the fitted ``guide``: ``{site: (num_samples, *shape)}``.

    ``x``, ``y`` are any minibatch the guide accepts (it is called with them; the draws of global
    sites do not depend on them). Seeded by ``seed``; the caller's RNG state is restored.
    """
    sites = list(model.symmetry_sites())
    if not sites:
        raise ValueError(f"{type(model).__name__} has no latent symmetry sites (build it with symmetry_prior=...)")
    out: dict[str, list[Tensor]] = {s: [] for s in sites}
    with pyro_scope(), eval_mode(model), eval_mode(guide), torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for _ in range(int(num_samples)):
            trace = poutine.trace(guide).get_trace(x, y, num_data=x.shape[0])
            for s in sites:
                out[s].append(trace.nodes[s]["value"].detach().cpu())
    return {s: torch.stack(v) for s, v in out.items()}
