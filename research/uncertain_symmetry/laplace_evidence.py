"""``log p(D | η)`` of an invariant MLP at a fixed η by a Laplace approximation of its read-out.

Given η and the transforms, an :class:`InvariantMLP`'s read-out is a Bayesian multinomial logistic
regression on fixed features (see :mod:`~research.uncertain_symmetry.annealed_evidence`):

    p(D | σ_p, η) = ∫ N(W; 0, σ_p² I) Π_n Cat(y_n | softmax(h̃_n W)) dW,   W = [W2, b2] ``(H + 1, C)``.

Its log posterior is concave in W, so the mode W* is unique and Newton's method finds it. The Laplace
approximation (MacKay 1992; the evidence that paper 004 maximises, Eqs. 9–11, here with the exact Hessian
rather than KFAC) is

    log p(D | σ_p, η) ≈ log p(D | W*) − ‖W*‖² / (2σ_p²) − m C log σ_p − ½ log det Λ,
    Λ = Σ_n (B_n B_nᵀ) ⊗ (diag p_n − p_n p_nᵀ) + I / σ_p²,

in the basis of ``H̃``'s right singular vectors (``H̃ = U Σ Vᵀ``, ``B = U Σ`` ``(N, m)``, ``m`` = rank): the
isotropic prior keeps its form there, and the ``(H + 1 − m) C`` directions outside the row space never
meet the likelihood and integrate to 1 exactly. For a softmax likelihood the Hessian equals the
generalised Gauss–Newton matrix, so no curvature approximation enters — only the Gaussian shape.

For ``prior="hierarchical"`` (``s = log σ_p ~ N(log σ₀, 1)``) the profile over a grid of ``s`` is integrated
against that prior by the trapezoidal rule (the same integral that the AIS reference takes); ``"fixed"``
and ``"learned"`` priors evaluate the model's σ_p only. Transforms drawn at random (``sampling=
"stochastic"``) enter as ``draws`` independent designs whose evidences are averaged,
``log mean_r p(D | ε_r, η)``, as AIS's chains average them.

With η a latent site (``symmetry_prior``), :func:`laplace_symmetry_posterior` evaluates this evidence on a grid of η and
returns ``p(η_j | D) ∝ p(D | η_j) p(η_j)`` with the model's own prior, and :func:`laplace_symmetry_predictive` predicts
with η integrated out over that grid (or at its mode: the type-II predictive).

Cost per σ_p: a few Newton steps, each one ``(mC) × (mC)`` Cholesky factorisation (``m ≤ min(N, H + 1)``).
The approximation's error is not diagnosed by this function; measure it against
:func:`~research.uncertain_symmetry.annealed_evidence.annealed_readout_evidence` (as
``research/uncertain_symmetry/scripts/uncertain_symmetry_laplace.py`` does, at every point of the AIS scan).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from pyro_invariance.diagnostics.symmetry_posterior import GridPosterior, grid_posterior
from pyro_invariance.models.invariant_mlp import InvariantMLP
from pyro_invariance.symmetry.priors import bounded_prior
from pyro_invariance.validation import check_labels, check_positive_int, check_seed
from research.uncertain_symmetry.annealed_evidence import _check_positive, _design, _invariant_mlp, _log_scale_prior

__all__ = [
    "LaplaceEvidence",
    "LaplaceSymmetryPosterior",
    "laplace_readout_evidence",
    "laplace_readout_predictive",
    "laplace_symmetry_posterior",
    "laplace_symmetry_predictive",
    "readout_log_evidence",
    "readout_mode",
]


@dataclass(frozen=True)
class LaplaceEvidence:
    """The Laplace estimate of ``log p(D | η)`` (nats, all N data).

    Attributes:
        log_evidence: the estimate (σ_p integrated out for a hierarchical prior).
        log_scales: ``(G,)`` float64 ``s = log σ_p`` where the read-out's evidence was evaluated.
        scale_profile: ``(G,)`` float64 Laplace ``log p(D | σ_p = e^s, η)`` (log mean over the draws).
        sigma_mode: σ_p at the grid's highest ``profile + log p(s)`` (the model's σ_p for a non-hierarchical prior).
        num_data: N.
        newton_steps: Newton steps taken over the whole grid and all draws.
        edge_share: the share of the hierarchical σ_p integral in the grid's last 5 % (0 for a fixed σ_p), as
            :class:`~research.uncertain_symmetry.annealed_evidence.AnnealedEvidence`'s: large means the grid
            ends before σ_p's posterior does and ``log_evidence`` is too low (widen ``scale_span``).
    """

    log_evidence: float
    log_scales: Tensor
    scale_profile: Tensor
    sigma_mode: float
    num_data: int
    newton_steps: int
    edge_share: float = 0.0

    @property
    def per_datum(self) -> float:
        """``log_evidence / num_data``."""
        return self.log_evidence / self.num_data


@dataclass(frozen=True)
class LaplaceSymmetryPosterior(GridPosterior):
    """A :class:`~pyro_invariance.diagnostics.symmetry_posterior.GridPosterior` over η from Laplace evidences, with
    what :func:`laplace_symmetry_predictive` needs at each grid point.

    Attributes:
        sigma_modes: ``(G,)`` the read-out's σ_p at each η_j (its posterior mode for a hierarchical prior).
    """

    sigma_modes: np.ndarray

    @classmethod
    def from_grid(cls, posterior: GridPosterior, sigma_modes: Sequence[float] | np.ndarray) -> LaplaceSymmetryPosterior:
        """``posterior`` with the σ_p of each of its grid points (e.g. rebuilt from stored evidences)."""
        sigmas = np.asarray(sigma_modes, dtype=np.float64)
        if sigmas.shape != posterior.grid.shape or not np.all(np.isfinite(sigmas) & (sigmas > 0)):
            raise ValueError(
                f"sigma_modes must be {posterior.grid.shape[0]} positive finite values, got shape {sigmas.shape}"
            )
        return cls(posterior.grid, posterior.density, posterior.log_evidence, posterior.log_marginal, sigmas)

    def weights(self) -> np.ndarray:
        """``(G,)`` the probability each grid point carries: its trapezoidal cell mass, normalised to sum to 1."""
        h = np.diff(self.grid)
        cell = np.concatenate([h[:1], h[:-1] + h[1:], h[-1:]]) / 2
        w = self.density * cell
        return w / w.sum()

    def top_points(self, mass: float) -> np.ndarray:
        """Indices of the fewest grid points whose :meth:`weights` sum to at least ``mass`` (largest first; ``mass=0``:
        the mode alone)."""
        if isinstance(mass, bool) or not isinstance(mass, (int, float)) or not 0.0 <= mass <= 1.0:
            raise ValueError(f"mass must be a number in [0, 1], got {mass!r}")
        w = self.weights()
        order = np.argsort(-w, kind="stable")
        return order[: int(np.searchsorted(np.cumsum(w[order]), mass * (1 - 1e-12))) + 1]


def _softmax_hessian(basis: Tensor, probs: Tensor) -> Tensor:
    """``(mC, mC)`` Σ_n (B_n B_nᵀ) ⊗ (diag p_n − p_n p_nᵀ), index ``k C + c``.

    The Hessian of the negative log-likelihood.
    """
    m, c = basis.shape[1], probs.shape[1]
    g = (basis.unsqueeze(-1) * probs.unsqueeze(1)).reshape(basis.shape[0], m * c)  # (N, mC): B_nk p_nc
    hess = -(g.T @ g).reshape(m, c, m, c)
    diag = (basis.T.unsqueeze(0) * probs.T.unsqueeze(1)) @ basis  # (C, m, m): Σ_n p_nc B_nk B_nl
    idx = torch.arange(c, device=basis.device)
    hess[:, idx, :, idx] += diag
    return hess.reshape(m * c, m * c)


def readout_mode(
    basis: Tensor, onehot: Tensor, sigma: float, init: Tensor | None = None, *, tol: float = 1e-8, max_steps: int = 100
) -> tuple[Tensor, Tensor, Tensor, int]:
    """Newton's method for the mode of ``log p(D | W) − ‖W‖² / (2σ²)``, ``W`` ``(m, C)``, logits ``basis @ W``.

    Returns ``(W*, log p(D | W*), L, steps)`` with ``L`` the Cholesky factor of Λ at W*. Stops when the
    Newton decrement gᵀΛ⁻¹g falls below ``tol``; steps are halved until the objective rises (it is concave)."""
    m, c = basis.shape[1], onehot.shape[1]
    w = torch.zeros(m, c, dtype=basis.dtype, device=basis.device) if init is None else init.clone()
    eye = torch.eye(m * c, dtype=basis.dtype, device=basis.device) / sigma**2

    def objective(v: Tensor) -> tuple[Tensor, Tensor]:
        logits = basis @ v
        ll = (logits * onehot).sum() - torch.logsumexp(logits, -1).sum()
        return ll, ll - 0.5 * (v**2).sum() / sigma**2

    ll, obj = objective(w)
    for step in range(1, max_steps + 1):
        probs = torch.softmax(basis @ w, -1)
        grad = (basis.T @ (onehot - probs) - w / sigma**2).reshape(-1)
        chol = torch.linalg.cholesky(_softmax_hessian(basis, probs) + eye)
        delta = torch.cholesky_solve(grad.unsqueeze(-1), chol).squeeze(-1)
        decrement = float(grad @ delta)
        if decrement < tol:
            return w, ll, chol, step - 1
        t = 1.0
        while True:
            ll_new, obj_new = objective(w + t * delta.reshape(m, c))
            if obj_new >= obj - 1e-12 * abs(float(obj)) or t < 1e-8:
                break
            t /= 2
        w, ll, obj = w + t * delta.reshape(m, c), ll_new, obj_new
    raise RuntimeError(f"Newton's method did not converge in {max_steps} steps (decrement {decrement:.3g})")


def readout_log_evidence(
    basis: Tensor, onehot: Tensor, sigma: float, init: Tensor | None = None
) -> tuple[float, Tensor, int]:
    """Laplace ``log ∫ N(W; 0, σ² I) Π_n Cat(y_n | softmax(B_n W)) dW`` for ``basis`` B ``(N, m)`` of full column rank.

    Returns ``(log evidence, W*, Newton steps)``: ``log p(D | W*) − ‖W*‖²/(2σ²) − mC log σ − ½ log det Λ``."""
    w, ll, chol, steps = readout_mode(basis, onehot, sigma, init)
    logdet = 2.0 * torch.log(torch.diagonal(chol)).sum()
    return float(ll - 0.5 * (w**2).sum() / sigma**2 - w.numel() * math.log(sigma) - 0.5 * logdet), w, steps


def laplace_readout_evidence(
    model: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_scales: int = 29,
    scale_span: tuple[float, float] = (-2.0, 5.0),
    draws: int = 1,
    seed: int = 0,
) -> LaplaceEvidence:
    """Laplace estimate of ``log p(D | η)`` for an :class:`InvariantMLP` at its fixed η (module docstring).

    Args:
        model: an ``InvariantMLP`` whose η is not a latent site.
        x: ``(N, C, h, w)`` or ``(N, D)`` images; y: ``(N,)`` labels.
        num_scales: G, grid points of ``s = log σ_p`` for a hierarchical prior (ignored otherwise).
        scale_span: the grid runs from ``log σ₀ + scale_span[0]`` to ``log σ₀ + scale_span[1]`` (prior sd 1).
        draws: R designs (draws of the transforms) averaged; 1 suffices for ``sampling="deterministic"``.
        seed: the transforms' random numbers (the same seed gives the same designs at every η).

    Returns:
        :class:`LaplaceEvidence`.
    """
    model = _invariant_mlp(model)
    x, y, scales, prior = _checked(model, x, y, num_scales, scale_span)
    return _evidence_of_design(
        _design(model, x, check_positive_int("draws", draws), check_seed(seed)), y, model.num_classes, scales, *prior
    )


def _checked(
    model: Any, x: Tensor, y: Tensor, num_scales: int, scale_span: tuple[float, float]
) -> tuple[Tensor, Tensor, Tensor, tuple[float, bool]]:
    """Flattened ``x``, checked ``y``, the grid of ``s = log σ_p`` and ``(loc, hierarchical)`` of σ_p's prior."""
    lo, hi = (float(v) for v in scale_span)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"scale_span must be two finite numbers, low < high, got {scale_span!r}")
    x = model._flatten(torch.as_tensor(x))
    y = torch.as_tensor(y)
    check_labels(y, x.shape[0], model.num_classes)
    loc, hierarchical = _log_scale_prior(model)
    num_scales = check_positive_int("num_scales", num_scales, minimum=2) if hierarchical else 1
    scales = (
        torch.linspace(loc + lo, loc + hi, num_scales, dtype=torch.float64)
        if hierarchical
        else torch.tensor([loc], dtype=torch.float64)
    )
    return x, y, scales, (loc, hierarchical)


def laplace_symmetry_posterior(
    model: Any,
    x: Tensor,
    y: Tensor,
    grid: Sequence[float] | Tensor | None = None,
    *,
    num_points: int = 32,
    num_scales: int = 29,
    scale_span: tuple[float, float] = (-2.0, 5.0),
    draws: int = 1,
    seed: int = 0,
    progress: bool = False,
) -> LaplaceSymmetryPosterior:
    """The posterior over η of an :class:`InvariantMLP` whose η is a latent site, on a grid, from the Laplace evidence:

        p(η_j | D) ∝ p(D | η_j) p(η_j),   log p(D | η_j) ≈ :func:`laplace_readout_evidence` at η_j,

    with the model's own prior ``p(η)`` (``symmetry_prior``: uniform or logit-normal on ``[0, η_max]``), normalised by
    the trapezoidal rule (:func:`~pyro_invariance.diagnostics.symmetry_posterior.grid_posterior`). The model's features
    are computed at η_j (``model.features(x, eta=η_j)``), so the same model that SVI fits with a ``q(η)`` gives its
    reference: compare ``symmetry_draws(model, guide, ...)["eta"]`` with this posterior. The
    read-out's parameters are integrated out at every η_j, the first layer is the model's (fixed) features. Cost:
    one Laplace evidence per grid point (about 30 s at N = 300, H = 256 on one CPU core). Its error is not diagnosed
    here; ``research/uncertain_symmetry/scripts/uncertain_symmetry_laplace.py`` measures it against AIS
    (5–21 nats low, changing by 7–14 nats along η on 300 digits).

    Args:
        model: an ``InvariantMLP`` with one generator, built with ``symmetry_prior``.
        x: ``(N, C, h, w)`` or ``(N, D)`` images; y: ``(N,)`` labels.
        grid: ``(G,)`` increasing η strictly inside ``(0, η_max)`` (a logit-normal prior's density is 0 at the ends);
            default: the ``num_points`` interior points of an even grid on ``[0, η_max]``
            (spacing ``η_max / (num_points + 1)``).
        num_scales, scale_span, draws, seed: as in :func:`laplace_readout_evidence` (the same ``seed`` at every η_j:
            common random numbers for random transforms).
        progress: a tqdm bar over the grid.

    Returns:
        :class:`LaplaceSymmetryPosterior`: a ``GridPosterior`` (its ``log_evidence``: the Laplace ``log p(D | η_j)``)
        with the σ_p mode at each η_j, for :func:`laplace_symmetry_predictive`.
    """
    model = _latent_eta_mlp(model, "laplace_symmetry_posterior")
    upper = float(model.eta_upper[0])
    if grid is None:
        points = check_positive_int("num_points", num_points, minimum=2)
        values = torch.arange(1, points + 1, dtype=torch.float64) * upper / (points + 1)
    else:
        values = torch.as_tensor(grid, dtype=torch.float64).detach().cpu()
        if values.ndim != 1 or values.numel() < 2 or not bool(torch.all(torch.diff(values) > 0)):
            raise ValueError(
                f"grid must be 1-D and strictly increasing with at least 2 points, got shape {tuple(values.shape)}"
            )
        if not bool(torch.all((values > 0) & (values < upper))):
            raise ValueError(f"grid must lie strictly inside (0, η_max = {upper:.6g})")
    x, y, scales, prior = _checked(model, x, y, num_scales, scale_span)
    draws, seed = check_positive_int("draws", draws), check_seed(seed)
    like = model.eta_upper
    results = []
    for eta in tqdm(values.tolist(), desc="η grid", disable=not progress):
        design = _design(model, x, draws, seed, eta=torch.tensor([eta], dtype=like.dtype, device=like.device))
        results.append(_evidence_of_design(design, y, model.num_classes, scales, *prior))
    log_prior = bounded_prior(model.symmetry_prior, like.double().cpu()).log_prob(values.unsqueeze(-1))
    return LaplaceSymmetryPosterior.from_grid(
        grid_posterior(values, [r.log_evidence for r in results], log_prior), [r.sigma_mode for r in results]
    )


def _latent_eta_mlp(model: Any, caller: str) -> Any:
    if not isinstance(model, InvariantMLP) or not model.eta_is_latent or len(model.generator_names) != 1:
        raise ValueError(
            f"{caller} needs an InvariantMLP with one generator and a latent η (symmetry_prior="
            f"'uniform' or 'logit-normal'), got {type(model).__name__}"
        )
    return model


def laplace_symmetry_predictive(
    model: Any,
    x: Tensor,
    y: Tensor,
    x_new: Tensor,
    posterior: LaplaceSymmetryPosterior,
    *,
    mass: float = 0.999,
    draws: int = 256,
    seed: int = 0,
) -> Tensor:
    """``(M, C)`` log posterior-predictive probabilities with η integrated out over the Laplace grid posterior:

        p(y* | x*, D) = Σ_j w_j p(y* | x*, D, η_j),

    ``w_j`` the grid points' probabilities (:meth:`LaplaceSymmetryPosterior.weights`) and ``p(y* | x*, D, η_j)`` the
    read-out's Laplace predictive at η_j and its σ_p (:func:`laplace_readout_predictive`). Only the fewest points that
    hold ``mass`` of the posterior enter (:meth:`LaplaceSymmetryPosterior.top_points`; their weights renormalised):
    ``mass=0`` keeps the posterior's mode alone, the type-II (maximum a posteriori η on the grid) predictive of the
    same model.

    Args:
        model: the ``InvariantMLP`` with a latent η that ``posterior`` was computed for
            (:func:`laplace_symmetry_posterior`).
        x, y: its training images and labels; x_new: ``(M, ...)`` images to predict.
        posterior: the grid posterior with σ_p per point.
        mass: in ``[0, 1]``; draws, seed: as in :func:`laplace_readout_predictive` (the same at every η_j).
    """
    model = _latent_eta_mlp(model, "laplace_symmetry_predictive")
    if not isinstance(posterior, LaplaceSymmetryPosterior):
        raise TypeError(
            "posterior must be a LaplaceSymmetryPosterior (laplace_symmetry_posterior's result), "
            f"got {type(posterior).__name__}"
        )
    keep = posterior.top_points(mass)
    args = _checked_predictive(model, x, y, x_new, draws, seed)
    w = posterior.weights()
    like = model.eta_upper
    terms = []
    for j in keep.tolist():
        eta = torch.tensor([posterior.grid[j]], dtype=like.dtype, device=like.device)
        terms.append(_predictive(model, *args, float(posterior.sigma_modes[j]), eta) + math.log(w[j]))
    return torch.logsumexp(torch.stack(terms), 0) - math.log(float(w[keep].sum()))


def _evidence_of_design(
    design: Tensor, y: Tensor, num_classes: int, scales: Tensor, loc: float, hierarchical: bool
) -> LaplaceEvidence:
    """:func:`laplace_readout_evidence` for checked arguments: ``design`` ``(R, N, P)`` (R draws of the features),
    ``scales`` the grid of ``s = log σ_p`` (one value, ``loc``, for a non-hierarchical prior)."""
    draws = design.shape[0]
    onehot = torch.nn.functional.one_hot(y.long(), num_classes).to(design)
    profiles, steps = [], 0
    for d in design:
        u, sv, _ = torch.linalg.svd(d, full_matrices=False)
        rank = int((sv > sv[0] * 1e-10).sum())
        basis = u[:, :rank] * sv[:rank]
        modes: list[Tensor] = []
        values = []
        for s in scales.tolist():
            sigma = math.exp(s)
            # warm start: the previous modes extrapolated linearly in s (the grid is uniform)
            init = None if not modes else modes[-1] if len(modes) == 1 else 2 * modes[-1] - modes[-2]
            value, w, n = readout_log_evidence(basis, onehot, sigma, init)
            modes = [*modes[-1:], w]
            steps += n
            values.append(value)
        profiles.append(torch.tensor(values, dtype=torch.float64))
    profile = torch.logsumexp(torch.stack(profiles), 0) - math.log(draws)
    if hierarchical:
        ds = torch.diff(scales)
        trap = torch.cat([ds[:1], ds[:-1] + ds[1:], ds[-1:]]) / 2
        terms = profile - 0.5 * (scales - loc) ** 2 - 0.5 * math.log(2 * math.pi)
        mass = terms + trap.log()
        log_evidence = float(torch.logsumexp(mass, 0))
        edge = int(math.ceil(0.95 * len(scales)))
        edge_share = float(torch.exp(torch.logsumexp(mass[edge:], 0) - log_evidence)) if edge < len(scales) else 0.0
        sigma_mode = math.exp(float(scales[int(torch.argmax(terms))]))
    else:
        log_evidence, sigma_mode, edge_share = float(profile[0]), math.exp(loc), 0.0
    return LaplaceEvidence(
        log_evidence=log_evidence,
        log_scales=scales,
        scale_profile=profile,
        sigma_mode=sigma_mode,
        num_data=int(design.shape[1]),
        newton_steps=steps,
        edge_share=edge_share,
    )


def laplace_readout_predictive(
    model: Any, x: Tensor, y: Tensor, x_new: Tensor, *, sigma: float, draws: int = 256, seed: int = 0
) -> Tensor:
    """``(M, C)`` log posterior-predictive probabilities of ``x_new``, Laplace posterior of the read-out at σ_p.

    The posterior is ``N(W*, Λ⁻¹)`` in the row space of the training features (:func:`readout_mode`) and the prior
    ``N(0, σ_p² I)`` outside it, where the data say nothing; ``log (1/K) Σ_k softmax(h̃(x_new) W_k)`` over ``draws``
    draws W_k. Deterministic transforms (``sampling="deterministic"``) make the features, and so the result, a
    function of η alone; random ones are drawn once, under ``seed``, for the training and the new inputs alike.

    Args:
        model: an ``InvariantMLP`` whose η is not a latent site.
        x, y: the training images and labels; x_new: ``(M, ...)`` images to predict.
        sigma: the read-out's prior scale σ_p (e.g. :attr:`LaplaceEvidence.sigma_mode`).
        draws: K posterior draws of W; seed: their random numbers and the transforms'.
    """
    model = _invariant_mlp(model)
    sigma = _check_positive("sigma", sigma)
    return _predictive(model, *_checked_predictive(model, x, y, x_new, draws, seed), sigma)


def _checked_predictive(
    model: Any, x: Tensor, y: Tensor, x_new: Tensor, draws: int, seed: int
) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """Flattened ``x`` and ``x_new``, checked ``y``, ``draws`` and ``seed``."""
    x = model._flatten(torch.as_tensor(x))
    y = torch.as_tensor(y)
    check_labels(y, x.shape[0], model.num_classes)
    return x, y, model._flatten(torch.as_tensor(x_new)), check_positive_int("draws", draws), check_seed(seed)


def _predictive(
    model: Any, x: Tensor, y: Tensor, x_new: Tensor, draws: int, seed: int, sigma: float, eta: Tensor | None = None
) -> Tensor:
    """:func:`laplace_readout_predictive` for checked arguments, at ``eta`` ``(k,)`` (the model's η if None)."""
    design = _design(model, torch.cat([x, x_new]), 1, seed, eta)[0]  # (N + M, P): one draw of the transforms for both
    train, new = design[: x.shape[0]], design[x.shape[0] :]
    _, sv, vt = torch.linalg.svd(train, full_matrices=False)
    rank = int((sv > sv[0] * 1e-10).sum())
    v = vt[:rank].T  # (P, m)
    basis = train @ v  # = U Σ
    onehot = torch.nn.functional.one_hot(y.long(), model.num_classes).to(design)
    w, _, chol, _ = readout_mode(basis, onehot, sigma)
    gen = torch.Generator(device=design.device).manual_seed(seed + 1)
    m, c = w.shape
    eps = torch.randn(draws, m * c, generator=gen, dtype=design.dtype, device=design.device)
    # N(W*, Λ⁻¹) with Λ = L Lᵀ: one triangular solve for all draws (a batched solve would copy L per draw)
    inside = w + torch.linalg.solve_triangular(chol.T, eps.T, upper=True).T.reshape(draws, m, c)
    outside = sigma * torch.randn(draws, design.shape[1], c, generator=gen, dtype=design.dtype, device=design.device)
    logits = (new @ v) @ inside + (new - (new @ v) @ v.T) @ outside  # (K, M, C)
    return torch.logsumexp(torch.log_softmax(logits, -1), 0) - math.log(draws)
