"""``log p(D | η)`` of an invariant MLP at a fixed η by annealed importance sampling.

The fixed-η IWAE_K bounds that the grid references are built from use a mean-field
``q(θ)`` as the proposal; their PSIS k̂ is 3–10, so one weight decides the estimate and the bound can
lie far below ``log p(D | η)``. Given η and the transforms' noise ε, an :class:`InvariantMLP`'s read-out
is a Bayesian multinomial logistic regression on fixed features, whose evidence annealed importance
sampling (AIS; Neal 2001) estimates with a diagnosable error:

    p(D | η) = E_ε ∫ p(s) p(D | σ_p = e^s, ε, η) ds,   p(D | σ_p, ε, η) = ∫ N(Z; 0, I) p(D | W = σ_p Z, ε, η) dZ,

with ``W = [W2, b2]`` ``(H + 1, C)`` (prior ``N(0, σ_p² I)``, written non-centred as ``W = σ_p Z``),
``s = log σ_p ~ N(log σ₀, 1)`` for ``prior="hierarchical"`` (``"fixed"`` and ``"learned"``: σ_p is the
model's value) and ``p(D | W, ε, η) = Π_n Cat(y_n | softmax(h̃_n W))``, ``h̃_n = [h(x_n), 1]`` the invariant
features of paper 003, Eq. 4, for one draw of the S transforms (``model.features``).

**The path is the prior scale.** Each of ``R`` chains draws its own ε (ε is part of the model, drawn from
its prior and never moved, so the weights average over it) and ``Z ~ N(0, I)``, and walks up a grid of
scales ``s_0 < s_1 < … < s_{T−1}`` through ``π_t(Z) ∝ N(Z; 0, I) p(D | e^{s_t} Z)``: ``log w`` starts at
``log p(D | e^{s_0} Z)`` (importance sampling from the prior; ``s_0`` is so small that the logits are
≲ 0.05 and the likelihood is nearly flat) and gains ``log p(D | e^{s_t} Z) − log p(D | e^{s_{t−1}} Z)`` at
every step, followed by ``leapfrog`` steps of Hamiltonian Monte Carlo that leave ``π_t`` invariant. After
step t, ``mean_r w_r`` estimates ``p(D | σ_p = e^{s_t}, η)`` without bias, for every ``t`` of one run: the
whole profile over σ_p. The hierarchical evidence integrates it against ``N(s; log σ₀, 1)`` (trapezoidal
rule over the fine grid, per chain, so each chain keeps one unbiased weight); the grid runs to
``log σ₀ + 5``. The non-centred ``Z`` is what makes the path short: directions of ``W`` that the data do
not inform stay ``N(0, 1)`` along it, where a path in ``W`` would have to stretch all ``D`` of them.

HMC uses a diagonal mass that depends only on the scale and the chain's features: in the basis of the
right singular vectors of ``H̃`` (``H̃ = U Σ Vᵀ``; the prior is isotropic, so the rotated ``Z`` has the
same prior), ``M_kc = 1 + κ σ² Σ_k²`` bounds the Hessian's diagonal (``κ = 1/4`` bounds ``p(1 − p)``).
Directions outside ``H̃``'s row space never meet the likelihood and are integrated out exactly.

Diagnostics: the chains' log-weight sd and PSIS k̂ (:func:`~pyro_invariance.infer.bounds.psis_khat`; below
0.7 the estimate is reliable), the HMC acceptance rate, and the share of the σ_p integral in the
grid's top end (``edge_share``; large means the grid ends too early). The same ``seed`` gives the same ε
and the same random numbers at every η (common random numbers along a scan of η).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pyro_invariance.infer.bounds import psis_khat
from pyro_invariance.models.invariant_mlp import InvariantMLP
from pyro_invariance.tasks import seeded_rng
from pyro_invariance.validation import check_labels, check_positive_int, check_seed

__all__ = ["AnnealedEvidence", "annealed_readout_evidence", "readout_design"]


@dataclass(frozen=True)
class AnnealedEvidence:
    """The AIS estimate of ``log p(D | η)`` (nats, all N data) and its diagnostics.

    Attributes:
        log_evidence: ``log mean_r exp(log_weights_r)``.
        log_weights: ``(R,)`` float64, one per chain.
        k_hat: PSIS k̂ of ``log_weights`` (reliable below 0.7).
        acceptance: mean HMC acceptance over chains and temperatures.
        num_data: N.
        temperatures: T, the number of scales on the path.
        log_scales: ``(T,)`` float64 ``s_t = log σ_p`` of the path.
        scale_profile: ``(T,)`` float64 ``log p(D | σ_p = e^{s_t}, η)`` (log mean of the chains' weights).
        edge_share: the share of the hierarchical σ_p integral in the grid's last 5 % (0 for a fixed σ_p).
        sigma_mode: σ_p at the path's highest ``scale_profile + log p(s)`` (σ_p's posterior mode on the path; the
            model's σ_p for a non-hierarchical prior).
    """

    log_evidence: float
    log_weights: Tensor
    k_hat: float
    acceptance: float
    num_data: int
    temperatures: int
    log_scales: Tensor
    scale_profile: Tensor
    edge_share: float
    sigma_mode: float

    @property
    def log_weight_sd(self) -> float:
        """The standard deviation of the chains' log weights in nats; about 1 or less when AIS is close to exact."""
        return float(self.log_weights.std())

    @property
    def per_datum(self) -> float:
        """``log_evidence / num_data``."""
        return self.log_evidence / self.num_data


def _invariant_mlp(model: Any) -> Any:
    if not isinstance(model, InvariantMLP):
        raise TypeError(f"annealed_readout_evidence needs an InvariantMLP, got {type(model).__name__}")
    if model.eta_is_latent:
        raise ValueError(
            "η is a latent site of this model: build it with a fixed η "
            "(symmetry_prior=None, learn_symmetry=False, eta_init=η) to estimate log p(D | η)"
        )
    return model


def readout_design(model: Any, x: Tensor, chains: int, seed: int = 0) -> Tensor:
    """``(R, N, H + 1)`` float64: ``[h(x), 1]`` for each of ``chains`` draws of the S transforms.

    ``model.features`` draws its transforms from torch's RNG; here it runs under ``seed``
    (:func:`~pyro_invariance.tasks.seeded_rng`), so the same seed gives the same ε
    at every η. Deterministic ε (``sampling="deterministic"``) gives R equal matrices."""
    model = _invariant_mlp(model)
    return _design(model, model._flatten(torch.as_tensor(x)), check_positive_int("chains", chains), check_seed(seed))


def _design(model: Any, x: Tensor, chains: int, seed: int, eta: Tensor | None = None) -> Tensor:
    """:func:`readout_design` for checked arguments and flattened ``x``.

    At ``eta`` ``(k,)`` if given, else at the model's η.
    """
    with torch.no_grad(), seeded_rng(seed):
        feats = torch.stack([model.features(x, eta) for _ in range(chains)]).double()
    ones = torch.ones(*feats.shape[:-1], 1, dtype=feats.dtype, device=feats.device)
    return torch.cat([feats, ones], dim=-1)


def _check_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _log_scale_prior(model: Any) -> tuple[float, bool]:
    """``(log σ₀ or log σ_p, hierarchical?)`` for the model's read-out prior."""
    if model.prior == "hierarchical":
        return float(model.prior_scale_loc), True
    return math.log(float(torch.as_tensor(model.prior_scale).detach())), False


def annealed_readout_evidence(
    model: Any,
    x: Tensor,
    y: Tensor,
    *,
    chains: int = 64,
    temperatures: int = 1000,
    leapfrog: int = 5,
    step_size: float = 0.3,
    curvature: float = 0.25,
    seed: int = 0,
) -> AnnealedEvidence:
    """AIS estimate of ``log p(D | η)`` for an :class:`InvariantMLP` at its fixed η (module docstring).

    Args:
        model: an ``InvariantMLP`` whose η is not a latent site (a fixed or a point-estimate η).
        x: ``(N, C, h, w)`` or ``(N, D)`` images; y: ``(N,)`` labels.
        chains: R independent AIS chains, each with its own draw of the transforms.
        temperatures: T, the number of scales on the path; each step costs ``leapfrog + 2``
            likelihood evaluations.
        leapfrog, step_size: HMC trajectory (in the preconditioned coordinates).
        curvature: κ in the mass ``1 + κ σ² Σ_k²`` (any positive value keeps the estimate valid;
            it sets the sampler's efficiency).
        seed: ε and every random number (common random numbers across η).

    Returns:
        :class:`AnnealedEvidence` (log evidence, chains' log weights, PSIS k̂, acceptance, the
        profile over σ_p).
    """
    model = _invariant_mlp(model)
    chains = check_positive_int("chains", chains, minimum=2)
    temperatures = check_positive_int("temperatures", temperatures, minimum=2)
    leapfrog = check_positive_int("leapfrog", leapfrog)
    step = _check_positive("step_size", step_size)
    kappa = _check_positive("curvature", curvature)
    seed = check_seed(seed)
    x = model._flatten(torch.as_tensor(x))
    y = torch.as_tensor(y)
    check_labels(y, x.shape[0], model.num_classes)

    design = _design(model, x, chains, seed)  # (R, N, P)
    u, sv, _ = torch.linalg.svd(design, full_matrices=False)  # (R, N, m), (R, m)
    rank = int((sv > sv[:, :1] * 1e-10).sum(-1).min())
    basis = (u * sv.unsqueeze(-2))[..., :rank]  # (R, N, m): logits = basis @ W'
    sv2 = (sv[:, :rank] ** 2).unsqueeze(-1)  # (R, m, 1)
    onehot = torch.nn.functional.one_hot(y.long(), model.num_classes).to(basis)  # (N, C)
    loc, hierarchical = _log_scale_prior(model)
    start = -math.log(float(sv[:, 0].max())) - 3.0  # logits ≲ e^{-3} |z|: a nearly flat likelihood
    end = loc + 5.0 if hierarchical else loc
    device = basis.device
    scales = torch.linspace(min(start, end - 1.0), end, temperatures, dtype=torch.float64, device=device)

    def loglik(w: Tensor) -> Tensor:
        logits = basis @ w  # (R, N, C)
        return (logits * onehot).sum((-1, -2)) - torch.logsumexp(logits, -1).sum(-1)

    def grad_loglik(w: Tensor) -> Tensor:
        return basis.transpose(-1, -2) @ (onehot - torch.softmax(basis @ w, -1))

    gen = torch.Generator(device=device).manual_seed(seed + 1)
    shape = (chains, rank, model.num_classes)
    z = torch.randn(shape, generator=gen, dtype=torch.float64, device=device)  # the prior N(0, I)
    ll = loglik(math.exp(float(scales[0])) * z)
    log_w = ll  # importance sampling from the prior to π_0
    weights = [log_w]
    accepted = 0.0
    for t in range(1, temperatures):
        sigma = math.exp(float(scales[t]))
        ll_new = loglik(sigma * z)
        log_w = log_w + ll_new - ll  # log p(D | σ_t Z) − log p(D | σ_{t−1} Z)
        weights.append(log_w)
        mass = 1.0 + kappa * sigma**2 * sv2  # (R, m, 1)

        def grad(v: Tensor) -> Tensor:
            return sigma * grad_loglik(sigma * v) - v

        momentum = mass.sqrt() * torch.randn(shape, generator=gen, dtype=torch.float64, device=device)
        energy = -(ll_new - 0.5 * (z**2).sum((-1, -2))) + 0.5 * (momentum**2 / mass).sum((-1, -2))
        v, p = z, momentum + 0.5 * step * grad(z)
        for i in range(leapfrog):
            v = v + step * p / mass
            p = p + (step if i < leapfrog - 1 else 0.5 * step) * grad(v)
        ll_proposed = loglik(sigma * v)
        proposed = -(ll_proposed - 0.5 * (v**2).sum((-1, -2))) + 0.5 * (p**2 / mass).sum((-1, -2))
        accept = torch.rand(chains, generator=gen, dtype=torch.float64, device=device).log() < (energy - proposed)
        accept = accept & torch.isfinite(proposed)
        z = torch.where(accept[:, None, None], v, z)
        accepted += float(accept.double().mean())
        ll = torch.where(accept, ll_proposed, ll_new)  # log p(D | σ_t Z) of the chain's new state
    path = torch.stack(weights, dim=1)  # (R, T): log w_r(s_t)
    profile = torch.logsumexp(path, 0) - math.log(chains)
    if hierarchical:
        # ∫ N(s; loc, 1) w_r(s) ds per chain, trapezoidal rule on the path's grid
        ds = torch.diff(scales)
        trap = torch.cat([ds[:1], ds[:-1] + ds[1:], ds[-1:]]) / 2
        log_prior = -0.5 * (scales - loc) ** 2 - 0.5 * math.log(2 * math.pi)
        terms = path + (log_prior + trap.log())
        log_weights = torch.logsumexp(terms, dim=1)
        mass_s = torch.logsumexp(terms, 0)
        edge = int(math.ceil(0.95 * temperatures))
        edge_share = float(torch.exp(torch.logsumexp(mass_s[edge:], 0) - torch.logsumexp(mass_s, 0)))
        sigma_mode = math.exp(float(scales[int(torch.argmax(profile + log_prior))]))
    else:
        log_weights, edge_share, sigma_mode = path[:, -1], 0.0, math.exp(loc)
    log_evidence = float(torch.logsumexp(log_weights, 0) - math.log(chains))
    k_hat = psis_khat(log_weights) if chains >= 50 else float("nan")
    return AnnealedEvidence(
        log_evidence=log_evidence,
        log_weights=log_weights,
        k_hat=float(k_hat),
        acceptance=accepted / (temperatures - 1),
        num_data=int(x.shape[0]),
        temperatures=temperatures,
        log_scales=scales,
        scale_profile=profile,
        edge_share=edge_share,
        sigma_mode=sigma_mode,
    )
