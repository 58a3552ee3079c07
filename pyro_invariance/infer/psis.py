"""Pareto-smoothed importance sampling (PSIS) k̂ of importance log weights: the package's one copy.

k̂ (Yao et al. 2018, "Yes, but did it work?"; Vehtari et al. 2024) is the shape of a generalised
Pareto fit to the largest importance weights ``w_s = p(D, z_s) / q(z_s)``, ``z_s ~ q``: < 0.5 good,
0.5–0.7 usable, > 0.7 the proposal ``q`` is poor. :func:`psis_khat` answers the inputs ArviZ
defines no k̂ for and otherwise returns ArviZ's number (:func:`arviz_khat`, on either ArviZ line);
the evidence bounds (:mod:`pyro_invariance.infer.bounds`) and the guide comparison use it.

This module needs numpy and ArviZ only (no torch: a tensor is read through its own ``.numpy()``), so
the torch-free ArviZ 1.x tests load it from its file, as they load
:mod:`pyro_invariance.diagnostics.arviz_compat`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

# ArviZ is imported at first use (importing it costs more than Pyro does)
from pyro_invariance._optional import arviz as az
from pyro_invariance._optional import arviz_stats
from pyro_invariance._optional import xarray as xr

__all__ = ["PSIS_MIN_DRAWS", "PSIS_MIN_TAIL", "arviz_khat", "psis_khat", "psis_tail_size"]


#: The fewest weights a generalised-Pareto fit of the tail is made to.
PSIS_MIN_TAIL = 10


def psis_tail_size(num_weights: int) -> int:
    """How many of the largest of ``num_weights`` weights PSIS fits its Pareto tail to:
    ``ceil(min(S/5, 3√S))`` (ArviZ's rule with r_eff = 1)."""
    return int(math.ceil(min(0.2 * num_weights, 3.0 * math.sqrt(num_weights))))


#: Fewer log weights than this give k̂ = NaN: their Pareto tail (:func:`psis_tail_size`) would hold
#: fewer than :data:`PSIS_MIN_TAIL` draws (46: ``ceil(46 / 5) = 10``).
PSIS_MIN_DRAWS = next(s for s in range(1, 10_000) if psis_tail_size(s) >= PSIS_MIN_TAIL)


def _psis_degenerate(lw: np.ndarray) -> tuple[float, str] | None:
    """k̂ and the reason for log weights whose k̂ ArviZ does not define (``None`` otherwise)."""
    s = lw.size
    if np.isnan(lw).any():
        return float("nan"), f"{int(np.isnan(lw).sum())} of {s} log weights are NaN: k̂ is undefined"
    if np.isposinf(lw).any():
        return float("inf"), "a log weight is +inf: one draw carries all the mass"
    finite = lw[np.isfinite(lw)]
    if finite.size == 0:
        return float("nan"), f"all {s} log weights are -inf (every draw has p = 0): k̂ is undefined"
    top = float(finite.max())
    tol = 1e-9 * max(1.0, abs(top))
    if top - float(finite.min()) <= tol:
        return float("-inf"), ""  # constant weights (zero weights aside): q ∝ posterior, no tail at all
    if s < PSIS_MIN_DRAWS:
        return float("nan"), (
            f"{s} log weights are too few for PSIS k̂: their Pareto tail would be the largest "
            f"{psis_tail_size(s)}, and a fit needs ≥ {PSIS_MIN_TAIL} (draw ≥ {PSIS_MIN_DRAWS})"
        )
    rel = np.sort(lw)[::-1] - top  # descending, 0 first (−inf last)
    if int((rel > math.log(1e-15)).sum()) < 10:
        return float("inf"), ""  # fewer than 10 weights within 1e-15 of the largest: a few draws carry all the mass
    m = psis_tail_size(s)
    if rel[m] >= -tol:
        return float("-inf"), ""  # the largest m + 1 weights tie: bounded weights, no tail to fit
    above = rel[rel > rel[m]]
    if float(above.min()) >= -tol:
        return float("inf"), ""  # the tail is a few tied draws with a gap below them
    return None


def psis_khat(log_weights: Any) -> float:
    """Pareto-smoothed importance sampling k̂ of the log importance weights ``log_weights`` (1-D).

    ArviZ's k̂ (:func:`arviz_khat`: ``az.psislw`` on ArviZ 0.x, arviz-stats' ``psislw`` on 1.x,
    r_eff = 1): the shape of a generalised Pareto fit to the
    largest weights. Read it as Yao et al. (2018): < 0.5 good, 0.5–0.7 usable, > 0.7 the proposal
    is poor (IWAE estimates and their errors unreliable).

    Inputs for which ArviZ defines no k̂ (it returns inf, NaN, or raises, differently on the two
    lines) are answered here, the same on both; S is the number of weights:

    ==============================================  ======  ====================================
    log weights                                     k̂       meaning
    ==============================================  ======  ====================================
    any NaN                                         NaN     undefined; warns
    any +inf                                        inf     one draw carries all the mass; warns
    all −inf                                        NaN     every draw has p = 0; warns
    some −inf (others finite)                       --      zero weights: kept, k̂ as usual
    finite ones equal (to ``1e-9·max(1, |max|)``)   −inf    q ∝ posterior (or a point mass)
    S < 46 (:data:`PSIS_MIN_DRAWS`)                 NaN     a tail of < 10 draws; warns
    < 10 weights within a factor 1e-15 of the max   inf     a few draws carry all the mass
    the largest ``ceil(min(S/5, 3√S)) + 1`` tie     −inf    bounded weights: no tail to fit
    the weights above that cutoff tie               inf     a few tied draws carry the mass
    ArviZ cannot fit the tail (1.x raises)          NaN     warns
    ==============================================  ======  ====================================
    """
    lw = _as_float64(log_weights)
    if lw.size == 0:
        raise ValueError("psis_khat needs at least one log weight")
    special = _psis_degenerate(lw)
    if special is not None:
        k, reason = special
        if reason:
            warnings.warn(reason)
        return k
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # exp underflow of tiny weights
            return arviz_khat(lw)
    except ValueError as exc:
        warnings.warn(f"ArviZ could not fit the Pareto tail ({exc}): k̂ = NaN")
        return float("nan")


def _as_float64(log_weights: Any) -> np.ndarray:
    """The log weights as a flat float64 numpy array (a torch tensor on any device, with or without
    grad, or anything ``numpy.asarray`` takes)."""
    if hasattr(log_weights, "detach"):  # a torch tensor: off the graph and onto the host first
        log_weights = log_weights.detach().cpu().double().numpy()
    return np.asarray(log_weights, dtype=np.float64).reshape(-1)


def _arviz_is_legacy() -> bool:
    """ArviZ 0.x (``az.psislw``) rather than 1.x (arviz-stats' accessor)."""
    try:
        return int(str(az.__version__).split(".")[0]) < 1
    except ValueError:  # an unparsable version: decide by the 0.x container class
        return hasattr(az, "InferenceData") and not hasattr(az, "loo_approximate_posterior")


def arviz_khat(log_weights: Any) -> float:
    """ArviZ's PSIS k̂ of 1-D log importance weights (r_eff = 1), with no checks of its own.

    ArviZ 0.x: ``az.psislw(log_weights)`` (its argument is the log ratios); ArviZ 1.x: arviz-stats'
    ``psislw`` (the ``.azstats`` accessor), whose argument is a log-likelihood, i.e. the *negated*
    log ratios. The two lines fit the tail a little differently (0.x: the ``ceil(min(S/5, 3√S))``
    weights above the cutoff; 1.x: the largest ``floor(3√S)`` (S > 225) or ``floor(S/5)``), so k̂
    agrees between them to about ±0.05, not exactly. Degenerate input (NaN, constant or tied
    weights, few draws) gives whatever ArviZ gives, or raises (1.x): :func:`psis_khat` answers
    those cases itself.
    """
    lw = np.asarray(log_weights, dtype=np.float64).reshape(-1)
    if _arviz_is_legacy():
        return float(np.asarray(az.psislw(lw.copy(), reff=1.0)[1]))
    arviz_stats.load()  # registers the .azstats accessor
    _, khat = xr.DataArray(-lw, dims=["draw"]).azstats.psislw(dim="draw", r_eff=1.0)
    return float(np.asarray(khat))
