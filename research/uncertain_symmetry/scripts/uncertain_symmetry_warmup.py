"""q(η) after a warm-up of q(θ | η) across a wide q(η) (issue 15), against the refined grid reference.

Why. ``uncertain_symmetry_iwae.py`` measured the *amortisation profile* of the full-Bayes fits: the
fitted guide's own IWAE_K(η) at fixed η. On upright digits (seeds 0 and 2) it loses 24–46 nats more at
the reference's mode than near q(η), for the mean-field and the symmetry-conditional guide, before and
after the IWAE refinement. The grid reference fits q(θ) afresh at every η; one guide's q(θ | η), linear
in η and trained only where q(η) draws, is good only near the η it was trained at — and q(η), whose
optimum is ∝ p(η) exp(bound(η)) of that same conditional, stays there. Two changes address the two
halves of that (issue 15's closing note named both; neither had been tried):

* **a wider training distribution for q(θ | η)**:
  :func:`research.uncertain_symmetry.symmetry_warmup.warm_up_conditional` holds q(η) at a wide start r(η)
  while everything else trains (the objective is then E_r(η)[ELBO(θ | η)] + const), before the usual
  joint fit;
* **a nonlinear θ | η dependence**: the symmetry-conditional guide's ``symmetry_dependence="rbf"``
  (fixed Gaussian bumps of η's unconstrained coordinate beside the linear term), so that one guide can
  hold a different weight location for each region of η that the warm-up visits.

Method (every setting fixed before any fit of this script ran; nothing here was tuned on its results):

a. **Fit.** For each variant (``"rbf"``: both changes; ``"linear"``: the warm-up alone, today's linear
   dependence), each dataset and each seed: ``InvariantMLP`` as in ``uncertain_symmetry.py`` (the input
   run's size, ``symmetry_prior="uniform"``, ``init_seed = seed``); the symmetry-conditional guide with
   that dependence and ``symmetry_init_scale = π/√3`` — q(u_η) starts as N(0, π²/3) in u = logit(η/π),
   the logistic spread of the U(0, π) prior, so r(η) covers the prior's range (90 %: η ∈ [0.15, 2.99]);
   every other guide setting the library default. Then ``WARMUP_STEPS`` = 2000 steps of
   ``warm_up_conditional`` (half the joint fit; the library's fit defaults: batch 128, Adam lr 0.05,
   cosine schedule, one particle, seed = the unit's seed), then the input run's joint fit (4000 steps,
   the same settings, seed = the unit's seed). The model's random features are the input run's.
b. **Evaluation** (in the same call): ``num_draws`` draws of q(η) (seeded by the unit's seed), the
   IWAE_K bound on the training set and held-out NLL/accuracy (``eval_samples`` draws) — the input
   run's functions (``uncertain_symmetry.q_draws``, ``bound``, ``held_out``).
c. **Criteria** (``--render``): the issue's criteria (``uncertain_symmetry.criteria``) against the refined
   reference of ``uncertain_symmetry_refined.py`` (four restarts, aligned mean; ``--reference``), beside
   those of the input run's symmetry-conditional ELBO fit (no warm-up, linear) against the same reference.
d. **Amortisation profile** (``--profile``): as ``uncertain_symmetry_iwae.py`` (d) — IWAE_K(η_j) of the
   fitted guide's own q(θ | η_j) on the reference's window, the mean of two estimates — for the fits of (a).

e. **The profile against the reference** (in ``--render``; added after the fits' results were seen, as a
   diagnostic with no setting of its own): the profile's posterior of (d) — the target of a q(η) trained by
   ``elbo="iwae-given-symmetry"`` at K = 100 with this q(θ | η) — against the reference, by the overlap
   masses of the criteria (its mass inside the reference's central 90 % interval, and the reference's inside
   its own). Where it overlaps and q(η) does not, the ELBO fit's q(η) is narrower than its guide's own target.
   (Read later with ``uncertain_symmetry_collapsed.py``: this profile has independent noise at each point, one
   estimate's sd 3–24 nats; with common random numbers on a 1° grid the same guides' IWAE profile posterior is
   about as narrow as q(η) and its place is Monte-Carlo noise, and the ELBO's own optimum sits on q(η). The
   overlaps in (e) came from the noise.)

f. **The IWAE refinement of the warm-up fits** (``--refine``; decided after (e) was seen, its settings
   those of ``uncertain_symmetry_iwae.py`` (b), unchanged: ``elbo="iwae-given-symmetry"``, K = 100, full
   batch, 1000 steps, Adam lr 0.005, cosine schedule, seed = the unit's seed). On an idle CPU core a fit takes
   ~45 min (2.7 s a step), so without a GPU it ran on the units chosen before any of them ran, in this order:
   rbf on upright seeds 0 and 2 (where the earlier fits were furthest from the reference), then rbf on upright
   seed 1 and linear on upright seed 0. The first two took 84 min each (two at a time on a 2-core CPU shared
   with other runs); the other two ran in a later session on a lent H100 (``--refine --device cuda`` from
   ``uncertain_symmetry_collapsed_device.sh``; under 100 s each, the settings unchanged). Their evaluation
   there failed after the fits were saved (the CPU reload picked up the GPU tensors of the same names from
   Pyro's global param store; fixed since: ``load_state`` empties it first), so they were evaluated on the
   CPU from the saved states, and their seconds and final bounds were not recorded. The tables report every
   unit it ran on; a criterion is judged over the seeds it ran on, and the number of those seeds is shown.

g. **Control for the extra steps** (variant ``"no-warm-up"``; decided after (a)–(e) were seen, because the
   warm-up fits train 2000 steps longer than the input run's): the linear variant's guide and start
   (``symmetry_init_scale = π/√3``), fitted jointly for 2000 + 4000 = 6000 steps in one call (one cosine
   schedule), q(η) free throughout; everything else as (a). Where it matches the warm-up fits, the steps,
   not the warm-up, did it.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_warmup_<suffix>.md``, ``.json``, ``.png``; the unit
files (``--work-dir``) hold each fit's evaluation; the fitted states (``.pt``) are not committed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_iwae as usi  # noqa: E402
import uncertain_symmetry_refined as usr  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.symmetry_warmup import warm_up_conditional  # noqa: E402

STEM = "uncertain_symmetry_warmup"
GUIDE = "symmetry-conditional"
#: variant -> the guide's ``symmetry_dependence`` (module docstring, a and g)
VARIANTS: dict[str, str] = {"rbf": "rbf", "linear": "linear", "no-warm-up": "linear"}
#: variants fitted in one call of warm-up + joint steps, q(η) free throughout (the control, g)
CONTROLS = ("no-warm-up",)
WARMUP_STEPS = 2000
SYMMETRY_INIT_SCALE = math.pi / math.sqrt(3.0)
#: the quick size's warm-up (tests)
QUICK_WARMUP_STEPS = 20


def variant_label(variant: str) -> str:
    if variant in CONTROLS:
        return (
            f"symmetry-conditional, {VARIANTS[variant]} dependence, one fit of warm-up + joint steps, "
            "no warm-up (control, g)"
        )
    return f"symmetry-conditional, {VARIANTS[variant]} dependence, warm-up"


def unit_name(variant: str, dataset: str, seed: int) -> str:
    return f"{variant}_{dataset}_seed{seed}"


def make_guide(model: Any, variant: str) -> Any:
    return pi.guides.get(GUIDE, model, symmetry_dependence=VARIANTS[variant], symmetry_init_scale=SYMMETRY_INIT_SCALE)


def fit_unit(
    variant: str, dataset: str, seed: int, size: dict[str, Any], warmup_steps: int, state: Path
) -> dict[str, Any]:
    """Warm-up and joint fit of one unit (module docstring, a), evaluated (b); the state saved to ``state``."""
    data = usi.load_dataset(us.DATASETS[dataset][0], size)
    pyro.set_rng_seed(seed)
    model = us.make_model(data, size, seed, symmetry_prior="uniform")
    guide = make_guide(model, variant)
    if variant in CONTROLS:
        warm = SimpleNamespace(seconds=0.0, final_elbo=float("nan"))
        res = pi.fit(model, guide, data, steps=warmup_steps + size["steps"], seed=seed, progress=False)
    else:
        warm = warm_up_conditional(model, guide, data, steps=warmup_steps, seed=seed, progress=False)
        res = pi.fit(model, guide, data, steps=size["steps"], seed=seed, progress=False)
    draws = us.q_draws(res, data, size, seed)
    x, y = us.train_arrays(data, model)
    meta = {
        "variant": variant,
        "guide": GUIDE,
        "dataset": dataset,
        "seed": seed,
        "size": size,
        "image_shape": list(data.image_shape),
        "num_classes": int(data.num_classes),
    }
    usi.save_state(state, model, guide, x, y, meta)
    return {
        "meta": {k: v for k, v in meta.items() if k != "size"},
        "q_eta": us.draw_summary(draws),
        "q_draws": draws.round(5).tolist(),
        "iwae": us.bound(res, data, size, seed),
        "metrics": us.held_out(res, data, size, seed),
        "warmup_seconds": warm.seconds,
        "fit_seconds": res.seconds,
        "warmup_final_elbo_per_datum": warm.final_elbo,
        "final_elbo_per_datum": res.final_elbo,
    }


def evaluate(res: Any, variant: str, dataset: str, seed: int, size: dict[str, Any]) -> dict[str, Any]:
    """q(η) draws, IWAE_K bound and held-out metrics of a fit (``res.model``, ``res.guide``; module docstring, b)."""
    data = usi.load_dataset(us.DATASETS[dataset][0], size)
    draws = us.q_draws(res, data, size, seed)
    return {
        "meta": {"variant": variant, "guide": GUIDE, "dataset": dataset, "seed": seed},
        "q_eta": us.draw_summary(draws),
        "q_draws": draws.round(5).tolist(),
        "iwae": us.bound(res, data, size, seed),
        "metrics": us.held_out((res.model, res.guide), data, size, seed),
    }


def refine_unit(state: Path, out_state: Path, size: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """A fitted unit continued by ``uncertain_symmetry_iwae.REFINE`` (module docstring, f) on ``device``,
    then evaluated on the CPU from the saved state (as every other unit)."""
    model, guide, x, y, meta = load_state(state, device)
    cfg = usi.refine_config(size)
    t0 = time.perf_counter()
    res = pi.fit(model, guide, (x, y), seed=int(meta["seed"]), progress=False, device=device, **cfg)
    done = {
        "refine": cfg,
        "device": device,
        "refine_seconds": time.perf_counter() - t0,
        "refine_final_bound_per_datum": float(res.final_elbo),
    }
    usi.save_state(out_state, model, guide, x, y, {**meta, **done})
    return evaluate_refined(out_state, size)


def evaluate_refined(out_state: Path, size: dict[str, Any]) -> dict[str, Any]:
    """:func:`evaluate` of a refined state on the CPU (as every other unit; also one refined on a device whose
    run ended before its evaluation). A state saved without its seconds (the first GPU run) reports ``None``."""
    model, guide, _, _, meta = load_state(out_state)
    ev = evaluate(SimpleNamespace(model=model, guide=guide), meta["variant"], meta["dataset"], int(meta["seed"]), size)
    return {
        **ev,
        "refine": meta["refine"],
        "refine_seconds": meta.get("refine_seconds"),
        "device": meta.get("device", "cpu"),
        "refine_final_bound_per_datum": meta.get("refine_final_bound_per_datum"),
    }


def load_state(path: Path, device: str = "cpu") -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """(model, guide, x, y, meta) from :func:`fit_unit`'s state (``uncertain_symmetry_iwae.load_state`` with this
    script's guide of the state's variant)."""
    return usi.load_state(path, device, make_guide=lambda model, meta: make_guide(model, meta["variant"]))


def variant_unit(
    unit: dict[str, Any], ev: dict[str, Any], ref: dict[str, Any], profile: dict[str, Any] | None
) -> dict[str, Any]:
    """The input unit with its full-Bayes fit replaced by a variant's (``ev``), against the refined reference."""
    fb = {
        **unit["full_bayes"],
        "q_eta": ev["q_eta"],
        "iwae": ev["iwae"],
        "metrics": ev["metrics"],
        "final_elbo_per_datum": ev["final_elbo_per_datum"],
    }
    out = usr.refined_unit({**unit, "full_bayes": fb, "q_draws": ev["q_draws"]}, ref)
    out["seconds"] = ev["warmup_seconds"] + ev["fit_seconds"]
    if profile is not None:
        out["profile"] = usi.profile_summary(profile, ref, ev["q_draws"], "refined")
        out["profile"]["vs_reference"] = profile_vs_reference(profile, us.refresh_grid(dict(out)))
    return out


def profile_vs_reference(profile: dict[str, Any], reference: Any) -> dict[str, float]:
    """The profile's posterior (prior U(0, π) on the window) against the reference, both ways (module
    docstring, e): its mass inside the reference's central 90 % interval, and the reference's inside its own."""
    etas = np.asarray(profile["etas"])
    gp = grid_posterior(etas, np.asarray(profile["refined"]), np.full_like(etas, -math.log(us.ETA_MAX)))
    return {
        "profile_in_reference90": gp.mass(reference.quantile(0.05), reference.quantile(0.95)),
        "reference_in_profile90": reference.mass(gp.quantile(0.05), gp.quantile(0.95)),
    }


def comparison_table(base: list[dict[str, Any]], by_variant: dict[str, list[dict[str, Any]]]) -> str:
    """Per unit: the reference, q(η) and overlap of the input fit and of each variant, IWAE_K / N and test NLL;
    ``input``: the input run's fit (4000 steps, no warm-up, q(η) started at scale 1)."""
    names = list(by_variant)
    header = [
        "data, seed",
        "reference: mean ± sd [90 %]",
        *[f"{n}: q(η) mean ± sd [90 %]" for n in ["input", *names]],
        f"overlap (q in grid, grid in q): {' / '.join(['input', *names])}",
        f"IWAE_K / N: {' / '.join(['input', *names])}",
        f"test NLL: {' / '.join(['input', *names])}",
        "type-II test NLL",
    ]
    rows = []
    for i, b in enumerate(base):
        units = [b, *[by_variant[n][i] for n in names]]
        g = b["grid"]["summary"]
        rows.append(
            [
                f"{b['dataset']}, {b['seed']}",
                f"{g['mean']:.3f} ± {g['sd']:.3f} [{g['q05']:.2f}, {g['q95']:.2f}]",
                *[
                    f"{u['full_bayes']['q_eta']['mean']:.3f} ± {u['full_bayes']['q_eta']['sd']:.3f} "
                    f"[{u['full_bayes']['q_eta']['q05']:.2f}, {u['full_bayes']['q_eta']['q95']:.2f}]"
                    for u in units
                ],
                " / ".join(f"{u['overlap']['q_in_grid90']:.2f}, {u['overlap']['grid_in_q90']:.2f}" for u in units),
                " / ".join(f"{u['full_bayes']['iwae']['per_datum']:.4f}" for u in units),
                " / ".join(f"{u['full_bayes']['metrics']['nll']:.4f}" for u in units),
                f"{b['type_ii']['metrics']['nll']:.4f}",
            ]
        )
    return common.md_table(header, rows)


def profile_table(by_variant: dict[str, list[dict[str, Any]]]) -> str:
    header = [
        "fit",
        "data, seed",
        "profile's grid: mode [90 %]",
        "q(η) in the profile's 90 %",
        "gap change: reference mode vs near q(η) (nats)",
        "profile noise, sd of one estimate (nats)",
        "profile vs reference: profile in ref. 90 %, ref. in profile 90 %",
    ]
    rows = []
    for name, units in by_variant.items():
        for u in units:
            if "profile" not in u:
                continue
            p = u["profile"]
            rows.append(
                [
                    name,
                    f"{u['dataset']}, {u['seed']}",
                    f"{p['mode']:.2f} [{p['q05']:.2f}, {p['q95']:.2f}]",
                    f"{p['overlap']['q_in_grid90']:.2f}",
                    f"{p['gap_change']:+.1f}",
                    f"{p['noise']:.1f}",
                    f"{p['vs_reference']['profile_in_reference90']:.2f}, "
                    f"{p['vs_reference']['reference_in_profile90']:.2f}",
                ]
            )
    return common.md_table(header, rows)


def refined_table(pairs: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> str:
    """Per refined unit (module docstring, f): q(η), overlap, IWAE_K / N and test NLL of the warm-up fit → its
    refinement."""
    header = [
        "fit",
        "data, seed",
        "reference: mean ± sd [90 %]",
        "q(η): warm-up fit → refined (mean ± sd [90 %])",
        "overlap (q in grid, grid in q): warm-up fit → refined",
        "IWAE_K / N: warm-up fit → refined",
        "test NLL: warm-up fit → refined",
        "profile posterior: warm-up fit → refined (mode [90 %]; q in it)",
        "profile vs reference: warm-up fit → refined",
        "refinement (wall s; 2 cores shared with other runs)",
    ]
    rows = []
    for name, b, a in pairs:
        g, qb, qa = b["grid"]["summary"], b["full_bayes"]["q_eta"], a["full_bayes"]["q_eta"]
        rows.append(
            [
                name,
                f"{b['dataset']}, {b['seed']}",
                f"{g['mean']:.3f} ± {g['sd']:.3f} [{g['q05']:.2f}, {g['q95']:.2f}]",
                f"{qb['mean']:.3f} ± {qb['sd']:.3f} [{qb['q05']:.2f}, {qb['q95']:.2f}] → "
                f"{qa['mean']:.3f} ± {qa['sd']:.3f} [{qa['q05']:.2f}, {qa['q95']:.2f}]",
                f"{b['overlap']['q_in_grid90']:.2f}, {b['overlap']['grid_in_q90']:.2f} → "
                f"{a['overlap']['q_in_grid90']:.2f}, {a['overlap']['grid_in_q90']:.2f}",
                f"{b['full_bayes']['iwae']['per_datum']:.4f} → {a['full_bayes']['iwae']['per_datum']:.4f}",
                f"{b['full_bayes']['metrics']['nll']:.4f} → {a['full_bayes']['metrics']['nll']:.4f}",
                " → ".join(
                    f"{u['profile']['mode']:.2f} [{u['profile']['q05']:.2f}, {u['profile']['q95']:.2f}]; "
                    f"{u['profile']['overlap']['q_in_grid90']:.2f}"
                    if "profile" in u
                    else "–"
                    for u in (b, a)
                ),
                " → ".join(
                    f"{u['profile']['vs_reference']['profile_in_reference90']:.2f}, "
                    f"{u['profile']['vs_reference']['reference_in_profile90']:.2f}"
                    if "profile" in u
                    else "–"
                    for u in (b, a)
                ),
                "not recorded" if a["refine_seconds"] is None else f"{a['refine_seconds']:.0f}",
            ]
        )
    return common.md_table(header, rows)


def plot(base: list[dict[str, Any]], by_variant: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Per unit: q(η) of the input fit and of each variant against the refined reference."""
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 7))
    axes = fig.subplots(3, (len(base) + 2) // 3, squeeze=False)
    for ax, (i, b) in zip(axes.T.flat, enumerate(base)):
        gp = us.refresh_grid(dict(b))
        units = {"input": b, **{n: by_variant[n][i] for n in by_variant}}
        lo = min(gp.quantile(0.005), *[min(u["q_draws"]) for u in units.values()])
        hi = max(gp.quantile(0.995), *[max(u["q_draws"]) for u in units.values()])
        bins = np.linspace(lo, hi, 40)
        for name, u in units.items():
            ax.hist(u["q_draws"], bins=bins, density=True, alpha=0.4, label=name)
        ax.plot(gp.grid, gp.density, "k-", lw=1.2, label="reference")
        ax.set_xlim(lo, hi)
        ax.set_title(f"{b['dataset']} {b['seed']}", fontsize=8)
        ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = usr.phase_parser(
        __doc__,
        "the symmetry-conditional run, whose fits had no warm-up",
        "where the unit files go (resumable)",
        {
            "fit": "warm-up, joint fit and evaluation of every unit (CPU)",
            "profile": "the amortisation profile of every fitted unit",
            "refine": "continue fitted units by the IWAE-given-η refinement (f)",
            "render": "no fits: the tables from the unit files",
        },
        "comma-separated unit names <variant>_<dataset>_seed<s>",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}")
    parser.add_argument(
        "--device", default="cpu", help="device of --refine (cuda on a GPU machine; evaluated on the CPU)"
    )
    args, payloads, _, settings, size, keys = usr.parse_phase_args(parser, argv)
    if len(payloads) != 1:
        parser.error("--from: one results file of uncertain_symmetry.py (the fits without warm-up)")
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(set(variants) - set(VARIANTS))}; use {list(VARIANTS)}")
    payload = payloads[0]
    warmup = QUICK_WARMUP_STEPS if size == {k: us.SIZES["quick"][k] for k in size} else WARMUP_STEPS
    jobs = [(v, d, s) for v in variants for d, s in keys]
    if args.only:
        jobs = [j for j in jobs if unit_name(*j) in set(args.only.split(","))]
    for sub in ("evaluated", "states", "profile"):
        (args.work_dir / sub).mkdir(parents=True, exist_ok=True)
    for variant, dataset, seed in jobs if not args.render else []:
        name = unit_name(variant, dataset, seed)
        evaluated, state = args.work_dir / "evaluated" / f"{name}.json", args.work_dir / "states" / f"{name}.pt"
        if args.fit and not evaluated.exists():
            t0 = time.perf_counter()
            ev = fit_unit(variant, dataset, seed, size, warmup, state)
            evaluated.write_text(json.dumps(ev, indent=1) + "\n")
            common.log(
                f"{name}: q(η) mean {ev['q_eta']['mean']:.3f} sd {ev['q_eta']['sd']:.3f} "
                f"({time.perf_counter() - t0:.0f} s) -> {evaluated}"
            )
        elif args.refine and not (args.work_dir / "evaluated" / f"{name}_refined.json").exists():
            if not state.exists():
                parser.error(f"--refine: {state} is missing (run --fit first)")
            refined = args.work_dir / "states" / f"{name}_refined.pt"
            ev = evaluate_refined(refined, size) if refined.exists() else refine_unit(state, refined, size, args.device)
            (args.work_dir / "evaluated" / f"{name}_refined.json").write_text(json.dumps(ev, indent=1) + "\n")
            common.log(
                f"{name}: refined q(η) mean {ev['q_eta']['mean']:.3f} sd {ev['q_eta']['sd']:.3f} "
                f"({ev['refine_seconds'] or 0:.0f} s on {ev['device']})"
            )
        elif args.profile:
            if not state.exists():
                parser.error(f"--profile: {state} is missing (run --fit first)")
            etas = [
                j * usr.STEP for j in usr.read_unit_file(parser, args.reference, dataset, seed, "--reference")["window"]
            ]
            # the fit's profile, and its refinement's (f) where that ran
            for stem, path in ((name, state), (f"{name}_refined", args.work_dir / "states" / f"{name}_refined.pt")):
                out_path = args.work_dir / "profile" / f"{stem}.json"
                if out_path.exists() or not path.exists():
                    continue
                model, guide, x, y, _ = load_state(path)
                estimates = usi.amortised_profile(model, guide, x, y, etas, int(size["iwae_K"]), usi.PROFILE_REPS, seed)
                out = {
                    "etas": etas,
                    "K": int(size["iwae_K"]),
                    "reps": usi.PROFILE_REPS,
                    "seed": seed,
                    "refined_estimates": estimates,
                    "refined": np.mean(estimates, axis=0).tolist(),
                }
                out_path.write_text(json.dumps(out, indent=1) + "\n")
                common.log(f"{stem}: amortisation profile on {len(etas)} points")
    if not args.render:
        return 0
    refs = {(d, s): usr.read_unit_file(parser, args.reference, d, s, "--reference") for d, s in keys}
    base, by_variant = [], {v: [] for v in variants}
    for dataset, seed in keys:
        ref, unit = refs[(dataset, seed)], usi.input_unit(payload, dataset, seed)
        base.append(usr.refined_unit(unit, ref))
        for v in variants:
            path = args.work_dir / "evaluated" / f"{unit_name(v, dataset, seed)}.json"
            if not path.exists():
                parser.error(f"--render: {path} is missing (run --fit first)")
            prof = args.work_dir / "profile" / f"{unit_name(v, dataset, seed)}.json"
            by_variant[v].append(
                variant_unit(
                    unit, json.loads(path.read_text()), ref, json.loads(prof.read_text()) if prof.exists() else None
                )
            )
    refined: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    pairs = []
    for v in variants:
        for (dataset, seed), b in zip(keys, by_variant[v]):
            path = args.work_dir / "evaluated" / f"{unit_name(v, dataset, seed)}_refined.json"
            if path.exists():
                ref, ev = refs[(dataset, seed)], json.loads(path.read_text())
                prof = args.work_dir / "profile" / f"{unit_name(v, dataset, seed)}_refined.json"
                a = {
                    **variant_unit(
                        usi.input_unit(payload, dataset, seed),
                        {
                            **ev,
                            "final_elbo_per_datum": ev["refine_final_bound_per_datum"],
                            "warmup_seconds": 0.0,
                            "fit_seconds": 0.0,
                        },
                        ref,
                        json.loads(prof.read_text()) if prof.exists() else None,
                    ),
                    "refine_seconds": ev["refine_seconds"],
                }
                refined[v].append(a)
                pairs.append((v, b, a))
    verdicts = {f"{payload['settings']['guide']}, no warm-up (the input)": us.criteria(base)}
    for v in variants:
        verdicts[variant_label(v)] = us.criteria(by_variant[v])
    for v in variants:
        if refined[v]:
            verdicts[f"{variant_label(v)}, then the IWAE refinement (f; the seeds it ran on)"] = us.criteria(refined[v])
    suffix = Path(args.inputs[0]).stem.removeprefix(us.STEM).strip("_").removeprefix(GUIDE).strip("_")
    stem = f"{STEM}_{suffix}" if suffix else STEM
    settings.update(
        {
            "input": Path(args.inputs[0]).name,
            "reference": f"{usr.STEM}: {usr.RESTARTS} restarts, {usr.RULES[0]}",
            "guide": GUIDE,
            "variants": {v: VARIANTS[v] for v in variants},
            "warmup_steps": warmup,
            "symmetry_init_scale": SYMMETRY_INIT_SCALE,
            "fit seconds (warm-up + joint, all units)": round(
                sum(u["seconds"] for us_ in by_variant.values() for u in us_), 1
            ),
        }
    )
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15's criteria for q(η) of the symmetry-conditional guide after a warm-up of q(θ | η) across a wide, "
        "fixed q(η) (`research.uncertain_symmetry.symmetry_warmup.warm_up_conditional`), with the linear and with the "
        'new nonlinear (`symmetry_dependence="rbf"`) dependence on η, against the refined grid reference of '
        "`uncertain_symmetry_refined.py`, beside the input run's fits (no warm-up, linear). Method and the reason for "
        "every setting: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_warmup.py`)."
    )
    parts = [
        common.header_markdown(
            "Uncertain symmetry: q(η) after a warm-up of q(θ | η) across a wide q(η)", info, settings, command, intro
        ),
        "## Verdicts\n",
        "Seeds on which each criterion holds.\n",
        usr.verdict_table(verdicts),
        "\n## Unit by unit\n",
        comparison_table(base, by_variant),
    ]
    for v in variants:
        parts += [
            f"\n### {variant_label(v)}: the issue's criteria against the refined reference\n",
            us.criteria_table(verdicts[variant_label(v)]),
        ]
    if pairs:
        parts += [
            "\n## The IWAE refinement of the warm-up fits (module docstring, f)\n",
            "Every unit it ran on (no GPU in this session: two at a time on a 2-core CPU shared with other runs), with "
            "the amortisation profile (d) of the warm-up fit and of its refinement, and each profile's posterior "
            "against the reference (e).\n",
            refined_table(pairs),
        ]
        for v in variants:
            if refined[v]:
                label = f"{variant_label(v)}, then the IWAE refinement (f; the seeds it ran on)"
                parts += [
                    f"\n### {v}, refined: the issue's criteria on the units it ran on\n",
                    us.criteria_table(verdicts[label]),
                ]
    if any("profile" in u for units in by_variant.values() for u in units):
        parts += [
            "\n## The amortisation profile of the fits (module docstring, d)\n",
            "IWAE_K(η) of each fit's own q(θ | η) at fixed η on the reference's window, its grid posterior, and how "
            "much more the fit loses against the per-η fits at the reference's mode than near its own q(η).\n",
            profile_table(by_variant),
        ]
    parts += [f"\n![q(η) per unit]({stem}.png)\n", "## Method\n", __doc__.split("\n\n", 1)[1]]
    payload_out = {
        "info": info,
        "settings": settings,
        "command": command,
        "verdicts": verdicts,
        "units": {v: usr.without_draws(u) for v, u in by_variant.items()},
        "refined_units": {v: usr.without_draws(u) for v, u in refined.items() if u},
    }
    common.write_results(stem, "\n".join(parts), payload_out, args.out_dir)
    plot(base, by_variant, Path(args.out_dir) / f"{stem}.png")
    usr.log_verdicts(verdicts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
