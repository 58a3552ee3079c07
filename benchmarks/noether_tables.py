"""Noether's razor tables (talk 000): SHO, n = 3 oscillators, 2-d 3-body; HNN / learned / oracle.

For each system three ``symmetrised-hnn`` models are fitted with the matrix-normal guide on the
same data -- ``symmetry="none"`` (HNN), ``"quadratic"`` (row "learned": K learned quadratic conserved
quantities) and the oracle (SO(2), U(3), SE(2)) -- and evaluated with
:func:`pyro_invariance.diagnostics.hnn_metrics.evaluate_hnn` (train MSE, NLL/N, KL/N, −ELBO/N, test /
wider / moved MSE, energy drift). The learned generators
are analysed by SVD (number of significant singular values, at least :data:`SIGNIFICANT_RTOL` = 0.1
of the largest, against the target: 1 for SHO, n² = 9 for 3 oscillators, 3 for the 3-body system) and
their parallelness to the oracle span. The talk's numbers are printed next to ours.

Whether the known symmetry was recovered is read by a measure that can fail (:func:`discovery`), for
the learned generators and, as the baseline, the same model's untrained generators (its start):

* (a) **conservation**: per test state, the learned quadratics' gradients ``∇C_k = A_k x + b_k``
  along the true flow ``J∇H``, relative to their size
  (:func:`pyro_invariance.diagnostics.conserved_analysis.discovery_measures`' ``flow_share``;
  0: every C_k conserved), median over the test states;
* (b) **agreement with the known set**: the significant span ``U (r)`` of the flattened generators
  against the oracle span ``O (d)`` (SHO: SO(2), i.e. H itself; oscillators: the n² conserved quadratic
  forms of U(n); 3-body: SE(2), the total momenta and the angular momentum),
  ``‖Oᵀ U‖_F² / max(r, d)`` ∈ [0, 1] — the sum of the squared principal cosines over the larger rank,
  so it is 1 only when the two spans coincide: a span holding extra significant directions or missing
  oracle ones scores less (30 untrained generators span most of the 27-d space of oscillator
  quadratics and so contain the oracle span; they score about d / 27, not 1);
* "recovered" iff (a) ≤ :data:`FLOW_TOL` = 0.1, (b) ≥ :data:`AGREE_MIN` = 0.5 and (b) ≥ the untrained
  start's (b) + :data:`AGREE_MARGIN` = 0.2 — the thresholds of the Kepler analysis
  (``benchmarks/kepler_noether.py``), taken over unchanged. The generators, learned and untrained,
  are stored in the JSON (``analysis.generators``, ``analysis.generators_at_start``) so the analysis
  can be read again without a refit.

A step-timing section measures the time per SVI step of the HNN and of the symmetrised model and the
cost ratio symmetrised / (S × HNN) per symmetry sample.

Reduced settings (default; each system ≤ 30 min on 2 CPU cores, 1 thread) versus paper settings
(``--paper``; docs/methods.md §4: widths 200/200 and 250/250/250, S = 200/100, E = 20/10, full data)
are listed in :data:`REDUCED` / :data:`PAPER`. The reference's closed-form prior-variance update for
the 3-body system is available (``prior="closed-form"``) but not used here: started from a guide of
scale 0.01 it collapses the prior at once (see the comment at :data:`REDUCED`). The reference's whole
3-body recipe — a warm-up HNN all rows start from, the closed-form update after every step (past a
fixed-prior warm-up), 2 weight samples, K = 10 — is ``benchmarks/threebody_recipe.py``. Each system
writes ``results/noether_<system>.json``; the markdown ``results/noether_tables.md`` is rebuilt from
all JSON files present, so systems can be run one at a time::

    .venv/bin/python benchmarks/noether_tables.py --systems sho
    .venv/bin/python benchmarks/noether_tables.py --systems oscillators
    .venv/bin/python benchmarks/noether_tables.py --systems nbody
    .venv/bin/python benchmarks/noether_tables.py --timing-only

Seeds: ``--seed k`` (k ≠ 0) writes ``results/noether_<system>_seed<k>.json`` (and ``_svd.png``) beside seed 0's
files; the markdown then adds a table of every seed per system, and the verdict counts seeds — a check holds when
it holds on more than half of a system's seeds. Seeds 1 and 2 were run after seed 0's results, at the same
reduced settings (nothing changed)::

    .venv/bin/python benchmarks/noether_tables.py --systems sho,oscillators,nbody --seed 1 --no-timing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from _common import RESULTS_DIR, command_line, log, machine_info, md_table, set_threads  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402

from pyro_invariance import fit, guides, pyro_scope  # noqa: E402
from pyro_invariance.data import physics  # noqa: E402
from pyro_invariance.diagnostics.conserved_analysis import SIGNIFICANT_RTOL, discovery_measures  # noqa: E402
from pyro_invariance.diagnostics.hnn_metrics import evaluate_hnn, plot_symmetry_analysis, symmetry_analysis  # noqa: E402
from pyro_invariance.diagnostics.plots import save_figure  # noqa: E402
from pyro_invariance.infer.prior_update import PriorUpdatingGuide  # noqa: E402
from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN  # noqa: E402
from pyro_invariance.symmetry.conserved import (  # noqa: E402
    analyse_generators,
    oracle_generators,
    quadratic_from_generator,
)

ORACLE = {"sho": "so2", "oscillators": "un", "nbody": "se2"}
TARGET_RANK = {"sho": 1, "oscillators": 9, "nbody": 3}
FLOW_TOL = 0.1  # (a) "conserved": at most a tenth of the gradients' size along the flow
AGREE_MIN = 0.5  # (b) the significant span at least half the oracle span ...
AGREE_MARGIN = 0.2  # ... and clearly above the untrained start's
MAX_STATES = 2000  # test states the conservation is read on

REDUCED: dict[str, dict[str, Any]] = {
    "sho": dict(
        data=dict(),
        dt=0.2,
        hidden=(32, 32),
        K=1,
        S=8,
        E=4,
        sampling="cube",
        steps=1500,
        batch=None,
        lr=0.05,
        eta_lr=0.05,
        prior="fixed",
    ),
    # K = 30 / 10: w_s in the unit ball and a small η rate. With the cube (‖w‖ ≈ √(K/3)) and eta_lr 0.02 the
    # learned generators grew hyperbolic parts within 200 steps and the flows blew up (ELBO/N −7e7).
    "oscillators": dict(
        data=dict(n=3, train_trajectories=50, train_steps=20),
        dt=0.2,
        hidden=(64, 64),
        K=30,
        S=8,
        E=5,
        sampling="ball",
        steps=1500,
        batch=100,
        lr=0.02,
        eta_lr=0.005,
        prior="fixed",
    ),
    # 3-body: the reference uses the closed-form prior update; here it collapsed the prior at initialisation
    # (guide scale 0.01 → v* ≈ 1e-4 → all three models stayed at H ≈ 0, ELBO/N −819), so the reduced
    # setting keeps the prior fixed; lr 0.05 (0.02 learned too slowly in 1500 steps). eta_lr 0.001: with 0.005
    # the learned model ended worse than the HNN (see the note in results/noether_tables.md).
    "nbody": dict(
        data=dict(n=3, train_trajectories=50, train_steps=20),
        dt=1.0,
        hidden=(64, 64, 64),
        K=10,
        S=8,
        E=5,
        sampling="ball",
        steps=2000,
        batch=100,
        lr=0.05,
        eta_lr=0.001,
        prior="fixed",
    ),
}
PAPER: dict[str, dict[str, Any]] = {
    "sho": dict(REDUCED["sho"], hidden=(200, 200), S=200, E=20, steps=20000),
    "oscillators": dict(REDUCED["oscillators"], data=dict(n=3), hidden=(200, 200), S=100, E=20, steps=20000, batch=200),
    "nbody": dict(REDUCED["nbody"], data=dict(n=3), hidden=(250, 250, 250), S=100, E=10, steps=20000, batch=200),
}

#: The talk's tables (talk 000; docs/methods.md §4). None: not reported.
TALK = {
    "sho": {
        "none": dict(train_mse=0.005, nll=0.3667, kl=3314.374, neg_elbo=3314.741, test_mse=0.005),
        "learned": dict(train_mse=0.002, nll=-2.618, kl=3304.754, neg_elbo=3302.136, test_mse=0.002),
        "oracle": dict(train_mse=0.002, nll=-3.213, kl=3298.357, neg_elbo=3295.144, test_mse=0.002),
    },
    "oscillators": {
        "none": dict(train_mse=0.00106, nll=-12.04, kl=5.27, neg_elbo=-6.77, test_mse=2.141e-5),
        "learned": dict(train_mse=0.00102, nll=-12.16, kl=2.53, neg_elbo=-9.63, test_mse=9.94e-6),
        "oracle": dict(train_mse=0.00102, nll=-12.15, kl=2.21, neg_elbo=-9.94, test_mse=8.98e-6),
    },
    "nbody": {
        "none": dict(
            train_mse=0.0028, nll=-13.87, kl=13.34, neg_elbo=-9.52, test_mse=0.0016, moved_mse=0.0035, wider_mse=0.0016
        ),
        "learned": dict(
            train_mse=0.0017, nll=-20.09, kl=7.28, neg_elbo=-12.81, test_mse=0.0006, moved_mse=0.0004, wider_mse=0.0006
        ),
        "oracle": dict(
            train_mse=0.0019, nll=-19.27, kl=7.96, neg_elbo=-11.32, test_mse=0.0006, moved_mse=0.0006, wider_mse=0.0006
        ),
    },
}
COLUMNS = ["train_mse", "nll", "kl", "neg_elbo", "test_mse", "wider_mse", "moved_mse", "energy_drift"]
LABEL = {"none": "HNN", "learned": "HNN + learned symmetry", "oracle": "HNN + oracle"}
TITLE = {"sho": "Simple harmonic oscillator", "oscillators": "n = 3 oscillators", "nbody": "2-d 3-body"}


def build(system: str, symmetry: str, s: dict[str, Any], seed: int) -> tuple[Any, Any]:
    pyro.set_rng_seed(seed)
    m = 2 * (1 if system == "sho" else (s["data"]["n"] if system == "oscillators" else 2 * s["data"]["n"]))
    sym = {"oracle": ORACLE[system], "learned": "quadratic"}.get(symmetry, symmetry)  # row label -> model's symmetry
    model = SymmetrisedHNN(
        m,
        s["hidden"],
        symmetry=sym,
        num_generators=s["K"],
        num_transforms=s["S"],
        euler_steps=s["E"],
        sampling=s["sampling"],
        dt=s["dt"],
        prior=s["prior"],
        init_seed=seed,
    )
    guide = guides.get("matrix-normal", model, init_scale=0.01)
    if s["prior"] == "closed-form":
        guide = PriorUpdatingGuide(guide, model, damping=0.5)
    return model, guide


def quadratic_gradients(generators: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """``∇C_k(x_n) = A_k x_n + b_k`` of the quadratics behind ``generators (K, M+1, M+1)`` at ``states (N, M)``
    → ``(N, K, M)`` (float64)."""
    a, b = quadratic_from_generator(generators.double())
    return torch.einsum("kij,nj->nki", a, states.double()) + b


def discovery(system: str, generators: torch.Tensor, flow: torch.Tensor, states: torch.Tensor) -> dict[str, Any]:
    """(a) the median flow share on ``states (N, M)`` given the true flow ``J∇H (N, M)``, and (b) the agreement
    of the generators' significant span with the oracle span (module docstring), with the span's rank."""
    g = quadratic_gradients(generators, states)
    flow = flow.double()
    grad_h = -physics.symplectic(flow)  # ∇H = −J(J∇H)
    share = discovery_measures(g, flow, grad_h.unsqueeze(1))["flow_share"]
    oracle = oracle_generators(ORACLE[system], states.shape[1], torch.float64)
    a = analyse_generators(generators.double(), oracle, rel_threshold=SIGNIFICANT_RTOL)
    overlap = float(a.principal_cosines.square().sum())
    return {
        "flow_share": float(share.median()),
        "rank": a.num_significant,
        "overlap": overlap,
        "agreement": overlap / max(a.num_significant, TARGET_RANK[system]),
    }


def recovered(after: dict[str, Any], before: dict[str, Any]) -> bool:
    """The pre-registered "symmetry recovered" of the module docstring."""
    return (
        after["flow_share"] <= FLOW_TOL
        and after["agreement"] >= AGREE_MIN
        and after["agreement"] >= before["agreement"] + AGREE_MARGIN
    )


def stem_of(system: str, seed: int) -> str:
    """The result files' stem of one system and seed: ``noether_<system>`` for seed 0 (the first run's name),
    ``noether_<system>_seed<k>`` for the others."""
    return f"noether_{system}" + (f"_seed{seed}" if seed else "")


def run_system(
    system: str,
    s: dict[str, Any],
    seed: int,
    cache_dir: str | None,
    models: tuple[str, ...] = ("none", "learned", "oracle"),
    stem: str | None = None,
) -> dict[str, Any]:
    """The three rows of ``system`` at settings ``s`` and ``seed``; the learned row's SVD figure is written to
    ``<stem>_svd.png`` (default ``noether_<system>``)."""
    data = physics.make_dataset(system, seed=seed, cache_dir=cache_dir, **s["data"])
    log(f"{system}: N={data.x_train.shape[0]} train pairs, M={data.state_dim}")
    out: dict[str, Any] = {"settings": {k: v for k, v in s.items()}, "rows": {}, "analysis": None}
    for symmetry in models:
        model, guide = build(system, symmetry, s, seed)
        start = model.generators().detach().double().clone()  # the untrained generators (the baseline)
        t0 = time.perf_counter()
        fit(
            model,
            guide,
            data,
            steps=s["steps"],
            batch_size=s["batch"],
            lr=s["lr"],
            eta_lr=s["eta_lr"],
            progress=False,
            seed=seed,
        )
        seconds = time.perf_counter() - t0
        pyro.set_rng_seed(seed + 1)
        metrics = evaluate_hnn(model, guide, data, num_samples=8, num_particles=4, max_test=2000)
        metrics["seconds"] = seconds
        out["rows"][symmetry] = metrics
        log(f"{system} {symmetry}: {seconds:.0f}s " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if symmetry == "learned":
            a = symmetry_analysis(model, system=system)
            learned = model.generators().detach().double()
            states = data.x_test[:MAX_STATES].double()
            flow = data.system.vector_field(states)
            after, before = discovery(system, learned, flow, states), discovery(system, start, flow, states)
            out["analysis"] = {
                "singular_values": a.singular_values.tolist(),
                "num_significant": a.num_significant,
                "target": TARGET_RANK[system],
                "parallelness": a.parallelness.tolist(),
                "principal_angles_deg": a.principal_angles_deg().tolist(),
                "discovery": after,
                "discovery_at_start": before,
                "recovered": recovered(after, before),
                "generators": learned.tolist(),
                "generators_at_start": start.tolist(),
            }
            fig = plot_symmetry_analysis(a, title=f"{system}: learned generators", target=TARGET_RANK[system])
            save_figure(fig, RESULTS_DIR / f"{stem or f'noether_{system}'}_svd.png", dpi=120)
    return out


def step_timing(reps: int, seed: int) -> dict[str, Any]:
    """Median time per SVI step: HNN vs symmetrised (learned, S samples), SHO-sized and 3-body-sized."""
    rows = []
    for label, m, hidden, batch, k, e in (
        ("SHO (32,32), B=28, E=4", 2, (32, 32), 28, 1, 4),
        ("3-body (64,64,64), B=100, E=5", 12, (64, 64, 64), 100, 10, 5),
    ):
        x, y = torch.randn(batch, m), torch.randn(batch, m)
        times: dict[str, float] = {}
        for name, sym, s in (("hnn", "none", 1), ("sym-8", "quadratic", 8), ("sym-32", "quadratic", 32)):
            pyro.set_rng_seed(seed)
            model = SymmetrisedHNN(m, hidden, symmetry=sym, num_generators=k, num_transforms=s, euler_steps=e)
            guide = guides.get("matrix-normal", model, init_scale=0.01)
            guide(x, y, num_data=batch)
            opt = torch.optim.Adam(list(model.parameters()) + list(guide.parameters()), lr=1e-3)
            loss_fn = TraceMeanField_ELBO()
            ts = []
            for i in range(reps + 3):
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = loss_fn.differentiable_loss(model, guide, x, y, num_data=batch)
                loss.backward()
                opt.step()
                if i >= 3:
                    ts.append(time.perf_counter() - t0)
            times[name] = statistics.median(ts)
        rows.append(
            {
                "setting": label,
                **times,
                "ratio_8": times["sym-8"] / (8 * times["hnn"]),
                "ratio_32": times["sym-32"] / (32 * times["hnn"]),
            }
        )
        log(f"timing {label}: {rows[-1]}")
    return {"rows": rows, "reps": reps}


def fmt(v: Any) -> str:
    if v is None:
        return "–"
    v = float(v)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
        return f"{v:.2e}"
    return f"{v:.4g}"


def markdown() -> str:
    parts = [
        "# Noether's razor tables (talk 000)",
        "",
        "Each system: HNN / HNN + learned quadratic conserved quantities / HNN + oracle symmetry, "
        "matrix-normal guide, `symmetrised-hnn` model (`models/symmetrised_hnn.py`). Ours at the settings "
        "listed per system (reduced unless marked paper); talk's numbers in the rows marked *talk*. "
        "MSEs are per state coordinate; −ELBO/N, NLL/N, KL/N per training pair. Energy drift: median over "
        "rollouts of the mean relative change of the true H along 20-step rollouts from test states "
        "(not reported in the talk).",
        "",
        "Was the known symmetry recovered? Read for the learned generators and, in parentheses, the same "
        "model's untrained generators (its start): (a) conservation — the learned quadratics' gradients along "
        "the true flow J∇H relative to their size, median over the test states (0: conserved); (b) agreement "
        f"— the significant span (singular values ≥ {SIGNIFICANT_RTOL} × the largest, rank r) against the "
        "oracle span (rank d), the sum of squared principal cosines over max(r, d) (1: the spans coincide; "
        "extra or missing directions lower it). Recovered iff (a) ≤ "
        f"{FLOW_TOL}, (b) ≥ {AGREE_MIN} and (b) ≥ the start's + {AGREE_MARGIN} (the Kepler analysis's "
        "thresholds, taken over unchanged).",
        "",
        "Regenerate: `.venv/bin/python benchmarks/noether_tables.py --systems sho` (then `oscillators`, `nbody`, "
        "`--timing-only`); `--paper` for paper settings.",
        "",
    ]
    info_done, results = False, {}
    for system in ("sho", "oscillators", "nbody"):
        parts += [f"## {TITLE[system]}", ""]
        results[system] = runs = seed_runs(system)
        res = runs.get(0)
        if res is None:
            parts += ["Not run yet.", ""]
            continue
        if not info_done:
            parts += ["Machine: " + ", ".join(f"{k} `{v}`" for k, v in res["machine"].items()), ""]
            info_done = True
        parts += [
            f"Settings ({'paper' if res.get('paper') else 'reduced'}): `{res['settings']}`; command `{res['command']}`",
            "",
        ]
        if res.get("note"):
            parts += [f"Note: {res['note']}", ""]
        header = [
            "model",
            "Train MSE",
            "NLL/N",
            "KL/N",
            "−ELBO/N ↓",
            "Test MSE ↓",
            "wider MSE",
            "moved MSE",
            "energy drift",
            "fit s",
        ]
        rows = []
        for sym in ("none", "learned", "oracle"):
            r = res["rows"].get(sym)
            if r:
                rows.append([LABEL[sym]] + [fmt(r.get(c)) for c in COLUMNS] + [f"{r['seconds']:.0f}"])
            t = TALK[system][sym]
            rows.append([f"*talk: {LABEL[sym]}*"] + [fmt(t.get(c)) for c in COLUMNS] + ["–"])
        parts += [md_table(header, rows), ""]
        r = res["rows"]
        if all(k in r for k in ("none", "learned", "oracle")):
            parts += [
                f"- learned / oracle test MSE = {r['learned']['test_mse'] / r['oracle']['test_mse']:.2f}, "
                f"−ELBO/N gap learned − oracle = {r['learned']['neg_elbo'] - r['oracle']['neg_elbo']:.3g}"
            ]
        a = res.get("analysis")
        if a:
            sv = ", ".join(f"{v:.3g}" for v in a["singular_values"][:12])
            par = ", ".join(f"{v:.2f}" for v in a["parallelness"][: max(a["target"], a["num_significant"]) + 2])
            ang = ", ".join(f"{v:.1f}" for v in a["principal_angles_deg"])
            parts += [
                f"- learned generators: **{a['num_significant']} significant singular values** "
                f"(> 0.1 × max; target {a['target']}); singular values: {sv}",
                f"- parallelness |cos| of the leading singular vectors to the oracle span: {par}; "
                f"principal angles (deg) between the significant span and the oracle span: {ang}",
                f"- plot: `noether_{system}_svd.png`",
            ]
            if "discovery" in a:
                parts += discovery_lines(a)
        parts += seeds_lines(runs)
        parts.append("")
    tpath = RESULTS_DIR / "noether_timing.json"
    parts += ["## Time per SVI step (not a claim of the talk)", ""]
    if tpath.exists():
        t = json.loads(tpath.read_text())
        parts += [
            "Median seconds per SVI step (TraceMeanField_ELBO + backward + Adam, matrix-normal guide, 1 thread). "
            "Ratio = t(symmetrised, S samples) / (S × t(HNN)): the cost per symmetry sample relative to the HNN "
            "(1 = no overhead beyond the S-fold batch; < 1 = the S-fold batch is cheaper than S HNN steps "
            "because per-step overheads are shared).",
            "",
        ]
        parts += [
            md_table(
                "setting | HNN s | S=8 s | S=32 s | ratio S=8 | ratio S=32",
                [
                    [
                        r["setting"],
                        f"{r['hnn']:.4f}",
                        f"{r['sym-8']:.4f}",
                        f"{r['sym-32']:.4f}",
                        f"{r['ratio_8']:.2f}",
                        f"{r['ratio_32']:.2f}",
                    ]
                    for r in t["rows"]
                ],
            ),
            "",
        ]
    else:
        parts += ["Not run yet.", ""]
    return "\n".join(parts + [verdict(results)])


def seeds_lines(runs: dict[int, dict[str, Any]]) -> list[str]:
    """Every seed of one system in one table (when more than seed 0 ran): −ELBO/N and test MSE of the three
    rows, the learned generators' significant count, (a), (b) against the start's (b), and "recovered"."""
    done = {seed: res for seed, res in sorted(runs.items()) if _complete(res) and "oracle" in res["rows"]}
    if len(done) < 2:
        return []
    rows = []
    for seed, res in done.items():
        r, a = res["rows"], res["analysis"]
        d, d0 = a["discovery"], a["discovery_at_start"]
        rows.append(
            [seed]
            + [fmt(r[m]["neg_elbo"]) for m in ("none", "learned", "oracle")]
            + [fmt(r[m]["test_mse"]) for m in ("none", "learned", "oracle")]
            + [f"{a['num_significant']} / {a['target']}", f"{d['flow_share']:.2f}"]
            + [f"{d['agreement']:.2f} ({d0['agreement']:.2f})", "yes" if a["recovered"] else "no"]
        )
    header = "seed | −ELBO/N HNN | learned | oracle | test MSE HNN | learned | oracle | significant / target "
    header += "| (a) flow share | (b) agreement (start) | recovered"
    return ["", f"Every seed ({len(done)}; seed 0's rows above):", "", md_table(header, rows)]


def discovery_lines(a: dict[str, Any]) -> list[str]:
    """The (a) / (b) lines of one system: learned (untrained start)."""
    d, d0 = a["discovery"], a["discovery_at_start"]
    return [
        f"- (a) conservation, flow share: **{d['flow_share']:.2f}** (start {d0['flow_share']:.2f}); "
        f"(b) agreement with the oracle span: **{d['agreement']:.2f}** (start {d0['agreement']:.2f}) — "
        f"significant rank {d['rank']} (start {d0['rank']}) against d = {a['target']}, sum of squared principal "
        f"cosines {d['overlap']:.2f} (start {d0['overlap']:.2f}); symmetry recovered: "
        f"**{'yes' if a['recovered'] else 'no'}**",
    ]


def seed_checks(res: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """The talk's claim for one system on one seed, check by check: ``{key: (text with the numbers, holds)}`` —
    the learned symmetry beats the HNN in −ELBO/N and test MSE, its generators have the oracle's number of
    significant singular values, and they are the oracle's symmetry (:func:`recovered`)."""
    r, a = res["rows"], res["analysis"]
    learned, hnn = r["learned"], r["none"]
    checks = {
        "elbo": (
            f"−ELBO/N below the HNN's ({fmt(learned['neg_elbo'])} vs {fmt(hnn['neg_elbo'])})",
            learned["neg_elbo"] < hnn["neg_elbo"],
        ),
        "mse": (
            f"test MSE at most the HNN's ({fmt(learned['test_mse'])} vs {fmt(hnn['test_mse'])})",
            learned["test_mse"] <= hnn["test_mse"],
        ),
        "rank": (
            f"{a['num_significant']} significant generator directions, target {a['target']}",
            a["num_significant"] == a["target"],
        ),
    }
    if "discovery" in a:
        d, d0 = a["discovery"], a["discovery_at_start"]
        checks["recovered"] = (
            f"symmetry recovered, (a) flow share {d['flow_share']:.2f} ≤ {FLOW_TOL}, (b) agreement "
            f"{d['agreement']:.2f} ≥ {AGREE_MIN} and ≥ the untrained start's {d0['agreement']:.2f} + {AGREE_MARGIN}",
            a["recovered"],
        )
    return checks


#: what each check asks, for the lines that count seeds
CHECK_NAMES = {
    "elbo": "−ELBO/N below the HNN's",
    "mse": "test MSE at most the HNN's",
    "rank": "the oracle's number of significant generator directions",
    "recovered": f"symmetry recovered ((a) ≤ {FLOW_TOL}, (b) ≥ {AGREE_MIN} and ≥ the start's + {AGREE_MARGIN})",
}


def _complete(res: dict[str, Any] | None) -> bool:
    return res is not None and all(k in res["rows"] for k in ("none", "learned")) and bool(res.get("analysis"))


def system_verdict(system: str, runs: dict[int, dict[str, Any]]) -> tuple[str, str]:
    """The verdict of one system over its seeds ``{seed: result}``: with one seed, each check as read on it;
    with more, a check holds when it holds on more than half of the seeds. Returns (verdict, the checks read)."""
    runs = {seed: res for seed, res in sorted(runs.items()) if _complete(res)}
    if not runs:
        return "not run", "not run"
    per_seed = {seed: seed_checks(res) for seed, res in runs.items()}
    if len(runs) == 1:
        (checks,) = per_seed.values()
        text = "; ".join(f"{name}: {'yes' if ok else 'no'}" for name, ok in checks.values())
        return common.verdict_of([ok for _, ok in checks.values()]), text
    keys = [k for k in CHECK_NAMES if all(k in c for c in per_seed.values())]
    counts = {k: sum(c[k][1] for c in per_seed.values()) for k in keys}
    text = "; ".join(
        f"{CHECK_NAMES[k]}: {counts[k]} of {len(runs)} seeds, {'yes' if 2 * counts[k] > len(runs) else 'no'}"
        for k in keys
    )
    return common.verdict_of([2 * counts[k] > len(runs) for k in keys]), text


def seed_runs(system: str) -> dict[int, dict[str, Any]]:
    """``{seed: result}`` of one system from its JSON files (``noether_<system>.json`` is seed 0's)."""
    runs = {}
    for path in [RESULTS_DIR / f"{stem_of(system, 0)}.json", *RESULTS_DIR.glob(f"noether_{system}_seed*.json")]:
        if path.exists():
            res = json.loads(path.read_text())
            runs[int(res.get("seed", 0))] = res
    return runs


def verdict(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    """The section over all systems; ``results``: per system ``{seed: result}`` (:func:`seed_runs`)."""
    words, lines = [], []
    for system, runs in results.items():
        word, text = system_verdict(system, runs)
        words.append(word)
        lines.append(f"- {TITLE[system]}: **{word}** — {text}.")
    ran = [w for w in words if w != "not run"]
    overall = "not run" if not ran else common.verdict_of([w == "reproduced" for w in ran])
    if overall == "not reproduced" and any(w == "partly reproduced" for w in ran):
        overall = "partly reproduced"
    seeds = sorted({seed for runs in results.values() for seed, res in runs.items() if _complete(res)})
    scope = "seed 0 only, each system" if seeds == [0] else f"seeds {', '.join(map(str, seeds))}"
    if len(seeds) > 1:
        scope += "; a check holds when it holds on more than half of a system's seeds"
    return common.verdict_section(overall, scope, lines)


@pyro_scope()  # module-local params for the script's own loops
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="sho,oscillators,nbody")
    ap.add_argument("--paper", action="store_true", help="paper settings (hours per model on CPU)")
    ap.add_argument("--steps", type=int, default=None, help="override the number of SVI steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--timing-only", action="store_true")
    ap.add_argument("--timing-reps", type=int, default=20)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument(
        "--models",
        default="none,learned,oracle",
        help="subset to (re)run; rows of the others are kept from the existing JSON if its settings match",
    )
    ap.add_argument("--eta-lr", type=float, default=None, help="override the η learning rate")
    ap.add_argument("--markdown-only", action="store_true", help="rebuild noether_tables.md from the JSON files")
    args = ap.parse_args(argv)
    set_threads(args.threads)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if not args.timing_only and not args.markdown_only:
        for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
            if system not in ORACLE:
                raise SystemExit(f"unknown system {system!r}; use {sorted(ORACLE)}")
            settings = dict((PAPER if args.paper else REDUCED)[system])
            if args.steps:
                settings["steps"] = args.steps
            if args.eta_lr:
                settings["eta_lr"] = args.eta_lr
            models = tuple(m.strip() for m in args.models.split(",") if m.strip())
            stem = stem_of(system, args.seed)
            res = run_system(system, settings, args.seed, args.cache_dir, models, stem)
            old_path = RESULTS_DIR / f"{stem}.json"
            if len(models) < 3 and old_path.exists():
                old = json.loads(old_path.read_text())
                same = {k: v for k, v in old["settings"].items() if k != "eta_lr"} == json.loads(
                    json.dumps({k: v for k, v in res["settings"].items() if k != "eta_lr"})
                )
                if not same:
                    raise SystemExit("existing results were made with other settings; rerun all models")
                res["rows"] = {**old["rows"], **res["rows"]}
                res["analysis"] = res["analysis"] or old.get("analysis")
                res["settings"]["eta_lr_per_model"] = {
                    m: (res["settings"]["eta_lr"] if m in models else old["settings"].get("eta_lr"))
                    for m in ("none", "learned", "oracle")
                }
            if old_path.exists() and "note" in (old := json.loads(old_path.read_text())):
                res["note"] = old["note"]  # the history of how a setting was chosen outlives a rerun
            res.update(machine=machine_info(), command=command_line(), paper=args.paper)
            res["seed"] = args.seed
            old_path.write_text(json.dumps(res, indent=1, default=str) + "\n")
            (RESULTS_DIR / "noether_tables.md").write_text(markdown())
    if args.timing_only or not (args.no_timing or args.markdown_only):
        t = step_timing(args.timing_reps, args.seed)
        t.update(machine=machine_info(), command=command_line())
        (RESULTS_DIR / "noether_timing.json").write_text(json.dumps(t, indent=1, default=str) + "\n")
    (RESULTS_DIR / "noether_tables.md").write_text(markdown())
    log(f"wrote {RESULTS_DIR / 'noether_tables.md'}")


if __name__ == "__main__":
    main()
