"""Uncertainty about the symmetry itself (issue 15): q(η) against a grid posterior, full Bayes against type-II.

On three versions of the 8×8 scikit-learn digits — fully rotated (θ ~ U[−π, π], ``rotated-digits``),
partially rotated (θ ~ U[−π/2, π/2], ``partially-rotated-digits``) and upright (``digits``) — and for
seeds 0, 1, 2, with ``InvariantMLP(symmetry="rotation")`` (one rotation range η ∈ [0, π], RFF first layer):

a. **Full Bayes.** ``symmetry_prior="uniform"``: η is the latent site ``"eta"`` with prior U(0, π), fitted
   jointly with the read-out by the mean-field guide, ``q(θ) q(η)`` (``q(η)`` is logit-normal on
   [0, π]). After the fit, ``num_draws`` draws of ``q(η)``
   (:func:`pyro_invariance.diagnostics.symmetry_posterior.symmetry_draws`) give its mean, sd, median,
   mode, ``P(η > 2.4)``, ``P(η < 1.0)`` and central 90 % interval (5 % and 95 % sample quantiles).
b. **Type-II.** The same model with ``symmetry_prior=None``: η a point estimate trained by the ELBO
   (``eta_init`` and ``eta_lr`` at the library defaults, 0.1 rad and 0.1); its final η.
c. **Grid reference.** Fixed-η fits (``learn_symmetry=False, eta_init=η_j``, otherwise identical) on the
   grid η_j = jπ/(G−1), j = 0..G−1, each followed by an IWAE_K bound on the training set
   (:func:`pyro_invariance.infer.bounds.iwae_bound`) as the estimate of ``log p(D | η_j)``;
   :func:`~pyro_invariance.diagnostics.symmetry_posterior.grid_posterior` with ``log p(η_j) = −log π``
   gives the grid posterior (piecewise linear between grid points, normalised by the trapezoidal
   rule): its mode (a grid point), mean, sd, central 90 % interval and the same probabilities as (a).
d. **Held-out.** Test NLL and accuracy of the posterior predictive (:func:`pyro_invariance.evaluate`,
   ``eval_samples`` joint guide draws; for full Bayes each draw carries its own η from ``q(η)``, so the
   predictive integrates over η) for full Bayes and type-II; the ELBO per datum of each (full
   Bayes: a bound on ``log p(D)``, integrated over η; type-II: on ``log p(D | η*)``), and IWAE_K / N of
   both beside the grid's ``log p(D) ≈ log ∫ p(D | η) p(η) dη`` (trapezoidal rule over the grid).

Definitions.

* **Mode of q(η)**: the maximiser, on 2001 points of [0, π], of a Gaussian KDE of the draws (SciPy's
  ``gaussian_kde``, Scott's bandwidth) reflected at 0 and π (draws mirrored to −η and 2π − η), so that a
  q(η) piled against a boundary keeps its mode at the boundary instead of being smeared outside [0, π].
* **Overlap of q(η) with the grid posterior**: two masses, ``q in grid 90 %`` = the fraction of the
  draws of q(η) inside the grid posterior's central 90 % interval, and ``grid in q 90 %`` = the grid
  posterior's mass inside q's central 90 % interval. Both are 0.9 when the two coincide; a q that is
  too narrow but well placed has the first near 1 and the second small; a q in the wrong place has both
  small.
* **Resolution of the grid**: the grid density is linear between points 15° (0.26 rad) apart, so a
  posterior narrower than the spacing shows as a triangle of half-width 0.26 rad around one grid point,
  whose central 90 % interval (from the CDF) is about ±0.18 rad; the overlap masses then ask whether
  q(η) lies within that band. ``GridPosterior.mean`` / ``.sd`` are the moments of that piecewise-linear
  density (before 2026-11-26 they were trapezoidal sums at the grid points, which report an sd near 0 for
  such a posterior; ``--render-only`` recomputes every grid summary from the stored bounds with today's
  code). Compare widths by the 90 % intervals, as the overlap masses and the "why" column do.
* **Noise of the reference**: each ``log p(D | η_j)`` is one IWAE_K estimate after one fit; where the
  evidence is flat in η (within a few nats), fit-to-fit and Monte-Carlo noise of the bounds moves the
  grid posterior between neighbouring points. The spread over seeds shows how much.

The issue's criteria (fixed before any run; evaluated on q(η) per seed, computed by :func:`criteria`):

1. fully rotated: ``P_q(η > 2.4) > 0.5`` ("mostly above 2.4 rad");
2. partially rotated (±90°): ``|mode_q − π/2| ≤ 0.5``;
3. upright: ``mode_q < 1.0`` or ``P_q(η < 1.0) > 0.5`` ("below 1.0: mode, or most mass");
4. every dataset: q(η) overlaps the grid posterior: ``q in grid 90 % ≥ 0.5`` **and** ``grid in q 90 %
   ≥ 0.5`` (each puts at least half of its mass inside the other's central 90 % interval).

A criterion *holds* on a dataset when it holds for all three seeds, *partly* for one or two, *fails* for
none. Criteria 1–3 are also evaluated on the grid posterior (mode and probabilities of the grid
density): where q(η) fails and the grid reference fails too, the evidence itself (of this model on
these N images, as estimated by the fixed-η bounds) does not support the criterion; where only q(η)
fails, variational inference missed the reference. The "why" column says which, from the numbers.

Settings, and why (all fixed before any result was seen; library defaults unless a reason is given):

* data: ``train_size=300`` ("a few hundred training images": few enough that η is not pinned to a
  point, so that the posterior width matters; the first 300 of the fixed split), ``test_size=450``
  (the whole test split: evaluation is cheap, and more test images make the NLL comparison less
  noisy).
* model: ``hidden=256``, ``num_transforms=16``, ``activation="rff"``, lengthscale √D/8 = 1, prior
  ``"hierarchical"`` — the model's defaults (tutorial 01's model). ``init_seed=seed``: each seed is an
  independent replicate of the whole experiment (random features, SVI noise, draws), so the spread
  over seeds includes the choice of random features, not only optimisation noise.
* guide: ``"mean-field"`` for all three kinds of fit (the brief's q(θ)q(η); the same guide family
  for full Bayes, type-II and the grid, so that differences come from how η is treated).
* fit: the library defaults — 1000 steps, batch 128, Adam lr 0.05 (q(η)'s parameters are guide
  parameters, so they train at this rate), η lr 0.1 (type-II), cosine schedule, ``TraceMeanField_ELBO``,
  one particle — with ``seed=seed``. 1000 steps is what tutorial 01 needs for η to settle (by ~500).
* grid: ``G = 13`` points, 15° apart (0, π/12, …, π): η_j = 0 is allowed with fixed η, 9π/12 ≈ 2.36
  and 10π/12 ≈ 2.62 bracket the 2.4 threshold, and π/2 ± 0.5 spans four grid points.
* IWAE: ``K = 100`` draws, one estimate (the brief's K ≥ 100; ~1 s per bound at this size).
* q(η) draws: 2000 (Monte-Carlo error of a probability ≤ 0.011).
* evaluation: ``eval_samples = 64`` guide draws in the posterior predictive (the library default is 16).
  The NLL of a Monte-Carlo mixture is biased upwards by its Monte-Carlo noise, more for the model with
  the extra latent η; 64 draws make that bias small for both at negligible cost. ELBO/N with the
  library's 8 particles. Every evaluation is seeded by the run's seed.
* threads: 1 (``_common.set_threads``; the machines have 2 shared cores).

``--guide symmetry-conditional`` fits the full-Bayes model with ``q(η) q(θ | η)`` instead
(:mod:`guides.symmetry_conditional`: θ linear-Gaussian in the unconstrained η, the issue's structured
option; its library defaults: diagonal weights, Normal q(u_η), initialised as the mean-field guide).
It was added after the mean-field run above, with its settings fixed before it ran, and it runs on
every dataset and seed. With ``--reference-from <results JSON>`` the type-II fit and the grid reference
of each (dataset, seed) are taken from an earlier run with the same settings (refused otherwise) instead
of being refitted: without a latent η this guide is the mean-field family (a diagonal Normal per site),
so the type-II and fixed-η fits are the same method; only the full-Bayes fit differs. Results go to
``uncertain_symmetry_<guide>[_quick]``.

``--steps N`` runs every fit (full Bayes, type-II, grid) for N steps instead of 1000, with the same
cosine schedule spanning them. Added after the runs above, as a check of their convergence (an
exploratory fit of type-II on fully rotated digits, seed 0, was still improving its ELBO well past
1000 steps). ``--steps 4000`` repeats the benchmark with 4× the steps: the type-II rows of the two
tables show how far from converged the 1000-step fits, the grid reference among them, are (not
converged at 4000 either; what it shows is whether the verdicts move with training length). On a
machine with several cores, run one process per dataset (``--datasets <one> --out-dir <its own folder>``)
and join their JSON files with ``--merge`` (settings must agree; each (dataset, seed) once).

A finer reference: ``research/uncertain_symmetry/scripts/uncertain_symmetry_refined.py`` takes a finished run (the
4000-step ones), refits the grid on 5° points around the mass of the grid posterior and of q(η), with four
training seeds per point, measures the reference's own fit-to-fit noise, and evaluates these criteria
of the stored q(η) against it (``uncertain_symmetry_refined_steps4000.md``).

``--quick`` is a smoke-test size (meaningless numbers, ~1 min): 100/100 images, H = 32, S = 4,
40 steps, a 5-point grid, K = 10, 200 draws, 8 evaluation draws.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry[_quick].md``, ``.json`` and ``.png`` (q(η) histograms
of every seed against the grid posteriors, type-II η marked), rewritten after every (dataset, seed) so
that a partial run can be read.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import pyro  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.data.arrays import train_arrays  # noqa: E402
from pyro_invariance.data.images import load_dataset  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import GridPosterior, grid_posterior, symmetry_draws  # noqa: E402
from pyro_invariance.infer.bounds import iwae_bound  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402
from pyro_invariance.tasks import seeded_rng  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402

STEM = "uncertain_symmetry"
ETA_MAX = math.pi
#: criteria thresholds
ROTATED_THRESHOLD = 2.4
PARTIAL_TARGET, PARTIAL_TOLERANCE = math.pi / 2, 0.5
UPRIGHT_THRESHOLD = 1.0
OVERLAP_MIN = 0.5

#: dataset key -> (registry name, title)
DATASETS: dict[str, tuple[str, str]] = {
    "rotated": ("rotated-digits", "fully rotated digits (θ ~ U[−π, π])"),
    "partially-rotated": ("partially-rotated-digits", "partially rotated digits (θ ~ U[−π/2, π/2])"),
    "upright": ("digits", "upright digits"),
}

#: size presets
SIZES: dict[str, dict[str, Any]] = {
    "quick": {
        "train_size": 100,
        "test_size": 100,
        "hidden": 32,
        "num_transforms": 4,
        "steps": 40,
        "grid_points": 5,
        "iwae_K": 10,
        "num_draws": 200,
        "eval_samples": 8,
    },
    "default": {
        "train_size": 300,
        "test_size": 450,
        "hidden": 256,
        "num_transforms": 16,
        "steps": 1000,
        "grid_points": 13,
        "iwae_K": 100,
        "num_draws": 2000,
        "eval_samples": 64,
    },
}
SEEDS = (0, 1, 2)
GUIDE = "mean-field"


# --------------------------------------------------------------------------------------------
# Statistics of draws and of the grid posterior
# --------------------------------------------------------------------------------------------
def reflected_kde_mode(draws: np.ndarray, low: float = 0.0, high: float = ETA_MAX, points: int = 2001) -> float:
    """Mode of a Gaussian KDE of ``draws`` (Scott's bandwidth) reflected at ``low`` and ``high``."""
    from scipy.stats import gaussian_kde

    draws = np.asarray(draws, dtype=np.float64)
    if draws.size < 2 or float(np.std(draws)) < 1e-9:
        return float(np.median(draws))
    kde = gaussian_kde(draws)
    u = np.linspace(low, high, points)
    density = kde(u) + kde(2 * low - u) + kde(2 * high - u)
    return float(u[int(np.argmax(density))])


def draw_summary(draws: np.ndarray) -> dict[str, float]:
    """Mean, sd, median, mode, the criteria's probabilities and the central 90 % interval of η draws."""
    d = np.asarray(draws, dtype=np.float64)
    return {
        "mean": float(d.mean()),
        "sd": float(d.std(ddof=1)) if d.size > 1 else 0.0,
        "median": float(np.median(d)),
        "mode": reflected_kde_mode(d),
        "p_above_2.4": float(np.mean(d > ROTATED_THRESHOLD)),
        "p_below_1.0": float(np.mean(d < UPRIGHT_THRESHOLD)),
        "q05": float(np.quantile(d, 0.05)),
        "q95": float(np.quantile(d, 0.95)),
    }


def grid_summary(gp: GridPosterior) -> dict[str, float]:
    """The same numbers for a grid posterior (mode: the grid point of highest density)."""
    return {
        "mean": gp.mean,
        "sd": gp.sd,
        "median": gp.quantile(0.5),
        "mode": gp.mode,
        "p_above_2.4": 1.0 - gp.cdf(ROTATED_THRESHOLD),
        "p_below_1.0": gp.cdf(UPRIGHT_THRESHOLD),
        "q05": gp.quantile(0.05),
        "q95": gp.quantile(0.95),
        "log_marginal": gp.log_marginal,
    }


def overlap(draws: np.ndarray, gp: GridPosterior) -> dict[str, float]:
    """``q_in_grid90``: fraction of draws inside the grid posterior's central 90 % interval;
    ``grid_in_q90``: the grid posterior's mass inside the draws' central 90 % interval."""
    d = np.asarray(draws, dtype=np.float64)
    lo, hi = gp.quantile(0.05), gp.quantile(0.95)
    q_lo, q_hi = float(np.quantile(d, 0.05)), float(np.quantile(d, 0.95))
    return {"q_in_grid90": float(np.mean((d >= lo) & (d <= hi))), "grid_in_q90": gp.mass(q_lo, q_hi)}


# --------------------------------------------------------------------------------------------
# Criteria
# --------------------------------------------------------------------------------------------
#: criterion id -> (dataset, statement)
CRITERIA: dict[str, tuple[str, str]] = {
    "rotated: mostly above 2.4": ("rotated", f"P_q(η > {ROTATED_THRESHOLD}) > 0.5"),
    "±90°: mode near π/2": ("partially-rotated", f"|mode_q − π/2| ≤ {PARTIAL_TOLERANCE}"),
    "upright: below 1.0": ("upright", f"mode_q < {UPRIGHT_THRESHOLD} or P_q(η < {UPRIGHT_THRESHOLD}) > 0.5"),
    **{
        f"{key}: overlaps grid": (key, f"q in grid 90 % ≥ {OVERLAP_MIN} and grid in q 90 % ≥ {OVERLAP_MIN}")
        for key in DATASETS
    },
}


def location_criterion(dataset: str, s: dict[str, float]) -> tuple[bool, str]:
    """Criteria 1–3 on a summary ``s`` (of q draws or of a grid posterior): (holds, the statistic)."""
    if dataset == "rotated":
        return s["p_above_2.4"] > 0.5, f"P(η>2.4) = {s['p_above_2.4']:.2f}"
    if dataset == "partially-rotated":
        dist = abs(s["mode"] - PARTIAL_TARGET)
        return dist <= PARTIAL_TOLERANCE, f"mode {s['mode']:.2f} (|Δ| {dist:.2f})"
    ok = s["mode"] < UPRIGHT_THRESHOLD or s["p_below_1.0"] > 0.5
    return ok, f"mode {s['mode']:.2f}, P(η<1) = {s['p_below_1.0']:.2f}"


def criterion_cell(c: tuple[bool, str]) -> str:
    """A criterion ``(holds, statistic)`` of :func:`location_criterion` as a Markdown table cell: ``holds (…)``."""
    return f"{'holds' if c[0] else 'fails'} ({c[1]})".replace("|", "\\|")


def overlap_reason(q: dict[str, float], g: dict[str, float], ov: dict[str, float]) -> str:
    """Why an overlap check failed, from the numbers (widths: the central 90 % intervals)."""
    qi, gi = f"[{q['q05']:.2f}, {q['q95']:.2f}]", f"[{g['q05']:.2f}, {g['q95']:.2f}]"
    if ov["q_in_grid90"] >= OVERLAP_MIN > ov["grid_in_q90"]:
        return f"q(η) sits inside the grid's 90 % interval {gi} but is narrower ({qi})"
    if ov["grid_in_q90"] >= OVERLAP_MIN > ov["q_in_grid90"]:
        return f"q(η)'s 90 % interval {qi} holds most of the grid posterior (90 % interval {gi}) but q(η) is wider"
    return f"q(η) and the grid posterior are apart (90 % intervals {qi} vs {gi})"


def refresh_grid(unit: dict[str, Any]) -> GridPosterior:
    """Build a unit's grid posterior from its stored bounds (``log p(D | η_j)``) with today's code and
    (re)write its density, summary and the overlap with its stored q(η) draws; returns the posterior."""
    grid = np.array([p["eta"] for p in unit["grid"]["points"]])
    log_evidence = np.array([p["iwae"]["value"] for p in unit["grid"]["points"]])
    gp = grid_posterior(grid, log_evidence, np.full_like(grid, -math.log(ETA_MAX)))
    unit["grid"] = {**unit["grid"], "density": gp.density.tolist(), "summary": grid_summary(gp)}
    unit["overlap"] = overlap(np.asarray(unit["q_draws"], dtype=np.float64), gp)
    return gp


def criteria(units: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate every criterion on the finished (dataset, seed) units: per-seed values and a verdict."""
    rows = []
    for name, (dataset, statement) in CRITERIA.items():
        mine = sorted((u for u in units if u["dataset"] == dataset), key=lambda u: u["seed"])
        if not mine:
            continue
        per_seed = []
        for u in mine:
            q, g, ov = u["full_bayes"]["q_eta"], u["grid"]["summary"], u["overlap"]
            if name.endswith("overlaps grid"):
                ok = ov["q_in_grid90"] >= OVERLAP_MIN and ov["grid_in_q90"] >= OVERLAP_MIN
                stat = f"q in grid {ov['q_in_grid90']:.2f}, grid in q {ov['grid_in_q90']:.2f}"
                ref_ok, ref_stat = None, ""
                why = "" if ok else overlap_reason(q, g, ov)
            else:
                ok, stat = location_criterion(dataset, q)
                ref_ok, ref_stat = location_criterion(dataset, g)
                if ok:
                    why = ""
                elif ref_ok:
                    why = f"the grid reference meets it ({ref_stat}): q(η) misses the reference"
                else:
                    why = (
                        f"the grid reference fails it too ({ref_stat}): the estimated evidence of this model on "
                        f"these images does not support it"
                    )
            per_seed.append(
                {
                    "seed": u["seed"],
                    "holds": bool(ok),
                    "statistic": stat,
                    "grid_holds": ref_ok,
                    "grid_statistic": ref_stat,
                    "why": why,
                }
            )
        n_ok = sum(p["holds"] for p in per_seed)
        verdict = "holds" if n_ok == len(per_seed) else ("fails" if n_ok == 0 else "partly")
        rows.append(
            {
                "criterion": name,
                "dataset": dataset,
                "statement": statement,
                "per_seed": per_seed,
                "seeds_holding": n_ok,
                "num_seeds": len(per_seed),
                "verdict": verdict,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# Fits
# --------------------------------------------------------------------------------------------
def make_model(data: Any, size: dict[str, Any], seed: int, **kw: Any) -> InvariantMLP:
    return InvariantMLP(
        image_shape=data.image_shape,
        num_classes=data.num_classes,
        hidden=size["hidden"],
        num_transforms=size["num_transforms"],
        symmetry="rotation",
        init_seed=seed,
        **kw,
    )


def fit(
    data: Any, size: dict[str, Any], seed: int, guide: str = GUIDE, train_seed: int | None = None, **model_kw: Any
) -> Any:
    """The unit's model (random features of ``init_seed = seed``) fitted with ``guide``; training (guide
    initialisation, minibatches, sampled transforms) seeded by ``train_seed`` (default ``seed``)."""
    train_seed = seed if train_seed is None else train_seed
    pyro.set_rng_seed(train_seed)
    model = make_model(data, size, seed, **model_kw)
    return pi.fit(model, pi.guides.get(guide, model), data, steps=size["steps"], seed=train_seed, progress=False)


def q_draws(result: Any, data: Any, size: dict[str, Any], seed: int) -> np.ndarray:
    """``num_draws`` draws of q(η) from a full-Bayes fit (float64, seeded by ``seed``)."""
    x, y = train_arrays(data, result.model)
    draws = symmetry_draws(result.model, result.guide, x[:1], y[:1], num_samples=size["num_draws"], seed=seed)
    return draws["eta"][:, 0].numpy().astype(np.float64)


def bound(result: Any, data: Any, size: dict[str, Any], seed: int) -> dict[str, float]:
    """IWAE_K on the training split (nats, all N images), seeded."""
    x, y = train_arrays(data, result.model)
    with seeded_rng(seed):
        b = iwae_bound(result.model, result.guide, x, y, K=size["iwae_K"])
    return {"value": float(b.value), "per_datum": float(b.per_datum), "k_hat": float(b.k_hat), "K": int(b.K)}


def held_out(result: Any, data: Any, size: dict[str, Any], seed: int) -> dict[str, float]:
    return pi.evaluate(result, data, num_samples=size["eval_samples"], seed=seed)


def run_unit(
    dataset: str, seed: int, size: dict[str, Any], guide: str = GUIDE, reference: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Full Bayes (with ``guide``), type-II and the grid reference on one dataset for one seed; type-II
    and the grid from ``reference`` (a unit of an earlier run with the same settings) when given."""
    data = load_dataset(DATASETS[dataset][0], train_size=size["train_size"], test_size=size["test_size"])
    t0 = time.perf_counter()
    unit: dict[str, Any] = {"dataset": dataset, "seed": seed}

    # (a) full Bayes: η latent, U(0, π) prior, q(θ) q(η) (or q(θ | η) q(η))
    fb = fit(data, size, seed, guide=guide, symmetry_prior="uniform")
    draws_np = q_draws(fb, data, size, seed)
    unit["full_bayes"] = {
        "q_eta": draw_summary(draws_np),
        "metrics": held_out(fb, data, size, seed),
        "iwae": bound(fb, data, size, seed),
        "fit_seconds": fb.seconds,
        "final_elbo_per_datum": fb.final_elbo,
    }
    unit["q_draws"] = draws_np.round(5).tolist()
    common.log(
        f"  {dataset} seed {seed}: full Bayes q(η) mean {unit['full_bayes']['q_eta']['mean']:.3f} "
        f"sd {unit['full_bayes']['q_eta']['sd']:.3f} ({fb.seconds:.0f} s)"
    )

    if reference is not None:  # (b) and (c) from the earlier run
        unit["type_ii"], unit["grid"] = reference["type_ii"], reference["grid"]
        refresh_grid(unit)
        unit["seconds"] = time.perf_counter() - t0 + reference["seconds"]
        unit["reference_seconds"] = reference["seconds"]
        return unit

    # (b) type-II: η a point estimate
    t2 = fit(data, size, seed)
    unit["type_ii"] = {
        "eta": t2.eta["rot"],
        "metrics": held_out(t2, data, size, seed),
        "iwae": bound(t2, data, size, seed),
        "fit_seconds": t2.seconds,
        "final_elbo_per_datum": t2.final_elbo,
    }
    common.log(f"  {dataset} seed {seed}: type-II η {unit['type_ii']['eta']:.3f} ({t2.seconds:.0f} s)")

    # (c) the grid reference: fixed-η fits, IWAE_K as log p(D | η_j)
    grid = np.linspace(0.0, ETA_MAX, size["grid_points"])
    points = []
    for eta_j in grid:
        r = fit(data, size, seed, learn_symmetry=False, eta_init=float(eta_j))
        points.append(
            {
                "eta": float(eta_j),
                "iwae": bound(r, data, size, seed),
                "final_elbo_per_datum": r.final_elbo,
                "fit_seconds": r.seconds,
            }
        )
    unit["grid"] = {"points": points}
    gp = refresh_grid(unit)  # the density, summary and overlap, as --render-only recomputes them
    unit["seconds"] = time.perf_counter() - t0
    common.log(
        f"  {dataset} seed {seed}: grid mode {gp.mode:.3f} mean {gp.mean:.3f} sd {gp.sd:.3f}; "
        f"overlap {unit['overlap']} ({unit['seconds']:.0f} s in all)"
    )
    return unit


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def _num(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals, without a sign on a rounded zero (1 − CDF can be −1e-16)."""
    return f"{round(float(value), digits) + 0.0:.{digits}f}"


def _ms(values: list[float], digits: int = 3) -> str:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 1:
        return _num(v[0], digits)
    return f"{_num(v.mean(), digits)} ± {_num(v.std(ddof=1), digits)}"


#: table rows: label -> function of a unit
ROWS: list[tuple[str, Any]] = [
    ("q(η) mean", lambda u: u["full_bayes"]["q_eta"]["mean"]),
    ("q(η) sd", lambda u: u["full_bayes"]["q_eta"]["sd"]),
    ("q(η) mode (reflected KDE)", lambda u: u["full_bayes"]["q_eta"]["mode"]),
    ("q(η) median", lambda u: u["full_bayes"]["q_eta"]["median"]),
    ("q(η) 90 % interval, low", lambda u: u["full_bayes"]["q_eta"]["q05"]),
    ("q(η) 90 % interval, high", lambda u: u["full_bayes"]["q_eta"]["q95"]),
    ("P_q(η > 2.4)", lambda u: u["full_bayes"]["q_eta"]["p_above_2.4"]),
    ("P_q(η < 1.0)", lambda u: u["full_bayes"]["q_eta"]["p_below_1.0"]),
    ("grid posterior mode", lambda u: u["grid"]["summary"]["mode"]),
    ("grid posterior mean", lambda u: u["grid"]["summary"]["mean"]),
    ("grid posterior sd", lambda u: u["grid"]["summary"]["sd"]),
    ("grid posterior 90 % interval, low", lambda u: u["grid"]["summary"]["q05"]),
    ("grid posterior 90 % interval, high", lambda u: u["grid"]["summary"]["q95"]),
    ("grid P(η > 2.4)", lambda u: u["grid"]["summary"]["p_above_2.4"]),
    ("grid P(η < 1.0)", lambda u: u["grid"]["summary"]["p_below_1.0"]),
    ("type-II η", lambda u: u["type_ii"]["eta"]),
    ("overlap: q in grid 90 %", lambda u: u["overlap"]["q_in_grid90"]),
    ("overlap: grid in q 90 %", lambda u: u["overlap"]["grid_in_q90"]),
    ("test NLL, full Bayes", lambda u: u["full_bayes"]["metrics"]["nll"]),
    ("test NLL, type-II", lambda u: u["type_ii"]["metrics"]["nll"]),
    ("test NLL, full Bayes − type-II", lambda u: u["full_bayes"]["metrics"]["nll"] - u["type_ii"]["metrics"]["nll"]),
    ("test accuracy, full Bayes", lambda u: u["full_bayes"]["metrics"]["accuracy"]),
    ("test accuracy, type-II", lambda u: u["type_ii"]["metrics"]["accuracy"]),
    ("ELBO/N, full Bayes (bound on log p(D))", lambda u: u["full_bayes"]["metrics"]["elbo_per_datum"]),
    ("ELBO/N, type-II (bound on log p(D | η*))", lambda u: u["type_ii"]["metrics"]["elbo_per_datum"]),
    ("IWAE/N, full Bayes", lambda u: u["full_bayes"]["iwae"]["per_datum"]),
    ("IWAE/N, type-II", lambda u: u["type_ii"]["iwae"]["per_datum"]),
    ("grid log p(D)/N (trapezoid over IWAE_j)", lambda u: u["grid"]["summary"]["log_marginal"] / u["num_train"]),
    ("seconds (all fits of this seed)", lambda u: u["seconds"]),
]


def dataset_table(units: list[dict[str, Any]]) -> str:
    seeds = [u["seed"] for u in units]
    header = ["quantity", f"mean ± sd ({len(units)} seeds)", *[f"seed {s}" for s in seeds]]
    rows = [[label, _ms([fn(u) for u in units]), *[_num(fn(u)) for u in units]] for label, fn in ROWS]
    return common.md_table(header, rows)


def grid_table(units: list[dict[str, Any]]) -> str:
    """IWAE_K / N at each grid point, per seed."""
    grid = [p["eta"] for p in units[0]["grid"]["points"]]
    header = [
        "η_j (rad)",
        "η_j (°)",
        *[f"IWAE/N seed {u['seed']}" for u in units],
        *[f"density seed {u['seed']}" for u in units],
    ]
    rows = []
    for j, eta in enumerate(grid):
        rows.append(
            [
                f"{eta:.3f}",
                f"{math.degrees(eta):.0f}",
                *[f"{u['grid']['points'][j]['iwae']['per_datum']:.4f}" for u in units],
                *[f"{u['grid']['density'][j]:.3f}" for u in units],
            ]
        )
    return common.md_table(header, rows)


def criteria_table(rows: list[dict[str, Any]]) -> str:
    header = [
        "criterion",
        "test",
        "per seed (q(η))",
        "holds per seed",
        "verdict",
        "grid reference per seed",
        "why (failing seeds)",
    ]
    out = []
    for r in rows:
        ps = r["per_seed"]
        grid_col = (
            "; ".join(
                f"{p['seed']}: {p['grid_statistic']} ({'yes' if p['grid_holds'] else 'no'})"
                for p in ps
                if p["grid_holds"] is not None
            )
            or "—"
        )
        why = "; ".join(f"seed {p['seed']}: {p['why']}" for p in ps if p["why"]) or "—"
        out.append(
            [
                r["criterion"],
                r["statement"],
                "; ".join(f"{p['seed']}: {p['statistic']}" for p in ps),
                " ".join("✓" if p["holds"] else "✗" for p in ps),
                f"**{r['verdict']}** ({r['seeds_holding']}/{r['num_seeds']})",
                grid_col,
                why,
            ]
        )
    return common.md_table(header, out, align=["l"] * len(header))


def plot(units: list[dict[str, Any]], path: Path) -> None:
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    keys = [k for k in DATASETS if any(u["dataset"] == k for u in units)]
    fig = Figure(figsize=(4.6 * len(keys), 3.6))
    axes = fig.subplots(1, len(keys), squeeze=False)
    bins = np.linspace(0.0, ETA_MAX, 49)
    for ax, key in zip(axes[0], keys):
        for u in sorted((u for u in units if u["dataset"] == key), key=lambda u: u["seed"]):
            c = f"C{u['seed'] % 10}"
            ax.hist(
                u["q_draws"], bins=bins, density=True, histtype="step", color=c, lw=1.5, label=f"q(η), seed {u['seed']}"
            )
            grid = [p["eta"] for p in u["grid"]["points"]]
            ax.plot(grid, u["grid"]["density"], "--o", color=c, ms=3, lw=1, label=f"grid posterior, seed {u['seed']}")
            ax.axvline(u["type_ii"]["eta"], color=c, ls=":", lw=1.2)
        if key == "rotated":
            ax.axvline(ROTATED_THRESHOLD, color="k", lw=0.8)
        elif key == "partially-rotated":
            ax.axvspan(PARTIAL_TARGET - PARTIAL_TOLERANCE, PARTIAL_TARGET + PARTIAL_TOLERANCE, color="grey", alpha=0.15)
        else:
            ax.axvline(UPRIGHT_THRESHOLD, color="k", lw=0.8)
        ax.set(xlim=(0, ETA_MAX), xlabel="η (rad)", ylabel="density", title=DATASETS[key][1])
        ax.set_yscale("symlog", linthresh=1.0)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "q(η) (histograms of draws) vs the grid posterior from fixed-η IWAE bounds (dashed); "
        "dotted: type-II η; black/grey: the criterion's threshold",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def render(
    units: list[dict[str, Any]],
    info: dict[str, Any],
    settings: dict[str, Any],
    stem: str,
    wall: float,
    complete: bool,
    command: str | None = None,
) -> str:
    intro = (
        __doc__.split("\n\n")[0]
        + "\n\n"
        + ("" if complete else "**PARTIAL RESULTS** (the run is still going).\n\n")
        + "Method, definitions, criteria and the reason for every setting: section *Method* at the end (the "
        "module docstring of `research/uncertain_symmetry/scripts/uncertain_symmetry.py`)."
    )
    parts = [
        common.header_markdown(
            "Uncertain symmetry: q(η) vs the grid posterior, full Bayes vs type-II",
            info,
            settings,
            command or common.command_line(),
            intro,
        )
    ]
    crit = criteria(units)
    parts += [
        "## The issue's criteria",
        "",
        "Evaluated on q(η) for every seed (computed, not typed). *holds*: all seeds; *partly*: some; *fails*: "
        "none. The grid reference column evaluates the same test on the grid posterior; where q(η) fails it, "
        "the why column says whether the reference fails it too.",
        "",
        criteria_table(crit),
        "",
    ]
    held = []
    for key in DATASETS:
        mine = [u for u in units if u["dataset"] == key]
        if mine:
            held.append(
                [
                    DATASETS[key][1],
                    _ms([u["full_bayes"]["metrics"]["nll"] for u in mine]),
                    _ms([u["type_ii"]["metrics"]["nll"] for u in mine]),
                    _ms([u["full_bayes"]["metrics"]["nll"] - u["type_ii"]["metrics"]["nll"] for u in mine]),
                    _ms([u["full_bayes"]["metrics"]["accuracy"] for u in mine]),
                    _ms([u["type_ii"]["metrics"]["accuracy"] for u in mine]),
                ]
            )
    parts += [
        "## Held-out: full Bayes vs type-II",
        "",
        f"Posterior predictive on the test split ({settings['test_size']} images, {settings['eval_samples']} guide "
        "draws; full Bayes draws η from q(η) in each), mean ± sd over seeds.",
        "",
        common.md_table(
            [
                "data",
                "test NLL full Bayes",
                "test NLL type-II",
                "NLL difference (FB − II)",
                "accuracy full Bayes",
                "accuracy type-II",
            ],
            held,
        ),
        "",
    ]
    for key in DATASETS:
        mine = sorted((u for u in units if u["dataset"] == key), key=lambda u: u["seed"])
        if not mine:
            continue
        parts += [
            f"## {DATASETS[key][1]} (`{DATASETS[key][0]}`)",
            "",
            dataset_table(mine),
            "",
            f"IWAE_{settings['iwae_K']} / N of the fixed-η fits (the grid's log p(D | η_j) / N) and the grid "
            "posterior density:",
            "",
            grid_table(mine),
            "",
        ]
    parts += [
        f"![q(η) vs grid posterior]({stem}.png)",
        "",
        f"Wall time: {wall / 60:.1f} min ({len(units)} (dataset, seed) units).",
        "",
        "## Method",
        "",
        __doc__.split("\n\n", 1)[1].split("\n\nResults:")[0].strip(),
        "",
    ]
    return "\n".join(parts)


def _differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose values differ between two settings dicts (a key missing on one side differs)."""
    return sorted(k for k in set(a) | set(b) if a.get(k, _differing) != b.get(k, _differing))


def merge_runs(payloads: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One results payload from runs on disjoint (dataset, seed) units with otherwise equal settings
    (e.g. one process per dataset on a multi-core machine); a one-line error otherwise."""
    free = ("datasets", "seeds")
    base = {k: v for k, v in payloads[0]["settings"].items() if k not in free}
    for name, p in zip(names, payloads):
        diff = _differing(base, {k: v for k, v in p["settings"].items() if k not in free})
        if diff:
            raise SystemExit(f"--merge: {name}'s settings differ from {names[0]}'s in {diff}")
    keys = [(u["dataset"], u["seed"]) for p in payloads for u in p["units"]]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"--merge: a (dataset, seed) unit is in more than one file: {sorted(keys)}")
    order = [name for name, _ in DATASETS.values()]
    units = sorted(
        (u for p in payloads for u in p["units"]), key=lambda u: (list(DATASETS).index(u["dataset"]), u["seed"])
    )
    settings = {
        **payloads[0]["settings"],
        "datasets": sorted({d for p in payloads for d in p["settings"]["datasets"]}, key=order.index),
        "seeds": sorted({s for p in payloads for s in p["settings"]["seeds"]}),
    }
    command = "\n".join(p["command"] for p in payloads) + f"\n# merged with --merge {' '.join(names)}"
    return {
        "info": payloads[0]["info"],
        "settings": settings,
        "command": command,
        "wall_seconds": max(p["wall_seconds"] for p in payloads),
        "complete": all(p["complete"] for p in payloads),
        "criteria": criteria(units),
        "units": units,
    }


#: settings that may differ between a run and the run it takes type-II and the grid from
_REFERENCE_FREE = ("guide", "seeds", "datasets", "type-II and grid", "fit config")


def reference_units(
    path: Path, settings: dict[str, Any], config: dict[str, Any]
) -> dict[tuple[str, int], dict[str, Any]]:
    """The (dataset key, seed) units of an earlier run whose settings equal ``settings`` except for the
    guide, seeds and datasets, and whose fit config equals ``config`` (the mean-field guide's) on the
    keys it recorded (later library versions record more, at their defaults); a one-line error otherwise."""
    import json

    payload = json.loads(Path(path).read_text())
    theirs = {k: v for k, v in payload["settings"].items() if k not in _REFERENCE_FREE}
    mine = json.loads(json.dumps({k: v for k, v in settings.items() if k not in _REFERENCE_FREE}))
    their_cfg = payload["settings"].get("fit config", {})
    theirs["fit config"], mine["fit config"] = their_cfg, json.loads(json.dumps({k: config.get(k) for k in their_cfg}))
    diff = _differing(theirs, mine)
    if diff:
        raise SystemExit(f"--reference-from {path}: its settings differ in {diff}")
    if payload["settings"].get("guide") != GUIDE:
        raise SystemExit(
            f"--reference-from {path}: its fits used the guide {payload['settings'].get('guide')!r}, not {GUIDE!r}"
        )
    return {(u["dataset"], u["seed"]): u for u in payload["units"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test size (~1 min, meaningless numbers)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {list(DATASETS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    parser.add_argument(
        "--guide",
        default=GUIDE,
        choices=(GUIDE, "symmetry-conditional"),
        help=f"the full-Bayes guide (default {GUIDE}; module docstring)",
    )
    parser.add_argument(
        "--reference-from",
        type=Path,
        default=None,
        help="take type-II and the grid reference of each unit from this results JSON (same settings)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="SVI steps of every fit (full Bayes, type-II, grid) instead of the size's; results go to "
        "<stem>_steps<N> (a sensitivity check: module docstring)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="merge these results JSON files (runs of this script on other datasets or seeds, same "
        "settings otherwise) into <out-dir>/<stem>.json and render it (no fits)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the markdown and the figure from the existing JSON (no fits)",
    )
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    size = dict(SIZES["quick" if args.quick else "default"])
    if args.steps is not None:
        if args.steps < 1:
            parser.error(f"--steps must be a positive integer, got {args.steps}")
        size["steps"] = args.steps
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    keys = [k.strip() for k in args.datasets.split(",") if k.strip()]
    unknown = set(keys) - set(DATASETS)
    if unknown:
        parser.error(f"unknown datasets {sorted(unknown)}; use {list(DATASETS)}")
    stem = (
        STEM
        + ("" if args.guide == GUIDE else f"_{args.guide}")
        + ("_quick" if args.quick else "")
        + ("" if args.steps is None else f"_steps{args.steps}")
    )
    if args.merge:
        import json

        merged = merge_runs([json.loads(Path(m).read_text()) for m in args.merge], [Path(m).name for m in args.merge])
        (Path(args.out_dir) / f"{stem}.json").write_text(json.dumps(merged, indent=1) + "\n")
        args.render_only = True
    if args.render_only:
        import json

        payload = json.loads((Path(args.out_dir) / f"{stem}.json").read_text())
        for unit in payload["units"]:
            refresh_grid(unit)
        payload["criteria"] = criteria(payload["units"])
        markdown = render(
            payload["units"],
            payload["info"],
            payload["settings"],
            stem,
            payload["wall_seconds"],
            payload["complete"],
            command=payload["command"],
        )
        common.write_results(stem, markdown, payload, args.out_dir)
        plot(payload["units"], Path(args.out_dir) / f"{stem}.png")
        common.log(f"re-rendered {stem}.md and {stem}.png from {stem}.json")
        return 0
    probe = InvariantMLP(symmetry="rotation", symmetry_prior="uniform")
    cfg = pi.FitConfig.recommended(probe, pi.guides.get(args.guide, probe), steps=size["steps"])
    settings = {
        **size,
        "seeds": seeds,
        "datasets": [DATASETS[k][0] for k in keys],
        "guide": args.guide,
        "model": "InvariantMLP(symmetry='rotation', activation='rff', prior='hierarchical', init_seed=seed)",
        "full Bayes": "symmetry_prior='uniform' (η ~ U(0, π))",
        "type-II": "symmetry_prior=None, eta_init=0.1 (default)",
        "grid log prior": "−log π",
        "fit config": {k: v for k, v in vars(cfg).items() if k != "seed"},
    }
    references = {}
    if args.reference_from is not None:
        base = pi.FitConfig.recommended(probe, pi.guides.get(GUIDE, probe), steps=size["steps"])
        references = reference_units(
            args.reference_from, settings, {k: v for k, v in vars(base).items() if k != "seed"}
        )
        settings["type-II and grid"] = (
            f"from {args.reference_from.name} (mean-field guide; module docstring), not refitted"
        )
    info = common.machine_info()
    common.log(f"{stem}: {size}, seeds {seeds}, datasets {keys}")
    start = time.perf_counter()
    units: list[dict[str, Any]] = []
    md_path = json_path = None
    for key in keys:
        for seed in seeds:
            if args.reference_from is not None and (key, seed) not in references:
                parser.error(f"{args.reference_from} has no unit for {key}, seed {seed}")
            unit = run_unit(key, seed, size, guide=args.guide, reference=references.get((key, seed)))
            unit["num_train"] = size["train_size"]
            units.append(unit)
            complete = len(units) == len(keys) * len(seeds)
            wall = time.perf_counter() - start
            payload = {
                "info": info,
                "settings": settings,
                "command": common.command_line(),
                "wall_seconds": wall,
                "complete": complete,
                "criteria": criteria(units),
                "units": units,
            }
            md_path, json_path = common.write_results(
                stem, render(units, info, settings, stem, wall, complete), payload, args.out_dir
            )
            plot(units, Path(args.out_dir) / f"{stem}.png")
    common.log(f"done in {(time.perf_counter() - start) / 60:.1f} min: {md_path}, {json_path}")
    for row in criteria(units):
        common.log(f"  {row['criterion']}: {row['verdict']} ({row['seeds_holding']}/{row['num_seeds']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
