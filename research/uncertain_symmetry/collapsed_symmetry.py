"""The optimal q(η) for a fitted q(θ | η), by quadrature over one scalar symmetry parameter.

A guide ``q(η) q(θ | η)`` bounds the evidence by (paper 003's ELBO with η latent; any per-η bound
``L(η) ≤ log p(D | η)`` in expectation may stand in for the inner ELBO)::

    log p(D) ≥ E_q(η)[L(η)] − KL(q(η) ‖ p(η)),       L(η) = bound of q(θ | η) at fixed η.

For a fixed conditional ``q(θ | η)`` the right side is maximised over *all* densities q(η) by

    q*(η) = p(η) exp(L(η)) / Z,       where it equals log Z = log ∫ p(η) exp(L(η)) dη

(the KL to q* is what any other q(η) loses: ``E_q[L] − KL(q ‖ p) = log Z − KL(q ‖ q*)``). A Gaussian
q(η) trained by SVI can only approach q* within its family and by noisy gradients; for one scalar η
it can be computed: :func:`collapse_symmetry` evaluates ``L(η_j)`` on a grid over η's support —
the importance-weighted bound IWAE_K of the guide's own ``q(θ | η_j)``
(:func:`~research.uncertain_symmetry.evidence_profile.guide_evidence_profile`) with common random
numbers, so that L is a smooth function of η — and normalises ``p(η_j) exp(L(η_j))`` by the
trapezoidal rule. The result, :class:`CollapsedSymmetryGuide`, is a guide for the same model:
η ~ q*(η) (:class:`~research.uncertain_symmetry.distributions.PiecewiseLinear`), then the fitted guide's θ given
that η (:meth:`~pyro_invariance.guides.base.CatalogueGuide.symmetry_condition`), so that posterior
predictives (``pi.evaluate((model, collapsed), data)``) integrate over q*(η).

Its precision is the profile's: q* ∝ exp(L), so Monte-Carlo noise in the *shape* of L(η) (what is left
after the common random numbers) moves and narrows q* as much as the evidence does. ``streams=R``
averages R streams and reports that noise (``profile_noise``, nats); compare it with the ½ nat by which
a profile falls within one sd of its posterior. Measured: on basis regression (8 weights, 60 points,
K = 100) one stream's shape noise is 0.4–0.9 nats and q*(λ) meets the criterion against the
exact posterior on seeds 0–2; on the invariant MLP (300 digits, K = 100) it is 0.7–11.6 nats and q*'s
width and place are noise (``research/uncertain_symmetry/results/uncertain_symmetry_collapsed_steps4000.md``). The ELBO
(``K=1`` with many ``streams``: a mean of log-weights, smooth in η) is far less noisy there: 128 streams
leave 0.3–0.7 nats. ``stream_batch=B`` draws B streams as blocks of one B·K-particle pass per point
(:func:`~research.uncertain_symmetry.evidence_profile.guide_evidence_profile` with ``blocks=B``): the same
estimator, and on a GPU a hundred IWAE_100 streams per fit take about a minute there (H100), leaving
0.3–0.45 nats.

What it does not fix: q* is the best q(η) *for this conditional*. Where q(θ | η) is poor at some η
(the amortisation gap, ``research/uncertain_symmetry/results/uncertain_symmetry_iwae_steps4000.md``), L(η) is low
there and q* avoids it; a conditional trained across η first
(:func:`~research.uncertain_symmetry.symmetry_warmup.warm_up_conditional`) gives q* more to follow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor, nn
from torch.distributions import constraints

from pyro_invariance import pyro_scope
from pyro_invariance.diagnostics.symmetry_posterior import GridPosterior, grid_posterior
from pyro_invariance.guides.base import CatalogueGuide
from pyro_invariance.models.base import symmetry_sites
from research.uncertain_symmetry.distributions import PiecewiseLinear
from research.uncertain_symmetry.evidence_profile import guide_evidence_profile

__all__ = ["CollapsedSymmetryGuide", "collapse_symmetry", "default_symmetry_grid", "profile_noise"]

#: the default grid's end points sit this fraction of the support's width inside it (q(η) and the
#: guide's η-transform are singular on the boundary)
EDGE = 1e-3


class CollapsedSymmetryGuide(nn.Module):
    """``q*(η) q(θ | η)``: η from a grid posterior, then the fitted guide's other sites given that η.

    A guide for the model it was collapsed on (Pyro traces and replays it like any guide): the
    symmetry site is a sample from :class:`~research.uncertain_symmetry.distributions.PiecewiseLinear` on the
    posterior's grid; the fitted guide runs with its draw of η held at that value (the sites and
    values of its ``symmetry_condition``, hidden from the trace: their density is replaced by
    q*(η)'s). Draws one η per call (not for vectorised particles).

    Attributes:
        guide: the fitted catalogue guide (a submodule: ``.to(device)`` and ``state_dict`` carry it).
        site: the model's symmetry site.
        posterior: the :class:`~pyro_invariance.diagnostics.symmetry_posterior.GridPosterior` q*(η);
            ``posterior.log_marginal`` is the collapsed bound log Z (nats, all of the data it was
            computed on).
        profile: ``(G,)`` the bound L(η_j) it was built from (``posterior.log_evidence`` as a tensor).
        stream_profiles: ``(R, G)`` each stream's profile (set by :func:`collapse_symmetry`).
        profile_noise: the Monte-Carlo noise of ``profile``'s shape, nats (:func:`profile_noise`; ``None``
            with one stream).
    """

    def __init__(
        self,
        guide: Any,
        site: str,
        posterior: GridPosterior,
        batch_shape: Sequence[int] = (),
        event_shape: Sequence[int] = (),
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.guide = guide
        self.site = site
        self.posterior = posterior
        self.batch_shape, self.event_shape = torch.Size(batch_shape), torch.Size(event_shape)
        self.register_buffer("grid", torch.as_tensor(posterior.grid, dtype=dtype))
        self.register_buffer("density", torch.as_tensor(posterior.density, dtype=dtype))
        self.register_buffer("profile", torch.as_tensor(posterior.log_evidence, dtype=torch.float64))
        self.stream_profiles: Tensor = self.profile.unsqueeze(0)
        self.profile_noise: float | None = None

    def distribution(self) -> Any:
        """q*(η) as a Pyro distribution of the site's batch and event shapes (the model's prior's)."""
        d = PiecewiseLinear(self.grid, self.density)
        shape = self.batch_shape + self.event_shape
        return d.expand(shape).to_event(len(self.event_shape)) if shape else d

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        eta = pyro.sample(self.site, self.distribution())
        if eta.shape != self.batch_shape + self.event_shape:
            raise ValueError(
                f"CollapsedSymmetryGuide draws one η per call, got shape {tuple(eta.shape)} (inside a "
                "vectorised particle plate?); use vectorize_particles=False"
            )
        held = self.guide.symmetry_condition(self.site, eta)
        with poutine.block(hide=[self.site, *held]), poutine.condition(data=held):
            return self.guide(*args, **kwargs)


def default_symmetry_grid(support: Any, num_points: int) -> Tensor:
    """``num_points`` points on a bounded interval support [a, b]: the two end points held ``EDGE·(b − a)``
    inside, and ``num_points − 2`` evenly spaced between them (float64 ``(num_points,)``)."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    if not isinstance(support, (constraints._Interval, constraints._HalfOpenInterval)):
        raise ValueError(
            f"collapse_symmetry: the symmetry site's support {support} is not a bounded interval; pass grid="
        )
    lo, hi = float(support.lower_bound), float(support.upper_bound)
    if num_points < 3:
        raise ValueError(f"collapse_symmetry: num_points must be >= 3, got {num_points}")
    edge = EDGE * (hi - lo)
    return torch.linspace(lo + edge, hi - edge, int(num_points), dtype=torch.float64)


@pyro_scope()
def collapse_symmetry(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    grid: Sequence[float] | Tensor | None = None,
    *,
    num_points: int = 181,
    K: int = 100,
    streams: int = 1,
    stream_batch: int = 1,
    seed: int = 0,
) -> CollapsedSymmetryGuide:
    """q*(η) ∝ p(η) exp(IWAE_K(η)) for the fitted ``guide``'s own q(θ | η) (module docstring).

    Args:
        model: a catalogue model with one scalar latent symmetry site (``symmetry_prior=...``).
        guide: its fitted catalogue guide (any whose ``symmetry_condition`` holds η: mean-field,
            symmetry-conditional, ...).
        x, y: the training data (all of it: the bound is of ``log p(D)``).
        grid: increasing η values strictly inside the site's support; default
            :func:`default_symmetry_grid` with ``num_points`` points (bounded supports only).
        K: importance samples per point (K = 1 with ``streams=R``: the R-draw ELBO of q(θ | η_j)).
        streams: independent streams of common random numbers (seeds ``seed``, ``seed + 1``, …); the
            profile is their mean (its Monte-Carlo noise falls as 1/√streams, the cost grows as streams),
            and with two or more the returned guide reports that noise (``profile_noise``).
        stream_batch: streams drawn together, as blocks of one pass of ``stream_batch·K`` particles at each
            point (``guide_evidence_profile(..., blocks=stream_batch)``): the same estimator, far faster on
            a GPU. ``streams`` must be a multiple of it; with B > 1, pass c (seed ``seed + c``) gives
            streams ``c·B … c·B + B − 1`` (other random numbers than B = 1's, the same statistics).
        seed: the common random numbers' seed (the caller's RNG state is restored).

    Returns:
        a :class:`CollapsedSymmetryGuide` (the fitted guide is shared, not copied).

    Raises:
        ValueError: (one line) not exactly one latent symmetry site, a site with more than one
            coordinate, a guide that is not a catalogue guide or draws η jointly with the weights,
            grid points outside the support.
    """
    sites = symmetry_sites(model)
    if len(sites) != 1:
        raise ValueError(
            f"collapse_symmetry needs a model with one latent symmetry site, got {sites} "
            "(build it with symmetry_prior=...)"
        )
    if not isinstance(guide, CatalogueGuide):
        raise ValueError(
            f"collapse_symmetry needs a catalogue guide (pyro_invariance.guides), got {type(guide).__name__}"
        )
    site = sites[0]
    n = x.shape[0]
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []), torch.no_grad():
        prior = poutine.trace(model).get_trace(x[:1], y[:1], num_data=n).nodes[site]["fn"]
    if prior.event_shape.numel() != 1 or prior.batch_shape.numel() != 1:
        raise ValueError(
            f"collapse_symmetry needs a scalar symmetry site, {site!r} has shape "
            f"{tuple(prior.batch_shape + prior.event_shape)}"
        )
    points = (
        default_symmetry_grid(prior.support, num_points) if grid is None else torch.as_tensor(grid, dtype=torch.float64)
    )
    if int(streams) < 1:
        raise ValueError(f"collapse_symmetry: streams must be >= 1, got {streams}")
    batch = int(stream_batch)
    if batch < 1 or int(streams) % batch:
        raise ValueError(
            f"collapse_symmetry: stream_batch must be >= 1 and divide streams={streams}, got {stream_batch}"
        )
    values = points.to(x.dtype)
    if batch == 1:
        each = torch.stack(
            [
                guide_evidence_profile(model, guide, x, y, values, K=K, seed=seed + r, common_noise=True)
                for r in range(int(streams))
            ]
        )
    else:
        each = torch.cat(
            [
                guide_evidence_profile(model, guide, x, y, values, K=K, seed=seed + c, common_noise=True, blocks=batch)
                for c in range(int(streams) // batch)
            ]
        )
    profile = each.mean(0)
    shape = prior.batch_shape + prior.event_shape
    with torch.no_grad():
        at = points.to(x.dtype).to(x.device).reshape(len(points), *shape)
        log_prior = prior.log_prob(at).reshape(len(points), -1).sum(-1).double().cpu()
    posterior = grid_posterior(points, profile, log_prior)
    collapsed = CollapsedSymmetryGuide(
        guide, site, posterior, batch_shape=prior.batch_shape, event_shape=prior.event_shape, dtype=x.dtype
    ).to(x.device)
    collapsed.stream_profiles = each
    collapsed.profile_noise = profile_noise(each, torch.as_tensor(posterior.density)) if len(each) > 1 else None
    return collapsed


def profile_noise(stream_profiles: Tensor, density: Tensor, floor: float = 1e-3) -> float:
    """The Monte-Carlo noise in the *shape* of a profile averaged over R ≥ 2 streams (nats): per stream, its
    deviation from the mean profile less that deviation's mean over η (an offset shared by every η does not
    move q*); the pooled sd of those deviations, × √(R / (R − 1)) for one stream's, ÷ √R for the mean's —
    over the grid points where the density is above ``floor`` of its peak. Compare it with how much the
    profile changes across q*'s width (≈ ½ nat within one sd of a Gaussian q*): where it is larger, q*'s
    shape is noise and more streams (or a larger K) are needed."""
    each = stream_profiles.double()
    r = each.shape[0]
    if r < 2:
        raise ValueError(f"profile_noise needs at least 2 streams, got {r}")
    where = density >= floor * density.max()
    dev = (each - each.mean(0))[:, where]
    dev = dev - dev.mean(1, keepdim=True)
    one = float(dev.pow(2).mean().sqrt()) * math.sqrt(r / (r - 1))
    return one / math.sqrt(r)
