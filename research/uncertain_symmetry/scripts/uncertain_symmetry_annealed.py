r"""Issue 15: log p(D | η) by annealed importance sampling on upright digits — a reference with a diagnosable error.

Why. Every grid reference of issue 15 so far (the 15° grid, the refined 5° one, the 1° one near its mode) estimates
log p(D | η_j) by IWAE_K with a mean-field q(θ) fitted at η_j, and their PSIS k̂ is 3–10: one weight decides each
bound, and at K = 1000 the reference's width moved by −14 % / +37 % (``uncertain_symmetry_fine_reference.py`` (e,
f)). How far below log p(D | η) these bounds lie, and whether that gap changes with η (which would move and reshape
the reference), was not measured. Given η, the invariant MLP's read-out is a Bayesian multinomial logistic
regression on fixed features, and :func:`~research.uncertain_symmetry.annealed_evidence.annealed_readout_evidence`
estimates its evidence by AIS along the prior scale σ_p (non-centred, HMC transitions), with the chains' log-weight
spread and PSIS k̂ as diagnostics. This script builds that reference on upright digits and judges the stored q(η)
of the earlier runs against it, unchanged.

Method (every setting fixed and committed before any unit of this script ran; the sampler settings were chosen in
pilots at η = 0.6 on seed 0, which looked at the AIS noise only, never at a posterior over η):

a. **Model.** The unit's ``InvariantMLP`` of ``uncertain_symmetry.py`` (300 upright training digits of the fixed
   split, random features of ``init_seed = seed``, H = 256, hierarchical σ_p ~ LogNormal(0, 1)), at a fixed η, with
   ``sampling="deterministic"``: the S = 16 transforms on a linspace of ε ∈ [−1, 1], i.e. the invariant features of
   paper 003 (Eq. 4) as a 16-point quadrature of the orbit average. Why not the fits' random ε: with ε drawn per
   chain, the evidence also averages over which 16 rotations each chain drew, and in the pilot at η = 0.6 that
   lottery spread the chains' log weights by 7–12 nats (against ≈ 4 with the quadrature); E_ε p(D | ε, η) is then
   decided by the luckiest draws, a property of the Monte-Carlo device, not of invariance. (b) and (c) measure both
   choices at one η.
b. **Scan.** ``ETAS``: η = 0.10, 0.15, …, 1.10 rad (21 points; every upright reference so far and every q(η) lies
   inside). At every η, two independent AIS runs (``HALVES``: seeds 0 and 1) of ``CHAINS`` = 32 chains,
   ``TEMPERATURES`` = 1000 scales, ``LEAPFROG`` = 5 steps of size ``STEP_SIZE`` = 0.3, κ = ``CURVATURE`` = 1/4;
   each run uses the same seed at every η (common random numbers along the scan). Run order: seeds 0, 2, 1; two
   processes, one per half.
c. **Checks at one η** (``CHECK_ETA`` = 0.5, seed 0, half 0): the same run with S = 64 quadrature points (is 16
   enough?) and with the fits' random ε, S = 16 (the lottery of (a)).
d. **Measures** (``--render``). Per seed: the combined estimate log mean_r w_r over both halves' 64 chains at each
   η; the noise from the halves' difference (sd over the scan of (ℓ_0 − ℓ_1)/2: the combined estimate's sd, taken as
   independent between points); the grid posterior with the U(0, π) prior (truncated to the scan; its edge
   densities reported) — mode, mean, sd, central 90 % interval, and each half's alone; the least-squares quadratic
   through the combined estimates within ``CURVATURE_HALF_WIDTH`` = 0.15 rad of the top
   (``uncertain_symmetry_collapsed.quadratic_curvature``, the combined noise as each point's sd): implied sd and 90 %
   interval; diagnostics: per-chain log-weight sd, PSIS k̂ of the 64 chains, acceptance, the σ_p integral's share
   in the path's top 5 %; σ_p's posterior mode at the scan's top (from the path's profile × the LogNormal prior).
e. **Against the IWAE reference.** The refined 5° reference (``uncertain_symmetry_refined.py``, 4 restarts, aligned
   mean): its summary, and the gap ℓ_AIS − IWAE_100 at its points in the scan's range (ℓ_AIS linearly
   interpolated): at the reference's mode, and its range.
f. **The issue's criterion against this reference.** For the stored q(η) of upright seeds 0–2 — mean-field and
   symmetry-conditional after 4000 steps (``uncertain_symmetry.py --steps 4000``), and the warm-up fits (rbf,
   linear) and their control (``uncertain_symmetry_warmup.py``) — the overlap masses of ``uncertain_symmetry.py``
   (q in the reference's 90 %, reference in q's 90 %; both ≥ 0.5 to hold). The runs stored q(η)'s 5 % and 95 %
   quantiles; q(η) is logit-normal on [0, π] in every one of them, so those two quantiles fix it, and 4000 of its
   quantiles stand in for the draws (checked against the 2000 stored draws of the mean-field units: the largest
   difference in either mass is reported). Type-II η: inside the reference's 90 % interval or not.

g. **The other datasets** (settings committed while the upright scan ran, after its first points' values had been
   logged and before any posterior was computed): ``SCANS`` — partially rotated (±90°) digits on η = 0.8, 0.9, …, 2.3
   (16 points) and fully rotated ones on π − 0.1 j, j = 0..8 (9 points up to π), coarser than the upright scan to fit
   the CPU time left; otherwise (a), (b), (d)–(f) unchanged, run after the upright scan and the checks. The quadratic
   of (d) then uses the points within two spacings of the top.

h. **The upright scan extended** (added while it ran, after upright seed 0's points up to 0.95 rad had been logged: the
   evidence there was flat within ≈ 3 nats from 0.55 rad on, so the posterior may reach past the scan's end at 1.10):
   ``UPRIGHT_EXTENSION``, η = 1.2, 1.3, …, 2.0 (9 points, coarser to fit the CPU time), run before (g), otherwise
   unchanged. Seed 0's extension came out flat within ≈ 5 nats up to 2.0 rad too, so ``UPRIGHT_TAIL``, η = 2.1, 2.2, …,
   3.1 (11 points), was added the same way (run after (i), before (g)); the upright posterior is over all three,
   0.10–3.1 rad.

i. **Is T = 1000 enough?** (added after upright seed 0's first render: PSIS k̂ 0.26–2.15 over its 21 points, above 0.7
   at some, while the halves agree to 0.6 nats — agreement that a bias shared by both halves would not show.) Upright
   seed 0, ``LONG_ETAS`` = 0.4, 0.6, …, 1.4 rad, both halves with ``LONG_TEMPERATURES`` = 4000 scales, otherwise (b);
   against the scan's T = 1000 estimates at the same η: the profile's shape (each estimate less its value at 0.8 rad),
   the chains' sd and k̂. Run after (h) and before (g); (g) then runs the ±90° digits first, and the fully rotated ones
   only if CPU time is left.

j. **±90° seed 0 past its scan** (added after its evidence was seen rising up to the scan's end at 2.3 rad; the CPU time
   left covered no more): ``PARTIAL_SEED0_EXTRA`` = 2.5, 2.7, 2.9 and π rad, both halves, otherwise (b). ±90° seed 1 and
   the fully rotated digits of (g) were not run.

k. **The rest of (g)** (added in a later session, before any fully rotated or ±90° seed 1 unit ran; no setting of
   (a)–(f) changed): the fully rotated digits, seeds 0, 2, 1, on their scan of (g) with ``ROTATED_LOWER`` = 1.6, 1.8,
   2.0, 2.2 rad added below it — without them the reference is truncated to [π − 0.8, π] and its mass above 2.4 rad
   could not fall below ≈ 0.9 whatever the evidence, so the criterion "mostly above 2.4" would be judged on a grid
   that cannot fail it; then ±90° seed 1 on its scan of (g); then ``PARTIAL_EXTRA`` (the points of (j)) for ±90° seeds
   2 and 1. Run order per half: rotated seeds 0, 2, 1; ±90° seed 1; the extra points (seeds 2, 1). Two processes, one
   per half. The reference table gains the issue's location criterion of each dataset, judged on the reference itself
   (``uncertain_symmetry.location_criterion`` on its grid summary).
   **Not run**, for CPU time: the extra points for ±90° seeds 2 and 1 (dropped while fully rotated seed 1 ran, when only
   the run logs' per-point values had been seen and no posterior of (k) had been rendered; the Laplace benchmark shared
   the two cores).

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_annealed.md``, ``.json``; unit files (``--work-dir``),
one per (seed, half) plus the checks, written after every η (a stopped run resumes).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import torch  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_collapsed as usc  # noqa: E402
import uncertain_symmetry_fine_reference as usf  # noqa: E402
from scipy.special import expit, logit, logsumexp  # noqa: E402
from scipy.stats import norm  # noqa: E402

from pyro_invariance.data import load_dataset  # noqa: E402
from pyro_invariance.data.arrays import train_arrays  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior  # noqa: E402
from pyro_invariance.infer.bounds import psis_khat  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.annealed_evidence import annealed_readout_evidence  # noqa: E402

STEM = "uncertain_symmetry_annealed"
SEEDS = (0, 2, 1)
ETAS = tuple(round(0.10 + 0.05 * j, 2) for j in range(21))
#: (h) added after upright seed 0's first 18 points showed the evidence flat from 0.55 to 0.95 rad
UPRIGHT_EXTENSION = tuple(round(1.2 + 0.1 * j, 2) for j in range(9))
#: (h) again, after seed 0's points up to 2.0 rad were logged: still flat, so on to 3.1 rad
UPRIGHT_TAIL = tuple(round(2.1 + 0.1 * j, 2) for j in range(11))
#: (k) below the fully rotated scan of (g), so that its reference can put mass below 2.4 rad
ROTATED_LOWER = (1.6, 1.8, 2.0, 2.2)
#: dataset -> its scan of η (g): upright first; the others coarser, where their references and q(η) lie
SCANS = {
    "upright": ETAS + UPRIGHT_EXTENSION + UPRIGHT_TAIL,
    "partially-rotated": tuple(round(0.8 + 0.1 * j, 2) for j in range(16)),
    "rotated": ROTATED_LOWER + tuple(math.pi - 0.1 * j for j in reversed(range(9))),
}
CHECK_DATASET = "upright"
#: (j) added after ±90° seed 0's evidence rose up to its scan's end; (k) runs them for seeds 2 and 1 too
PARTIAL_EXTRA = (2.5, 2.7, 2.9, math.pi)
#: (i) the same points with four times the scales: is T = 1000 enough for the profile's shape?
LONG_ETAS, LONG_SEED, LONG_TEMPERATURES = (0.4, 0.6, 0.8, 1.0, 1.2, 1.4), 0, 4000
HALVES = (0, 1)
CHAINS = 32
TEMPERATURES = 1000
LEAPFROG = 5
STEP_SIZE = 0.3
CURVATURE = 0.25
SAMPLING = "deterministic"
CHECK_ETA, CHECK_SEED = 0.5, 0
#: check file stem -> (label, model settings)
CHECKS = {
    "quadrature64": ("quadrature, S = 64", {"sampling": "deterministic", "num_transforms": 64}),
    "random16": ("random ε, S = 16 (the fits' transforms)", {"sampling": "stochastic", "num_transforms": 16}),
}
CURVATURE_HALF_WIDTH = 0.15
PLATEAU_NATS = 5.0
QUANTILE_DRAWS = 4000
#: q(η) of the earlier runs: label -> (results file, key path to the unit list)
Q_SOURCES = {
    "mean-field, 4000 steps": ("uncertain_symmetry_steps4000.json", ("units",)),
    "symmetry-conditional, 4000 steps": ("uncertain_symmetry_symmetry-conditional_steps4000.json", ("units",)),
    "rbf, warm-up": ("uncertain_symmetry_warmup_steps4000.json", ("units", "rbf")),
    "linear, warm-up": ("uncertain_symmetry_warmup_steps4000.json", ("units", "linear")),
    "control (no warm-up)": ("uncertain_symmetry_warmup_steps4000.json", ("units", "no-warm-up")),
}
REFINED = ("uncertain_symmetry_refined_steps4000.json", ("units", "mean-field"))


def unit_name(dataset: str, seed: int, half: int) -> str:
    return f"{dataset}_seed{seed}_half{half}"


def make_model(data: Any, seed: int, eta: float, sampling: str = SAMPLING, num_transforms: int = 16, **kw: Any) -> Any:
    """The reference model at a fixed η (``kw``: further ``InvariantMLP`` arguments, e.g. ``lengthscale``)."""
    size = {**us.SIZES["default"], "num_transforms": num_transforms}
    return us.make_model(data, size, seed, learn_symmetry=False, eta_init=eta, sampling=sampling, **kw)


def evaluate_point(
    data: Any, seed: int, eta: float, half: int, chains: int = CHAINS, temperatures: int = TEMPERATURES, **model_kw: Any
) -> dict[str, Any]:
    """One AIS run at η (b): the estimate, the chains' log weights and the diagnostics."""
    model = make_model(data, seed, eta, **model_kw)
    x, y = train_arrays(data, model)
    start = time.perf_counter()
    r = annealed_readout_evidence(
        model,
        x,
        y,
        chains=chains,
        temperatures=temperatures,
        leapfrog=LEAPFROG,
        step_size=STEP_SIZE,
        curvature=CURVATURE,
        seed=half,
    )
    scales, profile = r.log_scales.numpy(), r.scale_profile.numpy()
    return {
        "eta": eta,
        "log_evidence": r.log_evidence,
        "log_weights": r.log_weights.tolist(),
        "weight_sd": r.log_weight_sd,
        "acceptance": r.acceptance,
        "edge_share": r.edge_share,
        "sigma_mode": r.sigma_mode,
        "profile": {"log_scale": scales[::20].tolist(), "log_evidence": profile[::20].tolist()},
        "seconds": time.perf_counter() - start,
    }


def run_unit(
    data: Any, dataset: str, seed: int, half: int, path: Path, etas: tuple[float, ...] | None = None, **kw: Any
) -> dict[str, Any]:
    """Every η of the dataset's scan for (seed, half), resuming from ``path``; the file is rewritten after each η."""
    etas = SCANS[dataset] if etas is None else etas
    return common.fill_unit(
        path,
        {"dataset": dataset, "seed": seed, "half": half},
        etas,
        lambda p: p["eta"],
        lambda eta: evaluate_point(data, seed, eta, half, **kw),
        lambda eta, p: (
            f"{path.stem} η {eta:.2f}: {p['log_evidence']:.2f} (chains' sd {p['weight_sd']:.2f}, "
            f"σ_p mode {p['sigma_mode']:.1f}, {p['seconds']:.0f} s)"
        ),
    )


# --------------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------------
def combine(halves: list[dict[str, Any]]) -> dict[str, Any]:
    """(d): the combined profile over both halves' chains, each half's own, and the noise from their difference."""
    by_eta = [{p["eta"]: p for p in h["points"]} for h in halves]
    etas = sorted(set.intersection(*(set(b) for b in by_eta)))
    weights = [np.concatenate([np.asarray(b[e]["log_weights"]) for b in by_eta]) for e in etas]
    each = np.array([[b[e]["log_evidence"] for e in etas] for b in by_eta])  # (halves, G)
    diff = (each[0] - each[1]) / 2 if len(halves) == 2 else np.full(len(etas), np.nan)
    return {
        "etas": np.array(etas),
        "combined": np.array([logsumexp(w) - math.log(len(w)) for w in weights]),
        "each": each,
        "noise": float(np.std(diff, ddof=1)) if len(etas) > 1 else math.nan,
        "k_hat": [float(psis_khat(torch.as_tensor(w))) if len(w) >= 50 else math.nan for w in weights],
        "weight_sd": [b[e]["weight_sd"] for b in by_eta for e in etas],
        "acceptance": [b[e]["acceptance"] for b in by_eta for e in etas],
        "edge_share": [b[e]["edge_share"] for b in by_eta for e in etas],
        "sigma_mode": [b[e]["sigma_mode"] for b in by_eta for e in etas],
    }


def posterior(etas: np.ndarray, log_evidence: np.ndarray) -> Any:
    return grid_posterior(etas, log_evidence, log_prior=np.full(len(etas), -math.log(us.ETA_MAX)))


def implied_width(etas: np.ndarray, values: np.ndarray, noise: float) -> dict[str, Any]:
    """The quadratic through the points within ``CURVATURE_HALF_WIDTH`` (at least two spacings) of the top."""
    top = etas[int(np.argmax(values))]
    half = max(CURVATURE_HALF_WIDTH, 2 * float(np.min(np.diff(etas))))
    near = np.abs(etas - top) <= half + 1e-9
    if near.sum() < 3:  # a top at the scan's coarse end: no quadratic
        return {"eta0": float(top), "points": int(near.sum()), "sd": math.nan, "sd_interval": [math.nan, math.nan]}
    return {"eta0": float(top), **usc.quadratic_curvature(etas[near] - top, values[near], noise)}


def logit_normal_draws(q05: float, q95: float, n: int = QUANTILE_DRAWS) -> np.ndarray:
    """``n`` quantiles of the logit-normal q(η) on [0, π] whose 5 % and 95 % quantiles are ``q05``, ``q95`` (f)."""
    lo, hi = logit(q05 / us.ETA_MAX), logit(q95 / us.ETA_MAX)
    loc, scale = (lo + hi) / 2, (hi - lo) / (2 * norm.ppf(0.95))
    return us.ETA_MAX * expit(loc + scale * norm.ppf((np.arange(n) + 0.5) / n))


@functools.cache
def _results_file(path: Path) -> Any:
    """An earlier run's results, read once per render."""
    return json.loads(path.read_text())


def _units(results: Path, source: tuple[str, tuple[str, ...]], dataset: str) -> dict[int, dict[str, Any]]:
    node: Any = _results_file(results / source[0])
    for key in source[1]:
        node = node[key]
    return {u["seed"]: u for u in node if u["dataset"] == dataset}


def q_overlaps(results: Path, gps: dict[tuple[str, int], Any]) -> tuple[list[dict[str, Any]], float]:
    """(f): every stored q(η) against this reference, and the largest error of the quantile stand-in."""
    rows, worst = [], 0.0
    for label, source in Q_SOURCES.items():
        for (dataset, seed), gp in gps.items():
            units = _units(results, source, dataset)
            q = units[seed]["full_bayes"]["q_eta"]
            ov = us.overlap(logit_normal_draws(q["q05"], q["q95"]), gp)
            if "q_draws" in units[seed]:
                exact = us.overlap(np.asarray(units[seed]["q_draws"]), gp)
                worst = max(worst, *(abs(exact[k] - ov[k]) for k in ov))
            holds = ov["q_in_grid90"] >= us.OVERLAP_MIN and ov["grid_in_q90"] >= us.OVERLAP_MIN
            rows.append(
                {
                    "q": label,
                    "dataset": dataset,
                    "seed": seed,
                    "mean": q["mean"],
                    "sd": q["sd"],
                    **ov,
                    "holds": bool(holds),
                }
            )
    return rows, worst


def iwae_gap(results: Path, dataset: str, seed: int, etas: np.ndarray, combined: np.ndarray) -> dict[str, Any]:
    """(e): the refined IWAE_100 reference's summary and ℓ_AIS − IWAE at its points inside the scan."""
    unit = _units(results, REFINED, dataset)[seed]
    pts = [p for p in unit["grid"]["points"] if etas[0] - 1e-9 <= p["eta"] <= etas[-1] + 1e-9]
    gaps = np.array([np.interp(p["eta"], etas, combined) - p["iwae"]["value"] for p in pts])
    s = unit["grid"]["summary"]
    at_mode = float(gaps[int(np.argmin([abs(p["eta"] - s["mode"]) for p in pts]))])
    return {
        "summary": {k: s[k] for k in ("mode", "mean", "sd", "q05", "q95")},
        "gap_at_mode": at_mode,
        "gap_min": float(gaps.min()),
        "gap_max": float(gaps.max()),
        "points": len(pts),
        "type_ii_eta": _units(results, Q_SOURCES["mean-field, 4000 steps"], dataset)[seed]["type_ii"]["eta"],
    }


# --------------------------------------------------------------------------------------------
# Render
# --------------------------------------------------------------------------------------------
def long_check_rows(work: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(i): the T = 4000 estimates beside the scan's at the same η, as shapes (less their value at 0.8 rad)."""
    paths = [work / f"long_{unit_name(CHECK_DATASET, LONG_SEED, h)}.json" for h in HALVES]
    scans = [work / f"{unit_name(CHECK_DATASET, LONG_SEED, h)}.json" for h in HALVES]
    if not all(p.exists() for p in paths + scans):
        return [], []
    long, short = (combine([json.loads(p.read_text()) for p in ps]) for ps in (paths, scans))
    keep, keep_long = np.isin(short["etas"], long["etas"]), np.isin(long["etas"], short["etas"])
    etas, a, b = long["etas"][keep_long], long["combined"][keep_long], short["combined"][keep]
    long_k = np.asarray(long["k_hat"])[keep_long]
    anchor = int(np.argmin(np.abs(etas - 0.8)))
    t_long, t_short = LONG_TEMPERATURES, TEMPERATURES
    rows = [
        f"| η | T = {t_long} | T = {t_short} | shape at {t_long} (less 0.8 rad) | shape at {t_short} | "
        f"k̂ at {t_long} / {t_short} |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    short_k = np.asarray(short["k_hat"])[keep]
    for i, eta in enumerate(etas):
        rows.append(
            f"| {eta:.2f} | {a[i]:.2f} | {b[i]:.2f} | {a[i] - a[anchor]:+.2f} | {b[i] - b[anchor]:+.2f} | "
            f"{long_k[i]:.2f} / {short_k[i]:.2f} |"
        )
    shift = (a - a[anchor]) - (b - b[anchor])
    rows.append(
        f"\nShape change from T = {t_short} to {t_long}: {np.min(shift):+.2f} to {np.max(shift):+.2f} nats; "
        f"the T = {t_long} estimates "
        f"are higher by {np.min(a - b):+.2f} to {np.max(a - b):+.2f}; the halves' noise at T = 4000 "
        f"{long['noise'] / math.sqrt(2):.2f} nats."
    )
    return rows, [
        {"eta": float(e), "long": float(x), "short": float(y), "k_hat_long": float(k1), "k_hat_short": float(k2)}
        for e, x, y, k1, k2 in zip(etas, a, b, long_k, short_k)
    ]


def plateau(etas: np.ndarray, values: np.ndarray, within: float = PLATEAU_NATS) -> tuple[float, float]:
    """The lowest and highest η whose estimate is within ``within`` nats of the scan's top."""
    near = etas[values >= values.max() - within]
    return float(near.min()), float(near.max())


def plot(lean: list[dict[str, Any]], results: Path, path: Path) -> None:
    """ℓ_AIS(η) − its top per (dataset, seed), each half and combined, beside the refined IWAE_100 reference's points
    (less their own top): the shapes that the two references give the evidence."""
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.6 * len(lean), 3.2))
    axes = fig.subplots(1, len(lean), squeeze=False, sharey=True)
    for ax, u in zip(axes[0], lean):
        etas, combined = np.array(u["etas"]), np.array(u["combined"])
        for h, each in enumerate(u["each"]):
            ax.plot(etas, np.array(each) - combined.max(), lw=0.8, alpha=0.6, color=f"C{h + 1}", label=f"AIS, half {h}")
        ax.plot(etas, combined - combined.max(), "o-", ms=2.5, lw=1.2, color="C3", label="AIS, 64 chains")
        ref = _units(results, REFINED, u["dataset"])[u["seed"]]["grid"]["points"]
        iwae = np.array([p["iwae"]["value"] for p in ref])
        ax.plot(
            [p["eta"] for p in ref],
            iwae - iwae.max(),
            "s--",
            ms=2.5,
            lw=1,
            color="k",
            label="refined IWAE_100, less its top",
        )
        ax.set(xlim=(0, us.ETA_MAX), ylim=(-60, 5), xlabel="η (rad)", title=f"{u['dataset']}, seed {u['seed']}")
    finish_profiles(fig, axes, path)


def finish_profiles(fig: Any, axes: Any, path: Path) -> None:
    """Label and legend a row of ``log p(D | η) − top`` panels, save the figure to ``path`` and close it."""
    axes[0][0].set_ylabel("log p(D | η) − top (nats)")
    axes[0][0].legend(fontsize=6, loc="lower right")
    common.save_figure(fig, path)


def render(work: Path, results: Path, out_dir: Path | None) -> tuple[Path, Path] | None:
    gps, lean = {}, []
    ref_rows, diag_rows = [], []
    for dataset, seed in ((d, s) for d in SCANS for s in sorted(SEEDS)):
        halves = [work / f"{unit_name(dataset, seed, h)}.json" for h in HALVES]
        if not all(p.exists() for p in halves):
            continue
        c = combine([json.loads(p.read_text()) for p in halves])
        if len(c["etas"]) < 5:
            continue
        gp = posterior(c["etas"], c["combined"])
        each = [posterior(c["etas"], e) for e in c["each"]]
        width = implied_width(c["etas"], c["combined"], c["noise"] / math.sqrt(2))
        gap = iwae_gap(results, dataset, seed, c["etas"], c["combined"])
        dens = gp.density / gp.density.max()
        gps[(dataset, seed)] = gp
        ref = gap["summary"]
        t2 = gap["type_ii_eta"]
        top_lo, top_hi = plateau(c["etas"], c["combined"])
        crit = us.location_criterion(dataset, us.grid_summary(gp))
        ref_rows.append(
            f"| {dataset} | {seed} | {gp.mode:.2f} / {gp.mean:.3f} / {gp.sd:.3f} "
            f"{usf.interval(gp.quantile(0.05), gp.quantile(0.95))} | "
            f"{top_lo:.2f}–{top_hi:.2f} | {gp.cdf(us.UPRIGHT_THRESHOLD):.2f} | {us.criterion_cell(crit)} | "
            f"{', '.join(f'{e.mode:.2f} / {e.sd:.3f}' for e in each)} | {width['sd']:.3f} "
            f"{usf.interval(*width['sd_interval'])} | "
            f"{ref['mode']:.2f} / {ref['mean']:.3f} / {ref['sd']:.3f} {usf.interval(ref['q05'], ref['q95'])} | "
            f"{gap['gap_at_mode']:+.1f} ({gap['gap_min']:+.1f} to {gap['gap_max']:+.1f}) | {t2:.3f}, "
            f"{'inside' if gp.quantile(0.05) <= t2 <= gp.quantile(0.95) else 'outside'} |"
        )
        diag_rows.append(
            f"| {dataset} | {seed} | {len(c['etas'])} | {c['noise'] / math.sqrt(2):.2f} | "
            f"{min(c['weight_sd']):.1f}–{max(c['weight_sd']):.1f} | "
            f"{min(c['k_hat']):.2f}–{max(c['k_hat']):.2f} | {min(c['acceptance']):.2f}–{max(c['acceptance']):.2f} | "
            f"{max(c['edge_share']):.3f} | {min(c['sigma_mode']):.1f}–{max(c['sigma_mode']):.1f} | "
            f"{dens[0]:.1e}, {dens[-1]:.1e} |"
        )
        lean.append(
            {
                "dataset": dataset,
                "seed": seed,
                "etas": c["etas"].tolist(),
                "combined": c["combined"].tolist(),
                "each": c["each"].tolist(),
                "noise_combined": c["noise"] / math.sqrt(2),
                "k_hat": c["k_hat"],
                "summary": us.grid_summary(gp),
                "halves": [us.grid_summary(e) for e in each],
                "implied": width,
                "iwae_reference": gap,
                "edge_density": [float(dens[0]), float(dens[-1])],
                "plateau": [top_lo, top_hi],
                "location_criterion": {"holds": bool(crit[0]), "statistic": crit[1]},
            }
        )
    if not gps:
        return None
    overlaps, worst = q_overlaps(results, gps)
    q_rows = [
        f"| {r['q']} | {r['dataset']} | {r['seed']} | {r['mean']:.3f} / {r['sd']:.3f} | {r['q_in_grid90']:.2f}, "
        f"{r['grid_in_q90']:.2f} | "
        f"{'yes' if r['holds'] else 'no'} |"
        for r in overlaps
    ]
    done = sorted({d for d, _ in gps}, key=list(SCANS).index)
    counts = {
        f"{label}, {d}": f"{sum(r['holds'] for r in overlaps if r['q'] == label and r['dataset'] == d)}/"
        f"{sum(1 for dd, _ in gps if dd == d)}"
        for d in done
        for label in Q_SOURCES
    }
    checks = []
    for name, (label, _) in CHECKS.items():
        path = work / f"check_{name}.json"
        base = work / f"{unit_name(CHECK_DATASET, CHECK_SEED, 0)}.json"
        if path.exists() and base.exists():
            p = json.loads(path.read_text())
            b = next(q for q in json.loads(base.read_text())["points"] if q["eta"] == CHECK_ETA)
            checks.append(
                f"| {label} | {p['log_evidence']:.2f} | {b['log_evidence']:.2f} | {p['weight_sd']:.1f} | "
                f"{b['weight_sd']:.1f} |"
            )
    long_rows, long_lean = long_check_rows(work)
    settings = {
        "SCANS": {k: list(v) for k, v in SCANS.items()},
        "SEEDS": list(SEEDS),
        "HALVES": list(HALVES),
        "CHAINS": CHAINS,
        "TEMPERATURES": TEMPERATURES,
        "LEAPFROG": LEAPFROG,
        "STEP_SIZE": STEP_SIZE,
        "CURVATURE": CURVATURE,
        "SAMPLING": SAMPLING,
        "CHECK_ETA": CHECK_ETA,
        "CHECK_SEED": CHECK_SEED,
        "CHECKS": {k: v[1] for k, v in CHECKS.items()},
        "CURVATURE_HALF_WIDTH": CURVATURE_HALF_WIDTH,
        "QUANTILE_DRAWS": QUANTILE_DRAWS,
        "LONG_ETAS": list(LONG_ETAS),
        "LONG_SEED": LONG_SEED,
        "LONG_TEMPERATURES": LONG_TEMPERATURES,
        "PARTIAL_EXTRA": list(PARTIAL_EXTRA),
        "ROTATED_LOWER": list(ROTATED_LOWER),
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: log p(D | η) of the invariant MLP on 300 digits by annealed importance sampling, against the "
        "IWAE_100 references and the stored q(η). Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_annealed.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown(
                "Uncertain symmetry: an annealed-importance-sampling reference", info, settings, command, intro
            ),
            "## The reference, per seed\n",
            f"![ℓ_AIS and IWAE_100 profiles]({STEM}.png)\n",
            "| data | seed | AIS posterior: mode / mean / sd [90 %] | η within 5 nats of the top | P(η < 1.0) | "
            "the issue's location criterion, on this reference | each half alone: mode / sd | "
            "implied sd near the top [90 %] | "
            "refined IWAE_100 reference: mode / mean / sd [90 %] | ℓ_AIS − IWAE_100 at its mode (range) (nats) | "
            "type-II η |",
            "|:---|---:|---:|---:|---:|:---|---:|---:|---:|---:|---:|",
            *ref_rows,
            "\n## Diagnostics\n",
            "| data | seed | η points | combined estimate's noise (nats) | chains' log-weight sd | "
            "PSIS k̂ (64 chains) | acceptance | "
            "σ_p integral in the path's top 5 % | σ_p posterior mode | edge densities / top |",
            "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *diag_rows,
            "\n## Checks at η = 0.5, upright seed 0, half 0 (c)\n",
            "| variant | log p(D \\| η) | the scan's (16-point quadrature) | chains' sd | the scan's chains' sd |",
            "|:---|---:|---:|---:|---:|",
            *(checks or ["| not run | | | | |"]),
            f"\n## T = {LONG_TEMPERATURES} against T = {TEMPERATURES} (i; upright seed {LONG_SEED}, "
            "both halves' 64 chains)\n",
            *(long_rows or ["not run"]),
            "\n## The issue's overlap criterion against this reference (f)\n",
            "\n".join(f"- {label}: {n} seeds" for label, n in counts.items()),
            f"\nThe quantile stand-in for q(η)'s draws moves either mass by at most {worst:.3f} (the mean-field units' "
            "stored draws).\n",
            "| q(η) | data | seed | mean / sd | q in reference 90 %, reference in q 90 % | holds |",
            "|:---|:---|---:|---:|---:|:---|",
            *q_rows,
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    payload = {
        "info": info,
        "settings": settings,
        "command": command,
        "seeds": lean,
        "overlaps": overlaps,
        "counts": counts,
        "quantile_stand_in_error": worst,
        "long_check": long_lean,
    }
    paths = common.write_results(STEM, md, payload, out_dir)
    plot(lean, results, paths[0].with_suffix(".png"))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser, group = common.unit_script_parser(__doc__, STEM)
    group.add_argument(
        "--run", action="store_true", help="the scan (b) for --halves, every point not yet in --work-dir"
    )
    group.add_argument("--checks", action="store_true", help="the two checks of (c)")
    group.add_argument("--long-check", action="store_true", help="(i): LONG_ETAS with LONG_TEMPERATURES for --halves")
    group.add_argument(
        "--partial-extra", action="store_true", help="(j, k): PARTIAL_EXTRA on ±90° digits for --seeds, --halves"
    )
    group.add_argument("--render", action="store_true", help="no runs: the tables from the unit files (d–f)")
    parser.add_argument("--halves", default=",".join(map(str, HALVES)), help="comma-separated AIS seeds to run")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated data seeds, in run order")
    parser.add_argument("--datasets", default=",".join(SCANS), help="comma-separated datasets, in run order")
    parser.add_argument("--results", type=Path, default=common.RESULTS_DIR, help="where the earlier runs' results are")
    args = common.parse_script_args(parser, argv)
    if args.render:
        return 0 if render(args.work_dir, args.results, args.out_dir) else 1
    halves = [int(h) for h in args.halves.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    datasets = args.datasets.split(",")
    if not set(halves) <= set(HALVES) or not set(seeds) <= set(SEEDS) or not set(datasets) <= set(SCANS):
        parser.error(f"--halves from {HALVES}, --seeds from {SEEDS}, --datasets from {tuple(SCANS)}")
    args.work_dir.mkdir(parents=True, exist_ok=True)

    def load(dataset: str) -> Any:
        return load_dataset(
            us.DATASETS[dataset][0],
            train_size=us.SIZES["default"]["train_size"],
            test_size=us.SIZES["default"]["test_size"],
        )

    if args.partial_extra:
        data = load("partially-rotated")
        for seed in seeds:
            for half in halves:
                path = args.work_dir / f"{unit_name('partially-rotated', seed, half)}.json"
                run_unit(data, "partially-rotated", seed, half, path, etas=PARTIAL_EXTRA)
        return 0
    if args.long_check:
        data = load(CHECK_DATASET)
        for half in halves:
            path = args.work_dir / f"long_{unit_name(CHECK_DATASET, LONG_SEED, half)}.json"
            run_unit(data, CHECK_DATASET, LONG_SEED, half, path, etas=LONG_ETAS, temperatures=LONG_TEMPERATURES)
        return 0
    if args.checks:
        data = load(CHECK_DATASET)
        for name, (label, kw) in CHECKS.items():
            path = args.work_dir / f"check_{name}.json"
            if not path.exists():
                point = evaluate_point(data, CHECK_SEED, CHECK_ETA, 0, **kw)
                path.write_text(json.dumps({"check": label, **point}) + "\n")
                common.log(f"check {label}: {point['log_evidence']:.2f} (chains' sd {point['weight_sd']:.2f})")
        return 0
    for dataset in datasets:
        data = load(dataset)
        for seed in seeds:
            for half in halves:
                run_unit(data, dataset, seed, half, args.work_dir / f"{unit_name(dataset, seed, half)}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
