"""Do the guides reach a posterior they can represent? The gap to the exact log evidence on a linear-Gaussian model.

A bias-free Bayesian linear regression written the way Pyro's tutorials write models (a ``PyroModule``
with a ``PyroSample`` prior), whose posterior over its one ``1×5`` weight matrix is Gaussian: the
full-rank, block-Cholesky and matrix-normal guides can all represent it exactly (one row, so the
block-Cholesky guide's one 5×5 block and the matrix-normal guide's 5×5 column factor are full
covariances), so their gap ``log Z − ELBO`` = KL(q ‖ posterior) can reach 0. Mean-field's best gap
is the KL of the best diagonal Gaussian, ``½ (Σ log A_ii − log |A|)`` for posterior precision ``A``;
the low-rank guides (rank 2 = round(√5)) cannot represent every 5×5 covariance either.

Fixed settings:

- data: N = 100 rows, ``x_n = z_n + 0.3 z_n1`` with ``z_n ~ N(0, I_5)`` (correlated inputs, so the
  posterior is correlated), true weight ``w ~ N(0, I_5)``, ``y_n = x_nᵀ w + ε_n``, ``ε_n ~ N(0, 1)``,
  all from ``torch.Generator().manual_seed(0)`` (one data set for every seed);
- model: ``W ~ N(0, 1)`` of shape ``(1, 5)`` (``to_event(2)``), ``y_n ~ N(x_nᵀ W₀, 1)`` in
  ``pyro.plate("data")``; log Z = ``log N(y; 0, XXᵀ + I)`` exactly (float64);
- guides: the catalogue's mean-field, full-rank, low-rank, block-Cholesky and matrix-normal
  (``pi.guides.get``, their defaults: ``init_scale`` 0.1), and Pyro's own ``AutoMultivariateNormal``
  and ``AutoLowRankMultivariateNormal`` with Pyro's defaults;
- seeds 0, 1, 2 (the fit's seed; the data stay the same); steps 1000, 4000, 16000;
- **part 1, ``pi.fit``'s defaults** (each step count its own run, the cosine schedule spanning it):
  Adam at lr 0.05 for means and scales, ``factor_lr`` for unit-triangular and low-rank factors as each
  guide resolves it (the library's 1e-3; full-rank's ``fit_defaults`` 0.05; Pyro's guides are not
  catalogue guides and get 1e-3), ``TraceMeanField_ELBO`` (analytic KL where registered), 1 particle,
  batch 128 ≥ N (full batch). Diagnostic rows change one setting each (``factor_lr`` 0.05, or the old
  default ``init_scale`` 1.0) at 1000 and 4000 steps;
- **part 2, a plain Pyro SVI loop** (as the Pyro tutorials train): ``pyro.infer.SVI`` with
  ``pyro.optim.Adam({"lr": 0.01})`` (one constant rate for every parameter), ``Trace_ELBO`` with 1
  particle, the param store cleared before each run; the gap after 1000, 4000 and 16000 steps of one
  16000-step run per guide and seed;
- the final ELBO: 20 000 draws from the guide, ``mean(log p(y, W) − log q(W))`` (vectorised;
  ``pyro_invariance.infer.bounds.log_weights``), with its standard error; the draws are seeded apart
  from the training stream.

The criterion: full-rank, block-Cholesky and matrix-normal within 0.05 nats of log Z under
``pi.fit``'s defaults with 4000 steps (mean over the seeds).

    .venv/bin/python benchmarks/guide_convergence.py      # ≈ 40 min on one thread; resumable

Finished cells are kept in ``results/grids/guide_convergence/cells.json`` (git-ignored), so a stopped
run resumes; ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal  # noqa: E402
from pyro.nn import PyroModule, PyroSample  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.infer.bounds import log_weights  # noqa: E402
from pyro_invariance.infer.config import FitConfig  # noqa: E402

STEM = "guide_convergence"
N, D, SHARED, NOISE, PRIOR_SCALE, DATA_SEED = 100, 5, 0.3, 1.0, 1.0, 0
SEEDS, STEPS = (0, 1, 2), (1000, 4000, 16000)
SVI_LR, ELBO_DRAWS, CRITERION, CRITERION_STEPS = 0.01, 20_000, 0.05, 4000
UNIT = common.REPO_ROOT / "results" / "grids" / STEM / "cells.json"
TARGETS = ("full-rank", "block-cholesky", "matrix-normal")


class BayesLinear(PyroModule):
    """Bias-free Bayesian linear regression, ``W ~ N(0, s²)`` of shape ``(1, D)``, known noise."""

    def __init__(self, dim: int = D, prior_scale: float = PRIOR_SCALE, noise: float = NOISE) -> None:
        super().__init__()
        self.noise = noise
        self.weight = PyroSample(dist.Normal(0.0, prior_scale).expand([1, dim]).to_event(2))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, num_data: int | None = None) -> torch.Tensor:
        mean = (x * self.weight[..., 0, :]).sum(-1)  # broadcasts over a batch of weight draws (vectorised ELBO)
        with pyro.plate("data", num_data or x.shape[0], subsample_size=x.shape[0]):
            return pyro.sample("obs", dist.Normal(mean, self.noise), obs=y)


def make_data(noise: float = NOISE) -> tuple[torch.Tensor, torch.Tensor]:
    """The data set (module docstring); ``noise`` other than ``NOISE`` only in the diagnostic rows."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    z = torch.randn(N, D, generator=gen)
    x = z + SHARED * z[:, :1]
    w = PRIOR_SCALE * torch.randn(D, generator=gen)
    return x, x @ w + noise * torch.randn(N, generator=gen)


def log_evidence(x: torch.Tensor, y: torch.Tensor, noise: float = NOISE) -> float:
    """Exact ``log p(y | x) = log N(y; 0, s² XXᵀ + σ² I)`` (float64)."""
    x64, y64 = x.double(), y.double()
    cov = PRIOR_SCALE**2 * x64 @ x64.T + noise**2 * torch.eye(len(y64), dtype=torch.float64)
    return float(dist.MultivariateNormal(torch.zeros_like(y64), covariance_matrix=cov).log_prob(y64))


def mean_field_optimum(x: torch.Tensor) -> float:
    """The smallest gap a diagonal Gaussian can reach, ``½ (Σ log A_ii − log |A|)`` (``A``: posterior precision)."""
    x64 = x.double()
    precision = x64.T @ x64 / NOISE**2 + torch.eye(D, dtype=torch.float64) / PRIOR_SCALE**2
    return float(0.5 * (precision.diagonal().log().sum() - torch.logdet(precision)))


GUIDES: dict[str, Callable[[Any], Any]] = {
    "mean-field": lambda m: pi.guides.get("mean-field", m),
    "full-rank": lambda m: pi.guides.get("full-rank", m),
    "low-rank": lambda m: pi.guides.get("low-rank", m),
    "block-cholesky": lambda m: pi.guides.get("block-cholesky", m),
    "matrix-normal": lambda m: pi.guides.get("matrix-normal", m),
    "Pyro AutoMultivariateNormal": AutoMultivariateNormal,
    "Pyro AutoLowRankMultivariateNormal": AutoLowRankMultivariateNormal,
}
#: (label, guide, guide kwargs, fit overrides, data noise): one setting changed each, or a narrower
#: posterior (noise 0.3: posterior sd ≈ 0.03 instead of ≈ 0.1, three times narrower than the guides' start)
DIAGNOSTICS: list[tuple[str, str, dict[str, Any], dict[str, Any], float]] = [
    ("block-cholesky, factor_lr 0.05", "block-cholesky", {}, {"factor_lr": 0.05}, NOISE),
    ("matrix-normal, factor_lr 0.05", "matrix-normal", {}, {"factor_lr": 0.05}, NOISE),
    ("full-rank, init_scale 1.0 (the old default)", "full-rank", {"init_scale": 1.0}, {}, NOISE),
    ("block-cholesky, init_scale 1.0 (the old default)", "block-cholesky", {"init_scale": 1.0}, {}, NOISE),
    ("matrix-normal, init_scale 1.0 (the old default)", "matrix-normal", {"init_scale": 1.0}, {}, NOISE),
    ("full-rank, noise 0.3", "full-rank", {}, {}, 0.3),
    ("block-cholesky, noise 0.3", "block-cholesky", {}, {}, 0.3),
    ("matrix-normal, noise 0.3", "matrix-normal", {}, {}, 0.3),
    ("block-cholesky, noise 0.3, factor_lr 0.05", "block-cholesky", {}, {"factor_lr": 0.05}, 0.3),
    ("matrix-normal, noise 0.3, factor_lr 0.05", "matrix-normal", {}, {"factor_lr": 0.05}, 0.3),
]
DIAGNOSTIC_STEPS = (1000, 4000)
PYRO_TWIN = {"full-rank": "AutoMultivariateNormal", "low-rank": "AutoLowRankMultivariateNormal"}


def gap(model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor, seed: int) -> tuple[float, float]:
    """``(log Z − ELBO, its standard error)`` from ``ELBO_DRAWS`` guide draws, seeded apart from training."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10_000 + seed)
        lw, _ = log_weights(model, guide, x, y, ELBO_DRAWS, vectorize=True, particle_chunk=5000)
    return log_evidence(x, y, model.noise) - float(lw.mean()), float(lw.std() / math.sqrt(lw.numel()))


def fit_cell(key: tuple) -> dict[str, Any]:
    """Part 1 (and diagnostics): one ``pi.fit`` run of ``steps`` steps; key ``("fit", label, seed, steps)``."""
    _, label, seed, steps = key
    name, guide_kwargs, overrides, noise = {d[0]: d[1:] for d in DIAGNOSTICS}.get(label, (label, {}, {}, NOISE))
    x, y = make_data(noise)
    model = BayesLinear(noise=noise)
    guide = GUIDES[label](model) if label in GUIDES else pi.guides.get(name, model, **guide_kwargs)
    t0 = time.perf_counter()
    result = pi.fit(model, guide, (x, y), steps=steps, seed=seed, progress=False, **overrides)
    seconds = time.perf_counter() - t0
    value, se = gap(model, result.guide, x, y, seed)
    return {
        "key": list(key),
        "gap": value,
        "se": se,
        "ms_per_step": 1000 * seconds / steps,
        "factor_lr": result.config.factor_lr,
        "lr": result.config.lr,
        "elbo": result.config.elbo,
    }


def svi_cell(key: tuple) -> dict[str, Any]:
    """Part 2: one plain-SVI run of ``max(STEPS)`` steps, the gap at each of ``STEPS``; key ``("svi", label, seed)``."""
    _, label, seed = key
    x, y = make_data()
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model = BayesLinear()
    guide = GUIDES[label](model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": SVI_LR}), Trace_ELBO())
    gaps, ses, t0, seconds = {}, {}, time.perf_counter(), 0.0
    for step in range(1, max(STEPS) + 1):
        svi.step(x, y, num_data=N)
        if step in STEPS:
            seconds += time.perf_counter() - t0
            gaps[step], ses[step] = gap(model, guide, x, y, seed)
            t0 = time.perf_counter()
    pyro.clear_param_store()
    return {"key": list(key), "gaps": gaps, "ses": ses, "ms_per_step": 1000 * seconds / max(STEPS)}


def all_keys() -> list[tuple]:
    keys: list[tuple] = [("fit", label, seed, steps) for label in GUIDES for steps in STEPS for seed in SEEDS]
    keys += [("fit", d[0], seed, steps) for d in DIAGNOSTICS for steps in DIAGNOSTIC_STEPS for seed in SEEDS]
    keys += [("svi", label, seed) for label in GUIDES for seed in SEEDS]
    return keys


def run_cell(key: tuple) -> dict[str, Any]:
    return fit_cell(key) if key[0] == "fit" else svi_cell(key)


def describe(key: tuple, point: dict[str, Any]) -> str:
    if key[0] == "fit":
        return f"fit  {key[1]}, seed {key[2]}, {key[3]} steps: gap {point['gap']:.4f} ± {point['se']:.4f}"
    gaps = ", ".join(f"{s}: {g:.4f}" for s, g in point["gaps"].items())
    return f"svi  {key[1]}, seed {key[2]}: gaps {gaps}"


# ---------------------------------------------------------------------------------------------------
# the tables


def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def _cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean, sd = _stats(values)
    return f"{mean:.3f} ± {sd:.3f}"


def collect(points: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"fit": {label: {steps: [gaps by seed]}}, "svi": {...}, "se_max": ..., "ms": {...}, "factor_lr": {...}}``."""
    out: dict[str, Any] = {"fit": {}, "svi": {}, "ms": {}, "factor_lr": {}, "se_max": 0.0}
    for p in points:
        key = p["key"]
        if key[0] == "fit":
            out["fit"].setdefault(key[1], {}).setdefault(int(key[3]), []).append(p["gap"])
            out["se_max"] = max(out["se_max"], p["se"])
            out["ms"].setdefault(("fit", key[1]), []).append(p["ms_per_step"])
            out["factor_lr"][key[1]] = p["factor_lr"]
        else:
            for steps, g in p["gaps"].items():
                out["svi"].setdefault(key[1], {}).setdefault(int(steps), []).append(g)
            out["se_max"] = max(out["se_max"], *p["ses"].values())
            out["ms"].setdefault(("svi", key[1]), []).append(p["ms_per_step"])
    return out


def _table(
    by_label: dict[str, dict[int, list[float]]],
    labels: list[str],
    extra: Callable[[str], list[str]],
    extra_header: list[str],
) -> str:
    rows = [[label, *(_cell(by_label.get(label, {}).get(s, [])) for s in STEPS), *extra(label)] for label in labels]
    return common.md_table(["guide", *(f"{s} steps" for s in STEPS), *extra_header], rows)


def verdict(res: dict[str, Any], mf_best: float) -> str:
    """The "Verdict" section: the criterion per target guide, and why where it is not met."""
    fit, lines, met = res["fit"], [], []
    for name in TARGETS:
        at = {s: _stats(fit[name][s])[0] for s in STEPS}
        worst = max(fit[name][CRITERION_STEPS])
        met.append(at[CRITERION_STEPS] <= CRITERION)
        status = "**met**" if met[-1] else "**not met**"
        lines.append(
            f"- **{name}**: {status} — {at[CRITERION_STEPS]:.3f} nats after {CRITERION_STEPS} steps (worst seed "
            f"{worst:.3f}); {at[STEPS[0]]:.3f} after {STEPS[0]}, {at[STEPS[-1]]:.3f} after {STEPS[-1]}."
        )
    lines += [
        "",
        ("All three guides" if all(met) else "Not all of the three guides")
        + f" reach within {CRITERION} nats of log Z under `pi.fit`'s defaults with {CRITERION_STEPS} steps "
        f"(mean-field's best possible gap here is {mf_best:.3f}).",
        "",
        *why(res),
    ]
    return common.verdict_section(common.verdict_of(met), f"means over {len(SEEDS)} of 3 seeds", lines)


def why(res: dict[str, Any]) -> list[str]:
    """What the diagnostic rows say about the causes (the numbers of this run decide the wording)."""
    fit, out, first, at = res["fit"], [], STEPS[0], CRITERION_STEPS

    def mean(label: str, steps: int) -> float:
        return _stats(fit[label][steps])[0]

    def both(label: str) -> str:
        return f"{mean(label, first):.3f} / {mean(label, at):.3f}"

    out.append(
        f"Initialisation: after {first} / {at} steps from the old default `init_scale` 1.0: "
        + ", ".join(f"{n} {both(f'{n}, init_scale 1.0 (the old default)')}" for n in TARGETS)
        + "; from 0.1 (Pyro's start, now every catalogue guide's default): "
        + ", ".join(f"{n} {both(n)}" for n in TARGETS)
        + "."
    )
    for name in ("block-cholesky", "matrix-normal"):
        base, fast, full = mean(name, first), mean(f"{name}, factor_lr 0.05", first), mean("full-rank", first)
        if base <= CRITERION:
            continue
        verdict_rate = (
            "so the factor's rate, not the parameterisation, is what holds it back"
            if fast <= max(CRITERION, 1.5 * full)
            else "so it stays behind full-rank even at full-rank's rate"
        )
        default = " (`fit`'s default step count)" if first == FitConfig().steps else ""
        out += [
            "",
            f"After {first} steps{default} {name} is {base:.3f} nats short (full-rank {full:.3f}): its "
            f"unit-triangular factor trains at the library's `factor_lr` {res['factor_lr'][name]:g}, which the "
            f"library chose for the digits demo's 256-wide blocks (0.05 inflated that guide's variance), while "
            f"full-rank recommends 0.05 for itself. With `factor_lr` 0.05 it is {fast:.3f} nats short after "
            f"{first} steps, {verdict_rate}.",
        ]
    narrow = {n: mean(f"{n}, noise 0.3", at) for n in TARGETS}
    fast = {n: mean(f"{n}, noise 0.3, factor_lr 0.05", at) for n in ("block-cholesky", "matrix-normal")}
    out += [
        "",
        f"A three times narrower posterior (noise 0.3, posterior sd ≈ 0.03), after {at} steps: "
        + ", ".join(f"{n} {g:.3f}" for n, g in narrow.items())
        + "; with `factor_lr` 0.05: "
        + ", ".join(f"{n} {g:.3f}" for n, g in fast.items())
        + "."
        + (
            " So the criterion holds on the benchmark's data set, not on every one: where the posterior is narrower "
            "than the guides' start, the structured guides' factor rate decides again."
            if max(narrow.values()) > CRITERION and all(mean(n, at) <= CRITERION for n in TARGETS)
            else ""
        ),
    ]
    svi, last = res["svi"], STEPS[-1]
    if svi:
        out += [
            "",
            f"Plain SVI (one constant Adam rate {SVI_LR} for every parameter, `Trace_ELBO`), after {last} steps: "
            + ", ".join(f"{n} {_cell(svi[n][last])}" for n in GUIDES if n in svi)
            + ".",
        ]
        if _stats(svi["full-rank"][last])[0] > CRITERION:
            out[-1] += (
                f" A constant rate leaves every guide, Pyro's included, at a floor set by the noise of its steps "
                f"(full-rank {_stats(svi['full-rank'][last])[0]:.3f} against {_stats(fit['full-rank'][last])[0]:.3f} "
                "under `pi.fit`'s decaying schedule); the criterion is stated for `pi.fit`'s defaults."
            )
        same = [n for n in ("full-rank", "low-rank") if svi[n] == svi.get(f"Pyro {PYRO_TWIN[n]}")]
        if same:
            out[-1] += (
                f" The catalogue's {' and '.join(same)} guides are Pyro's autoguides with Pyro's start and give "
                "the same numbers as Pyro's own in this loop; under `pi.fit` full-rank differs from Pyro's "
                "AutoMultivariateNormal only by the factor rate it recommends (0.05)."
            )
    return out


def render(points: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    x, y = make_data()
    res, mf_best = collect(points), mean_field_optimum(x)
    ms = {k: statistics.mean(v) for k, v in res["ms"].items()}
    settings = {
        "data": f"N={N}, x = z + {SHARED} z[:, :1], z ~ N(0, I_{D}), w ~ N(0, I), noise {NOISE}, seed {DATA_SEED}",
        "model": f"BayesLinear: W ~ N(0, {PRIOR_SCALE}²) (1, {D}), y ~ N(x W₀, {NOISE}²)",
        "log Z": f"{log_evidence(x, y):.4f}",
        "mean-field's best gap": f"{mf_best:.4f}",
        "seeds": list(SEEDS),
        "steps": list(STEPS),
        "part 1": "pi.fit defaults (lr 0.05, factor_lr as resolved, "
        "TraceMeanField_ELBO, 1 particle, cosine, full batch)",
        "part 2": f"plain SVI, Adam {SVI_LR}, Trace_ELBO, 1 particle",
        "ELBO estimate": f"{ELBO_DRAWS} draws, largest standard error {res['se_max']:.4f} nats",
        "ms/step": "wall time of the training steps on this shared machine (load varies)",
        "criterion": f"≤ {CRITERION} nats after {CRITERION_STEPS} steps of pi.fit (mean over seeds)",
    }
    intro = __doc__.split("\n\n")[0]
    labels = list(GUIDES)

    def rate(label: str) -> str:
        return f"{res['factor_lr'].get(label, float('nan')):g}"

    part1 = _table(res["fit"], labels, lambda g: [rate(g), f"{ms.get(('fit', g), 0):.1f}"], ["factor_lr", "ms/step"])
    diag = _table(res["fit"], [d[0] for d in DIAGNOSTICS], lambda g: [rate(g)], ["factor_lr"])
    part2 = _table(res["svi"], labels, lambda g: [f"{ms.get(('svi', g), 0):.1f}"], ["ms/step"])
    title = "Guide convergence on an exactly representable posterior: gap to log Z"
    markdown = common.header_markdown(title, common.machine_info(), settings, common.command_line(), intro)
    markdown += "\n".join(
        [
            "",
            "Gap `log Z − ELBO` in nats (all N points), mean ± sd over the seeds. Full-rank, block-Cholesky and "
            "matrix-normal can reach 0; mean-field cannot go below " + f"{mf_best:.3f}.",
            "",
            "## Part 1: `pi.fit`'s defaults",
            "",
            part1,
            "",
            "Diagnostics (one setting changed each, or the narrower posterior of noise 0.3; "
            f"{STEPS[-1]} steps not run):",
            "",
            diag,
            "",
            "## Part 2: a plain Pyro SVI loop (Adam 0.01, `Trace_ELBO`)",
            "",
            part2,
            "",
            verdict(res, mf_best),
            "",
        ]
    )
    record = {
        "settings": settings,
        "fit": res["fit"],
        "svi": res["svi"],
        "factor_lr": res["factor_lr"],
        "mean_field_optimum": mf_best,
        "log_evidence": log_evidence(x, y),
        "points": points,
    }
    return markdown, record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="forget the finished cells and start over")
    args = parser.parse_args(argv)
    common.set_threads(1)
    UNIT.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh and UNIT.exists():
        UNIT.unlink()
    unit = common.fill_unit(UNIT, {"stem": STEM}, all_keys(), lambda p: tuple(p["key"]), run_cell, describe)
    markdown, record = render(unit["points"])
    common.publish(STEM, markdown, record)


if __name__ == "__main__":
    main()
