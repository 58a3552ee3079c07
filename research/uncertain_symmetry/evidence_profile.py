"""The fitted guide's own evidence profile over one symmetry parameter η.

:func:`guide_evidence_profile` — ``IWAE_K(η_j)`` at fixed η_j with the fitted guide's own
``q(θ | η_j)``: the η-dependence that a full-Bayes ``q(η)`` can follow, against a grid reference that
fits ``q(θ)`` afresh at every η_j (the amortisation gap).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from pyro import poutine
from torch import Tensor
from torch.distributions import constraints

from pyro_invariance import pyro_scope
from pyro_invariance.guides.base import CatalogueGuide
from pyro_invariance.infer.fast_step import LeanIWAE_ELBO
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.models.base import symmetry_sites, vectorizable_particles

__all__ = ["guide_evidence_profile"]


def _strictly_inside(support: Any, value: Tensor) -> bool:
    """Whether ``value`` lies in ``support`` and, for an interval, off its end points (where a bounded
    q(η) is singular and ``biject_to`` clamps instead of failing)."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if isinstance(support, (constraints._Interval, constraints._HalfOpenInterval)):
        return bool(((value > support.lower_bound) & (value < support.upper_bound)).all())
    return bool(support.check(value).all())


def guide_evidence_profile(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    values: Sequence[float] | Tensor,
    K: int = 100,
    repeats: int = 1,
    seed: int = 0,
    common_noise: bool = False,
    blocks: int = 1,
) -> Tensor:
    """The fitted guide's own evidence profile: at each fixed value η_j of the model's one symmetry site,
    the importance-weighted bound (Burda et al. 2016, Eq. 8) with the guide's conditional ``q(θ | η_j)``
    as proposal, the mean of ``repeats`` estimates (float64 ``(J,)``, nats, all of ``(x, y)``)::

        IWAE_K(η_j) = log (1/K) Σ_k p(D, θ_k | η_j) / q(θ_k | η_j),   θ_k ~ q(θ | η_j),
        E[IWAE_K(η_j)] ≤ log p(D | η_j).

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
    sites = symmetry_sites(model)
    if len(sites) != 1:
        raise ValueError(
            f"guide_evidence_profile needs a model with one latent symmetry site, got {sites} "
            "(build it with symmetry_prior=...)"
        )
    site = sites[0]
    n = x.shape[0]
    if int(blocks) < 1 or int(K) < 1:
        raise ValueError(f"guide_evidence_profile: K and blocks must be >= 1, got K={K}, blocks={blocks}")
    draws = int(K) * int(blocks)
    vector = vectorizable_particles(model) and draws > 1
    loss = LeanIWAE_ELBO(
        num_particles=draws, vectorize_particles=vector, **({"max_plate_nesting": 1} if vector else {})
    )
    out = []
    cuda = [x.device] if x.is_cuda else []
    with (
        pyro_scope(),
        eval_mode(model),
        eval_mode(guide),
        torch.random.fork_rng(devices=cuda),
        torch.no_grad(),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings(
            "ignore", message="Found (non-auxiliary )?vars in"
        )  # the conditioned η: observed in both
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
                raise ValueError(
                    f"{type(guide).__name__}: conditioning {sorted(held)} did not put {site!r} at "
                    f"{value.tolist()} (got {g_tr.nodes[site]['value'].tolist()})"
                )
            m_tr = poutine.trace(poutine.replay(model_at, trace=g_tr)).get_trace(x, y, num_data=n)
            g_tr.compute_log_prob()
            m_tr.compute_log_prob()
            log_q = sum(g_tr.nodes[s]["log_prob"].sum() for s in {site, *held} if s in g_tr.nodes)
            eta_terms = float(m_tr.nodes[site]["log_prob"].sum() - log_q)
            if blocks == 1:
                estimates = [
                    -float(loss.differentiable_loss(model_at, guide_at, x, y, num_data=n)) for _ in range(int(repeats))
                ]
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
