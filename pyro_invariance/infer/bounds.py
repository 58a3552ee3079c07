"""Bounds on the evidence of a fitted guide: ELBO, importance-weighted bounds (IWAE) and PSIS k̂.

For a catalogue model ``p(D, z) = p(z) Π_n p(y_n | x_n, z, η)`` with global latents ``z`` (symmetry
parameters η and other ``PyroParam`` point estimates are fixed hyperparameters, not latents) and a
guide ``q(z)``, the importance weights ``w_k = p(D, z_k) / q(z_k)``, ``z_k ~ q``, give the bounds::

    ELBO    = E_q[log w]                                ≤ log p(D | η)
    IWAE_K  = E[log (1/K) Σ_{k=1..K} w_k]                ≤ log p(D | η)

with ``ELBO = IWAE_1 ≤ IWAE_K ≤ IWAE_{K+1}`` and ``IWAE_K → log p(D | η)`` as ``K → ∞`` (Burda et
al. 2016; Pyro's ``RenyiELBO(alpha=0, num_particles=K)``). Each weight is one draw of *all*
latents evaluated on *all* n data: the bounds are on the evidence of the whole data set (in nats;
``per_datum`` divides by n), not sums of per-datum bounds. The ELBO here is the Monte-Carlo form
``E_q[log p(D, z) − log q(z)]`` (no analytic KL), estimated from the same draws.

PSIS k̂ (Yao et al. 2018, "Yes, but did it work?") of the log weights says whether ``q`` is a
usable importance proposal for the posterior: k̂ < 0.5 good, 0.5–0.7 usable, > 0.7 the IWAE
estimates and their standard errors are unreliable (the weights have a heavy right tail). The
number is ArviZ's (:func:`~pyro_invariance.infer.psis.psis_khat`, the package's one PSIS, documents what
degenerate weights give).

Point-estimate guides (``map``, Pyro's ``AutoDelta``) have ``log q = 0``: every "bound" is the log
joint ``log p(D, ẑ)`` at the point, which is *not* a bound on ``log p(D)`` for continuous latents.
It is still reported (``is_bound=False``, k̂ = NaN, with a note).

Evaluation: ``model(x_chunk, y_chunk, num_data=n)`` is replayed on each chunk of ``batch_size``
rows with the same guide draw; the observed sites' log-likelihoods are summed *unscaled* over the
chunks, the latent sites' log-priors are counted once. Models whose forward pass draws its own
noise (the transform samples ε of ``invariant-mlp`` and ``symmetrised-hnn``) get fresh noise per
chunk: their "likelihood" is the S-sample estimate the model defines, and the bounds are bounds for
the model as implemented.

Example::

    from pyro_invariance.infer.bounds import evidence_bounds
    b = evidence_bounds(model, guide, x, y, Ks=(10, 100, 1000))
    b.elbo.value, b.iwae[1000].value, b.k_hat
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.distributions import Delta
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.guides.base import check_guide_for
from pyro_invariance.infer.distributed import Ranks
from pyro_invariance.infer.modes import eval_mode
from pyro_invariance.infer.psis import PSIS_MIN_DRAWS, PSIS_MIN_TAIL, psis_khat, psis_tail_size
from pyro_invariance.validation import check_positive_int, num_data_kwargs

__all__ = [
    "BoundEstimate",
    "EvidenceBounds",
    "NotVectorizableError",
    "check_observed",
    "elbo_bound",
    "elbo_from_log_weights",
    "evidence_bounds",
    "iwae_bound",
    "iwae_from_log_weights",
    "log_weights",
    "PSIS_MIN_DRAWS",
    "PSIS_MIN_TAIL",
    "psis_khat",
    "psis_tail_size",
    "validate_K",
]

POINT_ESTIMATE_NOTE = "point-estimate guide: log p(D, ẑ) at the point, not a bound on log p(D)"


@dataclass
class BoundEstimate:
    """One Monte-Carlo estimate of a bound on ``log p(D)``.

    Attributes:
        value: the estimate, in nats, for the whole data set of ``num_data`` points.
        stderr: its Monte-Carlo standard error (for IWAE_K: the spread of independent IWAE_K
            estimates when there are several, else the delta-method error of the log-mean of the
            weights when k̂ ≤ 0.7, else NaN: no usable error).
        k_hat: PSIS k̂ of the log weights used (NaN for point-estimate guides).
        K: importance samples per bound (1 for the ELBO).
        per_datum: ``value / num_data``.
        num_data: n, the number of data the bound is on.
        num_samples: total guide draws behind the estimate.
        is_bound: False for point-estimate guides (see module docstring).
        note: why ``is_bound`` is False, or a warning.
    """

    value: float
    stderr: float
    k_hat: float
    K: int
    per_datum: float
    num_data: int
    num_samples: int
    is_bound: bool = True
    note: str = ""

    @property
    def per_datum_stderr(self) -> float:
        return self.stderr / self.num_data

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EvidenceBounds:
    """ELBO and IWAE_K estimates from one set of ``num_samples`` guide draws (:func:`evidence_bounds`)."""

    elbo: BoundEstimate
    iwae: dict[int, BoundEstimate]
    k_hat: float
    num_data: int
    num_samples: int
    log_weights: Tensor = field(repr=False)
    point_estimate: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "elbo": self.elbo.to_dict(),
            "iwae": {int(k): v.to_dict() for k, v in self.iwae.items()},
            "k_hat": self.k_hat,
            "num_data": self.num_data,
            "num_samples": self.num_samples,
            "point_estimate": self.point_estimate,
            "note": self.note,
        }


# ------------------------------------------------------------------------------------------------
# validation


def validate_K(K: Any, name: str = "K") -> int:
    """``K`` as an int ≥ 1; anything else raises ``ValueError``."""
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"{name} must be an integer >= 1 (number of importance samples), got {K!r}")
    return K


def _validate_Ks(Ks: Iterable[Any]) -> tuple[int, ...]:
    if isinstance(Ks, (str, bytes)) or not isinstance(Ks, Iterable):
        Ks = (Ks,)
    out = tuple(validate_K(k) for k in Ks)
    if not out:
        raise ValueError("need at least one K")
    return tuple(sorted(set(out)))


def _check_xy(x: Any, y: Any) -> tuple[Tensor, Tensor]:
    if y is None:
        raise ValueError("y is required: the bounds are on the evidence p(y | x) of observed data")
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"x and y must have the same, non-zero number of rows, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    return x, y


def _observed_sites(trace: poutine.Trace) -> list[str]:
    return [n for n, s in trace.nodes.items() if s["type"] == "sample" and s["is_observed"]]


def check_observed(model: Any, x: Tensor, y: Tensor, num_data: int | None = None) -> list[str]:
    """Names of the model's observed sample sites on ``(x, y)``; raises ``ValueError`` if none.

    Runs the model once from its prior (on the first two rows, without recording parameters).
    """
    x, y = _check_xy(x, y)
    with torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(x[:2], y[:2], **num_data_kwargs(model, num_data or x.shape[0]))
    names = _observed_sites(trace)
    if not names:
        raise ValueError(
            f"model {type(model).__name__} has no observed sample site (pyro.sample(..., obs=y)) on these data: "
            "there is no log-likelihood to bound; the evidence bounds need a model that observes y"
        )
    return names


def _base(fn: Any) -> Any:
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def _is_point_estimate(guide_trace: poutine.Trace) -> bool:
    sites = [
        s
        for s in guide_trace.nodes.values()
        if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
    ]
    return bool(sites) and all(
        isinstance(_base(s["fn"]), Delta) and not s["infer"].get("is_auxiliary", False) for s in sites
    )


def _in_data_plate(site: dict) -> bool:
    return any(
        f.name == "data" or (f.full_size is not None and f.full_size != f.size) for f in site["cond_indep_stack"]
    )


# ------------------------------------------------------------------------------------------------
# log weights


class NotVectorizableError(ValueError):
    """The model or guide did not broadcast over a batch of particles (use ``vectorize=False``)."""


def _reducer(particles: int | None, dim: int):
    """Sum a site's log-density to a scalar (one draw) or to ``(particles,)`` (vectorised draws)."""
    if particles is None:
        return lambda lp, name: lp.double().sum()

    def reduce(lp: Tensor, name: str) -> Tensor:
        lp = torch.as_tensor(lp)
        if lp.dim() < -dim or lp.shape[dim] != particles:
            raise NotVectorizableError(
                f"site {name!r} has log-density shape {tuple(lp.shape)} without the particle dim {dim} of size "
                f"{particles}: the model/guide do not vectorise over particles"
            )
        return lp.double().movedim(dim, 0).reshape(particles, -1).sum(-1)

    return reduce


def _log_weight(
    model: Any, guide: Any, x: Tensor, y: Tensor, batch_size: int, particles: int | None = None, dim: int = -2
) -> tuple[Tensor, bool]:
    """``log p(D, z) − log q(z)`` for one guide draw ``z`` (float64 scalar), or for ``particles``
    draws at once in a vectorised plate at ``dim`` (shape ``(particles,)``); and whether q is a point mass."""
    n = x.shape[0]
    kwargs = num_data_kwargs(model, n)
    b = min(batch_size, n) if kwargs else n  # a model without num_data scores the rows it gets as the data set
    reduce = _reducer(particles, dim)

    def run(fn: Any, *args: Any, **kwargs: Any) -> poutine.Trace:
        if particles is None:
            return poutine.trace(fn).get_trace(*args, **kwargs)
        with pyro.plate("_iw_particles", particles, dim=dim):
            return poutine.trace(fn).get_trace(*args, **kwargs)

    guide_tr = run(guide, x[:b], y[:b], **kwargs)
    log_q: Tensor | float = 0.0
    for name, site in guide_tr.nodes.items():
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site):
            lp = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"])
            log_q = log_q + reduce(lp, name)
    point = _is_point_estimate(guide_tr)
    log_p: Tensor | float = 0.0
    for start in range(0, n, b):
        xs, ys = x[start : start + b], y[start : start + b]
        model_tr = run(poutine.replay(model, trace=guide_tr), xs, ys, **kwargs)
        observed = False
        for name, site in model_tr.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if site["is_observed"]:
                observed = True
                # unscaled: the chunk's own log-likelihood (the plate would scale it by n / chunk)
                lp = scale_and_mask(site["fn"].log_prob(site["value"]), 1.0, site["mask"])
                log_p = log_p + reduce(lp, name)
                continue
            if name not in guide_tr.nodes:
                raise ValueError(
                    f"model latent site {name!r} is not sampled by the guide: the guide must cover every latent"
                )
            if _in_data_plate(site):
                raise ValueError(
                    f"latent site {name!r} lies inside the data plate (a local latent): the evidence bounds here "
                    "are for models with global latents only"
                )
            if start == 0:
                lp = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"])
                log_p = log_p + reduce(lp, name)
        if not observed:
            raise ValueError(
                f"model {type(model).__name__} has no observed sample site (pyro.sample(..., obs=y)): "
                "there is no log-likelihood to bound"
            )
    out = torch.as_tensor(log_p - log_q, dtype=torch.float64)
    if particles is not None and out.shape != (particles,):
        raise NotVectorizableError(f"vectorised log weights have shape {tuple(out.shape)}, expected ({particles},)")
    return out, point


def _max_plate_nesting(model: Any, x: Tensor, y: Tensor, n: int) -> int:
    with poutine.block():
        tr = poutine.trace(model).get_trace(x[:2], y[:2], **num_data_kwargs(model, n))
    dims = [-f.dim for s in tr.nodes.values() if s["type"] == "sample" for f in s["cond_indep_stack"] if f.vectorized]
    return max(dims, default=0)


@pyro_scope()
def log_weights(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int,
    *,
    batch_size: int = 4096,
    vectorize: bool = False,
    particle_chunk: int = 100,
    ranks: Ranks | None = None,
) -> tuple[Tensor, bool]:
    """``num_samples`` importance log weights ``log p(D, z_k) − log q(z_k)``, ``z_k ~ q`` (float64).

    Each weight evaluates one guide draw on all of ``(x, y)``, ``batch_size`` rows at a time, so
    memory is that of one forward pass on ``batch_size`` rows whatever ``num_samples`` is.

    Args:
        vectorize: draw ``particle_chunk`` particles at a time in a vectorised ``pyro.plate`` left of
            the model's plates (as Pyro's ``vectorize_particles``). Much faster, but only for
            models and guides that broadcast over a batch of latents (``basis-regression`` does);
            raises :class:`NotVectorizableError` when a site's log-density lacks the particle dim.
        particle_chunk: particles per vectorised pass (memory: ``particle_chunk`` × one pass).
        ranks: the ranks of a data-parallel run (:func:`pyro_invariance.infer.distributed.current_ranks`):
            the draws are split over them (rank r draws :func:`rank_share` of them) and the log
            weights all-gathered in rank order, so every rank returns all ``num_samples``. Rank r
            draws from a stream seeded by ``(s, r)``, with ``s`` one number drawn from the global
            stream (the same on every rank): :func:`ranked_log_weights` on one process repeats them.

    Returns:
        ``(log_weights (num_samples,), point_estimate)``; ``point_estimate`` is True when every
        guide site is a point mass (``map``): then ``log q = 0`` and the weights are the log joint.
    """
    check_positive_int("num_samples", num_samples)
    check_positive_int("batch_size", batch_size)
    check_positive_int("particle_chunk", particle_chunk)
    check_guide_for(model, guide)
    x, y = _check_xy(x, y)
    if ranks is not None and ranks.ddp:
        if num_samples < ranks.world:
            raise ValueError(f"num_samples={num_samples} is below the {ranks.world} ranks that split the draws")
        base = int(torch.randint(2**62, ()).item())  # the same on every rank: their global streams agree
        part, point = _rank_log_weights(
            model,
            guide,
            x,
            y,
            num_samples,
            base,
            ranks.rank,
            ranks.world,
            batch_size=batch_size,
            vectorize=vectorize,
            particle_chunk=particle_chunk,
        )
        return ranks.cat(part), point
    out = []
    point = False
    with eval_mode(model), torch.no_grad():
        if vectorize:
            dim = -_max_plate_nesting(model, x, y, x.shape[0]) - 1
            done = 0
            while done < num_samples:
                p = min(particle_chunk, num_samples - done)
                lw, point = _log_weight(model, guide, x, y, batch_size, particles=p, dim=dim)
                out.append(lw)
                done += p
        else:
            for _ in range(num_samples):
                lw, point = _log_weight(model, guide, x, y, batch_size)
                out.append(lw.reshape(1))
    lw = torch.cat(out)
    if not torch.isfinite(lw).all():
        bad = int((~torch.isfinite(lw)).sum())
        warnings.warn(f"{bad} of {num_samples} log weights are non-finite; the bounds will be ±inf or NaN")
    return lw, point


def rank_share(num_samples: int, rank: int, world: int) -> int:
    """How many of ``num_samples`` draws rank ``rank`` of ``world`` makes (the first ones one more)."""
    return num_samples // world + (1 if rank < num_samples % world else 0)


def rank_seed(base: int, rank: int) -> int:
    """The seed of rank ``rank``'s draws in :func:`log_weights` (``base`` from the shared stream)."""
    return (base + 104_729 * (rank + 1)) % (2**63 - 1)


def _rank_log_weights(
    model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int, base: int, rank: int, world: int, **kwargs: Any
) -> tuple[Tensor, bool]:
    """Rank ``rank``'s share of the draws, from its own stream seeded by ``(base, rank)``; the global
    stream is left as it was."""
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        torch.manual_seed(rank_seed(base, rank))
        return log_weights(model, guide, x, y, rank_share(num_samples, rank, world), **kwargs)


def ranked_log_weights(
    model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int, world: int, **kwargs: Any
) -> tuple[Tensor, bool]:
    """On one process, the log weights that ``world`` ranks of a data-parallel run would gather in
    :func:`log_weights` (each rank's share of the draws from its own seeded stream, in rank order)."""
    base = int(torch.randint(2**62, ()).item())
    parts = [_rank_log_weights(model, guide, x, y, num_samples, base, r, world, **kwargs) for r in range(world)]
    return torch.cat([lw for lw, _ in parts]), parts[-1][1]


# ------------------------------------------------------------------------------------------------
# estimators from log weights


def _logmeanexp(lw: Tensor, dim: int = -1) -> Tensor:
    return torch.logsumexp(lw, dim=dim) - math.log(lw.shape[dim])


def elbo_from_log_weights(
    lw: Tensor, num_data: int, *, point_estimate: bool = False, k_hat: float | None = None
) -> BoundEstimate:
    """ELBO estimate ``mean(lw)`` with standard error ``std(lw)/√S``."""
    lw = torch.as_tensor(lw, dtype=torch.float64).flatten()
    s = lw.numel()
    value = float(lw.mean())
    stderr = float(lw.std(unbiased=True) / math.sqrt(s)) if s > 1 else float("nan")
    if point_estimate:
        return BoundEstimate(value, stderr, float("nan"), 1, value / num_data, num_data, s, False, POINT_ESTIMATE_NOTE)
    k = psis_khat(lw) if k_hat is None else k_hat
    return BoundEstimate(value, stderr, k, 1, value / num_data, num_data, s)


def iwae_from_log_weights(
    lw: Tensor, K: int, num_data: int, *, point_estimate: bool = False, k_hat: float | None = None
) -> BoundEstimate:
    """IWAE_K estimate from ``S ≥ K`` log weights.

    The ``floor(S/K)`` disjoint groups of K weights each give an independent estimate
    ``log (1/K) Σ_k w_k`` of the IWAE_K bound; the value is their mean and the standard error their
    spread / √groups. With a single group the error is the delta-method one,
    ``sd(w)/(√K mean(w))``, when k̂ ≤ 0.7, and NaN otherwise (with heavy-tailed weights the delta
    method reports about ±1 nat whatever the true spread; draw ≥ 2K samples for an error).
    k̂ is that of all ``S`` weights (the guide as a proposal).
    """
    validate_K(K)
    lw = torch.as_tensor(lw, dtype=torch.float64).flatten()
    s = lw.numel()
    if s < K:
        raise ValueError(f"IWAE_{K} needs at least K = {K} log weights, got {s}")
    groups = s // K
    per_group = _logmeanexp(lw[: groups * K].reshape(groups, K), dim=-1)
    value = float(per_group.mean())
    k = float("nan") if point_estimate else (psis_khat(lw) if k_hat is None else k_hat)
    if groups > 1:
        stderr = float(per_group.std(unbiased=True) / math.sqrt(groups))
    elif K > 1 and (point_estimate or k <= 0.7):
        w = (lw[:K] - lw[:K].max()).exp()
        stderr = float(w.std(unbiased=True) / (math.sqrt(K) * w.mean()))
    else:
        # one estimate and heavy-tailed weights: the delta method would report about ±1 nat
        # whatever the real spread is; say that there is no usable error instead
        stderr = float("nan")
    if point_estimate:
        return BoundEstimate(
            value, stderr, float("nan"), K, value / num_data, num_data, groups * K, False, POINT_ESTIMATE_NOTE
        )
    return BoundEstimate(value, stderr, k, K, value / num_data, num_data, groups * K)


# ------------------------------------------------------------------------------------------------
# public entry points


@pyro_scope()
def evidence_bounds(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    Ks: Iterable[int] = (10, 100, 1000),
    *,
    num_samples: int | None = None,
    batch_size: int = 4096,
    vectorize: bool = False,
    particle_chunk: int = 100,
    ranks: Ranks | None = None,
) -> EvidenceBounds:
    """ELBO, IWAE_K for every K in ``Ks`` and PSIS k̂, all from one set of guide draws.

    Args:
        model, guide: a catalogue model ``model(x, y=None, num_data=None)`` and a fitted guide.
        x, y: the data the evidence is of (all rows; e.g. a prefix of the training set).
        Ks: importance sample sizes (ints ≥ 1).
        num_samples: guide draws (default ``max(Ks)``; must be ≥ ``max(Ks)``). IWAE_K with
            ``K < num_samples`` averages ``num_samples // K`` independent estimates.
        batch_size: rows per forward pass.
        vectorize, particle_chunk: draw particles in vectorised chunks (see :func:`log_weights`).
        ranks: the ranks of a data-parallel run: the draws after the first are split over them and
            the log weights all-gathered (:func:`log_weights`); every rank gets the same bounds.

    Point-estimate guides are evaluated with ``min(num_samples, 16)`` draws (the draws differ only
    by the model's own noise) and flagged (``point_estimate=True``, every ``is_bound`` False).
    """
    Ks = _validate_Ks(Ks)
    num_samples = max(Ks) if num_samples is None else validate_K(num_samples, "num_samples")
    if num_samples < max(Ks):
        raise ValueError(f"num_samples={num_samples} is smaller than the largest K={max(Ks)}")
    x, y = _check_xy(x, y)
    n = x.shape[0]
    # One draw first: it tells a point mass (no need for many draws) and fails fast on bad models.
    first, point = log_weights(model, guide, x, y, 1, batch_size=batch_size)
    rest_n = (min(num_samples, 16) if point else num_samples) - 1
    rest = first[:0]
    if rest_n > 0:
        rest = log_weights(
            model,
            guide,
            x,
            y,
            rest_n,
            batch_size=batch_size,
            vectorize=vectorize,
            particle_chunk=particle_chunk,
            ranks=ranks,
        )[0]
    lw = torch.cat([first, rest])
    if point:
        elbo = elbo_from_log_weights(lw, n, point_estimate=True)
        iwae = {k: iwae_from_log_weights(lw, min(k, lw.numel()), n, point_estimate=True) for k in Ks}
        for k, b in iwae.items():
            b.K = k  # all weights equal the log joint: every K gives the same number
        return EvidenceBounds(elbo, iwae, float("nan"), n, lw.numel(), lw, True, POINT_ESTIMATE_NOTE)
    k_hat = psis_khat(lw)
    elbo = elbo_from_log_weights(lw, n, k_hat=k_hat)
    iwae = {k: iwae_from_log_weights(lw, k, n, k_hat=k_hat) for k in Ks}
    note = (
        "k̂ > 0.7: the guide is a poor importance proposal; IWAE estimates and errors are unreliable"
        if k_hat > 0.7
        else ""
    )
    return EvidenceBounds(elbo, iwae, k_hat, n, lw.numel(), lw, False, note)


@pyro_scope()
def elbo_bound(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    num_particles: int = 1000,
    *,
    batch_size: int = 4096,
    vectorize: bool = False,
) -> BoundEstimate:
    """Monte-Carlo ELBO ``E_q[log p(D, z) − log q(z)]`` on all of ``(x, y)`` from ``num_particles`` draws."""
    check_positive_int("num_particles", num_particles)
    return evidence_bounds(
        model, guide, x, y, (1,), num_samples=num_particles, batch_size=batch_size, vectorize=vectorize
    ).elbo


@pyro_scope()
def iwae_bound(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    K: int,
    *,
    num_estimates: int = 1,
    batch_size: int = 4096,
    vectorize: bool = False,
) -> BoundEstimate:
    """IWAE_K = ``RenyiELBO(alpha=0, num_particles=K)`` bound on ``log p(y | x)`` for all of ``(x, y)``.

    ``num_estimates`` independent IWAE_K estimates (``K · num_estimates`` draws) are averaged; their
    spread gives the standard error (a single estimate uses the delta method).
    """
    validate_K(K)
    check_positive_int("num_estimates", num_estimates)
    return evidence_bounds(
        model, guide, x, y, (K,), num_samples=K * num_estimates, batch_size=batch_size, vectorize=vectorize
    ).iwae[K]
