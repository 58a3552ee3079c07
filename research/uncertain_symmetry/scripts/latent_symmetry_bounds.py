"""Bounds with η latent vs η point-estimated, per guide, against the exact evidence.

On basis regression (the catalogue entry with an exact evidence) :func:`pyro_invariance.compare_guides`
fits each guide twice — λ point-estimated (type-II, ``symmetry_prior=None``) and λ latent with a
uniform prior on [0, 2] (``symmetry_prior="uniform"``) — and reports ELBO/N, IWAE_K/N and the exact
log evidence per datum: log p(D | λ̂) at the learned λ̂ for the point estimate, log p(D) =
log ∫ p(D | λ) p(λ) dλ (quadrature) for the latent λ. The gap exact − ELBO says how tight each
guide's bound is; the two exact columns differ by the Occam factor of integrating over λ.

Guides: ``mean-field`` (q(θ)q(λ)), ``full-rank`` (joint Gaussian over (θ, logit λ/2)) and
``symmetry-conditional`` (q(λ) q(θ | λ), linear-Gaussian; ``AutoStructured``).

Settings (fixed before any run, from ``benchmarks/guide_comparison.py``'s basis-regression entry):
the talk's even toy (n = 100 train / 200 test, noise 0.3), 20 RBF features of lengthscale 0.5,
prior scale 1, noise scale 0.3, point-estimate λ starting at 0.3; 2000 full-batch steps, Adam lr 0.05
(factor_lr 0.05), 4 particles (the model's ``fit_defaults``), guide ``init_scale`` 0.1; bounds from
1000 guide draws, K = 10, 100; seeds 0, 1, 2.

    .venv/bin/python research/uncertain_symmetry/scripts/latent_symmetry_bounds.py [--quick]

Writes ``research/uncertain_symmetry/results/latent_symmetry_bounds[_quick].md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.models.basis_regression import make_symmetric_toy  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402

GUIDES = ["mean-field", "full-rank", "symmetry-conditional"]
PRIORS: tuple[str | None, ...] = (None, "uniform")
MODEL = dict(
    in_features=1,
    out_features=1,
    basis="rbf",
    num_features=20,
    lengthscale=0.5,
    prior_scale=1.0,
    noise_scale=0.3,
    eta_init=0.3,
)
SIZES = {
    "default": dict(steps=2000, bound_samples=1000, K=(10, 100), seeds=(0, 1, 2)),
    "quick": dict(steps=100, bound_samples=100, K=(10,), seeds=(0,)),
}


def data() -> Any:
    from types import SimpleNamespace

    x, y = make_symmetric_toy(100, seed=0, noise=0.3, even=True)
    x_test, y_test = make_symmetric_toy(200, seed=1, noise=0.3, even=True)
    return SimpleNamespace(x_train=x, y_train=y, x_test=x_test, y_test=y_test, name="symmetric-toy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke-test size")
    args = parser.parse_args(argv)
    common.set_threads(1)
    size = SIZES["quick" if args.quick else "default"]
    dataset = data()
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for seed in size["seeds"]:
        table = pi.compare_guides(
            "basis-regression",
            dataset,
            GUIDES,
            steps=size["steps"],
            batch_size=None,
            lr=0.05,
            factor_lr=0.05,
            num_particles=4,
            seed=seed,
            K=size["K"],
            bound_samples=size["bound_samples"],
            bound_vectorize=True,
            model_kwargs=MODEL,
            guide_kwargs={g: {"init_scale": 0.1} for g in GUIDES},
            symmetry_priors=PRIORS,
            log=common.log,
        )
        for r in table.rows:
            rows.append(
                {
                    "seed": seed,
                    **{k: r[k] for k in ("guide", "symmetry_prior", "elbo", "log_evidence", "eta_readable", "metrics")},
                    **{f"iwae{k}": r[f"iwae{k}"] for k in size["K"]},
                }
            )
    seconds = time.perf_counter() - t0

    def agg(values: list[float]) -> str:
        if len(values) == 1:
            return f"{values[0]:.4f}"
        return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"

    kmax = max(size["K"])
    header = ["guide", "λ", "ELBO/N", f"IWAE{kmax}/N", "exact log Z/N", "exact − ELBO (per datum)", "test NLL"]
    body = []
    for prior in PRIORS:
        for guide in GUIDES:
            rs = [r for r in rows if r["guide"].startswith(guide + " /") and r["symmetry_prior"] == prior]
            body.append(
                [
                    guide,
                    "point (type-II)" if prior is None else f"latent, {prior} prior",
                    agg([r["elbo"] for r in rs]),
                    agg([r[f"iwae{kmax}"] for r in rs]),
                    agg([r["log_evidence"] for r in rs]),
                    agg([r["log_evidence"] - r["elbo"] for r in rs]),
                    agg([r["metrics"]["nll"] for r in rs]),
                ]
            )
    settings = {
        "model": "basis-regression",
        "model_kwargs": MODEL,
        "data": "make_symmetric_toy(100, seed=0, noise=0.3, even=True); test: 200 points, seed 1",
        "guides": GUIDES,
        "symmetry_priors": list(PRIORS),
        **{k: list(v) if isinstance(v, tuple) else v for k, v in size.items()},
        "lr": 0.05,
        "factor_lr": 0.05,
        "num_particles": 4,
        "init_scale": 0.1,
        "seconds": round(seconds, 1),
    }
    md = common.header_markdown(
        "Bounds with η latent vs point-estimated (basis regression, exact evidence)",
        common.machine_info(),
        settings,
        common.command_line(),
        intro=__doc__.split("\n\n")[1],
    )
    md += "\n" + common.md_table(header, body) + "\n\n"
    md += (
        "Mean ± sd over seeds. A point row's exact log Z is log p(D | λ̂) at its learned λ̂; a latent row's is "
        "log p(D) = log ∫ p(D | λ) p(λ) dλ (quadrature), lower by the Occam factor of the prior over λ: the two "
        "columns answer different questions. exact − ELBO is the bound's looseness per datum.\n"
    )
    stem = "latent_symmetry_bounds" + ("_quick" if args.quick else "")
    common.write_results(stem, md, {"settings": settings, "rows": rows})
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
