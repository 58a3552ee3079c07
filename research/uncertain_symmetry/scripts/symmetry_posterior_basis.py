"""q(λ) of basis regression with a latent λ against the exact posterior.

The model and data of the NUTS reference ``basis-regression-lambda`` (8 RBF features, 60 noisy points
of cos(2x), λ ~ U(0, 2)): the exact ``p(λ | D)`` by quadrature
(:func:`pyro_invariance.diagnostics.symmetry_posterior.exact_symmetry_posterior`), the stored joint
NUTS draws, and q(λ) of the mean-field, full-rank and symmetry-conditional guides (the last added after
the first two had run, same settings), then refined by the IWAE bound or reweighted wake-sleep with K
draws (the K sweep, added last; ``elbo="rws"`` at K = 256 confirmed on seeds 3-5), each fitted with seeds 0–2 at the
settings of ``tests/diagnostics/test_symmetry_posterior.py`` (fixed before any q(λ) was looked at: 1500 steps,
full batch, lr = factor_lr = 0.05, init scale 0.3, 4 particles; q(λ) from 4000 draws). The pre-registered
criterion: q(λ)'s mean within 0.1·sd and its sd within 25 % of the exact posterior's.

    .venv/bin/python research/uncertain_symmetry/scripts/symmetry_posterior_basis.py [--seeds 0 1 2] [--threads 1]

writes ``research/uncertain_symmetry/results/symmetry_posterior_basis.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

from research.uncertain_symmetry import common as _common  # noqa: E402

# symmetry-conditional (q(λ) q(θ | λ), linear-Gaussian) was added after the first two had run, with
# the same settings; it is reported beside them, not chosen because of them.
GUIDES = ("mean-field", "full-rank", "symmetry-conditional")
# The IWAE refinement (added last): after the ELBO fit above, REFINE steps of the importance-weighted bound
# (elbo="iwae", K = 16). Found by trying it on seed 0 with the symmetry-conditional guide with a full θ
# covariance, after these did not move the sd ratio on seed 0: a spline q(λ) (0.55 with full θ covariance,
# 2.25 with diagonal), a nonlinear (MLP) θ | λ dependence (0.52-0.53). Then fixed and run on every seed.
REFINE = {"elbo": "iwae", "num_particles": 16, "steps": 1000, "lr": 0.005, "factor_lr": 0.005, "batch_size": None}
# The K sweep (added after all of the above): the same refinement with K = 16, 64, 256 draws, with the
# IWAE bound and with reweighted wake-sleep (elbo="rws": the guide follows the inclusive KL(p || q), whose
# K -> infinity optimum for a Gaussian q matches the posterior's mean and covariance). Run on seeds 0-2;
# the setting that met the criterion there (RWS, K = 256) was then run once on seeds 3-5, which played
# no part in choosing it.
SWEEP_K = (16, 64, 256)
CHOSEN = ("rws", 256)
CONFIRM_SEEDS = [3, 4, 5]


def _refine(elbo: str, k: int) -> dict:
    return {**REFINE, "elbo": elbo, "num_particles": k}


def _label(elbo: str, k: int) -> str:
    return f"full-rank + {elbo.upper()} (K = {k})"


#: (row label, guide, guide options, refinement or None, seeds or None for --seeds)
VARIANTS = [
    *((g, g, {}, None, None) for g in GUIDES),
    ("full-rank + IWAE", "full-rank", {}, REFINE, None),
    ("symmetry-conditional (full θ cov.) + IWAE", "symmetry-conditional", {"weight_covariance": "mvn"}, REFINE, None),
    *(
        (_label(e, k), "full-rank", {}, _refine(e, k), None)
        for e in ("iwae", "rws")
        for k in SWEEP_K
        if (e, k) != ("iwae", 16)
    ),
    (_label(*CHOSEN) + ", held-out seeds", "full-rank", {}, _refine(*CHOSEN), CONFIRM_SEEDS),
]
# The collapsed q*(λ) (added after all of the above, with the settings of
# research/uncertain_symmetry/tests/test_collapsed_symmetry.py, fixed before that test first ran): the
# symmetry-conditional guide with a full θ covariance, q(λ) started at scale π/√3, COLLAPSE_WARMUP steps
# of warm_up_conditional, then FIT; then q*(λ) ∝ p(λ) exp(IWAE_K(λ)) of the fitted q(θ | λ)
# (research.uncertain_symmetry.collapsed_symmetry.collapse_symmetry, K = COLLAPSE_K, COLLAPSE_POINTS points).
# Reported beside the same fits' Gaussian q(λ), on seeds 0-2 (--seeds) and CONFIRM_SEEDS.
COLLAPSE_GUIDE = {"weight_covariance": "mvn", "symmetry_init_scale": 1.8137993642342178}  # π/√3
COLLAPSE_WARMUP = 400
COLLAPSE_K, COLLAPSE_POINTS = 100, 201
COLLAPSED_LABELS = (
    "symmetry-conditional (full θ cov.), warm-up, Gaussian",
    "symmetry-conditional (full θ cov.), warm-up, collapsed",
)  # the table adds " q(λ)"
INIT_SCALE = 0.3
FIT = {"steps": 1500, "lr": 0.05, "factor_lr": 0.05, "batch_size": None, "num_particles": 4}
DRAWS = 4000
MEAN_TOL, SD_TOL = 0.1, 0.25  # the pre-registered criterion: |mean error| < 0.1 sd, |sd ratio − 1| < 0.25


def _fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="output folder (default research/uncertain_symmetry/results)")
    args = parser.parse_args(argv)
    _common.set_threads(args.threads)

    import numpy as np
    import pyro

    import pyro_invariance as pi
    from pyro_invariance import guides
    from pyro_invariance.diagnostics.reference import load_reference
    from pyro_invariance.diagnostics.symmetry_posterior import exact_symmetry_posterior, symmetry_draws
    from pyro_invariance.tasks import seeded_rng as pyro_invariance_seeded

    ref = load_reference("basis-regression-lambda")
    model, x, y = ref.entry.build()
    exact = exact_symmetry_posterior(model, x, y)
    nuts = ref.draws["lam"].astype(np.float64).ravel()
    _common.log(
        f"exact p(λ|D): mean {exact.mean:.4f} sd {exact.sd:.4f}; NUTS mean {nuts.mean():.4f} sd {nuts.std(ddof=1):.4f}"
    )

    import torch

    from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior
    from research.uncertain_symmetry.collapsed_symmetry import collapse_symmetry, profile_noise
    from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional

    def row_of(label: str, seed: int, lam: np.ndarray, elbo: float, seconds: float) -> dict:
        mean, sd = float(lam.mean()), float(lam.std(ddof=1))
        row = {
            "guide": label,
            "seed": seed,
            "q_mean": mean,
            "q_sd": sd,
            "mean_error_in_sd": (mean - exact.mean) / exact.sd,
            "sd_ratio": sd / exact.sd,
            "q_iqr": float(np.quantile(lam, 0.75) - np.quantile(lam, 0.25)),
            "elbo_per_datum": elbo,
            "fit_seconds": round(seconds, 1),
        }
        row["passes"] = bool(abs(row["mean_error_in_sd"]) < MEAN_TOL and abs(row["sd_ratio"] - 1) < SD_TOL)
        _common.log(
            f"{label} seed {seed}: q(λ) mean {mean:.4f} sd {sd:.4f} "
            f"(error {row['mean_error_in_sd']:+.3f} sd, sd ratio {row['sd_ratio']:.3f}) {seconds:.0f}s"
        )
        return row

    rows = []
    for label, guide_name, options, refine, seeds in VARIANTS:
        for seed in seeds or args.seeds:
            pyro.clear_param_store()
            model, x, y = ref.entry.build()
            guide = guides.get(guide_name, model, init_scale=INIT_SCALE, **options)
            t0 = time.perf_counter()
            result = pi.fit(model, guide, (x, y), seed=seed, progress=False, **FIT)
            if refine is not None:
                result = pi.fit(model, guide, (x, y), seed=seed, progress=False, **refine)
            seconds = time.perf_counter() - t0
            lam = symmetry_draws(model, guide, x, y, num_samples=DRAWS, seed=seed)["lam"].double().numpy()
            rows.append(row_of(label, seed, lam, result.final_elbo, seconds))
    collapse_seeds = [*args.seeds, *CONFIRM_SEEDS]
    for seed in collapse_seeds:
        pyro.clear_param_store()
        model, x, y = ref.entry.build()
        guide = guides.get("symmetry-conditional", model, **COLLAPSE_GUIDE)
        t0 = time.perf_counter()
        warm_up_conditional(model, guide, (x, y), seed=seed, progress=False, **{**FIT, "steps": COLLAPSE_WARMUP})
        result = pi.fit(model, guide, (x, y), seed=seed, progress=False, **FIT)
        seconds = time.perf_counter() - t0
        lam = symmetry_draws(model, guide, x, y, num_samples=DRAWS, seed=seed)["lam"].double().numpy()
        rows.append(row_of(COLLAPSED_LABELS[0], seed, lam, result.final_elbo, seconds))
        t0 = time.perf_counter()
        collapsed = collapse_symmetry(model, guide, x, y, num_points=COLLAPSE_POINTS, K=COLLAPSE_K, seed=seed)
        with pyro_invariance_seeded(seed):
            lam = collapsed.distribution().sample((DRAWS,)).reshape(-1).double().numpy()
        rows.append(
            row_of(
                COLLAPSED_LABELS[1], seed, lam, collapsed.posterior.log_marginal / x.shape[0], time.perf_counter() - t0
            )
        )
        # a diagnostic, added with the invariant MLP's noise check: a second stream (seed + 1) beside the first;
        # profile_noise of the two, weighted by the mean profile's posterior (the prior is flat), × √2 for one stream's
        second = collapse_symmetry(model, guide, x, y, num_points=COLLAPSE_POINTS, K=COLLAPSE_K, seed=seed + 1)
        each = torch.stack([collapsed.profile, second.profile])
        mean_post = grid_posterior(collapsed.posterior.grid, each.mean(0), np.zeros(COLLAPSE_POINTS))
        rows[-1]["one_stream_profile_noise"] = profile_noise(each, torch.as_tensor(mean_post.density)) * 2**0.5

    exact_iqr = exact.quantile(0.75) - exact.quantile(0.25)
    table = [
        ["exact (quadrature, 2001 points)", f"{exact.mean:.4f}", f"{exact.sd:.4f}", "0", "1", f"{exact_iqr:.4f}", "—"],
        [
            "NUTS reference (4×1500 draws)",
            f"{nuts.mean():.4f}",
            f"{nuts.std(ddof=1):.4f}",
            f"{(nuts.mean() - exact.mean) / exact.sd:+.3f}",
            f"{nuts.std(ddof=1) / exact.sd:.3f}",
            f"{np.quantile(nuts, 0.75) - np.quantile(nuts, 0.25):.4f}",
            "—",
        ],
    ]
    for label, seeds in [*((v[0], v[4]) for v in VARIANTS), *((c, collapse_seeds) for c in COLLAPSED_LABELS)]:
        sel = [r for r in rows if r["guide"] == label]
        table.append(
            [
                f"{label} q(λ), seeds {', '.join(map(str, seeds or args.seeds))}",
                _fmt([r["q_mean"] for r in sel]),
                _fmt([r["q_sd"] for r in sel]),
                _fmt([r["mean_error_in_sd"] for r in sel]),
                _fmt([r["sd_ratio"] for r in sel]),
                _fmt([r["q_iqr"] for r in sel]),
                f"{sum(r['passes'] for r in sel)}/{len(sel)}",
            ]
        )
    per_seed = [
        [
            r["guide"],
            r["seed"],
            f"{r['q_mean']:.4f}",
            f"{r['q_sd']:.4f}",
            f"{r['mean_error_in_sd']:+.3f}",
            f"{r['sd_ratio']:.3f}",
            f"{r['q_iqr']:.4f}",
            f"{r['elbo_per_datum']:.4f}",
            f"{r['fit_seconds']:.0f}",
            "yes" if r["passes"] else "no",
        ]
        for r in rows
    ]

    settings = {
        "reference": "basis-regression-lambda",
        "guides": [v[0] for v in VARIANTS],
        "seeds": args.seeds,
        "init_scale": INIT_SCALE,
        **FIT,
        "IWAE refinement (after the fit)": REFINE,
        "K sweep (the refinement with elbo and K replaced)": {"K": SWEEP_K, "elbo": ["iwae", "rws"]},
        "chosen (elbo, K), confirmed on": [CHOSEN, CONFIRM_SEEDS],
        "q_draws": DRAWS,
        "collapsed q*(λ) (after everything else)": {
            "guide": COLLAPSE_GUIDE,
            "warm-up steps": COLLAPSE_WARMUP,
            "K": COLLAPSE_K,
            "points": COLLAPSE_POINTS,
            "seeds": [*args.seeds, *CONFIRM_SEEDS],
        },
        "criterion": f"|mean_q − mean| < {MEAN_TOL}·sd and |sd_q / sd − 1| < {SD_TOL}",
    }
    intro = (
        "q(λ) of the guides against the exact posterior p(λ | D) (quadrature of the "
        "closed-form evidence) and the joint NUTS reference, on the data of `basis-regression-lambda`. "
        "Rows over seeds give mean ± sd over the seeds of q(λ)'s mean and sd. The exact posterior is "
        "symmetric about 1, with a sharp top and heavy shoulders (kurtosis "
        f"{np.trapezoid((exact.grid - exact.mean) ** 4 * exact.density, exact.grid) / exact.sd**4:.1f}); "
        "the interquartile range (IQR) shows the width of its core. The '+ IWAE' rows continue the ELBO fit "
        'with the importance-weighted bound (`elbo="iwae"`, K = 16 draws, 1000 steps, lr 0.005), which pulls q '
        "towards covering the posterior; that recipe was tried on seed 0 first (after a spline q(λ) and a "
        "nonlinear θ | λ had not changed the sd ratio there), then fixed and run on every seed. The K-sweep rows "
        "were added last: the same refinement with K = 16, 64, 256 and either the IWAE bound or reweighted "
        'wake-sleep (`elbo="rws"`: the IWAE bound for the model, the inclusive KL(p ‖ q) for the guide, '
        "whose K → ∞ optimum for a Gaussian guide matches the posterior's mean and covariance; Le et al. 2019). "
        "RWS with K = 256 was chosen from seeds 0-2 and then run on "
        "seeds 3-5 (the held-out row), which played no part in choosing it. The last two rows were added after "
        "all of these: the symmetry-conditional guide (full θ covariance, q(λ) started at scale π/√3) after the "
        "library's warm-up (400 steps with q(λ) held) and the same fit, with its Gaussian q(λ) and with the collapsed "
        "q*(λ) ∝ p(λ) exp(IWAE_100(λ)) of its fitted q(θ | λ) (`collapse_symmetry`, 201 points; the row's ELBO/N "
        "column holds the collapsed bound log Z / N), on seeds 0-5 (settings those of "
        "`research/uncertain_symmetry/tests/test_collapsed_symmetry.py`, fixed before it first ran on seeds 0-2; "
        "seeds 3-5 were first run here)."
    )
    md = _common.header_markdown(
        "q(λ) against the exact posterior: basis regression with a latent λ",
        _common.machine_info(),
        settings,
        _common.command_line(),
        intro,
    )
    md += "\n" + _common.md_table(["", "mean", "sd", "mean error / sd", "sd / exact sd", "IQR", "criterion"], table)
    noise = [r["one_stream_profile_noise"] for r in rows if "one_stream_profile_noise" in r]
    md += (
        f"\n\nThe collapsed q*(λ)'s profile: Monte-Carlo noise of one stream in its shape (`collapse_symmetry(..., "
        f"streams=2).profile_noise × √2`, seeds s and s + 1; a diagnostic added after the rows ran): "
        f"{', '.join(f'{v:.3f}' for v in noise)} nats on seeds {', '.join(map(str, collapse_seeds))}."
    )
    md += "\n\nPer seed:\n\n" + _common.md_table(
        ["guide", "seed", "q mean", "q sd", "error / sd", "sd ratio", "IQR", "ELBO/N", "fit s", "criterion"], per_seed
    )
    payload = {
        "settings": settings,
        "machine": _common.machine_info(),
        "exact": {"mean": exact.mean, "sd": exact.sd, "iqr": exact_iqr, "log_marginal": exact.log_marginal},
        "nuts": {"mean": float(nuts.mean()), "sd": float(nuts.std(ddof=1)), "draws": int(nuts.size)},
        "rows": rows,
    }
    _common.publish("symmetry_posterior_basis", md, payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
