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
* :func:`guide_evidence_profile` — ``IWAE_K(η_j)`` at fixed η_j with the fitted guide's own
  ``q(θ | η_j)``: the η-dependence that a full-Bayes ``q(η)`` can follow, against a grid reference
  that fits ``q(θ)`` afresh at every η_j (the amortisation gap).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.distributions import constraints

__all__ = ["GridPosterior", "exact_symmetry_posterior", "grid_posterior", "guide_evidence_profile", "symmetry_draws"]


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


def grid_posterior(grid: Sequence[float] | np.ndarray | Tensor, log_evidence: Sequence[float] | np.ndarray | Tensor,
                   log_prior: Sequence[float] | np.ndarray | Tensor) -> GridPosterior:  # fmt: skip
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
        raise ValueError(f"grid, log_evidence and log_prior must be 1-D of one length >= 2, got "
                         f"{g.shape}, {le.shape}, {lp.shape}")  # fmt: skip
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
    from pyro_invariance.models.basis_regression import BasisRegression

    if not isinstance(model, BasisRegression) or model.symmetry_sites() != ["lam"]:
        raise ValueError(
            "exact_symmetry_posterior needs a BasisRegression with a latent λ (symmetry_prior='uniform' or "
            f"'logit-normal'), got {type(model).__name__} with symmetry_prior={getattr(model, 'symmetry_prior', None)!r}"
        )
    grid, log_evidence, log_prior = model.log_evidence_grid(x, y, num_points)
    return grid_posterior(grid.cpu(), log_evidence.cpu(), log_prior.cpu())


def symmetry_draws(model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int = 1000,
                   seed: int = 0) -> dict[str, Tensor]:  # fmt: skip
    """Draws of ``model.symmetry_sites()`` from the fitted ``guide``: ``{site: (num_samples, *shape)}``.

    ``x``, ``y`` are any minibatch the guide accepts (it is called with them; the draws of global
    sites do not depend on them). Seeded by ``seed``; the caller's RNG state is restored.
    """
    from pyro import poutine

    from pyro_invariance._pyro_scope import pyro_scope
    from pyro_invariance.infer.modes import eval_mode

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


def _strictly_inside(support: Any, value: Tensor) -> bool:
    """Whether ``value`` lies in ``support`` and, for an interval, off its end points (where a bounded
    q(η) is singular and ``biject_to`` clamps instead of failing)."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if isinstance(support, (constraints._Interval, constraints._HalfOpenInterval)):
        return bool(((value > support.lower_bound) & (value < support.upper_bound)).all())
    return bool(support.check(value).all())


def guide_evidence_profile(model: Any, guide: Any, x: Tensor, y: Tensor, values: Sequence[float] | Tensor,
                           K: int = 100, repeats: int = 1, seed: int = 0, common_noise: bool = False,
                           blocks: int = 1) -> Tensor:  # fmt: skip
    """The fitted guide's own evidence profile: at each fixed value η_j of the model's one symmetry site,
    the importance-weighted bound (Burda et al. 2016, Eq. 8) with the guide's conditional ``q(θ | η_j)``
    as proposal, the mean of ``repeats`` estimates (float64 ``(J,)``, nats, all of ``(x, y)``)::

        IWAE_K(η_j) = log (1/K) Σ_k p(D, θ_k | η_j) / q(θ_k | η_j),   θ_k ~ q(θ | η_j)   ≤ log p(D | η_j) (in expectation).

    A full-Bayes ``q(η)`` trained by ``elbo="iwae-given-symmetry"`` targets ``∝ p(η) exp(IWAE_K(η))`` of
    exactly this profile, so comparing it with a grid reference of fixed-η fits (each with its own
    ``q(θ)``) separates the two approximations: where the profile falls below the reference, the one
    guide's ``q(θ | η)`` is worse at η_j than a fit made for η_j (the amortisation gap). With a guide whose
    ``q(θ | η)`` is the exact conditional posterior the bound equals ``log p(D | η_j)`` for every K.

    The guide's draw of η is conditioned to η_j (a catalogue guide names the sites and values:
    :meth:`~pyro_invariance.guides.base.CatalogueGuide.symmetry_condition` — the symmetry-conditional
    guide's noise ``<site>_aux`` that gives u_j, so that its q(θ | η) is read at η_j; any other guide: the
    site itself), as is the model's; the η terms
    ``log p(η_j) − log q(η_j)``, the same in every weight, are taken out. ``values``: points strictly
    inside the support of η (shape ``(J,)`` for a scalar η, ``(J, *event)`` otherwise); a boundary value,
    where ``q(η)`` is singular, is refused. Seeded by ``seed``; the caller's RNG state is restored.

    ``common_noise=True`` draws the same random numbers at every η_j (common random numbers: the RNG
    is reseeded with ``seed`` before each point, so the guide's noise and the model's own draws, e.g.
    its sampled transforms, repeat): the estimate at η_j is then the one a grid of η_j alone gives,
    and the profile is a smooth function of η whose point-to-point differences carry far less noise
    than independent estimates (its level's noise is shared by all points). The default draws a
    fresh stream through the grid.

    ``blocks=R`` (R ≥ 2) draws ``R·K`` particles at each η_j in one pass (vectorised where the model
    allows) and returns every block of ``K``'s bound, float64 ``(R, J)``: R independent IWAE_K estimates
    from one call, each block a stream of common random numbers with ``common_noise=True`` (a GPU
    evaluates R·K particles about as fast as K). ``logsumexp`` over the blocks less ``log R`` is the
    ``IWAE_{RK}`` of the same draws — exactly ``guide_evidence_profile(..., K=R·K)`` with the same seed.
    """
    from pyro import poutine

    from pyro_invariance._pyro_scope import pyro_scope
    from pyro_invariance.guides.base import CatalogueGuide
    from pyro_invariance.infer.fast_step import LeanIWAE_ELBO
    from pyro_invariance.infer.modes import eval_mode
    from pyro_invariance.models.base import symmetry_sites, vectorizable_particles

    sites = symmetry_sites(model)
    if len(sites) != 1:
        raise ValueError(f"guide_evidence_profile needs a model with one latent symmetry site, got {sites} "
                         "(build it with symmetry_prior=...)")  # fmt: skip
    site = sites[0]
    n = x.shape[0]
    if int(blocks) < 1 or int(K) < 1:
        raise ValueError(f"guide_evidence_profile: K and blocks must be >= 1, got K={K}, blocks={blocks}")
    draws = int(K) * int(blocks)
    vector = vectorizable_particles(model) and draws > 1
    loss = LeanIWAE_ELBO(num_particles=draws, vectorize_particles=vector, **({"max_plate_nesting": 1} if vector else {}))
    out = []
    cuda = [x.device] if x.is_cuda else []
    with pyro_scope(), eval_mode(model), eval_mode(guide), torch.random.fork_rng(devices=cuda), torch.no_grad(), \
            warnings.catch_warnings():  # fmt: skip
        warnings.filterwarnings("ignore", message="Found (non-auxiliary )?vars in")  # the conditioned η: observed in both
        torch.manual_seed(seed)
        prior = poutine.trace(model).get_trace(x[:1], y[:1], num_data=n).nodes[site]["fn"]
        poutine.trace(guide).get_trace(x[:1], y[:1], num_data=n)  # sets a lazily built guide up
        values = torch.as_tensor(values, dtype=x.dtype, device=x.device)
        for value in values.reshape(len(values), *prior.event_shape):
            if common_noise:
                torch.manual_seed(seed)
            if not _strictly_inside(prior.support, value):
                raise ValueError(f"η = {value.tolist()} is not strictly inside the support of {site!r}")
            held = guide.symmetry_condition(site, value) if isinstance(guide, CatalogueGuide) else {site: value}
            guide_at = poutine.condition(guide, data=held)
            model_at = poutine.condition(model, data={site: value})
            g_tr = poutine.trace(guide_at).get_trace(x, y, num_data=n)
            if not torch.allclose(g_tr.nodes[site]["value"], value.to(g_tr.nodes[site]["value"]), rtol=1e-4, atol=1e-6):
                raise ValueError(f"{type(guide).__name__}: conditioning {sorted(held)} did not put {site!r} at "
                                 f"{value.tolist()} (got {g_tr.nodes[site]['value'].tolist()})")  # fmt: skip
            m_tr = poutine.trace(poutine.replay(model_at, trace=g_tr)).get_trace(x, y, num_data=n)
            g_tr.compute_log_prob()
            m_tr.compute_log_prob()
            log_q = sum(g_tr.nodes[s]["log_prob"].sum() for s in {site, *held} if s in g_tr.nodes)
            eta_terms = float(m_tr.nodes[site]["log_prob"].sum() - log_q)
            if blocks == 1:
                estimates = [-float(loss.differentiable_loss(model_at, guide_at, x, y, num_data=n)) for _ in range(int(repeats))]
                out.append(sum(estimates) / len(estimates) - eta_terms)
                continue
            each = []
            for _ in range(int(repeats)):
                log_w = loss.log_weights(model_at, guide_at, x, y, num_data=n).double().reshape(int(blocks), int(K), -1)
                each.append((torch.logsumexp(log_w, dim=1) - math.log(K)).sum(-1))
            out.append((torch.stack(each).mean(0) - eta_terms).cpu())
    if blocks == 1:
        return torch.tensor(out, dtype=torch.float64)
    return torch.stack(out, dim=1)
