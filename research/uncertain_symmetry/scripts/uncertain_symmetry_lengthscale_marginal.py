r"""Issue 15: with the RFF lengthscale chosen or integrated out by the evidence, where is η?

Why. The lengthscale probe (``uncertain_symmetry_lengthscale.py``, seed 0, exploratory) found that on 1200 upright
digits the Laplace evidence prefers ℓ = 2 to the catalogue's default ℓ = 1 by 101 nats and to ℓ = 4 by 7 nats, and that
a longer ℓ moves the evidence's top in η down (2.35 → 1.6 → 0.6 rad for ℓ = 1, 2, 4); on ±90° digits the top stayed at
π for every ℓ. A researcher would not fix ℓ by hand: they would learn it by the evidence with η, as van der Wilk et al.
(2018) learn kernel hyperparameters with the invariance. This benchmark asks whether the issue's upright criterion
(mode below 1.0 rad or P(η < 1) > 0.5) and ±90° criterion (mode within 0.5 rad of π/2) hold once ℓ is (i) chosen by
type-II maximum likelihood, with η integrated out, or (ii) integrated out with η. The seed-0 numbers at ℓ = 1, 2, 4
were seen before this design; seeds 1 and 2 are fresh.

Method (every setting fixed and committed before any new point of this script ran):

a. **Model and data.** The data-size benchmark's model and data (``uncertain_symmetry_datasize.evaluate_point``:
   Laplace evidence with ``NUM_SCALES`` σ_p scales, held-out NLL of the predictive at the σ_p mode on the 450 test
   digits) at N = ``SIZE`` = 1200, on upright and ±90° digits (``DATASETS``), random features of seeds ``SEEDS`` = 0,
   1, 2, η ∈ ``ETAS`` (the lengthscale probe's 8 points), RFF lengthscale ℓ ∈ ``LENGTHSCALES`` = 1, 2, 2√2, 4 (a
   uniform prior on the grid, even in log ℓ except between 1 and 2: ℓ = √2 is not run).
b. **Points reused** (the same deterministic function on the same data): ℓ = 1 from the data-size benchmark's units
   (its 13-point grid holds ``ETAS``); seed 0 at ℓ = 2 and 4 from the lengthscale probe's units.
   **Points run** (``--run``), in ``RUN_ORDER``: seeds 1, 2 at ℓ = 2, 4 (upright, then ±90°), then ℓ = 2√2 on seeds
   0, 1, 2. Two processes take alternate η of every item (``--part 0/2`` and ``1/2``). ℓ = 2√2 runs last (after the
   28×28 benchmark's seeds 1 and 2, ``uncertain_symmetry_resolution.py``: ``--lengthscales`` picks items) and may be
   cut for CPU time (declared here if so); a (dataset, seed) is then rendered on the ℓ that are complete, named in
   the table.
c. **Measures** (``--render``), per (dataset, seed), on the complete ℓ:
   - log p(D | ℓ) = log ∫ p(D | η, ℓ) p(η) dη with the U(0, π) prior on the η grid (trapezoid,
     ``uncertain_symmetry_annealed.posterior``), and p(ℓ | D) on the ℓ grid;
   - **type-II ℓ**: ℓ* = argmax log p(D | ℓ); the grid posterior p(η | D, ℓ*) and the issue's criterion on it;
   - **ℓ integrated**: p(η | D) ∝ p(η) Σ_ℓ p(D | η, ℓ) / L, its mode / mean / sd and the issue's criterion;
   - the lowest held-out NLL over (ℓ, η), and the NLL at the evidence's joint top less the lowest.
   Per dataset: on how many seeds each criterion holds, and the mean ± sd of the ℓ-integrated posterior mean.
   **Reading fixed in advance:** a criterion counts as reproduced with ℓ learned when it holds on the ℓ-integrated
   posterior on at least 2 of the 3 seeds; the table also states the count on the fresh seeds 1 and 2 alone.
   Check: each reused ℓ = 1 point is taken from the data-size units unchanged, and each seed-0 point at ℓ = 2, 4 from
   the probe's; the table prints how many points came from each source.

d. **Is the Laplace evidence's ℓ ranking real? An AIS check** (added after (b) had started, before any of its new
   points had been looked at). On seed 0's upright digits the Laplace evidence puts log p(D | ℓ = 2) 7.7 nats above
   ℓ = 4, while the held-out NLL is lower at ℓ = 4 (0.413 against ≥ 0.554 at ℓ = 2); the Laplace evidence was 5–21
   nats below AIS on 300 digits (``uncertain_symmetry_annealed.py``), so an error that differs between ℓ could flip the
   ranking, and with it (c)'s upright posterior (ℓ = 4 alone puts the top at 0.6 rad). ``AIS_CHECK``: upright, seed 0,
   N = 300 and 1200, ℓ = 2 and 4, η = 0.6 and 1.6; at each point AIS with the annealed benchmark's sampler
   (``uncertain_symmetry_annealed.evaluate_point``: 32 chains, 1000 scales, the 16-point quadrature), two independent
   runs (``--ais-check --part 0/2`` and ``1/2``: AIS seeds 0 and 1), N = 300 first; and the Laplace evidence at the
   same points (N = 1200: the points of (b); N = 300: computed by part 0 after its AIS runs). Measures: the combined AIS
   estimate (log mean of both runs' 64 weights) and its noise (half the runs' difference); AIS − Laplace per point;
   at each (N, η) the ℓ = 4 − ℓ = 2 difference by AIS and by Laplace. **Reading fixed in advance:** the Laplace ranking
   of ℓ is confirmed when, at N = 1200, AIS's ℓ = 4 − ℓ = 2 difference has Laplace's sign at both η; otherwise (c)'s
   type-II ℓ and ℓ-integrated posteriors are not trusted, and the table says so.
   *Added after the check was rendered:* the reading left out whether AIS is itself converged. At N = 1200 it is not:
   with 1000 scales its per-chain log-weight sd is 17–25 (5–9 at N = 300) and its estimate, a stochastic lower bound
   of log p(D), lies 72–177 nats below the Laplace estimate (within 3.5 nats at N = 300). So the sign agreement at
   N = 1200 checks nothing; the check rests on N = 300, where AIS and Laplace both rank ℓ = 2 above ℓ = 4. The table
   prints each N's AIS − Laplace range and weight sd.

e. **The σ_p grid's cut at ℓ = 4** (added after (c) and (d) had been rendered). At ℓ = 4 the σ_p mode sits at the
   scale grid's next-to-last point and the grid's last 5 % holds up to 11 % of the σ_p integral (``edge_share``), so
   ℓ = 4's evidence is cut short by an amount (c) did not measure. ``EDGE_CHECK``: per dataset the seed with the largest
   ``edge_share`` at ℓ = 4 (upright 2, ±90° 1), every η of ``ETAS``, the Laplace evidence alone with the grid widened to
   ``EDGE_SPAN`` = [−2, 7] (``EDGE_SCALES`` = 37 points, the same 0.25 spacing; ``--edge-check --part 0/2`` and
   ``1/2``). Measures: per η the widened minus the stored evidence, and log p(D | ℓ = 4) − log p(D | ℓ*) before and
   after.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_lengthscale_marginal.md``, ``.json``; unit files in
``--work-dir``.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_annealed as usa  # noqa: E402
import uncertain_symmetry_datasize as usd  # noqa: E402
import uncertain_symmetry_lengthscale as usls  # noqa: E402

from pyro_invariance.data.arrays import train_arrays  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.laplace_evidence import laplace_readout_evidence  # noqa: E402

STEM = "uncertain_symmetry_lengthscale_marginal"
SIZE = 1200
DATASETS = ("upright", "partially-rotated")
SEEDS = (0, 1, 2)
LENGTHSCALES = (1.0, 2.0, 2.0 * math.sqrt(2.0), 4.0)
ETAS = usls.ETAS
#: (seed, dataset, ℓ) items run by this script, in order (b)
RUN_ORDER = tuple((s, d, e) for s in (1, 2) for d in DATASETS for e in (2.0, 4.0)) + tuple(
    (s, d, LENGTHSCALES[2]) for s in SEEDS for d in DATASETS
)
#: (d): upright, seed 0; (N, ℓ, η) in run order
AIS_CHECK = tuple((n, e, eta) for n in (300, 1200) for e in (2.0, 4.0) for eta in (0.6, 1.6))
#: (e): (dataset, seed) at ℓ = 4 with the σ_p grid widened
EDGE_CHECK = (("upright", 2), ("partially-rotated", 1))
EDGE_SPAN, EDGE_SCALES = (-2.0, 7.0), 37
PROBE_WORK = Path(f"research/uncertain_symmetry/results/{usls.STEM}_units")
DATASIZE_WORK = Path(f"research/uncertain_symmetry/results/{usd.STEM}_units")


def unit_path(work: Path, dataset: str, lengthscale: float, seed: int, k: int) -> Path:
    return work / f"{dataset}_lengthscale{lengthscale:.4g}_seed{seed}_part{k}.json"


def run_item(
    dataset: str, lengthscale: float, seed: int, path: Path, k: int = 0, n: int = 1, data: Any = None
) -> dict[str, Any]:
    """Points k, k + n, … of ``ETAS`` at (ℓ, seed), resuming from ``path``; the file is replaced after each η."""
    data = usd.load(dataset, SIZE) if data is None else data
    header = {"dataset": dataset, "lengthscale": lengthscale, "seed": seed}
    return usd.run_points(path, header, data, seed, ETAS[k::n], lengthscale=lengthscale)


def points(
    work: Path, probe_work: Path, datasize_work: Path, dataset: str, lengthscale: float, seed: int
) -> tuple[list[dict[str, Any]], str] | None:
    """The points of (dataset, ℓ, seed) at ``ETAS``, sorted, and their source (b); None while incomplete."""
    if lengthscale == 1.0:
        pts, source = usd.unit_points(datasize_work, dataset, SIZE, seed) or [], "data-size"
    else:
        files, source = (
            (probe_work.glob(f"{dataset}_lengthscale{lengthscale:g}_part*.json"), "probe")
            if seed == 0 and lengthscale in usls.LENGTHSCALES
            else (work.glob(f"{dataset}_lengthscale{lengthscale:.4g}_seed{seed}_part*.json"), "this script")
        )
        pts = [q for p in sorted(files) for q in json.loads(p.read_text())["points"]]
    pts = sorted((q for q in pts if q["eta"] in ETAS), key=lambda q: q["eta"])
    return (pts, source) if len(pts) == len(ETAS) else None


def run_ais_check(work: Path, half: int) -> dict[str, Any]:
    """(d) for one AIS run (``half`` = its seed), resuming from its file; part 0 then adds the Laplace points at
    N = 300."""
    load = functools.cache(functools.partial(usd.load, "upright"))
    unit = common.fill_unit(
        work / f"ais_check_half{half}.json",
        {"dataset": "upright", "seed": 0, "half": half},
        AIS_CHECK,
        check_key,
        lambda key: {
            "size": key[0],
            "lengthscale": key[1],
            **usa.evaluate_point(load(key[0]), 0, key[2], half, lengthscale=key[1]),
        },
        lambda key, p: (
            f"AIS check half {half}, N {key[0]}, ℓ {key[1]:g}, η {key[2]:.2f}: "
            f"{p['log_evidence']:.2f} ({p['seconds']:.0f} s)"
        ),
    )
    if half == 0:
        common.fill_unit(
            work / "ais_check_laplace.json",
            {"dataset": "upright", "seed": 0},
            [c for c in AIS_CHECK if c[0] != SIZE],
            check_key,
            lambda key: {
                "size": key[0],
                "lengthscale": key[1],
                **usd.evaluate_point(load(key[0]), 0, key[2], lengthscale=key[1]),
            },
        )
    return unit


def check_key(point: dict[str, Any]) -> tuple[int, float, float]:
    """(d)'s key of a stored point: (N, ℓ, η)."""
    return point["size"], point["lengthscale"], point["eta"]


def run_edge_check(work: Path, k: int = 0, n: int = 1) -> dict[str, Any]:
    """(e): points k, k + n, … of ``ETAS`` for every ``EDGE_CHECK`` item, resuming from its file."""
    load = functools.cache(lambda dataset: usd.load(dataset, SIZE))

    def widened(key: tuple[str, int, float]) -> dict[str, Any]:
        dataset, seed, eta = key
        model = usa.make_model(load(dataset), seed, eta, lengthscale=4.0)
        r = laplace_readout_evidence(
            model, *train_arrays(load(dataset), model), num_scales=EDGE_SCALES, scale_span=EDGE_SPAN
        )
        return {
            "dataset": dataset,
            "seed": seed,
            "eta": eta,
            "log_evidence": r.log_evidence,
            "edge_share": r.edge_share,
            "sigma_mode": r.sigma_mode,
        }

    keys = [(dataset, seed, eta) for dataset, seed in EDGE_CHECK for eta in ETAS[k::n]]
    return common.fill_unit(
        work / f"edge_check_part{k}.json",
        {"lengthscale": 4.0, "scale_span": list(EDGE_SPAN)},
        keys,
        lambda p: (p["dataset"], p["seed"], p["eta"]),
        widened,
        lambda key, p: (
            f"edge check {key[0]} seed {key[1]} η {key[2]:.2f}: {p['log_evidence']:.2f} (edge share "
            f"{p['edge_share']:.2g})"
        ),
    )


def edge_table(work: Path, rows: list[dict[str, Any]]) -> list[str]:
    """(e)'s table, for the items whose points are all there (none: no lines)."""
    pts = [q for p in sorted(work.glob("edge_check_part*.json")) for q in json.loads(p.read_text())["points"]]
    out = []
    for dataset, seed in EDGE_CHECK:
        wide = sorted((q for q in pts if (q["dataset"], q["seed"]) == (dataset, seed)), key=lambda q: q["eta"])
        row = next((r for r in rows if (r["dataset"], r["seed"]) == (dataset, seed) and 4.0 in r["lengthscales"]), None)
        if len(wide) < len(ETAS) or row is None:
            continue
        i = row["lengthscales"].index(4.0)
        stored = np.array(row["log_evidence"][i])
        lev = np.array([q["log_evidence"] for q in wide])
        after = usa.posterior(np.array(ETAS), lev).log_marginal
        best = max(row["log_p_data_given_ell"])
        before = row["log_p_data_given_ell"][i]
        if not out:
            out = [
                "\n**(e) The σ_p grid's cut at ℓ = 4** (grid widened to [−2, 7]; post hoc).\n",
                "| data | seed | widened − stored, per η (nats) | edge share: stored max → widened max | log p(D \\| "
                "ℓ = 4) − the best ℓ: before → after |",
                "|:---|---:|:---|:---|:---|",
            ]
        share = row["edge_share"][i]
        out.append(
            f"| {dataset} | {seed} | "
            + " / ".join(f"{v:.2f}" for v in lev - stored)
            + f" | {share:.3f} → {max(q['edge_share'] for q in wide):.1e} | {before - best:.1f} → {after - best:.1f} |"
        )
    return out


def ais_check(work: Path, probe_work: Path, datasize_work: Path = DATASIZE_WORK) -> list[dict[str, Any]] | None:
    """(d)'s rows from both AIS runs and the Laplace points; None until every point of both runs is there."""
    halves = [work / f"ais_check_half{h}.json" for h in (0, 1)]
    if not all(p.exists() for p in halves):
        return None
    runs = [{check_key(p): p for p in json.loads(h.read_text())["points"]} for h in halves]
    lap_path = work / "ais_check_laplace.json"
    laplace = {
        check_key(p): p["log_evidence"]
        for p in (json.loads(lap_path.read_text())["points"] if lap_path.exists() else [])
    }
    for ell in {e for _, e, _ in AIS_CHECK}:
        got = points(work, probe_work, datasize_work, "upright", ell, 0)
        laplace.update({(SIZE, ell, q["eta"]): q["log_evidence"] for q in (got[0] if got else [])})
    rows = []
    for key in AIS_CHECK:
        if not all(key in r for r in runs) or key not in laplace:
            return None
        weights = np.concatenate([np.array(r[key]["log_weights"]) for r in runs])
        ais = float(np.logaddexp.reduce(weights) - math.log(len(weights)))
        rows.append(
            {
                "size": key[0],
                "lengthscale": key[1],
                "eta": key[2],
                "ais": ais,
                "noise": abs(runs[0][key]["log_evidence"] - runs[1][key]["log_evidence"]) / 2,
                "laplace": laplace[key],
                "weight_sd": float(np.mean([r[key]["weight_sd"] for r in runs])),
            }
        )
    return rows


def ais_table(rows: list[dict[str, Any]]) -> list[str]:
    """(d)'s two tables: the points, then the ℓ = 4 − ℓ = 2 differences and the reading."""
    out = [
        "\n**(d) AIS check of the ℓ ranking** (upright, seed 0).\n",
        "| N | ℓ | η | AIS ± noise | per-chain log-weight sd | Laplace | AIS − Laplace |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r['size']} | {r['lengthscale']:g} | {r['eta']:.2f} | {r['ais']:.1f} ± {r['noise']:.1f} | "
        f"{r['weight_sd']:.1f} | {r['laplace']:.1f} | {r['ais'] - r['laplace']:.1f} |"
        for r in rows
    ]
    out += ["", "| N | η | ℓ = 4 − ℓ = 2, AIS | ℓ = 4 − ℓ = 2, Laplace | same sign |", "|---:|---:|---:|---:|:---|"]
    at = {(r["size"], r["lengthscale"], r["eta"]): r for r in rows}
    agree = []
    for size, eta in dict.fromkeys((n, eta) for n, _, eta in AIS_CHECK):
        a = at[(size, 4.0, eta)]["ais"] - at[(size, 2.0, eta)]["ais"]
        b = at[(size, 4.0, eta)]["laplace"] - at[(size, 2.0, eta)]["laplace"]
        if size == SIZE:
            agree.append(a * b > 0)
        out.append(f"| {size} | {eta:.2f} | {a:.1f} | {b:.1f} | {'yes' if a * b > 0 else 'no'} |")
    verdict = (
        "confirmed" if all(agree) else "not confirmed: (c)'s type-II ℓ and ℓ-integrated posteriors are not trusted"
    )
    out.append(f"\nReading (fixed in advance): the Laplace ranking of ℓ at N = {SIZE} is **{verdict}**.")
    # the AIS estimate's own state, per N (see the docstring's (d), last paragraph: added after the check was rendered)
    for size in dict.fromkeys(n for n, _, _ in AIS_CHECK):
        gap = [r["ais"] - r["laplace"] for r in rows if r["size"] == size]
        sd = [r["weight_sd"] for r in rows if r["size"] == size]
        out.append(
            f"At N = {size}: AIS − Laplace from {min(gap):.1f} to {max(gap):.1f} nats, "
            f"per-chain log-weight sd {min(sd):.1f}–{max(sd):.1f}."
        )
    return out


def summarise(dataset: str, seed: int, units: dict[float, list[dict[str, Any]]]) -> dict[str, Any]:
    """(c) for one (dataset, seed) from its complete ℓ (``units``: ℓ → points sorted by η)."""
    ells = sorted(units)
    etas = np.array(ETAS)
    lev = np.array([[q["log_evidence"] for q in units[e]] for e in ells])
    nll = np.array([[q["nll"] for q in units[e]] for e in ells])
    log_ml = np.array([usa.posterior(etas, row).log_marginal for row in lev])
    p_ell = np.exp(log_ml - log_ml.max())
    p_ell /= p_ell.sum()
    star = int(np.argmax(log_ml))
    at_star = us.grid_summary(usa.posterior(etas, lev[star]))
    mixed = np.logaddexp.reduce(lev, axis=0) - math.log(len(ells))
    integrated = us.grid_summary(usa.posterior(etas, mixed))
    top, best = np.unravel_index(np.argmax(lev), lev.shape), np.unravel_index(np.argmin(nll), nll.shape)
    return {
        "dataset": dataset,
        "seed": seed,
        "lengthscales": ells,
        "log_evidence": lev.tolist(),
        "nll": nll.tolist(),
        "log_p_data_given_ell": log_ml.tolist(),
        "p_ell": p_ell.tolist(),
        "ell_star": ells[star],
        "at_ell_star": at_star,
        "at_ell_star_criterion": us.location_criterion(dataset, at_star),
        "integrated": integrated,
        "integrated_criterion": us.location_criterion(dataset, integrated),
        "edge_share": [max((q.get("edge_share", math.nan) for q in units[e]), default=math.nan) for e in ells],
        "joint_top": [ells[top[0]], float(etas[top[1]])],
        "best_nll": [ells[best[0]], float(etas[best[1]]), float(nll[best])],
        "nll_at_top": float(nll[top] - nll[best]),
    }


def render(work: Path, probe_work: Path, datasize_work: Path, out_dir: Path | None) -> tuple[Path, Path] | None:
    rows, sources = [], {"data-size": 0, "probe": 0, "this script": 0}
    for dataset in DATASETS:
        for seed in SEEDS:
            got = {
                ell: g
                for ell in LENGTHSCALES
                if (g := points(work, probe_work, datasize_work, dataset, ell, seed)) is not None
            }
            if len(got) < 2:
                continue
            rows.append(summarise(dataset, seed, {ell: pts for ell, (pts, _) in got.items()}))
            for pts, source in got.values():
                sources[source] += len(pts)
    if not rows:
        return None

    table = [
        "| data | seed | ℓ grid | log p(D \\| ℓ) − the best, per ℓ | type-II ℓ* (p(ℓ* \\| D)) | η at ℓ*: "
        "mode / mean / sd — criterion "
        "| ℓ integrated: mode / mean / sd / 90 % interval — criterion | lowest held-out NLL: ℓ, η / NLL | "
        "NLL at the evidence's (ℓ, η) top − lowest |",
        "|:---|---:|:---|:---|---:|:---|:---|:---|---:|",
    ]
    for r in rows:
        lm, s, t = np.array(r["log_p_data_given_ell"]), r["at_ell_star"], r["integrated"]
        table.append(
            f"| {r['dataset']} | {r['seed']} | {', '.join(f'{e:.3g}' for e in r['lengthscales'])} | "
            + " / ".join(f"{v - lm.max():.1f}" for v in lm)
            + f" | {r['ell_star']:.3g} ({max(r['p_ell']):.2f}) | {s['mode']:.2f} / {s['mean']:.2f} / {s['sd']:.2f} — "
            f"{us.criterion_cell(r['at_ell_star_criterion'])}"
            f" | {t['mode']:.2f} / {t['mean']:.2f} / {t['sd']:.2f} / [{t['q05']:.2f}, "
            f"{t['q95']:.2f}] — {us.criterion_cell(r['integrated_criterion'])}"
            f" | {r['best_nll'][0]:.3g}, {r['best_nll'][1]:.2f} / {r['best_nll'][2]:.4f} | {r['nll_at_top']:.4f} |"
        )
    summary = [
        "\n| data | seeds | type-II ℓ: criterion holds on | ℓ integrated: criterion holds on (fresh seeds 1, 2) | "
        "ℓ-integrated posterior mean, mean ± sd | reproduced with ℓ learned (≥ 2 of 3 seeds) |",
        "|:---|:---|---:|---:|---:|:---|",
    ]
    for dataset in DATASETS:
        rs = [r for r in rows if r["dataset"] == dataset]
        if not rs:
            continue
        means = np.array([r["integrated"]["mean"] for r in rs])
        fresh = [r for r in rs if r["seed"] != 0]
        held = sum(r["integrated_criterion"][0] for r in rs)
        verdict = "—" if len(rs) < len(SEEDS) else ("yes" if held >= 2 else "no")
        summary.append(
            f"| {dataset} | {', '.join(str(r['seed']) for r in rs)} | {sum(r['at_ell_star_criterion'][0] for r in rs)} "
            f"of {len(rs)} | "
            f"{held} of {len(rs)} ({sum(r['integrated_criterion'][0] for r in fresh)} of {len(fresh)}) | "
            + (f"{means.mean():.2f} ± {means.std(ddof=1):.2f}" if len(means) > 1 else f"{means[0]:.2f}")
            + f" | {verdict} |"
        )
    ais_rows = ais_check(work, probe_work, datasize_work)
    if ais_rows:
        summary += ais_table(ais_rows)
    summary += edge_table(work, rows)
    settings = {
        "SIZE": SIZE,
        "DATASETS": list(DATASETS),
        "SEEDS": list(SEEDS),
        "LENGTHSCALES": list(LENGTHSCALES),
        "ETAS": list(ETAS),
        "RUN_ORDER": [list(i) for i in RUN_ORDER],
        "NUM_SCALES": usd.NUM_SCALES,
        "SCALE_SPAN": list(usd.SCALE_SPAN),
        "HELDOUT_DRAWS": usd.HELDOUT_DRAWS,
        "AIS_CHECK": [list(i) for i in AIS_CHECK],
        "EDGE_CHECK": [list(i) for i in EDGE_CHECK],
        "EDGE_SPAN": list(EDGE_SPAN),
        "EDGE_SCALES": EDGE_SCALES,
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: the Laplace evidence over (η, RFF lengthscale ℓ) on 1200 upright and ±90° digits, "
        "three feature seeds; "
        "η's posterior with ℓ chosen by type-II and with ℓ integrated out. "
        "Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_lengthscale_marginal.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown(
                "Uncertain symmetry: η with the RFF lengthscale learned", info, settings, command, intro
            ),
            *table,
            *summary,
            "\nPoints by source (b): " + ", ".join(f"{k}: {v}" for k, v in sources.items()) + ".\n",
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    return common.write_results(
        STEM,
        md,
        {
            "info": info,
            "settings": settings,
            "command": command,
            "units": rows,
            "sources": sources,
            "ais_check": ais_rows,
        },
        out_dir,
    )


def main(argv: list[str] | None = None) -> int:
    parser, group = common.unit_script_parser(__doc__, STEM)
    group.add_argument(
        "--run", action="store_true", help="(b): every point of --part not yet in --work-dir, in RUN_ORDER"
    )
    group.add_argument("--render", action="store_true", help="no runs: the tables from the unit files (c), (d)")
    group.add_argument("--ais-check", action="store_true", help="(d): the AIS run of --part k/2 (its seed k)")
    group.add_argument("--edge-check", action="store_true", help="(e): the points of --part with the σ_p grid widened")
    parser.add_argument("--part", default="0/1", help="k/n: run points k, k + n, … of every item")
    parser.add_argument(
        "--lengthscales", default=None, help="comma-separated: run only RUN_ORDER's items at these ℓ (default all)"
    )
    parser.add_argument("--probe-work-dir", type=Path, default=PROBE_WORK)
    parser.add_argument("--datasize-work-dir", type=Path, default=DATASIZE_WORK)
    args = common.parse_script_args(parser, argv)
    if args.render:
        return 0 if render(args.work_dir, args.probe_work_dir, args.datasize_work_dir, args.out_dir) else 1
    k, n = common.parse_part(parser, args.part)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.edge_check:
        run_edge_check(args.work_dir, k, n)
        return 0
    if args.ais_check:
        if n != 2:
            parser.error("--ais-check takes --part 0/2 or 1/2 (one AIS run each)")
        run_ais_check(args.work_dir, k)
        return 0
    try:
        only = None if args.lengthscales is None else [float(v) for v in args.lengthscales.split(",")]
    except ValueError:
        parser.error(f"--lengthscales must be comma-separated numbers, got {args.lengthscales!r}")
    items = [i for i in RUN_ORDER if only is None or any(math.isclose(i[2], v, rel_tol=1e-3) for v in only)]
    if not items:
        parser.error(f"--lengthscales {args.lengthscales!r} selects no item of RUN_ORDER (ℓ run: 2, 4, 2.828)")
    data: dict[str, Any] = {}
    for seed, dataset, ell in items:
        if dataset not in data:
            data[dataset] = usd.load(dataset, SIZE)
        run_item(dataset, ell, seed, unit_path(args.work_dir, dataset, ell, seed, k), k, n, data[dataset])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
