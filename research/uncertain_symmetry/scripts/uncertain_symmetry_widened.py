r"""Issue 15: re-train q(θ | η) across a widened q(η), then collapse — does q* take the evidence's width near the mode?

Why. ``uncertain_symmetry_fine_reference.py`` measured the evidence near its mode on 1° points: on upright digits
it implies sd 0.063 [90 %: 0.057, 0.071], 0.037 [0.034, 0.040] and 0.063 [0.054, 0.080] on seeds 0–2, while
the 100-stream IWAE q* of the warm-up fits (``uncertain_symmetry_collapsed.py`` (g)) has sd 0.034–0.051: too
narrow on seeds 0 and 2. q* ∝ p(η) e^{IWAE_K(η)} is set by the fitted q(θ | η) alone, and after the joint fit that
conditional was trained only where the narrow Gaussian q(η) (sd ≈ 0.03) draws: further out it is worse than a
fit at that η (the amortisation gap grows away from q(η)), which sharpens IWAE_K(η) and so q*. A narrow q(η)
keeps the conditional narrow and the conditional keeps q* narrow. This script breaks that loop once:
:func:`~research.uncertain_symmetry.symmetry_warmup.warm_up_conditional` with ``widen`` re-trains the conditional
with q(η) held at its place but wider, then collapses. A control re-trains as long with q(η) held as it is.

Method (every setting fixed and committed before any unit of this script ran):

a. **Units.** The rbf and linear warm-up fits of ``uncertain_symmetry_warmup.py`` (its saved states, ``--states``)
   on upright digits, seeds 0–2 (``SEEDS``): the units that have a 1° reference (``--fine``). Run order: seeds 0,
   2, then 1 (q* was too narrow on 0 and 2); per seed rbf, then linear; per fit the treatments in the order of (b).
b. **Treatments.** ``"widened"``: ``EXTRA_STEPS`` = 2000 steps of ``warm_up_conditional(model, guide, (x, y),
   widen=WIDEN, steps=EXTRA_STEPS, seed=seed)`` — q(η) held at its location with its scale × ``WIDEN`` = 3 (in
   u = logit(η/π): the fitted q(η)'s sd of ≈ 0.03 rad becomes ≈ 0.09, its central 95 % about ±0.18 rad, the 1°
   reference's ±0.2 rad window), then restored; everything else trains with the library's fit defaults (batch
   128, Adam lr 0.05, cosine schedule, one particle), the warm-up's settings. ``"held"`` (the control): the same
   with ``widen=1`` — as many steps, q(η) held as it is. ``"as fitted"``: the state unchanged.
c. **Collapse.** ``collapse_symmetry(model, guide, x, y, grid=points, K=100, streams=STREAMS, stream_batch=1,
   seed=seed)`` on the CPU: the 1° reference's 23 points of the unit (η₀ ± 0.2 rad, η₀ its mode), ``STREAMS`` = 20
   streams of K = 100 (the (g) streams' per-stream curvature on this window has sd 125–230 nats/rad², so 20
   streams give the mean curvature to ≈ ±40 — about ±0.004 in an implied sd of 0.05), common random numbers,
   prior U(0, π) truncated to the points.
d. **Measures.** (i) q*'s sd on the points (its grid posterior) beside the 1° reference's grid sd on the same
   points; (ii) the least-squares quadratic through the mean profile (``uncertain_symmetry_collapsed
   .quadratic_curvature``, x = η − η₀): its curvature and implied sd, and each stream's own curvature: mean,
   standard error and Student-t 90 % interval (19 dof), mapped to sd (``uncertain_symmetry_fine_reference
   .curvature_spread``); (iii) **the verdict**: whether q*'s implied sd lies inside the 1° reference's 90 % interval
   of its section (c) (and of its (d)); (iv) the amortisation gap at the mode: the 1° reference's mean IWAE_100 at
   η₀ over its restarts (each a fit at that η) minus q*'s mean profile there; (v) the mean profile's shape noise
   (``profile_noise``); (vi) held-out NLL and accuracy (``eval_samples`` draws, seed = the unit's) of the guide
   with its own, restored Gaussian q(η) and of the collapsed guide (η ~ q*, θ ~ q(θ | η)); (vii) the re-training's
   seconds and final ELBO per datum.
e. **Cross-check** (``--render``): for ``"as fitted"``, the same quadratic through (g)'s 100-stream GPU profile of
   the same state, linearly interpolated to the points: the 20-stream CPU estimate should agree with it.

f. **The gap across the window** (``--render``; a diagnostic added after the table of (d) was seen, no setting of its
   own). The gap of (d, iv) at the window's two ends (η₀ ± 0.2 rad: the reference's mean over its restarts there
   minus q*'s mean profile), their mean less the gap at the mode: how much more the conditional loses to a fit at
   that η at the ends than at the mode — the amortisation gap's growth that sharpens q* (a Gaussian of sd 0.063
   falls by 5.0 nats from its mode to ±0.2 rad, one of sd 0.047 by 9.1).

g. **q* at K = 1000** (``--k-check``; added after ``uncertain_symmetry_fine_reference.py`` (e) found one reference
   restart reshaped by 7–11 nats from K = 100 to 1000, settings fixed and committed before it ran). For
   ``K_CHECK_UNITS`` (rbf and linear, seed 0, as fitted; seed 2's two fits added while seed 0's ran, when a core came
   free, before any seed-2 result of this section or of the K = 1000 reference beyond restart 0 was seen): (c) with K =
   ``uncertain_symmetry_fine_reference.K_CHECK`` = 1000 and ``K_CHECK_STREAMS`` = 10 streams (a K = 1000 stream costs
   ten K = 100 ones), evaluated as (d, i–iii) against the K = 1000 reference of that script's (f) (its four
   restarts' K = 1000 bounds), beside the K = 100 q* and reference; no held-out metrics.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_widened_<suffix>.md``, ``.json``; the unit files
(``--work-dir``).
"""

from __future__ import annotations

import argparse
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
import uncertain_symmetry_fine_reference as usf  # noqa: E402
import uncertain_symmetry_iwae as usi  # noqa: E402
import uncertain_symmetry_warmup as usw  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.collapsed_symmetry import collapse_symmetry  # noqa: E402
from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional  # noqa: E402

STEM = "uncertain_symmetry_widened"
DATASET = "upright"
SEEDS = (0, 2, 1)
VARIANTS = ("rbf", "linear")
#: treatment -> ``widen`` of the re-training (``None``: no re-training)
TREATMENTS: dict[str, float | None] = {"widened": 3.0, "held": 1.0, "as fitted": None}
WIDEN = TREATMENTS["widened"]
EXTRA_STEPS = 2000
STREAMS = 20
K_CHECK_UNITS = (
    ("rbf", 0, "as fitted"),
    ("linear", 0, "as fitted"),
    ("rbf", 2, "as fitted"),
    ("linear", 2, "as fitted"),
)
K_CHECK_STREAMS = 10


def unit_name(variant: str, seed: int, treatment: str) -> str:
    return f"{usw.unit_name(variant, DATASET, seed)}_{treatment.replace(' ', '-')}"


def units() -> list[tuple[str, int, str]]:
    """(variant, seed, treatment) in the run order of (a)."""
    return [(v, s, t) for s in SEEDS for v in VARIANTS for t in TREATMENTS]


def run_unit(
    state: Path,
    fine: dict[str, Any],
    treatment: str,
    extra_steps: int = EXTRA_STEPS,
    K: int | None = None,
    streams: int | None = None,
) -> dict[str, Any]:
    """(b)–(d, vi–vii) for one unit: re-train (unless ``"as fitted"``), collapse on the 1° points, evaluate. With
    ``K`` (g): the collapse at that K with ``streams``, no held-out metrics."""
    model, guide, x, y, meta = usw.load_state(state)
    seed, size = int(meta["seed"]), meta["size"]
    streams = STREAMS if streams is None else streams
    k = int(K or size["iwae_K"])
    out: dict[str, Any] = {
        "meta": {"variant": meta["variant"], "dataset": meta["dataset"], "seed": seed, "treatment": treatment}
    }
    widen = TREATMENTS[treatment]
    if widen is not None:
        res = warm_up_conditional(model, guide, (x, y), widen=widen, steps=extra_steps, seed=seed, progress=False)
        out.update(
            {
                "widen": widen,
                "extra_steps": extra_steps,
                "train_seconds": res.seconds,
                "final_elbo_per_datum": float(res.final_elbo),
            }
        )
    t0 = time.perf_counter()
    collapsed = collapse_symmetry(
        model, guide, x, y, grid=np.asarray(fine["etas"]), K=k, streams=streams, stream_batch=1, seed=seed
    )
    out.update(
        {
            "collapse_seconds": time.perf_counter() - t0,
            "streams": streams,
            "K": k,
            "grid": fine["etas"],
            "profile": collapsed.posterior.log_evidence.tolist(),
            "profile_noise": collapsed.profile_noise,
            "stream_profiles": collapsed.stream_profiles.double().numpy().round(4).tolist(),
        }
    )
    if K is not None:
        return out
    data = usi.load_dataset(us.DATASETS[meta["dataset"]][0], size)
    n = int(size["eval_samples"])
    out["metrics"] = {
        "gaussian": pi.evaluate((model, guide), data, num_samples=n, seed=seed),
        "collapsed": pi.evaluate((model, collapsed), data, num_samples=n, seed=seed),
    }
    return out


def widths(unit: dict[str, Any], fine: dict[str, Any]) -> dict[str, Any]:
    """(d, i–v) of one unit file against its 1° reference unit."""
    etas, eta0 = np.asarray(fine["etas"]), float(fine["eta0"])
    profile, each = np.asarray(unit["profile"]), np.asarray(unit["stream_profiles"])
    x = etas - eta0
    log_prior = np.full_like(etas, -math.log(us.ETA_MAX))
    gap = [
        float(np.mean([f["iwae"]["value"] for f in fine["fits"] if f["k"] == k]) - profile[k]) for k in range(len(etas))
    ]
    at0 = int(np.argmin(np.abs(x)))
    quad = usc.quadratic_curvature(x, profile, math.nan)
    return {
        "grid_sd": grid_posterior(etas, profile, log_prior).sd,
        "sd": quad["sd"],
        "c": quad["c"],
        "streams": usf.curvature_spread(np.array([usc.quadratic_curvature(x, p, math.nan)["c"] for p in each])),
        "gap_at_mode": gap[at0],
        "gap_growth_at_ends": 0.5 * (gap[0] + gap[-1]) - gap[at0],
        "profile_noise": unit["profile_noise"],
    }


def gpu_cross_check(path: Path, fine: dict[str, Any]) -> float:
    """(e): implied sd of the quadratic through (g)'s 100-stream profile interpolated to the 1° points
    (``nan``: none)."""
    if not path.exists():
        return math.nan
    g = json.loads(path.read_text())
    etas = np.asarray(fine["etas"])
    if etas[0] < g["grid"][0] or etas[-1] > g["grid"][-1]:
        return math.nan
    return usc.quadratic_curvature(etas - fine["eta0"], np.interp(etas, g["grid"], g["profile"]), math.nan)["sd"]


def k_check_rows(work: Path, fine_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(g): per K_CHECK unit that ran, q* at K = 100 and at K = 1000 against the 1° reference at the same K (its
    complete restarts)."""
    rows, lean = [], []
    for variant, seed, treatment in K_CHECK_UNITS:
        path = work / f"{unit_name(variant, seed, treatment)}_k{usf.K_CHECK}.json"
        check_path = fine_dir / f"{DATASET}_seed{seed}_k{usf.K_CHECK}.json"
        if not path.exists() or not check_path.exists():
            continue
        check = json.loads(check_path.read_text())
        for K, unit_path, fine_unit in (
            (100, work / f"{unit_name(variant, seed, treatment)}.json", usf.k_check_reference(check, "iwae")),
            (usf.K_CHECK, path, usf.k_check_reference(check)),
        ):
            unit, fine = json.loads(unit_path.read_text()), usf.fine_summary(fine_unit)
            w = widths(unit, fine_unit)
            lo, hi = fine["sd_interval"]
            rows.append(
                f"| {variant} | {seed} | {K} | {unit['streams']} | {w['grid_sd']:.3f} ({fine['grid_sd']:.3f}) | "
                f"{w['sd']:.3f} {usf.interval(*w['streams']['sd_interval'])} | {fine['sd']:.3f} {usf.interval(lo, hi)} "
                f"({len(fine['restarts'])} restarts) | {'yes' if lo <= w['sd'] <= hi else 'no'} | "
                f"{w['gap_at_mode']:+.1f}; {w['gap_growth_at_ends']:+.1f} | {w['profile_noise']:.2f} |"
            )
            lean.append(
                {
                    "unit": unit_name(variant, seed, treatment),
                    "K": K,
                    "widths": w,
                    "fine": {k: fine[k] for k in ("sd", "sd_interval", "grid_sd", "restarts")},
                }
            )
    if not rows:
        return [], []
    head = [
        "fit",
        "seed",
        "K",
        "streams",
        "q* sd on the points (reference's)",
        "q* implied sd [90 %, streams' curvatures]",
        "reference implied sd [90 %] (its c), at the same K",
        "inside",
        "gap at the mode; its growth at ±0.2 rad (nats)",
        "shape noise (nats)",
    ]
    return (
        [
            "\n## q* and the reference at K = 1000 (g)\n",
            "| " + " | ".join(head) + " |",
            "|:---|---:|---:|---:|" + "---:|" * (len(head) - 4),
            *rows,
        ],
        lean,
    )


def render(work: Path, fine_dir: Path, collapsed_dir: Path, out_dir: Path | None) -> tuple[Path, Path]:
    rows, lean, counts = [], [], {t: [0, 0] for t in TREATMENTS}
    for variant, seed, treatment in sorted(
        units(), key=lambda u: (u[1], VARIANTS.index(u[0]), list(TREATMENTS).index(u[2]))
    ):
        path = work / f"{unit_name(variant, seed, treatment)}.json"
        if not path.exists():
            rows.append(f"| {variant} | {seed} | {treatment} | not run |" + " |" * 8)
            continue
        unit, fine_unit = (
            json.loads(path.read_text()),
            json.loads((fine_dir / f"{DATASET}_seed{seed}.json").read_text()),
        )
        fine, w = usf.fine_summary(fine_unit), widths(unit, fine_unit)
        lo, hi = fine["sd_interval"]
        rlo, rhi = fine["restart_curvature"]["sd_interval"]
        inside, inside_d = lo <= w["sd"] <= hi, rlo <= w["sd"] <= rhi
        counts[treatment][0] += inside
        counts[treatment][1] += 1
        st = w["streams"]
        gpu = gpu_cross_check(
            collapsed_dir / "collapsed" / f"{usc.state_stem(variant, DATASET, seed)}_streams.json", fine_unit
        )
        m = unit["metrics"]
        train = f"{unit['final_elbo_per_datum']:.3f}; {unit['train_seconds']:.0f} s" if "train_seconds" in unit else "–"
        rows.append(
            f"| {variant} | {seed} | {treatment} | {w['grid_sd']:.3f} ({fine['grid_sd']:.3f}) | {w['sd']:.3f} "
            f"{usf.interval(*st['sd_interval'])} | {fine['sd']:.3f} {usf.interval(lo, hi)} | "
            f"{'yes' if inside else 'no'}, "
            f"{'yes' if inside_d else 'no'} | {w['gap_at_mode']:+.1f}; {w['gap_growth_at_ends']:+.1f} | "
            f"{w['profile_noise']:.2f} | "
            f"{m['gaussian']['nll']:.3f} / {m['collapsed']['nll']:.3f} | {train} | "
            f"{'–' if math.isnan(gpu) else f'{gpu:.3f}'} |"
        )
        lean.append(
            {
                "unit": unit_name(variant, seed, treatment),
                **unit["meta"],
                "widths": w,
                "fine": {k: fine[k] for k in ("sd", "sd_interval", "grid_sd")},
                "fine_restart_interval": [rlo, rhi],
                "inside": bool(inside),
                "inside_restart_interval": bool(inside_d),
                "metrics": m,
                "gpu_cross_check_sd": gpu,
                **{k: unit[k] for k in ("train_seconds", "final_elbo_per_datum", "collapse_seconds") if k in unit},
            }
        )
    head = [
        "fit",
        "seed",
        "treatment",
        "q* sd on the points (1° reference's)",
        "q* implied sd [90 %, 20 streams' curvatures]",
        "1° reference implied sd [90 %] (its c)",
        "q* inside the reference's interval (c), (d)",
        "gap at the mode: reference − q* profile; its growth at ±0.2 rad (f) (nats)",
        "shape noise (nats)",
        "test NLL: Gaussian q(η) / q*",
        "re-training: final ELBO/N; seconds",
        "(g) 100-stream GPU profile: implied sd",
    ]
    table = "\n".join(["| " + " | ".join(head) + " |", "|:---|---:|:---|" + "---:|" * (len(head) - 3), *rows])
    verdicts = "\n".join(
        f"- {t}: q* inside the 1° reference's interval (c) on {k} of {n} units" for t, (k, n) in counts.items()
    )
    k_rows, k_lean = k_check_rows(work, fine_dir)
    settings = {
        "DATASET": DATASET,
        "SEEDS": list(SEEDS),
        "VARIANTS": list(VARIANTS),
        "TREATMENTS": TREATMENTS,
        "EXTRA_STEPS": EXTRA_STEPS,
        "STREAMS": STREAMS,
        "K_CHECK_UNITS": [list(u) for u in K_CHECK_UNITS],
        "K_CHECK_STREAMS": K_CHECK_STREAMS,
        "K_CHECK": usf.K_CHECK,
        "K": "the input run's iwae_K",
        "fits": "uncertain_symmetry_warmup.py's states",
        "reference": usf.STEM,
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: the warm-up fits' conditional q(θ | η) re-trained across a widened q(η) (and, as a control, "
        "as long with "
        "q(η) held as it is), then collapsed on the 1° reference's points, against that reference. Method: section "
        "*Method* (the module docstring of `research/uncertain_symmetry/scripts/uncertain_symmetry_widened.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown(
                "Uncertain symmetry: a widened conditional before the collapse", info, settings, command, intro
            ),
            "## Verdicts\n",
            verdicts,
            "\n## Units\n",
            table,
            *k_rows,
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    payload = {
        "info": info,
        "settings": settings,
        "command": command,
        "counts": counts,
        "units": lean,
        "k_check": k_lean,
    }
    return common.write_results(f"{STEM}_steps4000", md, payload, out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--fit", action="store_true", help="re-train and collapse every unit not yet in --work-dir (b, c)"
    )
    group.add_argument("--render", action="store_true", help="no fits: the tables from the unit files (d, e)")
    group.add_argument("--k-check", action="store_true", help="the K = 1000 collapse of K_CHECK_UNITS (g)")
    parser.add_argument(
        "--states",
        type=Path,
        default=Path("research/uncertain_symmetry/results/uncertain_symmetry_warmup_units/states"),
        help="uncertain_symmetry_warmup.py's saved states",
    )
    parser.add_argument(
        "--fine",
        type=Path,
        default=Path("research/uncertain_symmetry/results/uncertain_symmetry_fine_reference_units"),
        help="uncertain_symmetry_fine_reference.py's unit files",
    )
    parser.add_argument(
        "--collapsed",
        type=Path,
        default=Path("research/uncertain_symmetry/results/uncertain_symmetry_collapsed_units"),
        help="uncertain_symmetry_collapsed.py's work dir (its (g) units, for the cross-check)",
    )
    parser.add_argument("--work-dir", type=Path, default=Path(f"research/uncertain_symmetry/results/{STEM}_units"))
    parser.add_argument("--only", default=None, help="comma-separated unit names <fit>_upright_seed<s>_<treatment>")
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    todo = [u for u in units() if not args.only or unit_name(*u) in args.only.split(",")]
    if args.only and not todo:
        parser.error(f"--only {args.only}: no such unit (names: {', '.join(unit_name(*u) for u in units())})")
    if args.render:
        return 0 if render(args.work_dir, args.fine, args.collapsed, args.out_dir) else 1
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.k_check:
        todo = [u for u in K_CHECK_UNITS if u in todo]
    for variant, seed, treatment in todo:
        suffix = f"_k{usf.K_CHECK}" if args.k_check else ""
        out = args.work_dir / f"{unit_name(variant, seed, treatment)}{suffix}.json"
        state = args.states / f"{usw.unit_name(variant, DATASET, seed)}.pt"
        fine_path = args.fine / f"{DATASET}_seed{seed}.json"
        if out.exists():
            continue
        for need, what in ((state, "--states"), (fine_path, "--fine")):
            if not need.exists():
                parser.error(f"{what}: {need} is missing")
        common.log(f"{unit_name(variant, seed, treatment)}: start")
        fine = json.loads(fine_path.read_text())
        unit = (
            run_unit(state, fine, treatment, K=usf.K_CHECK, streams=K_CHECK_STREAMS)
            if args.k_check
            else run_unit(state, fine, treatment)
        )
        out.write_text(json.dumps(unit) + "\n")
        w = widths(unit, fine)
        common.log(
            f"{unit_name(variant, seed, treatment)}: implied sd {w['sd']:.3f}, grid sd {w['grid_sd']:.3f}, "
            f"noise {w['profile_noise']:.2f}, {unit['collapse_seconds']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
