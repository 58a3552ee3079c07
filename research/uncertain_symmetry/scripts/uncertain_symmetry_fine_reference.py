"""Issue 15: a 1° grid reference near the mode, to decide whether the 5° reference is wide or the IWAE q* narrow.

Why. ``uncertain_symmetry_collapsed.py`` (g)–(i) left the width question with the reference: with a hundred IWAE
streams the upright IWAE q* has sd 0.034–0.051 against the refined reference's 0.069–0.081, and the reference's own
data cannot tell the two apart — it is a grid posterior on 5° points (0.087 rad) with σ/√R = 2.0–3.2 nats of noise
at each point, and the quadratic through its 5 points within 0.2 rad of its top implies sd 0.062, 0.037 and 0.063
on seeds 0–2 with 90 % intervals [0.045, 0.188], [0.030, 0.052], [0.043, ∞]. This script fits the same fixed-η
model on 1° points over that same ±0.2 rad, with the same restarts, so the curvature there is measured on 23
points instead of 5.

Method (every setting fixed and committed before any fit of this script ran):

a. **Points.** Per upright unit (``FINE_DATASETS``; seeds of the input run; the ±90° units were added after the
   upright results were seen, with the same settings, and run to a fixed deadline: whole restarts only, as (c)
   says), η₀ = the refined reference's window
   point of highest aligned-mean IWAE bound (``uncertain_symmetry_refined.aligned_mean``; as in the collapsed
   script's (i)), and η₀ + k·``FINE_SPACING`` for k = −11 … 11 (1°, ±``FINE_HALF_WIDTH`` = 0.2 rad), clipped
   to (0, π).
b. **Fits.** At every point ``FINE_RESTARTS`` = 4 fixed-η fits exactly as the refined reference's (``us.fit`` with
   ``learn_symmetry=False``, ``eta_init=η``, the input run's size and settings, training seed seed + 1000 r for
   restart r, then ``us.bound``: IWAE_K, K = 100, seeded by the training seed). Every fifth point is a 5° point
   of the reference with the same seeds, so there the fit repeats the reference's (reported: the largest
   difference). Fits run restart by restart (restart 0 at every point of every unit first), so a run cut short
   leaves whole restarts; each fit is saved as it ends (``--fit`` resumes).
c. **Evidence and width** (``--render``). Only restarts complete at every point of a unit are used. The restarts
   are aligned as the reference's (each shifted by its mean difference to restart 0 over the points) and
   averaged; σ is the pooled sd of one aligned restart at a point and σ/√R that of the mean. A least-squares
   quadratic through all points gives the curvature c with its standard error from σ/√R (points taken as
   independent) and from the residuals; the implied sd 1/√(−2c) and its 90 % interval (c ± 1.645 SE). Also the
   grid posterior on the points (prior U(0, π) truncated to them): its sd. Beside them: the 5° reference's (i)
   numbers and the 100-stream IWAE q* sd of every fit of ``uncertain_symmetry_collapsed.py`` (g) on the unit, and
   whether each lies inside the fine interval.

d. **The restarts' own curvatures** (added after the first render was seen: the quadratic's residual sd came out
   below σ/√R on every unit, 0.3–1.5 against 1.0–2.1 nats, so the noise is smooth in η within a restart — one
   training seed at every point — and the points are not independent; the standard error of (c) then misses
   the restart-to-restart change of shape). Per restart, the same quadratic through its own aligned bounds; the
   mean of the R curvatures, their standard error (sd / √R) and the 90 % interval of Student's t with R − 1
   degrees of freedom, mapped to sd the same way. Both intervals are reported; the q* verdicts are given for each.

e. **Is K = 100 enough for the shape?** (``--k-check``; decided after (c)–(d) and ``uncertain_symmetry_widened.py``'s
   first units were seen, settings fixed and committed before it ran.) The reference and q* are both IWAE_100
   profiles; if the bound's gap to log p(D | η) changed with η on this window, both widths would be K's. On
   ``K_CHECK_UNITS`` (upright seeds 0 and 2, where q* is narrower than the reference) restart 0 is refitted at every
   point (the same call and seeds as (b): it repeats the unit's restart-0 bound, reported) and evaluated by
   ``us.bound`` with K = 100 and with K = ``K_CHECK`` = 1000 (seeded by the training seed). Per unit: the quadratic
   (as (c), x = η − η₀) through each profile and through their difference IWAE_1000 − IWAE_100 (curvature with its
   standard error from the residuals), the implied sd at each K, the difference's range over the points and the
   PSIS k̂ of the K = 1000 weights (above 0.7 the estimate is unreliable). A
   difference with no curvature means K = 100 has the evidence's shape on this window.
f. **The K = 1000 reference** (``--k-check --k-restarts 4``; added after (e) was seen — one restart reshaped by 7–11
   nats — settings fixed and committed before it ran). (e) for restarts 1–3 as well (training seeds as (b)), so
   that (c) and (d) can be computed from the K = 1000 bounds of all ``FINE_RESTARTS`` restarts: its implied sd with
   both intervals and its grid sd on the points (``--render``), beside the same restarts' K = 100 values.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_fine_reference_<suffix>.md``, ``.json``; the unit
files (``--work-dir``) hold every fit.
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
import uncertain_symmetry_collapsed as usc  # noqa: E402
import uncertain_symmetry_iwae as usi  # noqa: E402
import uncertain_symmetry_refined as usr  # noqa: E402

from pyro_invariance.data.images import load_dataset  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402

STEM = "uncertain_symmetry_fine_reference"
FINE_DATASETS = ("upright", "partially-rotated")
FINE_SPACING = math.pi / 180
FINE_HALF_WIDTH = 0.2
FINE_RESTARTS = 4
K_CHECK = 1000
K_CHECK_UNITS = (("upright", 0), ("upright", 2))


def fine_points(refined: dict[str, Any]) -> tuple[float, list[float]]:
    """(a): η₀, the reference's best window point, and the 1° points within ``FINE_HALF_WIDTH`` of it inside (0, π)."""
    etas, values = usr.aligned_mean(refined, lambda f: f["iwae"]["value"])
    top = float(etas[int(np.argmax(values))])
    k = int(round(FINE_HALF_WIDTH / FINE_SPACING))
    return top, [top + i * FINE_SPACING for i in range(-k, k + 1) if 0.0 < top + i * FINE_SPACING < us.ETA_MAX]


def fit_unit(
    dataset: str, seed: int, refined: dict[str, Any], size: dict[str, Any], path: Path, restart: int
) -> dict[str, Any]:
    """(b) for one restart of one unit: every point not yet in ``path``, saved after each fit."""
    top, etas = fine_points(refined)
    unit = (
        json.loads(path.read_text())
        if path.exists()
        else {"dataset": dataset, "seed": seed, "eta0": top, "etas": etas, "fits": []}
    )
    if not np.allclose(unit["etas"], etas, rtol=0, atol=1e-12):
        raise SystemExit(f"{path}: its points are not this reference's")
    done = {(f["k"], f["restart"]) for f in unit["fits"]}
    todo = [k for k in range(len(etas)) if (k, restart) not in done]
    data = (
        load_dataset(us.DATASETS[dataset][0], train_size=size["train_size"], test_size=size["test_size"])
        if todo
        else None
    )
    train_seed = seed + usr.RESTART_SEED_OFFSET * restart
    for k in todo:
        t0 = time.perf_counter()
        res = us.fit(data, size, seed, train_seed=train_seed, learn_symmetry=False, eta_init=float(etas[k]))
        unit["fits"].append(
            {
                "k": k,
                "eta": etas[k],
                "restart": restart,
                "iwae": us.bound(res, data, size, train_seed),
                "final_elbo_per_datum": res.final_elbo,
                "fit_seconds": time.perf_counter() - t0,
            }
        )
        path.write_text(json.dumps(unit, indent=1) + "\n")
        common.log(
            f"  {dataset} seed {seed}: η {etas[k]:.4f} restart {restart}: IWAE/N "
            f"{unit['fits'][-1]['iwae']['per_datum']:.4f}"
        )
    return unit


def k_check_unit(
    dataset: str, seed: int, unit: dict[str, Any], size: dict[str, Any], path: Path, restart: int = 0
) -> dict[str, Any]:
    """(e) for one unit and restart (f: restarts 1–3): the restart refitted at every point, its bound at K = iwae_K and
    K = ``K_CHECK``; saved after each point (resumes)."""
    out = (
        json.loads(path.read_text())
        if path.exists()
        else {"dataset": dataset, "seed": seed, "eta0": unit["eta0"], "etas": unit["etas"], "K": K_CHECK, "points": []}
    )
    done = {(p["k"], p["restart"]) for p in out["points"]}
    todo = [k for k in range(len(unit["etas"])) if (k, restart) not in done]
    data = (
        load_dataset(us.DATASETS[dataset][0], train_size=size["train_size"], test_size=size["test_size"])
        if todo
        else None
    )
    train_seed = seed + usr.RESTART_SEED_OFFSET * restart
    for k in todo:
        eta, t0 = float(unit["etas"][k]), time.perf_counter()
        res = us.fit(data, size, seed, train_seed=train_seed, learn_symmetry=False, eta_init=eta)
        base = us.bound(res, data, size, train_seed)
        more = us.bound(res, data, {**size, "iwae_K": K_CHECK}, train_seed)
        stored = next(f["iwae"]["value"] for f in unit["fits"] if f["k"] == k and f["restart"] == restart)
        out["points"].append(
            {
                "k": k,
                "restart": restart,
                "eta": eta,
                "iwae": base["value"],
                "iwae_more": more["value"],
                "k_hat_more": more["k_hat"],
                "repeat_difference": abs(base["value"] - stored),
                "seconds": time.perf_counter() - t0,
            }
        )
        path.write_text(json.dumps(out, indent=1) + "\n")
        common.log(
            f"  k-check {dataset} seed {seed} restart {restart}: η {eta:.4f}: "
            f"IWAE_{size['iwae_K']} {base['value']:.2f}, "
            f"IWAE_{K_CHECK} {more['value']:.2f}"
        )
    return out


def k_check_reference(check: dict[str, Any], key: str = "iwae_more") -> dict[str, Any]:
    """(f): the check's bounds ``key`` (K = ``K_CHECK``, or ``"iwae"``: K = 100) as a 1° reference unit, for
    :func:`fine_summary` (only restarts complete at every point count there)."""
    fits = [{"k": p["k"], "eta": p["eta"], "restart": p["restart"], "iwae": {"value": p[key]}} for p in check["points"]]
    return {
        "dataset": check["dataset"],
        "seed": check["seed"],
        "eta0": check["eta0"],
        "etas": check["etas"],
        "fits": fits,
    }


def k_check_summary(check: dict[str, Any]) -> dict[str, Any]:
    """(e): implied sd of each K's profile and the curvature of their difference (standard error from the residuals),
    for restart 0; (f) where more restarts are complete: :func:`fine_summary` of each K's bounds."""
    out = _restart_k_check([p for p in check["points"] if p["restart"] == 0], check["eta0"])
    more = k_check_reference(check)
    if len(complete_restarts(more)) > 1:
        keep = ("restarts", "sd", "sd_interval", "grid_sd", "mean_sd")
        summaries = {"K100": fine_summary(k_check_reference(check, "iwae")), f"K{K_CHECK}": fine_summary(more)}
        out["reference"] = {
            name: {
                **{k: v for k, v in f.items() if k in keep},
                "restart_interval": f["restart_curvature"]["sd_interval"],
            }
            for name, f in summaries.items()
        }
    return out


def _restart_k_check(points: list[dict[str, Any]], eta0: float) -> dict[str, Any]:
    pts = sorted(points, key=lambda p: p["k"])
    x = np.array([p["eta"] for p in pts]) - eta0
    base, more = np.array([p["iwae"] for p in pts]), np.array([p["iwae_more"] for p in pts])
    diff = usc.quadratic_curvature(x, more - base, math.nan)
    return {
        "points": len(pts),
        "sd": usc.quadratic_curvature(x, base, math.nan)["sd"],
        "sd_more": usc.quadratic_curvature(x, more, math.nan)["sd"],
        "diff_c": diff["c"],
        "diff_se": diff["se_residual"],
        "diff_range": [float((more - base).min()), float((more - base).max())],
        "k_hat_range": [min(p["k_hat_more"] for p in pts), max(p["k_hat_more"] for p in pts)],
        "repeat_difference": max(p["repeat_difference"] for p in pts),
    }


def k_check_table(summaries: list[tuple[str, int, dict[str, Any]]]) -> str:
    head = [
        "data, seed",
        "points",
        "implied sd, K = 100 (restart 0)",
        f"implied sd, K = {K_CHECK}",
        f"curvature of IWAE_{K_CHECK} − IWAE_100 ± SE (nats/rad²)",
        "its range over the points (nats)",
        f"PSIS k̂ at K = {K_CHECK}",
        "largest |difference| from the unit's restart-0 bound (nats)",
    ]
    rows = [
        f"| {d}, {s} | {k['points']} | {k['sd']:.3f} | {k['sd_more']:.3f} | {k['diff_c']:+.0f} ± {k['diff_se']:.0f} | "
        f"{k['diff_range'][0]:.2f} … {k['diff_range'][1]:.2f} | {k['k_hat_range'][0]:.1f}–{k['k_hat_range'][1]:.1f} | "
        f"{k['repeat_difference']:.2g} |"
        for d, s, k in summaries
    ]
    table = "\n".join(["| " + " | ".join(head) + " |", "|:---|" + "---:|" * (len(head) - 1), *rows])
    full = [(d, s, k["reference"]) for d, s, k in summaries if "reference" in k]
    if not full:
        return table
    head = [
        "data, seed, K",
        "restarts",
        "implied sd [90 %] (c)",
        "restarts' curvatures: 90 % t interval (d)",
        "grid sd on the points",
        "σ/√R (nats)",
    ]
    rows = [
        f"| {d}, {s}, K = {name[1:]} | {len(r['restarts'])} | {r['sd']:.3f} {interval(*r['sd_interval'])} | "
        f"{interval(*r['restart_interval'])} | {r['grid_sd']:.3f} | {r['mean_sd']:.2f} |"
        for d, s, ref in full
        for name, r in ref.items()
    ]
    return "\n".join(
        [
            table,
            "\nThe K = 1000 reference (f), from the same restarts' bounds at each K:\n",
            "| " + " | ".join(head) + " |",
            "|:---|" + "---:|" * (len(head) - 1),
            *rows,
        ]
    )


def interval(lo: float, hi: float) -> str:
    """A 90 % interval of an implied sd as the tables print it (no upper end: ∞; none computed: "(none)")."""
    if math.isnan(lo):
        return "(none)"
    return f"[{lo:.3f}, {'∞' if math.isinf(hi) else f'{hi:.3f}'}]"


def complete_restarts(unit: dict[str, Any]) -> list[int]:
    """The restarts with a fit at every point."""
    n = len(unit["etas"])
    return sorted(r for r in {f["restart"] for f in unit["fits"]} if sum(f["restart"] == r for f in unit["fits"]) == n)


def fine_summary(unit: dict[str, Any]) -> dict[str, Any]:
    """(c): the aligned mean over the complete restarts, its noise, the quadratic's curvature and implied sd with
    its 90 % interval, and the grid posterior's sd."""
    restarts = complete_restarts(unit)
    if not restarts:
        raise ValueError(f"{unit['dataset']} seed {unit['seed']}: no restart is complete")
    etas = np.asarray(unit["etas"])
    table = np.array(
        [
            [next(f["iwae"]["value"] for f in unit["fits"] if f["k"] == k and f["restart"] == r) for r in restarts]
            for k in range(len(etas))
        ]
    )
    aligned = table - (table - table[:, :1]).mean(axis=0)
    mean = aligned.mean(axis=1)
    sigma = float(np.sqrt(np.mean(aligned.var(axis=1, ddof=1)))) if len(restarts) > 1 else math.nan
    mean_sd = sigma / math.sqrt(len(restarts))
    gp = grid_posterior(etas, mean, np.full_like(etas, -math.log(us.ETA_MAX)))
    x = etas - unit["eta0"]
    spread = curvature_spread(
        np.array([usc.quadratic_curvature(x, aligned[:, i], math.nan)["c"] for i in range(len(restarts))])
    )
    return {
        "restarts": restarts,
        **usc.quadratic_curvature(x, mean, mean_sd),
        "sigma": sigma,
        "mean_sd": mean_sd,
        "grid_sd": gp.sd,
        "mean_profile": mean.tolist(),
        "restart_curvature": spread,
    }


def curvature_spread(each: np.ndarray) -> dict[str, Any]:
    """(d): curvatures of independent repeats (restarts; or streams): their mean, its standard error sd/√R and the
    90 % interval of Student's t with R − 1 degrees of freedom, mapped to the implied sd (``nan`` for one repeat)."""
    spread = {"each_c": each.tolist(), "c": float(each.mean()), "se": math.nan, "sd_interval": [math.nan, math.nan]}
    if len(each) > 1:
        from scipy.stats import t as student_t

        se, q = float(each.std(ddof=1) / math.sqrt(len(each))), float(student_t.ppf(0.95, len(each) - 1))
        spread.update(
            {"se": se, "sd_interval": [usc.implied_sd(spread["c"] - q * se), usc.implied_sd(spread["c"] + q * se)]}
        )
    return spread


def repeats_reference(unit: dict[str, Any], refined: dict[str, Any]) -> float:
    """(b): the largest |IWAE difference| between a fine fit at a 5° point and the reference's fit there with the same
    restart (nats; ``nan`` where none coincide)."""
    ref = {
        (round(f["eta"] / usr.STEP), f["restart"]): f["iwae"]["value"]
        for f in refined["fits"]
        if f.get("source") == "fitted"
    }
    diffs = [
        abs(f["iwae"]["value"] - ref[(round(f["eta"] / usr.STEP), f["restart"])])
        for f in unit["fits"]
        if abs(f["eta"] / usr.STEP - round(f["eta"] / usr.STEP)) < 1e-6
        and (round(f["eta"] / usr.STEP), f["restart"]) in ref
    ]
    return max(diffs) if diffs else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = usr.phase_parser(
        __doc__,
        "the symmetry-conditional run (its settings and units)",
        "where the fine units go (resumable)",
        {
            "fit": "the fixed-η fits of every upright unit, restart by restart (b)",
            "k-check": "restart 0 refitted and evaluated at K = 100 and K = K_CHECK (e)",
            "render": "no fits: the tables from the unit files (c)",
        },
        "comma-separated units <dataset>_seed<s>",
    )
    parser.add_argument(
        "--collapsed",
        type=Path,
        default=Path("research/uncertain_symmetry/results/uncertain_symmetry_collapsed_units"),
        help="uncertain_symmetry_collapsed.py's work dir (its (g) units)",
    )
    parser.add_argument(
        "--k-restarts",
        type=int,
        default=1,
        choices=range(1, FINE_RESTARTS + 1),
        help="--k-check: restarts 0 … n−1 (e: 1; f: all 4)",
    )
    args, payloads, _, settings, size, keys = usr.parse_phase_args(parser, argv)
    keys = [(d, s) for d, s in keys if d in FINE_DATASETS and (not args.only or f"{d}_seed{s}" in args.only.split(","))]
    refs = {(d, s): usr.read_unit_file(parser, args.reference, d, s, "--reference") for d, s in keys}
    args.work_dir.mkdir(parents=True, exist_ok=True)
    paths = {(d, s): args.work_dir / f"{d}_seed{s}.json" for d, s in keys}
    if args.fit:
        for restart in range(FINE_RESTARTS):
            for d, s in keys:
                fit_unit(d, s, refs[(d, s)], size, paths[(d, s)], restart)
        return 0
    if args.k_check:
        for d, s in (u for u in keys if u in K_CHECK_UNITS):
            if not paths[(d, s)].exists():
                parser.error(f"--k-check: {paths[(d, s)]} is missing (run --fit first)")
            for restart in range(args.k_restarts):
                k_check_unit(
                    d,
                    s,
                    json.loads(paths[(d, s)].read_text()),
                    size,
                    args.work_dir / f"{d}_seed{s}_k{K_CHECK}.json",
                    restart,
                )
        return 0
    rows, lean = [], []
    for d, s in keys:
        if not paths[(d, s)].exists():
            parser.error(f"--render: {paths[(d, s)]} is missing (run --fit first)")
        unit = json.loads(paths[(d, s)].read_text())
        fine, repeat = fine_summary(unit), repeats_reference(unit, refs[(d, s)])
        coarse = usc.reference_curvature(usr.refined_unit(usi.input_unit(payloads[0], d, s), refs[(d, s)]))
        q = {}
        for fit in usc.FITS:
            path = args.collapsed / "collapsed" / f"{usc.state_stem(fit, d, s)}_streams.json"
            if path.exists():
                q[fit] = float(json.loads(path.read_text())["q_eta"]["sd"])
        lo, hi = fine["sd_interval"]
        rc = fine["restart_curvature"]
        rlo, rhi = rc["sd_interval"]
        inside = (
            "; ".join(
                f"{f} {v:.3f} {'yes' if lo <= v <= hi else 'no'}, {'yes' if rlo <= v <= rhi else 'no'}"
                for f, v in q.items()
            )
            or "–"
        )
        rows.append(
            f"| {d}, {s} | {fine['points']} × {len(fine['restarts'])} | {fine['mean_sd']:.2f}; "
            f"{fine['residual_sd']:.2f} | "
            f"{fine['c']:.0f} ± {fine['se_noise']:.0f}; {fine['se_residual']:.0f} | "
            f"{fine['sd']:.3f} {interval(lo, hi)} | "
            f"{', '.join(f'{c:.0f}' for c in rc['each_c'])}: {rc['c']:.0f} ± {rc['se']:.0f}; {interval(rlo, rhi)} | "
            f"{fine['grid_sd']:.3f} | {coarse['sd']:.3f} {interval(*coarse['sd_interval'])}; "
            f"{coarse['reference_sd']:.3f} | "
            f"{repeat:.2g} | {inside} |"
        )
        lean.append(
            {
                "dataset": d,
                "seed": s,
                "eta0": unit["eta0"],
                "fine": fine,
                "coarse": coarse,
                "q_star_sd": q,
                "repeat_difference": repeat,
            }
        )
    head = [
        "data, seed",
        "points × restarts",
        "σ/√R; the quadratic's residual sd (nats)",
        "curvature c ± SE (σ/√R; residuals)",
        "implied sd [90 %] (c)",
        "each restart's curvature: mean ± SE; implied sd's 90 % t interval (d)",
        "grid posterior sd (1° points)",
        "5° reference: implied sd [90 %] (collapsed (i)); grid sd",
        "largest |difference| from the reference's fit at the shared 5° points (nats)",
        "IWAE q* sd, 100 streams (collapsed (g)): inside the interval of (c), of (d)",
    ]
    table = "\n".join(["| " + " | ".join(head) + " |", "|:---|" + "---:|" * (len(head) - 1), *rows])
    checks = [
        (d, s, k_check_summary(json.loads(p.read_text())))
        for d, s in keys
        if (p := args.work_dir / f"{d}_seed{s}_k{K_CHECK}.json").exists()
    ]
    for d, s, k in checks:
        next(u for u in lean if (u["dataset"], u["seed"]) == (d, s))["k_check"] = k
    settings.update({"K_CHECK": K_CHECK, "K_CHECK_UNITS": [list(u) for u in K_CHECK_UNITS]})
    settings.update(
        {
            "input": Path(args.inputs[0]).name,
            "reference": usr.STEM,
            "FINE_DATASETS": list(FINE_DATASETS),
            "FINE_SPACING": FINE_SPACING,
            "FINE_HALF_WIDTH": FINE_HALF_WIDTH,
            "FINE_RESTARTS": FINE_RESTARTS,
        }
    )
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: a 1° grid of fixed-η fits within 0.2 rad of the refined reference's mode on upright and ±90° "
        "digits, to "
        "measure the evidence's curvature there. Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_fine_reference.py`)."
    )
    suffix = Path(args.inputs[0]).stem.removeprefix(us.STEM).strip("_").removeprefix("symmetry-conditional").strip("_")
    stem = f"{STEM}_{suffix}" if suffix else STEM
    md = "\n".join(
        [
            common.header_markdown("Uncertain symmetry: a 1° reference near the mode", info, settings, command, intro),
            "## Curvature and width\n",
            table,
            *(["\n## Is K = 100 enough for the shape? (e)\n", k_check_table(checks)] if checks else []),
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    common.write_results(
        stem, md, {"info": info, "settings": settings, "command": command, "units": lean}, args.out_dir
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
