"""Scoring a guide against a reference posterior.

:func:`score_guide` draws from the guide (:func:`guide_draws`) and compares with
:func:`score_draws` — per coordinate, the standardised mean error ``|mean_q − mean_ref| / sd_ref``
and the log variance ratio ``log(var_q / var_ref)``; jointly, a sliced Wasserstein-2 distance in
the reference's standardised coordinates (averaged over random directions,
:func:`sliced_wasserstein2`) and the mean 1-D Wasserstein-1 distance per coordinate
(``scipy.stats.wasserstein_distance``). :func:`fit_and_score` fits guides by SVI and scores them.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch
from pyro import poutine
from torch import Tensor

from pyro_invariance import guides as guide_registry
from pyro_invariance._optional import scipy_stats
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.diagnostics.reference.store import (
    Reference,
    data_fingerprint,
    load_reference,
)
from pyro_invariance.infer.training import fit
from pyro_invariance.models.base import symmetry_summary

__all__ = ["fit_and_score", "guide_draws", "score_draws", "score_guide", "sliced_wasserstein2"]


def sliced_wasserstein2(
    a: np.ndarray, b: np.ndarray, num_projections: int = 200, seed: int = 0, num_quantiles: int = 1000
) -> float:
    """Sliced Wasserstein-2 distance between samples ``a`` ``(n, D)`` and ``b`` ``(m, D)``.

    ``sqrt(mean_u W2²(u·a, u·b))`` over ``num_projections`` random unit directions ``u``; each 1-D
    W2 compares the two empirical quantile functions on ``num_quantiles`` midpoint levels.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need two (n, D) arrays with the same D, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((a.shape[1], num_projections))
    dirs /= np.linalg.norm(dirs, axis=0, keepdims=True)
    levels = (np.arange(num_quantiles) + 0.5) / num_quantiles
    qa, qb = _quantiles(a @ dirs, levels), _quantiles(b @ dirs, levels)
    return float(np.sqrt(np.mean((qa - qb) ** 2)))


def _quantiles(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Column-wise empirical quantiles of ``x`` ``(n, K)`` at ``levels``, by one sort and linear
    interpolation between order statistics at positions ``level·n − ½`` (np.quantile with many
    levels partitions once per level, which is slow)."""
    s = np.sort(x, axis=0)
    pos = np.clip(levels * s.shape[0] - 0.5, 0.0, s.shape[0] - 1.0)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, s.shape[0] - 1)
    frac = (pos - lo)[:, None]
    return s[lo] * (1.0 - frac) + s[hi] * frac


def _flat_draws(draws: Mapping[str, Any], ref: Reference) -> np.ndarray:
    """The draws of the reference's sites side by side, ``(S, D)`` float64, in the reference's order."""
    missing = [k for k in ref.draws if k not in draws]
    if missing:
        raise ValueError(f"draws lack the reference's sites {missing} (have {sorted(draws)})")
    q_parts = []
    for site, value in ref.draws.items():
        d = draws[site]
        q = np.asarray(d.detach().cpu() if isinstance(d, Tensor) else d, dtype=np.float64)
        if q.shape[1:] != value.shape[2:]:
            raise ValueError(
                f"site {site!r}: draws have shape {q.shape[1:]} per sample, the reference {value.shape[2:]}"
            )
        q_parts.append(q.reshape(q.shape[0], -1))
    return np.concatenate(q_parts, axis=1)


def _summary(mean_err: np.ndarray, log_vr: np.ndarray, w1: np.ndarray) -> dict[str, float]:
    """Max / mean of the per-scalar numbers over a set of scalars."""
    return {
        "mean_error_max": float(mean_err.max()),
        "mean_error_mean": float(mean_err.mean()),
        "log_var_ratio_min": float(log_vr.min()),
        "log_var_ratio_max": float(log_vr.max()),
        "log_var_ratio_mean": float(log_vr.mean()),
        "w1_mean": float(w1.mean()),
    }


def score_draws(
    draws: Mapping[str, Any], reference: Reference | str, num_projections: int = 200, seed: int = 0
) -> dict[str, Any]:
    """Compare draws ``{site: (S, *site shape)}`` with a reference.

    Returns a dict of floats:

    * ``mean_error_max`` / ``mean_error_mean``: ``|mean_q − mean_ref| / sd_ref`` over all scalars;
    * ``log_var_ratio_min`` / ``_max`` / ``_mean``: ``log(var_q / var_ref)`` (0 is a match; a
      guide that is too narrow has negative values); ``var_ratio_geomean`` = exp of the mean;
    * ``sliced_w2``: :func:`sliced_wasserstein2` in the reference's standardised coordinates
      (one unit = one reference standard deviation per scalar);
    * ``w1_mean``: mean over scalars of the 1-D Wasserstein-1 distance (standardised,
      ``scipy.stats.wasserstein_distance``);
    * ``sliced_w2_floor``: the same sliced W2 between two halves of the reference's chains — the
      Monte-Carlo noise level below which differences mean nothing;
    * ``sites``: the per-coordinate numbers per site; ``num_samples``, ``num_reference_draws``.
    """
    ref = load_reference(reference) if isinstance(reference, str) else reference
    q_flat = _flat_draws(draws, ref)
    r_flat = ref.flat()
    if q_flat.shape[0] < 2:
        raise ValueError("need at least 2 draws to score")
    mu, sd = r_flat.mean(0), r_flat.std(0, ddof=1)
    mean_err = np.abs(q_flat.mean(0) - mu) / sd
    with np.errstate(divide="ignore"):  # a point-mass guide (map) has variance 0: log ratio −inf
        log_vr = np.log(q_flat.var(0, ddof=1) / sd**2)
    zq, zr = (q_flat - mu) / sd, (r_flat - mu) / sd
    w1 = np.array([scipy_stats.wasserstein_distance(zq[:, j], zr[:, j]) for j in range(zr.shape[1])])
    half = ref.num_chains // 2
    floor = sliced_wasserstein2(
        (ref.flat(range(half)) - mu) / sd, (ref.flat(range(half, ref.num_chains)) - mu) / sd, num_projections, seed
    )
    per_site, start = {}, 0
    for site, value in ref.draws.items():
        d = int(np.prod(value.shape[2:], dtype=int))
        sl = slice(start, start + d)
        start += d
        per_site[site] = _summary(mean_err[sl], log_vr[sl], w1[sl])
    totals = _summary(mean_err, log_vr, w1)
    return {
        **{k: v for k, v in totals.items() if k != "w1_mean"},
        "var_ratio_geomean": float(np.exp(log_vr.mean())),
        "sliced_w2": sliced_wasserstein2(zq, zr, num_projections, seed),
        "sliced_w2_floor": floor,
        "w1_mean": totals["w1_mean"],
        "num_samples": int(q_flat.shape[0]),
        "num_reference_draws": int(r_flat.shape[0]),
        "num_scalars": int(r_flat.shape[1]),
        "sites": per_site,
    }


@pyro_scope()
@torch.no_grad()
def guide_draws(
    guide: Any, x: Tensor, y: Tensor, sites: Sequence[str], num_samples: int = 2000, seed: int = 0
) -> dict[str, np.ndarray]:
    """``num_samples`` joint draws of ``sites`` from ``guide`` (run on the full data), ``{site: (S, ...)}``.

    Works for any guide that samples the sites when called as ``guide(x, y, num_data=N)``; the global
    RNG state is restored afterwards.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
        raise ValueError(f"num_samples must be an integer >= 2, got {num_samples!r}")
    out: dict[str, list[np.ndarray]] = {k: [] for k in sites}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(num_samples):
            with poutine.block():
                tr = poutine.trace(guide).get_trace(x, y, num_data=x.shape[0])
            for k in sites:
                if k not in tr.nodes:
                    sampled = sorted(n for n, s in tr.nodes.items() if s["type"] == "sample")
                    raise ValueError(f"the guide has no site {k!r} (it samples {sampled})")
                out[k].append(tr.nodes[k]["value"].detach().cpu().numpy())
    return {k: np.stack(v) for k, v in out.items()}


@pyro_scope()
def score_guide(
    guide: Any,
    model: Any,
    reference: Reference | str,
    num_samples: int = 2000,
    data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    num_projections: int = 200,
) -> dict[str, Any]:
    """Score a fitted guide against a reference (see :func:`score_draws` for the numbers).

    ``model`` must be the entry's model (same fixed hyperparameters) and ``guide`` fitted on the
    entry's data; ``data`` defaults to the entry's training data (rebuilt; a warning is raised
    when it differs from the data the reference was sampled on).
    """
    ref = load_reference(reference) if isinstance(reference, str) else reference
    if data is None:
        _, x, y = ref.entry.build()
    else:
        x, y = data
    stored = ref.metadata.get("data", {}).get("fingerprint_sha256")
    if stored and stored != data_fingerprint(x, y):
        warnings.warn(
            f"reference {ref.name!r} was sampled on data with another fingerprint than the data given/rebuilt "
            "here (different library versions can change generated data); scores may be off",
            stacklevel=2,
        )
    symmetry = {k: float(v) for k, v in symmetry_summary(model).items()}
    for key, value in ref.entry.fixed.items():
        if key in symmetry and not math.isclose(symmetry[key], value, rel_tol=1e-5, abs_tol=1e-5):
            warnings.warn(
                f"model has {key} = {symmetry[key]:.4g} but reference {ref.name!r} holds it at {value:.4g}",
                stacklevel=2,
            )
    draws = guide_draws(guide, x, y, ref.sites, num_samples=num_samples, seed=seed)
    return score_draws(draws, ref, num_projections=num_projections, seed=seed)


@pyro_scope()
def fit_and_score(
    reference_names: Sequence[str],
    guide_names: Sequence[str],
    *,
    steps: int = 1500,
    lr: float = 0.05,
    init_scale: float = 0.3,
    num_samples: int = 2000,
    seed: int = 0,
    directory: str | Path | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Fit each guide to each entry's model and data (``pyro_invariance.fit``, full batch, one
    learning rate ``lr`` for all guide parameters) and score it with :func:`score_guide`.

    Returns one row per (reference, guide): the settings, the fit's seconds and final ELBO/N, and the
    scores without the per-site breakdown.
    """
    rows = []
    for name in reference_names:
        ref = load_reference(name, directory)
        for guide_name in guide_names:
            pyro.clear_param_store()
            model, x, y = ref.entry.build()
            kwargs = {} if guide_name == "map" else {"init_scale": init_scale}
            guide = guide_registry.get(guide_name, model, **kwargs)
            start = time.perf_counter()
            result = fit(
                model, guide, (x, y), steps=steps, batch_size=None, lr=lr, factor_lr=lr, seed=seed, progress=False
            )
            seconds = time.perf_counter() - start
            scores = score_guide(guide, model, ref, num_samples=num_samples, data=(x, y), seed=seed)
            scores.pop("sites")
            row = {
                "reference": name,
                "guide": guide_name,
                "steps": steps,
                "lr": lr,
                "init_scale": init_scale,
                "seed": seed,
                "fit_seconds": round(seconds, 1),
                "elbo_per_datum": result.final_elbo,
                **scores,
            }
            rows.append(row)
            if log:
                log(row)
    return rows
