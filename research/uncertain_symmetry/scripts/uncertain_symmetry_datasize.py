r"""Issue 15: does the evidence's η move toward the issue's targets as the training set grows?

Why. Against the AIS reference of log p(D | η) (``uncertain_symmetry_annealed.py``) and the Laplace evidence that
tracks it (``uncertain_symmetry_laplace.py``), the issue's upright criterion (η below 1.0) and ±90° criterion (mode
within 0.5 rad of π/2) fail for the evidence itself on 300 training digits: upright digits put the evidence's top at
1.4–2.3 rad, ±90° digits at 2.3–2.9 rad. A symmetry is a constraint, and the marginal likelihood trades fit against
Occam's factor: a too-wide invariance costs fit on every datum, so that cost grows about ∝ N, while the Occam factor
of the more flexible (less invariant) read-out grows about ∝ log N. If the criteria fail because 300 digits are few,
the evidence's η must move down as N grows; if it does not, the preference for wide invariance is a property of this
model (random first-layer features, 8×8 images rotated with interpolation) and not of the data's size. The held-out
NLL along η says, at each N, which η predicts best, independently of the evidence.

Method (every setting fixed and committed before any unit of this script ran; nothing of it was run on these data
beforehand except one timing point, upright seed 0, N = 1200, η = 1.0, whose value was not compared with anything):

a. **Model and data.** The reference model of the AIS and Laplace benchmarks
   (``uncertain_symmetry_annealed.make_model``: random features of ``init_seed = seed``, H = 256, hierarchical σ_p ~
   LogNormal(0, 1), the 16-point quadrature of the orbit), on the first ``N`` ∈ ``SIZES`` = 300, 600, 1200 digits of the
   fixed 1347-digit training split (N = 300 is the earlier benchmarks' set) and the same 450 test digits; datasets
   upright and ±90° (``DATASETS``; the fully rotated criterion already holds at N = 300 and is not run here); seeds 0,
   2, 1 in that order.
b. **Points.** ``ETAS``: η = 0.1, 0.35, …, 2.85 (spacing 0.25) and π, 13 points. At each, the Laplace evidence
   (:func:`~research.uncertain_symmetry.laplace_evidence.laplace_readout_evidence`, ``NUM_SCALES`` = 29 scales on
   ``SCALE_SPAN`` = [−2, 5], as in ``uncertain_symmetry_laplace.py``), then the held-out NLL and accuracy of the Laplace
   posterior predictive (:func:`~research.uncertain_symmetry.laplace_evidence.laplace_readout_predictive`) at that
   point's σ_p mode, ``HELDOUT_DRAWS`` = 256 draws seeded by the data seed. Run order: for each seed, for each dataset,
   N = 300, 600, 1200; two processes take alternate points of every unit (``--part 0/2`` and ``1/2``). Seed 1 runs
   last and may be cut for CPU time (declared here if so).
c. **Measures** (``--render``), per (dataset, N, seed): the grid posterior from the Laplace evidence (U(0, π) prior on
   the 13 points, ``uncertain_symmetry_annealed.posterior``) — mode / mean / sd / 90 % interval — and the issue's
   location criterion on it; the gain ℓ(top) − ℓ(0.1) in nats and per datum; the η of the lowest held-out NLL and the
   NLL at the evidence's top less the lowest. Per (dataset, N), over the seeds run: mean ± sd of the posterior mean and
   the count of seeds on which the criterion holds. **Reading fixed in advance:** the evidence's η "moves down with
   N" on a seed when its posterior mean at N = 1200 is below the one at N = 300 by more than the larger of the two
   posterior sds; the table states, per dataset, on how many seeds it does.
   Check: at N = 300 the points that the AIS scan shares with ``ETAS`` must equal the Laplace benchmark's values (the
   same deterministic function on the same data); the largest difference is printed.

e. **Full Bayes against type-II on held-out digits** (added while (b) ran, before any unit was rendered; no setting of
   (a)–(c) changed). Per complete unit of (b), with the same model built with η latent (``symmetry_prior="uniform"``,
   the prior of (c)'s grid posterior): the Laplace grid posterior from (b)'s stored evidences and σ_p modes
   (:class:`~research.uncertain_symmetry.laplace_evidence.LaplaceSymmetryPosterior`), and the held-out NLL and accuracy
   of :func:`~research.uncertain_symmetry.laplace_evidence.laplace_symmetry_predictive` with ``mass`` = 0.999 (full
   Bayes: η integrated out over the grid) and ``mass`` = 0 (type-II: the posterior's mode alone),
   ``HELDOUT_DRAWS`` draws seeded by the data seed. Run after (b) (``--predictive``, two processes taking alternate
   units).

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_datasize.md``, ``.json``, ``.png``; unit files
(``--work-dir``), one per (dataset, N, seed, part), replaced after every η (a stopped run resumes).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_annealed as usa  # noqa: E402
import uncertain_symmetry_laplace as usl  # noqa: E402

from pyro_invariance.data import load_dataset  # noqa: E402
from pyro_invariance.data.arrays import test_arrays, train_arrays  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.laplace_evidence import (  # noqa: E402
    LaplaceSymmetryPosterior,
    laplace_readout_evidence,
    laplace_readout_predictive,
    laplace_symmetry_predictive,
)

STEM = "uncertain_symmetry_datasize"
SIZES = (300, 600, 1200)
DATASETS = ("upright", "partially-rotated")
SEEDS = (0, 2, 1)
ETAS = tuple(round(0.1 + 0.25 * j, 2) for j in range(12)) + (math.pi,)
NUM_SCALES, SCALE_SPAN = usl.NUM_SCALES, usl.SCALE_SPAN
HELDOUT_DRAWS = 256
#: (e) the posterior mass that the full-Bayes predictive keeps
FULL_BAYES_MASS = 0.999
#: (seed, dataset, N) units in run order (b)
UNITS = tuple((s, d, n) for s in SEEDS for d in DATASETS for n in SIZES)
LAPLACE_WORK = Path(f"research/uncertain_symmetry/results/{usl.STEM}_units")


def unit_path(work: Path, dataset: str, size: int, seed: int, k: int) -> Path:
    return work / f"{dataset}_n{size}_seed{seed}_part{k}.json"


def load(dataset: str, size: int) -> Any:
    return load_dataset(us.DATASETS[dataset][0], train_size=size, test_size=us.SIZES["default"]["test_size"])


def evaluate_point(data: Any, seed: int, eta: float, **model_kw: Any) -> dict[str, Any]:
    """(b) at one η: the Laplace evidence, then the held-out NLL of the predictive at its σ_p mode
    (``model_kw``: further model arguments, for ``uncertain_symmetry_lengthscale.py``). ``edge_share`` (the σ_p
    integral's share at the scale grid's end) was added to the points after this benchmark's own units had been
    run; theirs do not have it."""
    model = usa.make_model(data, seed, eta, **model_kw)
    (x, y), (xt, yt) = train_arrays(data, model), test_arrays(data, model)
    start = time.perf_counter()
    r = laplace_readout_evidence(model, x, y, num_scales=NUM_SCALES, scale_span=SCALE_SPAN)
    logp = laplace_readout_predictive(model, x, y, xt, sigma=r.sigma_mode, draws=HELDOUT_DRAWS, seed=seed)
    return {
        "eta": eta,
        "log_evidence": r.log_evidence,
        "sigma_mode": r.sigma_mode,
        "edge_share": r.edge_share,
        "newton_steps": r.newton_steps,
        "nll": float(-logp.gather(1, yt.long().unsqueeze(1)).mean()),
        "accuracy": float((logp.argmax(1) == yt).double().mean()),
        "seconds": time.perf_counter() - start,
    }


def run_unit(dataset: str, size: int, seed: int, path: Path, k: int = 0, n: int = 1) -> dict[str, Any]:
    """Points k, k + n, … of ``ETAS``, resuming from ``path``; the file is replaced after each η."""
    header = {"dataset": dataset, "size": size, "seed": seed}
    return run_points(path, header, load(dataset, size), seed, ETAS[k::n])


def run_points(
    path: Path, header: dict[str, Any], data: Any, seed: int, etas: tuple[float, ...], **model_kw: Any
) -> dict[str, Any]:
    """:func:`evaluate_point` at each of ``etas`` not yet in ``path`` (a unit ``{**header, "points": [...]}``), the file
    replaced after each η; ``model_kw`` as in :func:`evaluate_point`."""
    return common.fill_unit(
        path,
        header,
        etas,
        lambda p: p["eta"],
        lambda eta: evaluate_point(data, seed, eta, **model_kw),
        lambda eta, p: (
            f"{path.stem} η {eta:.2f}: {p['log_evidence']:.2f} (σ_p mode {p['sigma_mode']:.1f}), "
            f"held-out NLL {p['nll']:.4f}, {p['seconds']:.0f} s"
        ),
    )


def unit_points(work: Path, dataset: str, size: int, seed: int) -> list[dict[str, Any]] | None:
    """(b)'s points of one unit sorted by η, or None while it is incomplete."""
    pts = [
        q
        for p in sorted(work.glob(f"{dataset}_n{size}_seed{seed}_part*.json"))
        for q in json.loads(p.read_text())["points"]
    ]
    return sorted(pts, key=lambda q: q["eta"]) if len(pts) == len(ETAS) else None


def laplace_posterior(pts: list[dict[str, Any]]) -> LaplaceSymmetryPosterior:
    """(c)'s grid posterior with each point's σ_p (e)."""
    etas = np.array([p["eta"] for p in pts])
    return LaplaceSymmetryPosterior.from_grid(
        usa.posterior(etas, np.array([p["log_evidence"] for p in pts])), [p["sigma_mode"] for p in pts]
    )


def predictive_unit(dataset: str, size: int, seed: int, work: Path) -> dict[str, Any] | None:
    """(e) for one complete unit of (b), written to its own file (skipped if that file exists)."""
    path = work / f"predictive_{dataset}_n{size}_seed{seed}.json"
    pts = unit_points(work, dataset, size, seed)
    if path.exists() or pts is None:
        return json.loads(path.read_text()) if path.exists() else None
    data = load(dataset, size)
    model = us.make_model(data, us.SIZES["default"], seed, symmetry_prior="uniform", sampling=usa.SAMPLING)
    (x, y), (xt, yt) = train_arrays(data, model), test_arrays(data, model)
    post = laplace_posterior(pts)
    unit: dict[str, Any] = {"dataset": dataset, "size": size, "seed": seed}
    start = time.perf_counter()
    for name, mass in (("full_bayes", FULL_BAYES_MASS), ("type_ii", 0.0)):
        logp = laplace_symmetry_predictive(model, x, y, xt, post, mass=mass, draws=HELDOUT_DRAWS, seed=seed)
        unit[name] = {
            "nll": float(-logp.gather(1, yt.long().unsqueeze(1)).mean()),
            "accuracy": float((logp.argmax(1) == yt).double().mean()),
        }
    unit["points_mixed"] = len(post.top_points(FULL_BAYES_MASS))
    unit["seconds"] = time.perf_counter() - start
    common.write_unit(path, unit)
    common.log(
        f"{path.stem}: full Bayes {unit['full_bayes']['nll']:.4f}, type-II {unit['type_ii']['nll']:.4f} "
        f"({unit['points_mixed']} points mixed, {unit['seconds']:.0f} s)"
    )
    return unit


def summarise(dataset: str, size: int, seed: int, pts: list[dict[str, Any]]) -> dict[str, Any]:
    """(c) for one (dataset, N, seed) from its points sorted by η."""
    etas = np.array([p["eta"] for p in pts])
    ell, nll = np.array([p["log_evidence"] for p in pts]), np.array([p["nll"] for p in pts])
    s = us.grid_summary(usa.posterior(etas, ell))
    top, best = int(np.argmax(ell)), int(np.argmin(nll))
    return {
        "dataset": dataset,
        "size": size,
        "seed": seed,
        "etas": etas.tolist(),
        "log_evidence": ell.tolist(),
        "nll": nll.tolist(),
        "posterior": s,
        "location": us.location_criterion(dataset, s),
        "gain": float(ell[top] - ell[0]),
        "best_eta": float(etas[best]),
        "best_nll": float(nll[best]),
        "best_accuracy": pts[best]["accuracy"],
        "nll_at_top": float(nll[top] - nll[best]),
        "seconds": float(np.mean([p["seconds"] for p in pts])),
    }


def moves_down(lo: dict[str, Any], hi: dict[str, Any]) -> bool:
    """(c)'s reading: the posterior mean at the largest N below the smallest N's by more than the larger sd."""
    a, b = lo["posterior"], hi["posterior"]
    return bool(a["mean"] - b["mean"] > max(a["sd"], b["sd"]))


def check_against_laplace(rows: list[dict[str, Any]], work: Path) -> float | None:
    """Largest |Δ| between N = 300 points and the Laplace benchmark's at the η both have (None: nothing shared)."""
    diffs = []
    for r in (r for r in rows if r["size"] == SIZES[0]):
        for p in sorted(work.glob(f"{r['dataset']}_seed{r['seed']}_part*.json")):
            theirs = {q["eta"]: q["log_evidence"] for q in json.loads(p.read_text())["points"]}
            diffs += [abs(theirs[e] - v) for e, v in zip(r["etas"], r["log_evidence"]) if e in theirs]
    return max(diffs) if diffs else None


def render(work: Path, laplace_work: Path, out_dir: Path | None) -> tuple[Path, Path] | None:
    rows = []
    for dataset in DATASETS:
        for size in SIZES:
            for seed in sorted(SEEDS):
                pts = unit_points(work, dataset, size, seed)
                if pts is not None:  # only complete units
                    rows.append(summarise(dataset, size, seed, pts))
                    pred = work / f"predictive_{dataset}_n{size}_seed{seed}.json"
                    rows[-1]["predictive"] = json.loads(pred.read_text()) if pred.exists() else None
    if not rows:
        return None

    table = [
        "| data | N | seed | posterior from the Laplace evidence: mode / mean / sd [90 %] | location criterion | "
        "ℓ(top) − ℓ(0.1): nats (per datum) | lowest held-out NLL: η / NLL / accuracy | "
        "NLL at the evidence's top − lowest | s per point |",
        "|:---|---:|---:|---:|:---|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r["posterior"]
        table.append(
            f"| {r['dataset']} | {r['size']} | {r['seed']} | {s['mode']:.2f} / {s['mean']:.2f} / {s['sd']:.2f} "
            f"[{s['q05']:.2f}, {s['q95']:.2f}] | {us.criterion_cell(r['location'])} | "
            f"{r['gain']:.1f} ({r['gain'] / r['size']:.4f}) | "
            f"{r['best_eta']:.2f} / {r['best_nll']:.4f} / {r['best_accuracy']:.3f} | {r['nll_at_top']:+.4f} | "
            f"{r['seconds']:.0f} |"
        )
    summary = [
        "| data | N | seeds | posterior mean: mean ± sd over seeds | criterion holds | lowest-NLL η: mean ± sd |",
        "|:---|---:|---:|---:|---:|---:|",
    ]
    moves = {}

    def sd(v):
        return float(np.std(v, ddof=1)) if len(v) > 1 else math.nan

    for dataset in DATASETS:
        for size in SIZES:
            rs = [r for r in rows if r["dataset"] == dataset and r["size"] == size]
            if rs:
                m, b = np.array([r["posterior"]["mean"] for r in rs]), np.array([r["best_eta"] for r in rs])
                summary.append(
                    f"| {dataset} | {size} | {len(rs)} | {m.mean():.2f} ± {sd(m):.2f} | "
                    f"{sum(r['location'][0] for r in rs)}/{len(rs)} | {b.mean():.2f} ± {sd(b):.2f} |"
                )
        pairs = [
            (lo, hi)
            for lo in rows
            for hi in rows
            if lo["dataset"] == hi["dataset"] == dataset
            and lo["seed"] == hi["seed"]
            and lo["size"] == SIZES[0]
            and hi["size"] == SIZES[-1]
        ]
        if pairs:
            moves[dataset] = f"{sum(moves_down(lo, hi) for lo, hi in pairs)}/{len(pairs)}"
    versus = [
        "| data | N | seed | full Bayes over η: NLL / accuracy | type-II (posterior mode): NLL / accuracy | "
        "full Bayes − type-II NLL | grid points mixed |",
        "|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in (r for r in rows if r["predictive"] is not None):
        f, t = r["predictive"]["full_bayes"], r["predictive"]["type_ii"]
        versus.append(
            f"| {r['dataset']} | {r['size']} | {r['seed']} | {f['nll']:.4f} / {f['accuracy']:.3f} | "
            f"{t['nll']:.4f} / {t['accuracy']:.3f} | {f['nll'] - t['nll']:+.4f} | {r['predictive']['points_mixed']} |"
        )
    check = check_against_laplace(rows, laplace_work)
    settings = {
        "SIZES": list(SIZES),
        "DATASETS": list(DATASETS),
        "SEEDS": list(SEEDS),
        "ETAS": list(ETAS),
        "NUM_SCALES": NUM_SCALES,
        "SCALE_SPAN": list(SCALE_SPAN),
        "HELDOUT_DRAWS": HELDOUT_DRAWS,
        "FULL_BAYES_MASS": FULL_BAYES_MASS,
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: the Laplace evidence's posterior over η, and the held-out NLL along η, "
        "as the training set grows from "
        "300 to 1200 digits. Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_datasize.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown(
                "Uncertain symmetry: the evidence's η against the training set's size", info, settings, command, intro
            ),
            f"![log p(D | η) and held-out NLL against N]({STEM}.png)\n",
            *summary,
            "\nThe evidence's η moves down from N = 300 to 1200 (posterior mean lower by more than the larger sd) on: "
            + (", ".join(f"{d} {c} seeds" for d, c in moves.items()) or "no seed with both sizes")
            + ".\n",
            "## Per seed\n",
            *table,
            "\n## Full Bayes against type-II on held-out digits (e)\n",
            *(versus if len(versus) > 2 else ["not run"]),
            "\nCheck against `uncertain_symmetry_laplace.py` at N = 300 (shared η): "
            + ("no shared point" if check is None else f"largest |Δ log p(D | η)| = {check:.2e} nats")
            + ".\n",
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    payload = {
        "info": info,
        "settings": settings,
        "command": command,
        "units": rows,
        "moves_down": moves,
        "check": check,
    }
    paths = common.write_results(STEM, md, payload, out_dir)
    plot(rows, paths[0].with_suffix(".png"))
    return paths


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Top row: log p(D | η) − top per dataset, coloured by N; bottom row: held-out NLL; one line per seed."""
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5 * len(DATASETS), 6.0))
    axes = fig.subplots(2, len(DATASETS), squeeze=False, sharex=True)
    styles = {s: ls for s, ls in zip(sorted(SEEDS), ("-", "--", ":"))}
    for col, dataset in enumerate(DATASETS):
        for r in (r for r in rows if r["dataset"] == dataset):
            etas, ell = np.array(r["etas"]), np.array(r["log_evidence"])
            kw = {"color": f"C{SIZES.index(r['size'])}", "ls": styles[r["seed"]], "marker": "o", "ms": 2.5, "lw": 1.0}
            axes[0][col].plot(etas, ell - ell.max(), label=f"N = {r['size']}, seed {r['seed']}", **kw)
            axes[1][col].plot(etas, r["nll"], **kw)
        axes[0][col].set(title=dataset, ylim=(-80, 5), ylabel="log p(D | η) − top (nats)")
        axes[1][col].set(xlabel="η (rad)", ylabel="held-out NLL (nats / digit)", xlim=(0, us.ETA_MAX))
        axes[0][col].legend(fontsize=6, loc="lower left")
    common.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser, group = common.unit_script_parser(__doc__, STEM)
    group.add_argument("--run", action="store_true", help="(b): the units, every point of --part not yet in --work-dir")
    group.add_argument("--predictive", action="store_true", help="(e): units k, k + n, … of --part that (b) completed")
    group.add_argument("--render", action="store_true", help="no runs: the tables from the unit files (c, e)")
    parser.add_argument(
        "--part", default="0/1", help="k/n: run points k, k + n, … of every unit (two processes: 0/2 and 1/2)"
    )
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds, in run order")
    parser.add_argument("--laplace-work-dir", type=Path, default=LAPLACE_WORK)
    args = common.parse_script_args(parser, argv)
    if args.render:
        return 0 if render(args.work_dir, args.laplace_work_dir, args.out_dir) else 1
    k, n = common.parse_part(parser, args.part)
    seeds = common.parse_seeds(parser, args.seeds, SEEDS)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    order = [
        u for u in sorted(UNITS, key=lambda u: seeds.index(u[0]) if u[0] in seeds else len(seeds)) if u[0] in seeds
    ]
    for i, (seed, dataset, size) in enumerate(order):
        if args.predictive:
            if i % n == k:
                predictive_unit(dataset, size, seed, args.work_dir)
        else:
            run_unit(dataset, size, seed, unit_path(args.work_dir, dataset, size, seed, k), k, n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
