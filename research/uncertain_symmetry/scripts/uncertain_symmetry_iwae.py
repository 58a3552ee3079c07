"""q(η) refined by the IWAE bound given η (issue 15), against the refined grid reference.

Why. ``uncertain_symmetry_refined.py`` found q(η) of the ELBO fits below the fixed-η IWAE grid on upright
digits on every seed, and the same fits' ELBO grid between the two: the ELBO's gap to ``log p(D | η)``
grows with η there (16–24 nats over the window), and the q(η) that maximises an ELBO is
∝ p(η) exp(ELBO(η)) at best (Turner & Sahani 2011). The bound
``elbo="iwae-given-symmetry"`` (:class:`research.uncertain_symmetry.iwae_given_symmetry.LeanIWAEGivenSymmetry_ELBO`)
is an ELBO in η and an IWAE_K bound in θ given η; the q(η) that maximises it is ∝ p(η) exp(IWAE_K(η)),
which is what the grid reference estimates (IWAE_K after separate fixed-η fits). At the reference's K
both target the same posterior, and the question becomes whether one joint fit gets there.

Method (every setting fixed before any refinement ran; nothing here was tuned on its results):

a. **Start.** For each input run (``--from``: the 4000-step results of ``uncertain_symmetry.py``, one per
   guide) and each (dataset, seed): its full-Bayes ELBO fit, repeated as it ran (``uncertain_symmetry.fit``,
   the unit's seed; deterministic on the CPU). Its q(η) draws are compared with the stored ones (the
   reproduction check, ``max |Δ draw|``), and model and guide are saved (``--prepare``; state dicts, read
   back with ``weights_only=True``).
b. **Refinement.** That fit continued by ``REFINE``: ``elbo="iwae-given-symmetry"`` with K = the input's
   ``iwae_K`` (100, the reference's K), 1000 steps, Adam lr 0.005 for means, scales and factors, full batch
   (the bound is then one on ``log p(D)`` of all N images, like the reference's IWAE bounds), cosine
   schedule, seed = the unit's seed: ``symmetry_posterior_basis.py``'s IWAE refinement of basis regression
   (1000 steps, lr 0.005, full batch) with this bound and this K. The mean-field and the
   symmetry-conditional guides both draw η on its own, so both can share it; the symmetry-conditional
   one adapts q(θ | η) to each η draw, the mean-field one cannot (its IWAE_K(η) uses one q(θ) for every
   η). ``--refine`` runs it (``--device cuda``: 2.7 s a step on one CPU core at K = 100, ~45 min a fit;
   on a lent GPU machine without this project's environment,
   ``research/uncertain_symmetry/scripts/uncertain_symmetry_iwae_device.sh`` installs what is missing, refines every
   prepared unit and returns the states as one archive).
c. **Evaluation** (``--render``, CPU). ``num_draws`` draws of the refined q(η) (seeded by the unit's
   seed), the issue's criteria (``uncertain_symmetry.criteria``) against the refined reference of
   ``uncertain_symmetry_refined.py`` (four restarts, aligned mean; its work dir, ``--reference``), beside
   the criteria of the ELBO fits' q(η) against the same reference; the IWAE_K bound on the training set
   and the held-out NLL/accuracy (``eval_samples`` draws) of the refined fit beside the ELBO fit's.

d. **Amortisation profile** (``--profile``, CPU; added after (c)'s results were seen, as a diagnostic,
   its settings fixed before it ran). The grid reference fits q(θ) afresh at every η_j; full Bayes has one
   guide for all η, and its q(η) can only follow ``IWAE_K(η)`` as that guide's q(θ | η) gives it. For each
   fit (the ELBO fit and its refinement): IWAE_K(η_j) of the guide's own q(θ | η_j) with η held at η_j
   (:func:`~research.uncertain_symmetry.evidence_profile.guide_evidence_profile`; K = ``iwae_K``, the
   mean of two estimates, seeded by the unit's seed) on the reference's window points (0 and π held
   10⁻³ rad inside, where q(η) is singular). The two estimates use seeds s and s + 1; their difference
   gives the profile's own noise. (A first profile run evaluated the guide outside the library's Pyro
   scope, where a second module of the same kind can read a first one's parameters from Pyro's global
   store; it was discarded and rerun through the library function, which runs in that scope. The
   symmetry-conditional guide's profiles were rerun once more on 2026-11-27: until then the function held η by
   setting that guide's standard-normal noise to u_j itself instead of (u_j − m)/s, so its q(θ | η) was read near
   q(η)'s location whatever η_j was; the mean-field profiles, which hold the site itself, reproduce bit for bit.) The
   difference reference − profile is the *amortisation gap*: what one guide loses at η_j against a fit made for η_j. The
   profile's own grid posterior (prior U(0, π), truncated to the window) is what the refinement's q(η) targets.

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_iwae_<suffix>.md``, ``.json``, ``.png``; the refined
states are not kept (``.pt`` files are not committed): what the tables need is in the JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
import uncertain_symmetry as us  # noqa: E402
import uncertain_symmetry_refined as usr  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.diagnostics.symmetry_posterior import grid_posterior  # noqa: E402
from pyro_invariance.infer.training import set_up_guide  # noqa: E402
from research.uncertain_symmetry import common  # noqa: E402
from research.uncertain_symmetry.evidence_profile import guide_evidence_profile  # noqa: E402

STEM = "uncertain_symmetry_iwae"
#: IWAE estimates averaged per point of the amortisation profile (module docstring, d)
PROFILE_REPS = 2
#: the profile's η_j is held this far inside (0, η_max): q(η) and the guide's η-transform are singular on
#: the boundary (added when the first profile run gave −∞ at η = π; no profile value had been looked at)
PROFILE_EDGE = 1e-3
#: the refinement (module docstring, b); ``num_particles`` is the input's ``iwae_K``
REFINE: dict[str, Any] = {
    "elbo": "iwae-given-symmetry",
    "steps": 1000,
    "lr": 0.005,
    "factor_lr": 0.005,
    "batch_size": None,
}


def refine_config(size: dict[str, Any]) -> dict[str, Any]:
    """``REFINE`` with K = the input run's ``iwae_K``."""
    return {**REFINE, "num_particles": int(size["iwae_K"])}


def input_unit(payload: dict[str, Any], dataset: str, seed: int) -> dict[str, Any]:
    """The (dataset, seed) unit of an input run."""
    return next(u for u in payload["units"] if u["dataset"] == dataset and u["seed"] == seed)


def unit_name(guide: str, dataset: str, seed: int) -> str:
    return f"{guide}_{dataset}_seed{seed}"


def save_state(path: Path, model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor, meta: dict[str, Any]) -> None:
    """Model and guide state dicts (CPU), the training arrays and plain metadata; written atomically."""
    state = {
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "guide": {k: v.detach().cpu() for k, v in guide.state_dict().items()},
        "x": x.cpu(),
        "y": y.cpu(),
        "meta": meta,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_state(
    path: Path, device: str = "cpu", make_guide: Any = None
) -> tuple[Any, Any, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(model, guide, x, y, meta) rebuilt from :func:`save_state`'s file (``weights_only=True``) on
    ``device``: the guide is set up there (an autoguide keeps the prior's tensors from its set-up), and
    ``x``, ``y`` stay on the CPU. ``make_guide(model, meta)`` builds the guide (default: the catalogue
    guide named ``meta["guide"]``)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    meta = state["meta"]
    data = SimpleNamespace(image_shape=tuple(meta["image_shape"]), num_classes=int(meta["num_classes"]))
    model = us.make_model(data, meta["size"], int(meta["seed"]), symmetry_prior="uniform")
    model.load_state_dict(state["model"])
    model.to(device)
    guide = pi.guides.get(meta["guide"], model) if make_guide is None else make_guide(model, meta)
    x, y = state["x"], state["y"]
    pyro.clear_param_store()  # the set-up runs in Pyro's global mode: no earlier guide's values (or device) by name
    set_up_guide(model, guide, x[:2].to(device), y[:2].to(device), num_data=x.shape[0])
    guide.to(device)
    guide.load_state_dict(state["guide"])
    return model, guide, x, y, meta


def prepare(payload: dict[str, Any], dataset: str, seed: int, size: dict[str, Any], path: Path) -> dict[str, Any]:
    """Repeat the input's full-Bayes ELBO fit of (dataset, seed) (module docstring, a) and save it."""
    guide_name = payload["settings"]["guide"]
    unit = input_unit(payload, dataset, seed)
    data = load_dataset(us.DATASETS[dataset][0], size)
    res = us.fit(data, size, seed, guide=guide_name, symmetry_prior="uniform")
    draws = us.q_draws(res, data, size, seed)
    stored = np.asarray(unit["q_draws"], dtype=np.float64)
    meta = {
        "guide": guide_name,
        "dataset": dataset,
        "seed": seed,
        "size": size,
        "image_shape": list(data.image_shape),
        "num_classes": int(data.num_classes),
        "elbo_fit_seconds": float(res.seconds),
        "reproduction_max_abs_diff": float(np.max(np.abs(draws.round(5) - stored))),
    }
    x, y = us.train_arrays(data, res.model)
    save_state(path, res.model, res.guide, x, y, meta)
    return meta


def load_dataset(name: str, size: dict[str, Any]) -> Any:
    return usr.load_dataset(name, train_size=size["train_size"], test_size=size["test_size"])


def refine(start: Path, out: Path, device: str) -> dict[str, Any]:
    """Continue a prepared fit by ``REFINE`` on ``device`` (module docstring, b) and save it to ``out``."""
    model, guide, x, y, meta = load_state(start, device)
    cfg = refine_config(meta["size"])
    t0 = time.perf_counter()
    res = pi.fit(model, guide, (x, y), seed=int(meta["seed"]), progress=False, device=device, **cfg)
    meta = {
        **meta,
        "refine": cfg,
        "device": device,
        "refine_seconds": time.perf_counter() - t0,
        "refine_history": {"step": list(res.history["step"]), "elbo": [float(v) for v in res.history["elbo"]]},
        "refine_final_bound_per_datum": float(res.final_elbo),
    }
    model.to("cpu"), guide.to("cpu")
    save_state(out, model, guide, x, y, meta)
    return meta


def evaluate_unit(path: Path, payload_unit: dict[str, Any]) -> dict[str, Any]:
    """Draws, IWAE_K bound and held-out metrics of a refined fit (module docstring, c); the input unit's
    (the ELBO fit's) numbers are in ``payload_unit``."""
    model, guide, x, y, meta = load_state(path)
    size, seed = meta["size"], int(meta["seed"])
    data = load_dataset(us.DATASETS[meta["dataset"]][0], size)
    res = SimpleNamespace(model=model, guide=guide)
    draws = us.q_draws(res, data, size, seed)
    meta = {k: v for k, v in meta.items() if k != "size"}  # the run's settings are in the results JSON
    return {
        "meta": meta,
        "q_eta": us.draw_summary(draws),
        "q_draws": draws.round(5).tolist(),
        "iwae": us.bound(res, data, size, seed),
        "metrics": pi.evaluate((model, guide), data, num_samples=size["eval_samples"], seed=seed),
    }


def amortised_profile(
    model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor, etas: list[float], K: int, reps: int, seed: int
) -> list[list[float]]:
    """``reps`` estimates (seeds ``seed``, ``seed + 1``, …) of IWAE_K(η_j) with the fitted guide's own
    q(θ | η_j) at each fixed η_j (module docstring, d; :func:`~pyro_invariance.diagnostics.symmetry_posterior.
    guide_evidence_profile`), nats, ``(reps, J)``; η_j = 0 and η_max are held ``PROFILE_EDGE`` inside the
    support, where q(η) is singular."""
    upper = float(model.eta_upper.max())
    inside = [min(max(float(eta), PROFILE_EDGE), upper - PROFILE_EDGE) for eta in etas]
    return [guide_evidence_profile(model, guide, x, y, inside, K=K, seed=seed + r).tolist() for r in range(reps)]


def refined_q_unit(unit: dict[str, Any], evaluated: dict[str, Any]) -> dict[str, Any]:
    """A copy of an input unit whose full-Bayes fit is the refined one (q(η), bound, metrics)."""
    fb = {
        **unit["full_bayes"],
        "q_eta": evaluated["q_eta"],
        "iwae": evaluated["iwae"],
        "metrics": evaluated["metrics"],
        "final_elbo_per_datum": evaluated["meta"]["refine_final_bound_per_datum"],
    }
    return {**unit, "full_bayes": fb, "q_draws": evaluated["q_draws"]}


def comparison_table(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """Per unit: q(η) and the reference, the overlap masses, the IWAE_K bound and the held-out NLL of the
    ELBO fit and of its refinement."""
    header = [
        "data, seed",
        "reference: mean ± sd [90 %]",
        "ELBO fit q(η): mean ± sd",
        "refined q(η): mean ± sd",
        "overlap (q in grid, grid in q): ELBO fit → refined",
        "IWAE_K / N: ELBO fit → refined",
        "test NLL: ELBO fit → refined",
        "test acc.: ELBO fit → refined",
        "reproduced start (max |Δ draw|)",
    ]
    rows = []
    for b, a in zip(before, after):
        g, qb, qa = b["grid"]["summary"], b["full_bayes"]["q_eta"], a["full_bayes"]["q_eta"]
        mb, ma = b["full_bayes"]["metrics"], a["full_bayes"]["metrics"]
        rows.append(
            [
                f"{b['dataset']}, {b['seed']}",
                f"{g['mean']:.3f} ± {g['sd']:.3f} [{g['q05']:.2f}, {g['q95']:.2f}]",
                f"{qb['mean']:.3f} ± {qb['sd']:.3f}",
                f"{qa['mean']:.3f} ± {qa['sd']:.3f}",
                f"{b['overlap']['q_in_grid90']:.2f}, {b['overlap']['grid_in_q90']:.2f} → "
                f"{a['overlap']['q_in_grid90']:.2f}, {a['overlap']['grid_in_q90']:.2f}",
                f"{b['full_bayes']['iwae']['per_datum']:.4f} → {a['full_bayes']['iwae']['per_datum']:.4f}",
                f"{mb['nll']:.4f} → {ma['nll']:.4f}",
                f"{mb['accuracy']:.3f} → {ma['accuracy']:.3f}",
                f"{a['reproduction_max_abs_diff']:.1e}",
            ]
        )
    return common.md_table(header, rows)


def profile_summary(
    profile: dict[str, Any], refined_ref: dict[str, Any], draws: list[float], fit: str
) -> dict[str, Any]:
    """The amortisation profile of one fit (``fit``: ``"elbo_fit"`` or ``"refined"``) against the reference
    on the window (module docstring, d): the profile's grid posterior (mode, central 90 % interval), the
    overlap masses of ``draws`` (that fit's q(η)) with it, and the amortisation gap reference − profile
    at the reference's mode minus the gap at the window point nearest the mean of ``draws`` (nats; the
    gap's level carries the fit-to-fit offset of the reference's restarts, its change across η does not);
    ``noise``: the mean over points of |estimate 1 − estimate 2| / √2, the sd of one estimate (nats)."""
    grid, ref = usr.aligned_mean(refined_ref, lambda f: f["iwae"]["value"])
    etas, prof = np.asarray(profile["etas"]), np.asarray(profile[fit])
    if not np.allclose(grid, etas):
        raise ValueError("the profile's points are not the reference's window")
    gp = grid_posterior(etas, prof, np.full_like(etas, -np.log(us.ETA_MAX)))
    gap = ref - prof
    at_q = int(np.argmin(np.abs(etas - float(np.mean(draws)))))
    at_ref = int(np.argmax(ref))
    est = np.asarray(profile[f"{fit}_estimates"])
    return {
        "mode": gp.mode,
        "q05": gp.quantile(0.05),
        "q95": gp.quantile(0.95),
        "noise": float(np.mean(np.abs(est[0] - est[1])) / 2**0.5),
        "ref_mode": float(etas[at_ref]),
        "overlap": us.overlap(np.asarray(draws, dtype=np.float64), gp),
        "gap_change": float(gap[at_ref] - gap[at_q]),
        "gap": gap.tolist(),
        "grid": etas.tolist(),
        "density": gp.density.tolist(),
    }


def profile_table(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    header = [
        "data, seed",
        "reference (window): mode",
        "refined q(η): mean ± sd",
        "profile of the refined fit: mode [90 %]",
        "refined q(η) vs its profile: q in grid, grid in q",
        "gap change, refined fit (nats)",
        "profile noise, sd of one estimate (nats)",
        "profile of the ELBO fit: mode [90 %]",
        "gap change, ELBO fit (nats)",
    ]
    rows = []
    for b, a in zip(before, after):
        pa, pb, q = a["profile"], b["profile"], a["full_bayes"]["q_eta"]
        rows.append(
            [
                f"{a['dataset']}, {a['seed']}",
                f"{pa['ref_mode']:.3f}",
                f"{q['mean']:.3f} ± {q['sd']:.3f}",
                f"{pa['mode']:.3f} [{pa['q05']:.2f}, {pa['q95']:.2f}]",
                f"{pa['overlap']['q_in_grid90']:.2f}, {pa['overlap']['grid_in_q90']:.2f}",
                f"{pa['gap_change']:+.1f}",
                f"{pa['noise']:.1f}",
                f"{pb['mode']:.3f} [{pb['q05']:.2f}, {pb['q95']:.2f}]",
                f"{pb['gap_change']:+.1f}",
            ]
        )
    return common.md_table(header, rows)


def plot(pairs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], path: Path) -> None:
    """q(η) of the ELBO fit and of its refinement against the refined reference and the refined fit's
    amortisation profile (module docstring, d), one panel per unit."""
    # A Figure of its own, not pyplot: the script draws without switching the process's backend.
    from matplotlib.figure import Figure

    names = list(pairs)
    units = pairs[names[0]][0]
    fig = Figure(figsize=(2.2 * len(units), 2.2 * len(names)))
    axes = fig.subplots(len(names), len(units), squeeze=False)
    for i, name in enumerate(names):
        for j, (b, a) in enumerate(zip(*pairs[name])):
            ax = axes[i][j]
            gp = us.refresh_grid(dict(b))
            lo, hi = (
                min(gp.quantile(0.005), min(a["q_draws"]), min(b["q_draws"])),
                max(gp.quantile(0.995), max(a["q_draws"]), max(b["q_draws"])),
            )
            bins = np.linspace(lo, hi, 40)
            ax.hist(b["q_draws"], bins=bins, density=True, alpha=0.45, label="ELBO fit")
            ax.hist(a["q_draws"], bins=bins, density=True, alpha=0.45, label="refined")
            ax.plot(gp.grid, gp.density, "k-", lw=1.2, label="reference")
            ax.plot(a["profile"]["grid"], a["profile"]["density"], "C1--", lw=1.0, label="profile of the refined fit")
            ax.set_xlim(lo, hi)
            ax.set_title(f"{name}\n{b['dataset']} {b['seed']}", fontsize=7)
            ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = usr.phase_parser(
        __doc__,
        "one per guide, as for uncertain_symmetry_refined.py",
        "where the prepared and refined states go (resumable)",
        {
            "prepare": "repeat and save the inputs' ELBO fits (CPU)",
            "refine": "continue every prepared fit by the refinement",
            "evaluate": "draws, bounds and metrics of every refined fit (CPU)",
            "profile": "the amortisation profile of every fit (CPU; module docstring, d)",
            "render": "no fits: the tables from the evaluated units",
        },
        "comma-separated unit names <guide>_<dataset>_seed<s> to run",
    )
    parser.add_argument("--device", default="cpu", help="device of --refine (cuda on a GPU machine)")
    args, payloads, names, settings, size, keys = usr.parse_phase_args(parser, argv)
    jobs = [(p, name, d, s) for p, name in zip(payloads, names) for d, s in keys]
    if args.only:
        wanted = set(args.only.split(","))
        jobs = [j for j in jobs if unit_name(j[0]["settings"]["guide"], j[2], j[3]) in wanted]
    for sub in ("prepared", "refined", "evaluated", "profile"):
        (args.work_dir / sub).mkdir(parents=True, exist_ok=True)
    for p, name, dataset, seed in jobs if not args.render else []:
        stem = unit_name(p["settings"]["guide"], dataset, seed)
        start, done, evaluated = (
            args.work_dir / "prepared" / f"{stem}.pt",
            args.work_dir / "refined" / f"{stem}.pt",
            args.work_dir / "evaluated" / f"{stem}.json",
        )
        if args.prepare and not start.exists():
            meta = prepare(p, dataset, seed, size, start)
            common.log(
                f"{stem}: ELBO fit repeated ({meta['elbo_fit_seconds']:.0f} s), max |Δ draw| "
                f"{meta['reproduction_max_abs_diff']:.1e} -> {start}"
            )
        elif args.refine and not done.exists():
            if not start.exists():
                parser.error(f"--refine: {start} is missing (run --prepare first)")
            meta = refine(start, done, args.device)
            common.log(
                f"{stem}: refined on {meta['device']} in {meta['refine_seconds']:.0f} s, final bound/N "
                f"{meta['refine_final_bound_per_datum']:.4f} -> {done}"
            )
        elif args.profile and not (args.work_dir / "profile" / f"{stem}.json").exists():
            if not done.exists():
                parser.error(f"--profile: {done} is missing (run --refine first)")
            etas = [
                j * usr.STEP for j in usr.read_unit_file(parser, args.reference, dataset, seed, "--reference")["window"]
            ]
            out = {"etas": etas, "K": int(size["iwae_K"]), "reps": PROFILE_REPS, "seed": seed}
            for label, path in (("elbo_fit", start), ("refined", done)):
                model, guide, x, y, _ = load_state(path)
                out[f"{label}_estimates"] = amortised_profile(
                    model, guide, x, y, etas, int(size["iwae_K"]), PROFILE_REPS, seed
                )
                out[label] = np.mean(out[f"{label}_estimates"], axis=0).tolist()
            (args.work_dir / "profile" / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
            common.log(f"{stem}: amortisation profile on {len(etas)} points")
        elif args.evaluate and not evaluated.exists():
            if not done.exists():
                parser.error(f"--evaluate: {done} is missing (run --refine first)")
            unit = input_unit(p, dataset, seed)
            ev = evaluate_unit(done, unit)
            evaluated.write_text(json.dumps(ev, indent=1) + "\n")
            common.log(f"{stem}: refined q(η) mean {ev['q_eta']['mean']:.3f} sd {ev['q_eta']['sd']:.3f} -> {evaluated}")
    if not args.render:
        return 0
    refined_ref = {(d, s): usr.read_unit_file(parser, args.reference, d, s, "--reference") for d, s in keys}
    pairs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    verdicts: dict[str, list[dict[str, Any]]] = {}
    for p, name in zip(payloads, names):
        before, after = [], []
        for dataset, seed in keys:
            path = args.work_dir / "evaluated" / f"{unit_name(p['settings']['guide'], dataset, seed)}.json"
            if not path.exists():
                parser.error(f"--render: {path} is missing (run --evaluate first)")
            ev = json.loads(path.read_text())
            unit = input_unit(p, dataset, seed)
            prof_path = args.work_dir / "profile" / f"{unit_name(p['settings']['guide'], dataset, seed)}.json"
            if not prof_path.exists():
                parser.error(f"--render: {prof_path} is missing (run --profile first)")
            profile = json.loads(prof_path.read_text())
            ref = refined_ref[(dataset, seed)]
            before.append(
                {**usr.refined_unit(unit, ref), "profile": profile_summary(profile, ref, unit["q_draws"], "elbo_fit")}
            )
            after.append(
                {
                    **usr.refined_unit(refined_q_unit(unit, ev), ref),
                    "profile": profile_summary(profile, ref, ev["q_draws"], "refined"),
                    "reproduction_max_abs_diff": ev["meta"]["reproduction_max_abs_diff"],
                    "refine_seconds": ev["meta"]["refine_seconds"],
                    "device": ev["meta"]["device"],
                }
            )
        pairs[name] = (before, after)
        verdicts[f"{name}: ELBO fit (the input)"] = us.criteria(before)
        verdicts[f"{name}: refined by IWAE given η"] = us.criteria(after)
    suffix = Path(args.inputs[0]).stem.removeprefix(us.STEM).strip("_")
    stem = f"{STEM}_{suffix}" if suffix else STEM
    settings.update(
        {
            "inputs": [Path(p).name for p in args.inputs],
            "input names": names,
            "reference": f"{usr.STEM}: {usr.RESTARTS} restarts, {usr.RULES[0]}",
            "refinement": refine_config(size),
            "refinement device": sorted({a["device"] for _, after in pairs.values() for a in after}),
            "refinement seconds": round(sum(a["refine_seconds"] for _, after in pairs.values() for a in after), 1),
        }
    )
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15's criteria for q(η) after the ELBO fits of `uncertain_symmetry.py` were continued by "
        '`elbo="iwae-given-symmetry"` (an ELBO in η, the IWAE_K bound in θ given η), against the refined grid '
        "reference of `uncertain_symmetry_refined.py`. Method and the reason for every setting: section *Method* "
        "(the module docstring of `research/uncertain_symmetry/scripts/uncertain_symmetry_iwae.py`). "
        "The refinement ran with `--refine` on "
        "the device named in the settings; the states it needs are not committed, so the command below "
        "re-renders from the evaluated units (`--evaluate` wrote them)."
    )
    parts = [
        common.header_markdown(
            "Uncertain symmetry: q(η) refined by the IWAE bound given η", info, settings, command, intro
        ),
        "## Verdicts\n",
        "Seeds on which each criterion holds, for each guide's q(η) before and after the refinement.\n",
        usr.verdict_table(verdicts),
    ]
    for name, (before, after) in pairs.items():
        parts += [f"\n## {name}: the ELBO fit and its refinement, unit by unit\n", comparison_table(before, after)]
        parts += [
            f"\n### {name}, refined: the issue's criteria against the refined reference\n",
            us.criteria_table(verdicts[f"{name}: refined by IWAE given η"]),
        ]
        parts += [
            f"\n### {name}: the amortisation profile (module docstring, d)\n",
            "IWAE_K(η) of each fit's own q(θ | η) at fixed η on the reference's window, its grid posterior, "
            "and how much "
            "more the fit loses against the per-η fits at the reference's mode than near its own q(η) (the gap change; "
            "positive: the guide's q(θ | η) is worse there).\n",
            profile_table(before, after),
        ]
    parts += [f"\n![q(η) before and after the refinement]({stem}.png)\n", "## Method\n", __doc__.split("\n\n", 1)[1]]
    payload = {
        "info": info,
        "settings": settings,
        "command": command,
        "verdicts": verdicts,
        "units": {n: usr.without_draws(after) for n, (_, after) in pairs.items()},
    }
    common.write_results(stem, "\n".join(parts), payload, args.out_dir)
    plot(pairs, Path(args.out_dir) / f"{stem}.png")
    usr.log_verdicts(verdicts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
