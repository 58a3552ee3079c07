r"""Issue 15: a Laplace evidence of the invariant MLP's read-out against the AIS reference of log p(D | η).

Why. ``uncertain_symmetry_annealed.py`` found the fixed-η IWAE_100 bounds 70–180 nats below log p(D | η), with a
gap that grows with η: every q(η) fitted to such a bound, and every grid reference built from them, is pulled to
small η. AIS costs ≈ 40 s per η on a CPU core per 32 chains and leaves a few nats of noise. Given η, the read-out
is a Bayesian softmax regression on fixed features; its log posterior is concave, and the Laplace evidence with
the exact Hessian (:func:`~research.uncertain_symmetry.laplace_evidence.laplace_readout_evidence`; the evidence that
paper 004 maximises, Eqs. 9–11, without KFAC) is deterministic. How far it lies from log p(D | η), and — what
decides a posterior over η — whether that error changes with η, is measured here at every point of the AIS scan.

Method (every setting fixed and committed before any Laplace unit of this script ran; nothing of it was tried
on these data beforehand except three points of upright seed 0 — η = 0.5, 2.0, 3.0 — while the function was
written, which showed Laplace 8–12 nats below the AIS estimate of one half):

a. **Model and data.** Those of the AIS reference (``uncertain_symmetry_annealed.make_model``: 300 training digits
   of the fixed split, random features of ``init_seed = seed``, H = 256, hierarchical σ_p ~ LogNormal(0, 1), the
   16-point quadrature of the orbit), datasets upright, ±90° and fully rotated, seeds 0, 2, 1.
b. **Points.** Every η of the AIS scan of that dataset (``uncertain_symmetry_annealed.SCANS``, and its
   ``PARTIAL_EXTRA`` for ±90° digits). ``NUM_SCALES`` = 29 values of s = log σ_p evenly on [−2, 5]
   (``SCALE_SPAN``; spacing 0.25), trapezoidal rule against σ_p's prior; Newton to a decrement below 10⁻⁸.
   Run order: (dataset, seed) units upright 0, ±90° 0, rotated 0, then seeds 2 and 1 the same way; two
   processes take alternate points of every unit (``--part 0/2`` and ``1/2``), each with its own file.
   **Seed 1's units were not run**, for CPU time (stopped once seeds 0 and 2 were done; decided while upright seed 0
   ran, when only its run log had been seen and nothing had been rendered against AIS).
c. **Measures** (``--render``), per unit, at the η where both exist (the AIS estimate: both halves' 64 chains):
   the error ℓ_Laplace − ℓ_AIS (mean and range) beside the IWAE_100 bound's ℓ_IWAE − ℓ_AIS (range, the refined
   reference's points); the error's *shape*: its sd over η and its largest minus smallest value (a constant error
   moves no posterior over η); the grid posteriors (U(0, π) prior, truncated to the scan) from both — mode / mean /
   sd / 90 % interval — and the issue's overlap criterion of the Laplace posterior against the AIS one
   (``uncertain_symmetry.overlap``, 4000 quantiles of the Laplace posterior as its draws; both masses ≥ 0.5 to hold);
   each dataset's location criterion on the Laplace posterior; σ_p's posterior mode at the AIS top, both ways; seconds
   per point.

d. **Held-out NLL along η** (added while (b) ran, before any of its points was rendered against AIS; no setting of
   (a)–(c) changed). Does the larger η that log p(D | η) prefers predict as well? At every point of (b), the Laplace
   posterior predictive of the read-out
   (:func:`~research.uncertain_symmetry.laplace_evidence.laplace_readout_predictive`) at σ_p = that point's Laplace σ_p
   mode, ``HELDOUT_DRAWS`` = 256 draws (seeded by the data seed), on the 450 test images of the fixed split: mean NLL
   and accuracy. Reported per unit: the η of the lowest NLL, and the NLL at the AIS posterior's top, at the refined
   IWAE_100 reference's mode and at the type-II η of the 4000-step fits (each at the nearest scan point), less the
   lowest. Run after (b), the same two parts. Its first run was killed for memory (the predictive's triangular solve was
   batched over the draws, copying the (mC)² factor per draw); after the fix (one solve for all draws, the same random
   numbers) it was rerun from scratch, and only the rerun is reported. ±90° seed 2's points past 2.3 rad have no AIS
   estimate (dropped there, ``uncertain_symmetry_annealed.py`` (k)); the comparison uses the points that both have.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_laplace.md``, ``.json``; unit files (``--work-dir``),
one per (dataset, seed, part), written after every η (a stopped run resumes).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_annealed as usa  # noqa: E402
import uncertain_symmetry_fine_reference as usf  # noqa: E402

from pyro_invariance.data import load_dataset  # noqa: E402
from pyro_invariance.data.arrays import test_arrays, train_arrays  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.laplace_evidence import laplace_readout_evidence, laplace_readout_predictive  # noqa: E402

STEM = "uncertain_symmetry_laplace"
NUM_SCALES = 29
SCALE_SPAN = (-2.0, 5.0)
#: (dataset, seed) units in run order (b)
UNITS = tuple((d, s) for s in (0, 2, 1) for d in ("upright", "partially-rotated", "rotated"))
QUANTILE_DRAWS = 4000
HELDOUT_DRAWS = 256
AIS_WORK = Path(f"research/uncertain_symmetry/results/{usa.STEM}_units")


def points(dataset: str) -> tuple[float, ...]:
    """The AIS scan's η for ``dataset`` (b)."""
    return usa.SCANS[dataset] + (usa.PARTIAL_EXTRA if dataset == "partially-rotated" else ())


def evaluate_point(data: Any, seed: int, eta: float) -> dict[str, Any]:
    model = usa.make_model(data, seed, eta)
    x, y = train_arrays(data, model)
    start = time.perf_counter()
    r = laplace_readout_evidence(model, x, y, num_scales=NUM_SCALES, scale_span=SCALE_SPAN)
    return {
        "eta": eta,
        "log_evidence": r.log_evidence,
        "sigma_mode": r.sigma_mode,
        "newton_steps": r.newton_steps,
        "profile": r.scale_profile.tolist(),
        "seconds": time.perf_counter() - start,
    }


def unit_path(work: Path, dataset: str, seed: int, k: int) -> Path:
    return work / f"{dataset}_seed{seed}_part{k}.json"


def _load(dataset: str) -> Any:
    return load_dataset(
        us.DATASETS[dataset][0],
        train_size=us.SIZES["default"]["train_size"],
        test_size=us.SIZES["default"]["test_size"],
    )


def run_unit(dataset: str, seed: int, path: Path, k: int = 0, n: int = 1) -> dict[str, Any]:
    """Points k, k + n, … of the unit's η, resuming from ``path``; the file is replaced after each η."""
    data = _load(dataset)
    return common.fill_unit(
        path,
        {"dataset": dataset, "seed": seed},
        points(dataset)[k::n],
        lambda p: p["eta"],
        lambda eta: evaluate_point(data, seed, eta),
        lambda eta, p: (
            f"{path.stem} η {eta:.2f}: {p['log_evidence']:.2f} (σ_p mode {p['sigma_mode']:.1f}, "
            f"{p['newton_steps']} Newton steps, {p['seconds']:.0f} s)"
        ),
    )


def heldout_unit(dataset: str, seed: int, work: Path, k: int = 0, n: int = 1) -> dict[str, Any]:
    """(d) at the points of (b)'s part k, with σ_p from its unit file; resumes from its own file."""
    path = work / f"heldout_{dataset}_seed{seed}_part{k}.json"
    sigmas = {p["eta"]: p["sigma_mode"] for p in json.loads(unit_path(work, dataset, seed, k).read_text())["points"]}
    data = _load(dataset)

    def heldout(eta: float) -> dict[str, Any]:
        model = usa.make_model(data, seed, eta)
        (x, y), (xt, yt) = train_arrays(data, model), test_arrays(data, model)
        logp = laplace_readout_predictive(model, x, y, xt, sigma=sigmas[eta], draws=HELDOUT_DRAWS, seed=seed)
        return {
            "eta": eta,
            "nll": float(-logp.gather(1, yt.long().unsqueeze(1)).mean()),
            "accuracy": float((logp.argmax(1) == yt).double().mean()),
            "sigma": sigmas[eta],
        }

    return common.fill_unit(
        path,
        {"dataset": dataset, "seed": seed},
        [e for e in points(dataset)[k::n] if e in sigmas],
        lambda p: p["eta"],
        heldout,
        lambda eta, p: f"{path.stem} η {eta:.2f}: held-out NLL {p['nll']:.4f}",
    )


def heldout_summary(work: Path, r: dict[str, Any], results: Path) -> dict[str, Any] | None:
    """(d) for one rendered unit: the lowest NLL's η and the NLL at the AIS top, IWAE mode and type-II η, less it."""
    pts = [
        q
        for p in sorted(work.glob(f"heldout_{r['dataset']}_seed{r['seed']}_part*.json"))
        for q in json.loads(p.read_text())["points"]
    ]
    if len(pts) < 5:
        return None
    pts.sort(key=lambda q: q["eta"])
    etas, nll = np.array([q["eta"] for q in pts]), np.array([q["nll"] for q in pts])
    gap = usa.iwae_gap(results, r["dataset"], r["seed"], np.array(r["etas"]), np.array(r["ais"]))

    def at(eta: float) -> float | None:
        near = int(np.argmin(np.abs(etas - eta)))
        return float(nll[near] - nll.min()) if abs(etas[near] - eta) <= 0.1 else None  # None: outside the scan

    best = int(np.argmin(nll))
    return {
        "etas": etas.tolist(),
        "nll": nll.tolist(),
        "accuracy": [q["accuracy"] for q in pts],
        "best_eta": float(etas[best]),
        "best_nll": float(nll[best]),
        "best_accuracy": pts[best]["accuracy"],
        "at_ais_top": at(r["etas"][int(np.argmax(r["ais"]))]),
        "at_iwae_mode": at(gap["summary"]["mode"]),
        "at_type_ii": at(gap["type_ii_eta"]),
    }


def grid_draws(gp: Any, n: int = QUANTILE_DRAWS) -> np.ndarray:
    """``n`` evenly spaced quantiles of a grid posterior, standing in for its draws."""
    return np.array([gp.quantile((i + 0.5) / n) for i in range(n)])


def compare(unit: dict[str, Any], ais: dict[str, Any], results: Path) -> dict[str, Any]:
    """(c) for one (dataset, seed)."""
    lap = {p["eta"]: p for p in unit["points"]}
    keep = np.array([e in lap for e in ais["etas"]])
    etas = ais["etas"][keep]
    a = ais["combined"][keep]
    lp = np.array([lap[e]["log_evidence"] for e in etas])
    err = lp - a
    gp_a, gp_l = usa.posterior(etas, a), usa.posterior(etas, lp)
    ov = us.overlap(grid_draws(gp_l), gp_a)
    gap = usa.iwae_gap(results, unit["dataset"], unit["seed"], etas, a)
    top = int(np.argmax(a))
    s_a, s_l = us.grid_summary(gp_a), us.grid_summary(gp_l)
    return {
        "dataset": unit["dataset"],
        "seed": unit["seed"],
        "points": len(etas),
        "etas": etas.tolist(),
        "laplace": lp.tolist(),
        "ais": a.tolist(),
        "error_mean": float(err.mean()),
        "error_range": [float(err.min()), float(err.max())],
        "error_shape_sd": float(np.std(err - err.mean(), ddof=1)),
        "error_spread": float(err.max() - err.min()),
        "iwae_minus_ais": [-gap["gap_max"], -gap["gap_min"]],
        "ais_posterior": s_a,
        "laplace_posterior": s_l,
        "overlap": ov,
        "holds": bool(min(ov.values()) >= us.OVERLAP_MIN),
        "location": us.location_criterion(unit["dataset"], s_l),
        "location_ais": us.location_criterion(unit["dataset"], s_a),
        "sigma_mode_laplace": lap[float(etas[top])]["sigma_mode"],
        "sigma_mode_ais": ais["sigma_mode_at_top"],
        "seconds": float(np.mean([lap[e]["seconds"] for e in etas])),
    }


def ais_reference(dataset: str, seed: int, work: Path) -> dict[str, Any] | None:
    paths = [work / f"{usa.unit_name(dataset, seed, h)}.json" for h in usa.HALVES]
    if not all(p.exists() for p in paths):
        return None
    halves = [json.loads(p.read_text()) for p in paths]
    c = usa.combine(halves)
    top = float(c["etas"][int(np.argmax(c["combined"]))])
    modes = [p["sigma_mode"] for h in halves for p in h["points"] if p["eta"] == top]
    return {**c, "sigma_mode_at_top": float(np.mean(modes))}


def render(work: Path, ais_work: Path, results: Path, out_dir: Path | None) -> tuple[Path, Path] | None:
    rows = []
    for dataset, seed in sorted(UNITS, key=lambda u: (list(usa.SCANS).index(u[0]), u[1])):
        parts = sorted(work.glob(f"{dataset}_seed{seed}_part*.json"))
        ais = ais_reference(dataset, seed, ais_work)
        if not parts or ais is None:
            continue
        merged = {
            "dataset": dataset,
            "seed": seed,
            "points": [q for p in parts for q in json.loads(p.read_text())["points"]],
        }
        r = compare(merged, ais, results)
        if r["points"] >= 5:
            r["heldout"] = heldout_summary(work, r, results)
            rows.append(r)
    if not rows:
        return None

    def post(s: dict[str, float]) -> str:
        return f"{s['mode']:.2f} / {s['mean']:.2f} / {s['sd']:.2f} {usf.interval(s['q05'], s['q95'])}"

    table = [
        "| data | seed | points | ℓ_Laplace − ℓ_AIS: mean [range] | its shape: sd / spread | "
        "ℓ_IWAE_100 − ℓ_AIS [range] | "
        "AIS posterior: mode / mean / sd [90 %] | Laplace posterior | overlap (Laplace in AIS 90 %, "
        "AIS in Laplace 90 %) | "
        "location criterion: AIS / Laplace | σ_p mode at the top: AIS / Laplace | s per point |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|---:|:---|---:|---:|",
    ]
    for r in rows:
        table.append(
            f"| {r['dataset']} | {r['seed']} | {r['points']} | {r['error_mean']:+.1f} [{r['error_range'][0]:+.1f}, "
            f"{r['error_range'][1]:+.1f}] | "
            f"{r['error_shape_sd']:.2f} / {r['error_spread']:.1f} | [{r['iwae_minus_ais'][0]:+.0f}, "
            f"{r['iwae_minus_ais'][1]:+.0f}] | "
            f"{post(r['ais_posterior'])} | {post(r['laplace_posterior'])} | {r['overlap']['q_in_grid90']:.2f}, "
            f"{r['overlap']['grid_in_q90']:.2f} ({'holds' if r['holds'] else 'fails'}) | "
            f"{us.criterion_cell(r['location_ais'])} / {us.criterion_cell(r['location'])} | "
            f"{r['sigma_mode_ais']:.1f} / {r['sigma_mode_laplace']:.1f} | {r['seconds']:.0f} |"
        )

    def above(v: float | None) -> str:
        return "outside the scan" if v is None else f"{v:+.4f}"

    held = [
        "| data | seed | points | lowest held-out NLL: η / NLL / accuracy | NLL above the lowest at: the AIS top | "
        "the refined IWAE_100 mode | the type-II η |",
        "|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        h = r["heldout"]
        if h is not None:
            held.append(
                f"| {r['dataset']} | {r['seed']} | {len(h['etas'])} | {h['best_eta']:.2f} / {h['best_nll']:.4f} / "
                f"{h['best_accuracy']:.3f} | {above(h['at_ais_top'])} | {above(h['at_iwae_mode'])} | "
                f"{above(h['at_type_ii'])} |"
            )
    counts = {
        d: f"{sum(r['holds'] for r in rows if r['dataset'] == d)}/{sum(r['dataset'] == d for r in rows)}"
        for d in usa.SCANS
        if any(r["dataset"] == d for r in rows)
    }
    settings = {
        "NUM_SCALES": NUM_SCALES,
        "SCALE_SPAN": list(SCALE_SPAN),
        "UNITS": [list(u) for u in UNITS],
        "QUANTILE_DRAWS": QUANTILE_DRAWS,
        "HELDOUT_DRAWS": HELDOUT_DRAWS,
        "AIS": {
            "CHAINS": usa.CHAINS,
            "HALVES": list(usa.HALVES),
            "TEMPERATURES": usa.TEMPERATURES,
            "SAMPLING": usa.SAMPLING,
        },
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: the Laplace evidence of the invariant MLP's read-out against the AIS reference of log p(D | η), "
        "at every "
        "point of the AIS scan. Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_laplace.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown(
                "Uncertain symmetry: a Laplace evidence against the AIS reference", info, settings, command, intro
            ),
            f"![ℓ_Laplace and ℓ_AIS]({STEM}.png)\n",
            *table,
            "\nThe overlap criterion of the Laplace posterior against the AIS one: "
            + ", ".join(f"{d} {c}" for d, c in counts.items())
            + ".\n",
            "## Held-out NLL along η (d)\n",
            *(held if len(held) > 2 else ["not run"]),
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    payload = {"info": info, "settings": settings, "command": command, "units": rows, "counts": counts}
    paths = common.write_results(STEM, md, payload, out_dir)
    plot(rows, paths[0].with_suffix(".png"))
    return paths


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """ℓ(η) − its top for AIS and Laplace, one panel per (dataset, seed)."""
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.0 * len(rows), 3.0))
    axes = fig.subplots(1, len(rows), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], rows):
        etas, a, lp = (np.array(r[k]) for k in ("etas", "ais", "laplace"))
        ax.plot(etas, a - a.max(), "o-", ms=2.5, lw=1.2, color="C3", label="AIS, 64 chains")
        ax.plot(etas, lp - lp.max(), "s--", ms=2.5, lw=1.0, color="C0", label="Laplace")
        ax.set(xlim=(0, us.ETA_MAX), ylim=(-60, 5), xlabel="η (rad)", title=f"{r['dataset']}, seed {r['seed']}")
    usa.finish_profiles(fig, axes, path)


def main(argv: list[str] | None = None) -> int:
    parser, group = common.unit_script_parser(__doc__, STEM)
    group.add_argument("--run", action="store_true", help="(b): the units of --part, every point not yet in --work-dir")
    group.add_argument(
        "--heldout", action="store_true", help="(d): held-out NLL at the points of --part that (b) finished"
    )
    group.add_argument("--render", action="store_true", help="no runs: the tables from the unit files (c, d)")
    parser.add_argument(
        "--part", default="0/1", help="k/n: run points k, k + n, … of every unit (two processes: 0/2 and 1/2)"
    )
    parser.add_argument("--results", type=Path, default=common.RESULTS_DIR, help="where the earlier runs' results are")
    parser.add_argument("--ais-work-dir", type=Path, default=AIS_WORK)
    args = common.parse_script_args(parser, argv)
    if args.render:
        return 0 if render(args.work_dir, args.ais_work_dir, args.results, args.out_dir) else 1
    k, n = common.parse_part(parser, args.part)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    for dataset, seed in UNITS:
        if args.heldout:
            if unit_path(args.work_dir, dataset, seed, k).exists():
                heldout_unit(dataset, seed, args.work_dir, k, n)
        else:
            run_unit(dataset, seed, unit_path(args.work_dir, dataset, seed, k), k, n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
