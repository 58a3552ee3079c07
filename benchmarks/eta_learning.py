"""How η is learned on rotated digits: MAP against the ELBO (paper 003 Fig. 5), and the ±90° η by a converged ELBO.

Two tables, one result file each; every setting below was fixed before any full run of this script (the
step costs were measured first: ≈ 25 ms of CPU per step for the block-Cholesky guide and ≈ 15 ms for the
point estimates at H = 256, S = 16, batch 128, one thread).

**Table A — paper 003 Fig. 5** (``results/eta_learning_map_vs_elbo.md``, ``.json``, ``.png``). Paper 003
(Sec. 4.1) trains one model by its ELBO and one with the Gaussian guide replaced by a point estimate and the
KL term dropped (cross-entropy), and finds the point estimate "completely incapable" of learning the
rotation invariance of fully rotated MNIST, while VI learns it. Here:

- data: ``rotated-digits`` (scikit-learn's 8×8 digits shipped with scikit-learn, every image rotated once by
  θ ~ U[−π, π] as the library's dataset does; all 1347 training and 450 test images);
- model: ``InvariantMLP(symmetry="rotation")`` with random Fourier features, H = 256, S = 16 rotations per
  step, η from 0.1 rad, ``init_seed`` = the seed (tutorial 01's model, its features drawn per seed);
- four rows, the same model and fit settings, differing only in the guide and the prior scale σ_p:
  ``ELBO (σ_p hierarchical)`` (block-Cholesky guide, σ_p ~ LogNormal(0, 1): tutorial 01 §3),
  ``ELBO (σ_p = 1)`` (block-Cholesky, σ_p fixed at 1: the MAP row's model, so that only the guide differs),
  ``MAP (σ_p = 1)`` (the ``map`` guide, σ_p fixed at 1: tutorial 01 §4; with the hierarchical σ_p MAP is
  degenerate) and ``ML (σ_p = 1000)`` (the ``map`` guide with σ_p fixed at 1000: the log prior's pull,
  −w/σ_p², is 10⁻⁶ of MAP's, so the objective is the paper's cross-entropy up to a constant);
- **added after the first run had been seen** (reported, not counted in the verdict): ``ML (σ_p = 1000), from
  W2 = 0``. The ``map`` guide starts its point estimates at the median of draws from the prior, so the ML row
  above starts with W2 of the prior's scale, σ_p = 1000 (the table's mean |W2| after the first step), and
  its fit stays near chance accuracy; this row is the same fit started at 0 (``init_loc_fn=init_to_feasible``),
  where the ELBO rows' guide means start;
- fit: ``pyro_invariance.fit``'s defaults (Adam lr 0.05, η lr 0.1, factor lr 1e-3, cosine to 0,
  ``TraceMeanField_ELBO`` with one particle, batch 128), 2000 steps, seeds 0, 1, 2 (the fit's seed and
  the features' ``init_seed``);
- reported: η over training (figure; the table at steps 1, 100, 250, 500, 1000, 1500, 2000), the final η
  mean ± sd over seeds, test accuracy and NLL (``pyro_invariance.evaluate``, 16 guide draws) and, for the
  ELBO rows, ELBO/N on the training set (32 particles);
- criteria: both ELBO rows end with η > 2.4 rad and both point-estimate rows with η < 1.0 rad, on every
  seed (the thresholds of the fully rotated and the upright criteria of Table B). Whether a point
  estimate's η ends below its start (the paper's figure shows it falling) is reported, not a criterion.

**Table B — the ±90° η by a converged ELBO with the paper's guide** (``results/eta_learning_converged.md``,
``.json``). Paper 003's claim is that the ELBO learns the amount of invariance the data have.

- data: the first 300 training digits (and the 450 test digits) of ``partially-rotated-digits``
  (θ ~ U[−π/2, π/2]), ``rotated-digits`` and ``digits`` (upright): the data of the evidence results below;
- model: as in Table A with σ_p hierarchical and ``init_seed`` = the seed: the model whose evidence
  log p(D | η) the research files below computed (they average over a 16-point quadrature of the
  rotations, the fits over S = 16 random ones);
- guide: ``block-cholesky`` (paper 003's: one full-covariance Gaussian per class row of W2; the library's
  ``init_scale`` 0.1, where the paper starts at L = I);
- fit: ``pyro_invariance.fit``'s defaults as in Table A, seeds 0, 1, 2;
- **convergence rule**: fits of 1000, 2000, 4000 and 8000 steps, each a fresh fit whose cosine schedule spans
  its own length; a unit (data set, seed) has converged at 2S steps when, between the S-step and the
  2S-step fit, η moves by < 0.05 rad and the ELBO/N (32 particles on the 300 training digits, the fit's
  seed) changes by < 0.01; its η is then the 2S-step fit's. A unit stops at its first converged length.
  **Cap: 8000 steps**; a unit not converged by then is reported "not converged (cap)" with its last η.
  **Past the cap** (added after the 8000-step table, where all 9 units ended "not converged (cap)"; nothing
  else changed): ``--cap 16000`` adds a 16 000-step fit to each unit not yet converged, the rule between the
  8000- and the 16 000-step fit as between the shorter ones, into ``eta_learning_converged_cap16000.md``;
  at the measured 0.020–0.024 CPU s per step that is ≈ 9 × 340 s ≈ 51 CPU minutes, so ``--cpu-budget 7200``;
  **One more doubling** (added after the 16 000-step table, where all 9 units were still "not converged
  (cap)", η settled on 8 of 9 but ELBO/N rising 0.014–0.029; nothing else changed): ``--cap 32000
  --cpu-budget 12600`` adds a 32 000-step fit to each unit not yet converged, the rule between the 16 000- and
  the 32 000-step fit, into ``eta_learning_converged_cap32000.md``; at the measured 0.019–0.020 CPU s per step
  ≈ 9 × 630 s ≈ 95 CPU minutes on top of the 6315 spent;
- **CPU budget**: 3600 CPU seconds of one thread for Table A and Table B together (``--cpu-budget``),
  counted from the fits' own CPU time stored in the unit files. A fit starts only when the time spent plus
  its estimate (its steps × the mean CPU time per step of the finished fits of that table) stays within the
  budget; units it stops are reported "not converged (CPU budget)". A run stopped before that (by time)
  leaves its units "unfinished" and the verdict "not run"; the same command continues it. Order: Table A,
  then Table B by length (all units at 1000, then 2000, …), within a length ±90°, fully rotated, upright,
  seeds 0, 1, 2;
- criteria, on the converged η: ±90°: |η − π/2| ≤ 0.5; fully rotated: η > 2.4; upright: η < 1.0. A unit
  that did not converge fails its criterion (its last η is shown beside it).
- beside each unit, the **evidence's answer** from the existing research files (read, not recomputed):
  the mode of the AIS posterior over η and the η within 5 nats of its top
  (``research/uncertain_symmetry/results/uncertain_symmetry_annealed.json``), the Laplace posterior's
  mode (``uncertain_symmetry_laplace.json``; seeds 0 and 2 only), and why the two answers differ: the
  evidence gained from the ELBO's η to the AIS mode, ℓ_AIS(mode) − ℓ_AIS(η̂) (AIS estimates interpolated
  linearly along the scan), this fit's gap ℓ_AIS(η̂) − N·ELBO/N at η̂, and over the part of that range
  covered by the mean-field fixed-η fits of ``uncertain_symmetry_refined_units/`` (4000 steps, mean of 4
  restarts' final ELBO) the evidence's gain against the growth of their ELBO gap to the evidence.

Result files end with the Verdict (``_common.verdict_section``); ``--smoke`` runs both tables at toy
sizes in seconds (its numbers test nothing). Fits are resumable units (``_common.fill_unit``) in
``benchmarks/results/eta_learning_units/`` (committed, so a later session continues a stopped run with
the same command, e.g. with a larger ``--cpu-budget``); ``--collect`` only rewrites the tables.

    nice -n 10 .venv/bin/python benchmarks/eta_learning.py            # ≈ 60 CPU minutes, resumable
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import numpy as np  # noqa: E402
import pyro  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from pyro.infer.autoguide.initialization import init_to_feasible  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402

STEM_A, STEM_B = "eta_learning_map_vs_elbo", "eta_learning_converged"
UNITS_DIR = common.RESULTS_DIR / "eta_learning_units"
RESEARCH = common.REPO_ROOT / "research" / "uncertain_symmetry" / "results"
SEEDS = (0, 1, 2)
#: per size: Table A's data and fit length, Table B's data and fit lengths (the last is the cap)
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "hidden": 256,
        "samples": 16,
        "a_train": None,
        "a_test": None,
        "a_steps": 2000,
        "b_train": 300,
        "b_test": 450,
        "b_levels": (1000, 2000, 4000, 8000),
    },
    "smoke": {
        "hidden": 8,
        "samples": 2,
        "a_train": 40,
        "a_test": 20,
        "a_steps": 8,
        "b_train": 40,
        "b_test": 20,
        "b_levels": (4, 8),
    },
}
#: Table A's rows: label -> (guide, prior, σ_p, start of the point estimates: the map guide's default, a prior
#: median, or "zero")
ROWS_A: dict[str, tuple[str, str, float, str]] = {
    "ELBO (σ_p hierarchical)": ("block-cholesky", "hierarchical", 1.0, "default"),
    "ELBO (σ_p = 1)": ("block-cholesky", "fixed", 1.0, "default"),
    "MAP (σ_p = 1)": ("map", "fixed", 1.0, "default"),
    "ML (σ_p = 1000)": ("map", "fixed", 1000.0, "default"),
    "ML (σ_p = 1000), from W2 = 0": ("map", "fixed", 1000.0, "zero"),
}
#: rows added after the first run had been seen: reported, left out of the verdict
POST_HOC_ROWS = ("ML (σ_p = 1000), from W2 = 0",)
CHECKPOINT_FRACTIONS = (0.05, 0.125, 0.25, 0.5, 0.75, 1.0)
ETA_INIT, ELBO_ABOVE, POINT_BELOW = 0.1, 2.4, 1.0
#: Table B's data sets in run order: key -> (library name, title)
DATASETS_B: dict[str, tuple[str, str]] = {
    "partially-rotated": ("partially-rotated-digits", "±90° (θ ~ U[−π/2, π/2])"),
    "rotated": ("rotated-digits", "fully rotated (θ ~ U[−π, π])"),
    "upright": ("digits", "upright"),
}
CONVERGED_ETA, CONVERGED_ELBO = 0.05, 0.01
PARTIAL_TOLERANCE = 0.5
EVAL_SAMPLES, ELBO_PARTICLES = 16, 32
CPU_BUDGET = 3600.0
DEFAULT_SECONDS_PER_STEP = 0.03  # the budget's estimate before any fit of a table has finished


class BudgetExhausted(RuntimeError):
    """The next fit would take the CPU time spent past the budget."""


class Budget:
    """CPU seconds spent by the fits of both unit files, and the check before each new fit."""

    def __init__(self, limit: float, points: Sequence[dict[str, Any]]) -> None:
        self.limit, self.spent = float(limit), sum(p["cpu_seconds"] for p in points)
        self.rates: dict[str, list[float]] = {}
        for p in points:
            self.rates.setdefault(p["table"], []).append(p["cpu_seconds"] / p["steps"])

    def check(self, table: str, steps: int) -> None:
        rates = self.rates.get(table) or [DEFAULT_SECONDS_PER_STEP]
        estimate = steps * statistics.fmean(rates)
        if self.spent + estimate > self.limit:
            raise BudgetExhausted(f"{self.spent:.0f} s spent + {estimate:.0f} s estimated > {self.limit:.0f} s")

    def add(self, point: dict[str, Any]) -> None:
        self.spent += point["cpu_seconds"]
        self.rates.setdefault(point["table"], []).append(point["cpu_seconds"] / point["steps"])


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------
def run_fit(
    data: Any,
    size: dict[str, Any],
    seed: int,
    steps: int,
    guide_name: str,
    prior: str,
    prior_scale: float,
    start: str = "default",
) -> dict[str, Any]:
    """One fit of the rotation-invariant MLP and its evaluation: η's path, final η, held-out metrics, CPU time."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    model, guide = model_and_guide(data, size, seed, guide_name, prior, prior_scale, start)
    result = pi.fit(model, guide, data, steps=steps, seed=seed, progress=False)
    metrics = pi.evaluate(result, data, num_samples=EVAL_SAMPLES, num_particles=ELBO_PARTICLES, seed=seed)
    path = result.history["eta"]["rot"]
    every = max(1, steps // 200)
    return {
        "steps": steps,
        "seed": seed,
        "eta": result.eta["rot"],
        "path_steps": result.history["step"][::every] + result.history["step"][-1:],
        "eta_path": path[::every] + path[-1:],
        "accuracy": metrics["accuracy"],
        "nll": metrics["nll"],
        "elbo_per_datum": metrics["elbo_per_datum"],  # for a point estimate: the log joint / N, not a bound
        "train_elbo_last10pct": result.final_elbo,
        "cpu_seconds": time.process_time() - cpu0,
        "wall_seconds": time.perf_counter() - wall0,
    }


def model_and_guide(
    data: Any, size: dict[str, Any], seed: int, guide_name: str, prior: str, prior_scale: float, start: str
) -> tuple[Any, Any]:
    """The rotation-invariant MLP of a row (seeded) and its guide; ``start="zero"``: the point estimates start at
    0 (the ELBO rows' guide means), not at the median of prior draws."""
    pyro.set_rng_seed(seed)
    model = InvariantMLP(
        image_shape=data.image_shape,
        num_classes=data.num_classes,
        hidden=size["hidden"],
        num_transforms=size["samples"],
        symmetry="rotation",
        eta_init=ETA_INIT,
        prior=prior,
        prior_scale=prior_scale,
        init_seed=seed,
    )
    guide = pi.guides.get(guide_name, model, **({"init_loc_fn": init_to_feasible} if start == "zero" else {}))
    return model, guide


def start_scale(data: Any, size: dict[str, Any], seed: int, row: str) -> dict[str, Any]:
    """Mean |W2| of the row's guide after its fit's first step (the same seeded start as the full fit): where
    the point estimates and the guide means begin."""
    guide_name, prior, prior_scale, start = ROWS_A[row]
    model, guide = model_and_guide(data, size, seed, guide_name, prior, prior_scale, start)
    result = pi.fit(model, guide, data, steps=1, seed=seed, progress=False)
    with pi.pyro_scope():  # module-local parameters: this result's own values, whatever the global store holds
        w2 = result.guide.median()["out_weight"]
    return {"row": row, "seed": seed, "w2_mean_abs": float(w2.abs().mean())}


def checkpoints(steps: int) -> list[int]:
    """Table A's read-out steps: 1 and the fractions :data:`CHECKPOINT_FRACTIONS` of the run."""
    return sorted({1, *(max(1, round(f * steps)) for f in CHECKPOINT_FRACTIONS)})


def eta_at(point: dict[str, Any], step: int) -> float:
    """η after ``step`` steps, from the stored (thinned) path: the last stored step ≤ ``step``."""
    pairs = [(s, e) for s, e in zip(point["path_steps"], point["eta_path"], strict=True) if s <= step]
    return pairs[-1][1] if pairs else ETA_INIT


def fill_table_a(work: Path, size: dict[str, Any], seeds: Sequence[int], budget: Budget) -> list[dict[str, Any]]:
    """Table A's fits (row × seed), resumable; stops at the budget."""
    data = pi.load_dataset("rotated-digits", train_size=size["a_train"], test_size=size["a_test"])

    def evaluate(key: tuple[str, int]) -> dict[str, Any]:
        row, seed = key
        budget.check("a", size["a_steps"])
        point = {"table": "a", "row": row, **run_fit(data, size, seed, size["a_steps"], *ROWS_A[row])}
        budget.add(point)
        return point

    keys = [(row, seed) for row in ROWS_A for seed in seeds]
    path = work / "map_vs_elbo.json"
    try:
        common.fill_unit(path, {"table": "a"}, keys, _key_a, evaluate, _describe)
    except BudgetExhausted as stop:
        common.log(f"Table A stopped by the CPU budget: {stop}")
    common.fill_unit(
        work / "map_vs_elbo_starts.json", {"table": "a"}, keys, _key_a, lambda k: start_scale(data, size, k[1], k[0])
    )
    return _points(path)


def _key_a(p: dict[str, Any]) -> tuple[str, int]:
    return p["row"], p["seed"]


def _key_b(p: dict[str, Any]) -> tuple[str, int, int]:
    return p["dataset"], p["seed"], p["steps"]


def _describe(key: Any, p: dict[str, Any]) -> str:
    elbo, acc, cpu = p["elbo_per_datum"], p["accuracy"], p["cpu_seconds"]
    return f"{key}: η {p['eta']:.3f}, ELBO/N {elbo:.3f}, acc {acc:.3f}, CPU {cpu:.0f} s"


def _points(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["points"] if path.exists() else []


def unit_status(fits: Sequence[dict[str, Any]], levels: Sequence[int]) -> dict[str, Any]:
    """The convergence rule on one unit's fits (any order): ``{"state", "steps", "fit"}``.

    ``state`` is ``"converged"`` at the first length 2S whose fit moved η by < :data:`CONVERGED_ETA` and the
    ELBO/N by < :data:`CONVERGED_ELBO` from the S-step fit; ``"not converged (cap)"`` when the last length
    ran without that; else ``"running"`` (the next length is due). ``fit`` is the deciding (or last) fit."""
    by_steps = {f["steps"]: f for f in fits}
    last = None
    for i, steps in enumerate(levels):
        fit = by_steps.get(steps)
        if fit is None:
            return {"state": "running", "steps": steps, "fit": last}
        if last is not None and is_converged(last, fit):
            return {"state": "converged", "steps": steps, "fit": fit}
        last = fit
    return {"state": "not converged (cap)", "steps": levels[-1], "fit": last}


def is_converged(shorter: dict[str, Any], longer: dict[str, Any]) -> bool:
    """The rule between the S-step and the 2S-step fit: |Δη| < 0.05 rad and |ΔELBO/N| < 0.01."""
    return (
        abs(longer["eta"] - shorter["eta"]) < CONVERGED_ETA
        and abs(longer["elbo_per_datum"] - shorter["elbo_per_datum"]) < CONVERGED_ELBO
    )


def fill_table_b(work: Path, size: dict[str, Any], seeds: Sequence[int], budget: Budget) -> list[dict[str, Any]]:
    """Table B's fits, length by length, each unit until it converges or reaches the cap; stops at the budget."""
    path, levels = work / "converged.json", size["b_levels"]
    data = {
        key: pi.load_dataset(name, train_size=size["b_train"], test_size=size["b_test"])
        for key, (name, _) in DATASETS_B.items()
    }

    def evaluate(key: tuple[str, int, int]) -> dict[str, Any]:
        dataset, seed, steps = key
        budget.check("b", steps)
        fit = run_fit(data[dataset], size, seed, steps, "block-cholesky", "hierarchical", 1.0)
        point = {"table": "b", "dataset": dataset, **fit}
        budget.add(point)
        return point

    for steps in levels:
        done = _points(path)
        keys = []
        for ds in DATASETS_B:
            for seed in seeds:
                status = unit_status([p for p in done if (p["dataset"], p["seed"]) == (ds, seed)], levels)
                if status["state"] == "running" and status["steps"] == steps:
                    keys.append((ds, seed, steps))
        try:
            common.fill_unit(path, {"table": "b"}, keys, _key_b, evaluate, _describe)
        except BudgetExhausted as stop:
            common.log(f"Table B stopped by the CPU budget at {steps} steps: {stop}")
            break
    return _points(path)


# --------------------------------------------------------------------------------------------
# Table A: rendering
# --------------------------------------------------------------------------------------------
def _mean_sd(values: Sequence[float], fmt: str = ".2f") -> str:
    if not values:
        return "…"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):{fmt}} ± {sd:{fmt}}"


def _by_row(points: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, list[dict[str, Any]]]:
    found = {(p["row"], p["seed"]): p for p in points}
    return {row: [found[(row, s)] for s in seeds if (row, s) in found] for row in ROWS_A}


def criterion_a(row: str, eta: float) -> bool:
    """An ELBO row learns the invariance (η > 2.4); a point-estimate row does not (η < 1.0)."""
    return eta > ELBO_ABOVE if ROWS_A[row][0] != "map" else eta < POINT_BELOW


def verdict_a(points: Sequence[dict[str, Any]], seeds: Sequence[int], preset: str) -> str:
    """The Verdict of Table A: every row fixed in advance meets its criterion on every seed (the rows added after
    the first run are listed, not counted)."""
    if preset == "smoke":
        return common.verdict_section("not run", "smoke size: its numbers test nothing")
    every = _by_row(points, seeds)
    rows = {row: fits for row, fits in every.items() if row not in POST_HOC_ROWS}
    if any(len(fits) < len(seeds) for fits in rows.values()):
        missing = sum(len(seeds) - len(f) for f in rows.values())
        return common.verdict_section("not run", f"{missing} of {len(rows) * len(seeds)} fits missing")
    checks, lines = [], []
    for row, fits in every.items():
        held = [criterion_a(row, f["eta"]) for f in fits]
        if row in rows:
            checks.append(all(held))
        want = f"η > {ELBO_ABOVE}" if ROWS_A[row][0] != "map" else f"η < {POINT_BELOW}"
        etas = ", ".join(f"{f['eta']:.2f}" for f in fits)
        accuracy = ", ".join(f"{100 * f['accuracy']:.1f}" for f in fits)
        if not fits:
            continue
        late = " (added after the first run: not counted)" if row in POST_HOC_ROWS else ""
        lines.append(
            f"- {row}{late}: {want} on {sum(held)} of {len(fits)} seeds (final η {etas} rad; "
            f"test accuracy {accuracy} %)."
        )
    below = sum(f["eta"] < ETA_INIT for row, fits in rows.items() if ROWS_A[row][0] == "map" for f in fits)
    lines.append(
        f"- Not a criterion: the point estimates fixed in advance end below their start (η < {ETA_INIT}) in "
        f"{below} of {sum(len(f) for r, f in rows.items() if ROWS_A[r][0] == 'map')} fits (paper 003's figure "
        "shows η falling)."
    )
    lines.append(
        "- Sklearn's 8×8 digits at H = 256, S = 16, against the paper's MNIST: the claim is compared, not the numbers."
    )
    counts = ", ".join(f"{r} {sum(criterion_a(r, f['eta']) for f in fits)}/{len(fits)}" for r, fits in rows.items())
    return common.verdict_section(common.verdict_of(checks), f"seeds {', '.join(map(str, seeds))}; {counts}", lines)


def draw_a(points: Sequence[dict[str, Any]], seeds: Sequence[int], path: Path) -> None:
    """η over training, every row and seed, on a Figure of its own (no pyplot state)."""
    fig = Figure(figsize=(9.0, 3.8))
    ax = fig.add_subplot()
    for i, (row, fits) in enumerate(_by_row(points, seeds).items()):
        for j, f in enumerate(fits):
            ax.plot(f["path_steps"], f["eta_path"], color=f"C{i}", lw=1.2, alpha=0.8, label=row if j == 0 else None)
    ax.axhline(math.pi, color="grey", ls=":", lw=1)
    ax.axhline(ELBO_ABOVE, color="grey", ls="--", lw=0.8)
    ax.axhline(POINT_BELOW, color="grey", ls="--", lw=0.8)
    ax.set(
        xlabel="SVI step", ylabel="η (rad)", ylim=(0, 3.3), title="rotated digits: η over training (one line per seed)"
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _start_note(rows: dict[str, list[dict[str, Any]]], starts: Sequence[dict[str, Any]]) -> list[str]:
    """Where the point estimates start (the map guide's prior-median start), read off the starts unit file."""
    w2 = {r: [p["w2_mean_abs"] for p in starts if p["row"] == r] for r in rows}
    ml, ml0, mp = "ML (σ_p = 1000)", "ML (σ_p = 1000), from W2 = 0", "MAP (σ_p = 1)"
    if not (w2[ml] and w2[mp] and rows[ml]):
        return []
    accuracy = ", ".join(f"{100 * f['accuracy']:.1f}" for f in rows[ml])
    return [
        f"The `map` guide starts at the median of prior draws: mean |W2| after the first step is "
        f"{statistics.fmean(w2[ml]):.0f} for {ml} against {statistics.fmean(w2[mp]):.2f} for {mp}. From there the "
        f"{ml} fits end near chance accuracy ({accuracy} %): that row measures its start, not cross-entropy's η. "
        f"The row {ml0}, added after the first run had been seen, starts where the ELBO rows' guide means start "
        "(0) and is the cross-entropy fit the paper describes; it is listed in the Verdict but not counted.",
        "",
    ]


def settings_a(size: dict[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """Table A's settings, as its result file lists them."""
    return {
        "data": f"rotated-digits, training images {size['a_train'] or 'all 1347'}, test {size['a_test'] or 'all 450'}",
        "model": f"InvariantMLP(symmetry='rotation', activation='rff', hidden={size['hidden']}, "
        f"num_transforms={size['samples']}, eta_init={ETA_INIT}, init_seed=seed)",
        "rows (guide, prior, σ_p)": {row: list(v) for row, v in ROWS_A.items()},
        "fit": f"pyro_invariance.fit defaults (Adam lr 0.05, eta_lr 0.1, factor_lr 1e-3, cosine to 0, "
        f"TraceMeanField_ELBO 1 particle, batch 128), {size['a_steps']} steps, seed = seed",
        "evaluation": f"pyro_invariance.evaluate: {EVAL_SAMPLES} guide draws, ELBO/N with {ELBO_PARTICLES} particles",
        "seeds": list(seeds),
        "criteria": f"ELBO rows η > {ELBO_ABOVE}, point-estimate rows η < {POINT_BELOW}, on every seed",
        "threads": 1,
    }


def _final_table(points: Sequence[dict[str, Any]], seeds: Sequence[int], starts: Sequence[dict[str, Any]]) -> list[str]:
    """Table A's first table: final η, held-out metrics, ELBO/N and where W2 starts, per row."""
    rows = []
    for row, fits in _by_row(points, seeds).items():
        elbo = _mean_sd([f["elbo_per_datum"] for f in fits], ".3f") if ROWS_A[row][0] != "map" else "– (not a bound)"
        w2 = [p["w2_mean_abs"] for p in starts if p["row"] == row and p["seed"] in seeds]
        rows.append(
            [
                row + (" (added after the first run)" if row in POST_HOC_ROWS else ""),
                _mean_sd([f["eta"] for f in fits]),
                ", ".join(f"{f['eta']:.2f}" for f in fits) or "…",
                _mean_sd([100 * f["accuracy"] for f in fits], ".1f"),
                _mean_sd([f["nll"] for f in fits], ".3f"),
                elbo,
                _mean_sd(w2, ".3g"),
            ]
        )
    return [
        "## Final η and held-out metrics (mean ± sd over seeds)",
        "",
        common.md_table(
            "row | final η (rad) | per seed | test accuracy % | test NLL | ELBO/N (train) | mean \\|W2\\| after step 1",
            rows,
        ),
        "",
    ]


def render_a(
    points: Sequence[dict[str, Any]],
    size: dict[str, Any],
    seeds: Sequence[int],
    preset: str,
    head: dict[str, Any],
    starts: Sequence[dict[str, Any]] = (),
) -> tuple[str, dict[str, Any]]:
    """Table A's markdown and JSON payload."""
    settings = settings_a(size, seeds)
    intro = (
        "Paper 003 Fig. 5 (Sec. 4.1): a point estimate trained by cross-entropy cannot learn the rotation "
        "invariance of fully rotated images, variational inference (the ELBO) can. Re-run on scikit-learn's "
        "rotated 8×8 digits with the library's invariant MLP; method and the reasons for every setting: the "
        "docstring of `benchmarks/eta_learning.py`."
    )
    out = [
        common.header_markdown(
            "η learned by MAP and by the ELBO (paper 003 Fig. 5)", head["info"], settings, head["command"], intro
        )
    ]
    total = len(ROWS_A) * len(seeds)
    out.append(
        f"Fits finished: {len(points)} of {total}; CPU time of this table's fits "
        f"{sum(p['cpu_seconds'] for p in points):.0f} s (both tables: {head['spent']:.0f} s of the "
        f"{head['budget']:.0f} s budget).\n"
    )
    out += [f"![η over training]({head['figure']})", ""]
    out += _final_table(points, seeds, starts)
    out += _start_note(_by_row(points, seeds), starts)
    marks = checkpoints(size["a_steps"])
    traj = [
        [row, *(_mean_sd([eta_at(f, s) for f in fits]) for s in marks)] for row, fits in _by_row(points, seeds).items()
    ]
    out += ["## η over training (rad, mean ± sd over seeds)", ""]
    out += [common.md_table(["row", *(f"step {s}" for s in marks)], traj), ""]
    out.append(verdict_a(points, seeds, preset))
    payload = {
        "settings": settings,
        "machine": head["info"],
        "command": head["command"],
        "points": list(points),
        "starts": list(starts),
    }
    return "\n".join(out), payload


# --------------------------------------------------------------------------------------------
# Table B: the evidence's answer, read from the research files
# --------------------------------------------------------------------------------------------
def evidence_reference() -> dict[tuple[str, int], dict[str, Any]]:
    """Per (data set, seed): the AIS scan and posterior, the Laplace posterior's mode (where run) and the
    mean-field fixed-η fits' ELBO along η, from ``research/uncertain_symmetry/results/``."""
    annealed = json.loads((RESEARCH / "uncertain_symmetry_annealed.json").read_text())
    laplace = json.loads((RESEARCH / "uncertain_symmetry_laplace.json").read_text())
    num_train = json.loads((RESEARCH / "uncertain_symmetry_refined_steps4000.json").read_text())["settings"][
        "train_size"
    ]
    modes = {(u["dataset"], u["seed"]): u["laplace_posterior"]["mode"] for u in laplace["units"]}
    out = {}
    for unit in annealed["seeds"]:
        key = (unit["dataset"], unit["seed"])
        refined = RESEARCH / "uncertain_symmetry_refined_units" / f"{key[0]}_seed{key[1]}.json"
        fixed: dict[float, list[float]] = {}
        for fit in json.loads(refined.read_text())["fits"] if refined.exists() else []:
            fixed.setdefault(fit["eta"], []).append(num_train * fit["final_elbo_per_datum"])
        out[key] = {
            "ais_etas": unit["etas"],
            "ais_log_evidence": unit["combined"],
            "ais_mode": unit["summary"]["mode"],
            "ais_top5": unit["plateau"],
            "laplace_mode": modes.get(key),
            "type_ii_meanfield_4000": unit["iwae_reference"]["type_ii_eta"],
            "meanfield_elbo": sorted((eta, statistics.fmean(v)) for eta, v in fixed.items()),
            "num_train": num_train,
        }
    return out


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Linear interpolation inside ``[min xs, max xs]``; None outside."""
    return float(np.interp(x, xs, ys)) if min(xs) <= x <= max(xs) else None


def why_columns(eta: float, elbo_per_datum: float, ref: dict[str, Any]) -> dict[str, Any]:
    """How far the ELBO's η̂ is from the evidence's mode, and why: the evidence gained from η̂ to the mode,
    this fit's gap ℓ_AIS(η̂) − N·ELBO/N, and from η̂ towards the mode (both clipped to the η the mean-field
    fixed-η fits cover) the evidence's gain against the growth of those fits' ELBO gap to it."""
    xs, ys = ref["ais_etas"], ref["ais_log_evidence"]
    at_eta, at_mode = _interp(eta, xs, ys), _interp(ref["ais_mode"], xs, ys)
    out: dict[str, Any] = {
        "evidence_gain": None if at_eta is None or at_mode is None else at_mode - at_eta,
        "gap_here": None if at_eta is None else at_eta - ref["num_train"] * elbo_per_datum,
        "window": None,
    }
    grid = [(e, v) for e, v in ref["meanfield_elbo"] if min(xs) <= e <= max(xs)]
    if len(grid) < 2:
        return out
    lo, hi = grid[0][0], grid[-1][0]
    start, end = min(max(eta, lo), hi), min(max(ref["ais_mode"], lo), hi)  # η̂ and the mode, clipped to the fits
    if abs(end - start) < 0.05:
        return out
    ge, gv = [e for e, _ in grid], [v for _, v in grid]
    evidence = _interp(end, xs, ys) - _interp(start, xs, ys)
    elbo = _interp(end, ge, gv) - _interp(start, ge, gv)
    out["window"] = {"from": start, "to": end, "evidence_gain": evidence, "gap_growth": evidence - elbo}
    return out


# --------------------------------------------------------------------------------------------
# Table B: rendering
# --------------------------------------------------------------------------------------------
def criterion_b(dataset: str, eta: float) -> bool:
    """±90°: |η − π/2| ≤ 0.5; fully rotated: η > 2.4; upright: η < 1.0."""
    if dataset == "partially-rotated":
        return abs(eta - math.pi / 2) <= PARTIAL_TOLERANCE
    return eta > ELBO_ABOVE if dataset == "rotated" else eta < POINT_BELOW


def statuses(
    points: Sequence[dict[str, Any]], seeds: Sequence[int], levels: Sequence[int], spent: float, limit: float
) -> dict[tuple[str, int], dict[str, Any]]:
    """Every unit's :func:`unit_status`. A unit whose next length is due is "not converged (CPU budget)" when
    that fit would not fit in what is left of ``limit`` after ``spent`` (the budget's estimate), else
    "unfinished" (the run stopped early: the same command continues it)."""
    rates = [p["cpu_seconds"] / p["steps"] for p in points] or [DEFAULT_SECONDS_PER_STEP]
    out = {}
    for ds in DATASETS_B:
        for seed in seeds:
            status = dict(unit_status([p for p in points if (p["dataset"], p["seed"]) == (ds, seed)], levels))
            if status["state"] == "running":
                over = spent + status["steps"] * statistics.fmean(rates) > limit
                status["state"] = "not converged (CPU budget)" if over else "unfinished"
            status["holds"] = status["state"] == "converged" and criterion_b(ds, status["fit"]["eta"])
            out[(ds, seed)] = status
    return out


def _f(value: float | None, fmt: str = ".2f", none: str = "–") -> str:
    return none if value is None else f"{value:{fmt}}"


def _criterion_cell(ds: str, status: dict[str, Any]) -> str:
    """ "holds" / "fails" for a converged unit; for any other, what its last η would say (not a pass)."""
    fit = status["fit"]
    if fit is None:
        return "–"
    if status["state"] == "converged":
        return "holds" if status["holds"] else "fails"
    last = "meets" if criterion_b(ds, fit["eta"]) else "misses"
    return f"{'pending' if status['state'] == 'unfinished' else 'fails'} (last η {last} it)"


def _unit_row(ds: str, seed: int, status: dict[str, Any], ref: dict[str, Any] | None) -> list[str]:
    fit = status["fit"]
    state = status["state"] + (f" at {status['steps']}" if status["state"] == "converged" else "")
    eta = "…" if fit is None else f"{fit['eta']:.2f}, {state}"
    crit = _criterion_cell(ds, status)
    if ref is None:
        return [DATASETS_B[ds][1], str(seed), eta, crit, *["–"] * 6]
    if fit is None:
        return [DATASETS_B[ds][1], str(seed), eta, crit, *["…"] * 6]
    why = (
        why_columns(fit["eta"], fit["elbo_per_datum"], ref)
        if fit
        else {"evidence_gain": None, "gap_here": None, "window": None}
    )
    w = why["window"]
    window = (
        "–"
        if w is None
        else f"{w['from']:.2f} → {w['to']:.2f}: evidence {w['evidence_gain']:+.1f}, gap {w['gap_growth']:+.1f}"
    )
    return [
        DATASETS_B[ds][1],
        str(seed),
        eta,
        crit,
        f"{ref['ais_mode']:.2f} [{ref['ais_top5'][0]:.2f}, {ref['ais_top5'][1]:.2f}]",
        _f(ref["laplace_mode"], none="not run"),
        _f(ref["type_ii_meanfield_4000"]),
        _f(why["evidence_gain"], "+.1f", "outside the AIS scan"),
        _f(why["gap_here"], ".1f", "outside the AIS scan"),
        window,
    ]


def verdict_b(
    units: dict[tuple[str, int], dict[str, Any]], refs: dict[Any, Any], seeds: Sequence[int], preset: str
) -> str:
    """The Verdict of Table B: every unit converged within the cap and its η meets its data set's criterion."""
    if preset == "smoke":
        return common.verdict_section("not run", "smoke size: its numbers test nothing")
    unfinished = sum(u["state"] == "unfinished" for u in units.values())
    if unfinished:
        return common.verdict_section(
            "not run",
            f"{unfinished} of {len(units)} units unfinished: the run stopped before the CPU budget was spent; "
            "the same command continues it",
        )
    lines, counts = [], []
    for ds, (_, title) in DATASETS_B.items():
        mine = [units[(ds, s)] for s in seeds]
        held, conv = sum(u["holds"] for u in mine), sum(u["state"] == "converged" for u in mine)
        counts.append(f"{title.split(' (')[0]} {held} of {len(seeds)}")
        etas = ", ".join("…" if u["fit"] is None else f"{u['fit']['eta']:.2f}" for u in mine)
        ais = [criterion_b(ds, refs[(ds, s)]["ais_mode"]) for s in seeds if (ds, s) in refs]
        lines.append(
            f"- {title}: converged on {conv} of {len(seeds)} seeds, criterion met by a converged η on {held} "
            f"(η {etas}); the AIS evidence's mode meets the same criterion on {sum(ais)} of {len(ais)} seeds."
        )
    lines.append("- The claim is about the ELBO; the evidence's answer beside it is read from the research files.")
    word = common.verdict_of([u["holds"] for u in units.values()])
    return common.verdict_section(word, "; ".join(counts) + " seeds (converged and within the criterion)", lines)


def _lengths_table(points: Sequence[dict[str, Any]], units: dict[Any, Any], levels: Sequence[int]) -> list[str]:
    found = {_key_b(p): p for p in points}
    rows = []
    for (ds, seed), status in units.items():
        cells = []
        for steps in levels:
            p = found.get((ds, seed, steps))
            cells.append("–" if p is None else f"{p['eta']:.3f} / {p['elbo_per_datum']:.4f} / {p['cpu_seconds']:.0f}")
        rows.append([DATASETS_B[ds][1], str(seed), *cells, status["state"]])
    header = ["data", "seed", *(f"{s} steps: η / ELBO/N / CPU s" for s in levels), "state"]
    return [common.md_table(header, rows, align=["l", "r", *["r"] * len(levels), "l"]), ""]


def settings_b(size: dict[str, Any], seeds: Sequence[int], budget: float) -> dict[str, Any]:
    """Table B's settings, as its result file lists them."""
    return {
        "data": f"first {size['b_train']} training and {size['b_test']} test images of "
        + ", ".join(name for name, _ in DATASETS_B.values()),
        "model": f"InvariantMLP(symmetry='rotation', activation='rff', hidden={size['hidden']}, num_transforms="
        f"{size['samples']}, prior='hierarchical', eta_init={ETA_INIT}, init_seed=seed)",
        "guide": "block-cholesky (library init_scale 0.1)",
        "fit": "pyro_invariance.fit defaults (Adam lr 0.05, eta_lr 0.1, factor_lr 1e-3, cosine to 0 over each fit, "
        "TraceMeanField_ELBO 1 particle, batch 128), seed = seed",
        "lengths (the last is the cap)": list(size["b_levels"]),
        "convergence rule": f"between the S- and the 2S-step fit |Δη| < {CONVERGED_ETA} rad and |ΔELBO/N| < "
        f"{CONVERGED_ELBO} (ELBO/N: {ELBO_PARTICLES} particles on the training set)",
        "criteria": f"±90°: |η − π/2| ≤ {PARTIAL_TOLERANCE}; fully rotated: η > {ELBO_ABOVE}; "
        f"upright: η < {POINT_BELOW}",
        "CPU budget (both tables)": f"{budget:.0f} s",
        "seeds": list(seeds),
        "evidence files": "research/uncertain_symmetry/results/uncertain_symmetry_annealed.json, "
        "uncertain_symmetry_laplace.json, uncertain_symmetry_refined_units/<data>_seed<k>.json",
        "threads": 1,
    }


def render_b(
    points: Sequence[dict[str, Any]], size: dict[str, Any], seeds: Sequence[int], preset: str, head: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Table B's markdown and JSON payload."""
    levels = size["b_levels"]
    settings = settings_b(size, seeds, head["budget"])
    intro = (
        "Paper 003 claims the ELBO learns the amount of invariance the data have. Here the ELBO with the paper's "
        "block-Cholesky guide is run until a convergence rule fixed in advance holds, on ±90°, fully rotated and "
        "upright digits, and set beside what the evidence log p(D | η) itself says (read from the research "
        "files named in Settings). Method and the reasons for every setting: the docstring of "
        "`benchmarks/eta_learning.py`."
    )
    out = [
        common.header_markdown(
            "η by a converged ELBO, beside the evidence's mode", head["info"], settings, head["command"], intro
        )
    ]
    out.append(
        f"Fits finished: {len(points)}; CPU time of this table's fits {sum(p['cpu_seconds'] for p in points):.0f} s "
        f"(both tables: {head['spent']:.0f} s of the {head['budget']:.0f} s budget).\n"
    )
    refs = evidence_reference()
    units = statuses(points, seeds, levels, head["spent"], head["budget"])
    header = (
        "data | seed | ELBO η̂ (rad; state) | criterion | AIS posterior mode [η within 5 nats of its top] | "
        "Laplace mode | mean-field type-II η (4000 steps) | evidence gain ℓ_AIS(mode) − ℓ_AIS(η̂) | "
        "this fit's gap ℓ_AIS(η̂) − N·ELBO/N(η̂) | "
        "mean-field fixed-η fits between η̂ and the mode: evidence gain, gap growth"
    )
    rows = [_unit_row(ds, seed, st, refs.get((ds, seed))) for (ds, seed), st in units.items()]
    out += [
        "## The ELBO's η and the evidence's",
        "",
        common.md_table(header, rows, align=["l", "r", "r", "l", *["r"] * 6]),
        "",
    ]
    out += [
        "How to read the last four columns (nats, N = the 300 training digits): the AIS posterior, Laplace mode and "
        "mean-field type-II η come from the research files; *evidence gain* is how much log p(D | η) rises from the "
        "ELBO's η̂ to the AIS mode; *this fit's gap* is log p(D | η̂) − ELBO at η̂; the last column takes, over the "
        "part of [η̂, AIS mode] that the stored mean-field fixed-η fits cover, the rise of the evidence and the "
        "rise of those fits' gap to it: where the gap grows by more than the evidence, the ELBO falls while the "
        "evidence rises, and the ELBO's maximum stays below the evidence's. The AIS evidence averages the 16-point "
        "quadrature of the rotations, the fits 16 random rotations per step (a few nats apart at η = 0.5, "
        "`uncertain_symmetry_annealed.md`, checks (c)).",
        "",
        "## Every fit: η / ELBO/N / CPU seconds per length",
        "",
    ]
    out += _lengths_table(points, units, levels)
    out.append(verdict_b(units, refs, seeds, preset))
    payload = {
        "settings": settings,
        "machine": head["info"],
        "command": head["command"],
        "budget": {"spent": head["spent"], "limit": head["budget"]},
        "units": {f"{ds}|{seed}": {**st, "fit": st["fit"]} for (ds, seed), st in units.items()},
        "points": list(points),
    }
    return "\n".join(out), payload


def levels_to(levels: Sequence[int], cap: int, parser: argparse.ArgumentParser) -> tuple[int, ...]:
    """Table B's lengths extended by doubling the last one up to ``cap`` (which must be such a doubling)."""
    out = list(levels)
    while out[-1] < cap:
        out.append(2 * out[-1])
    if out[-1] != cap or cap == levels[-1]:
        parser.error(f"--cap {cap}: use the cap {levels[-1]} doubled one or more times ({2 * levels[-1]}, …)")
    return tuple(out)


# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="toy sizes, seconds (the numbers test nothing)")
    parser.add_argument("--tables", default="a,b", help="a, b or a,b (default)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cpu-budget", type=float, default=CPU_BUDGET, help="CPU seconds for all fits together")
    parser.add_argument(
        "--cap", type=int, default=None, help="Table B's longest fit: the preset's cap doubled one or more times"
    )
    parser.add_argument("--collect", action="store_true", help="only rewrite the tables from the unit files")
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR, help="where the result files go")
    parser.add_argument("--work-dir", type=Path, default=None, help="unit files (default results/eta_learning_units)")
    args = parser.parse_args(argv)
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not tables or set(tables) - {"a", "b"}:
        parser.error("--tables takes a, b or a,b")
    common.set_threads(args.threads)
    preset = "smoke" if args.smoke else "full"
    size, seeds = SIZES[preset], [int(s) for s in args.seeds.split(",")]
    if args.cap is not None:
        size = {**size, "b_levels": levels_to(size["b_levels"], args.cap, parser)}
    work = args.work_dir or (args.out_dir / "eta_learning_units" if args.smoke else UNITS_DIR)
    work.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.cpu_budget, _points(work / "map_vs_elbo.json") + _points(work / "converged.json"))
    common.log(f"{preset} size, seeds {seeds}; CPU spent so far {budget.spent:.0f} of {budget.limit:.0f} s")
    if not args.collect:
        if "a" in tables:
            fill_table_a(work, size, seeds, budget)
        if "b" in tables:
            fill_table_b(work, size, seeds, budget)
    suffix = "_smoke" if args.smoke else ""
    points_a, points_b = _points(work / "map_vs_elbo.json"), _points(work / "converged.json")
    head = {
        "info": common.machine_info(),
        # the command that fits (a --collect run only re-renders what it fitted)
        "command": common.command_line().replace(" --collect", ""),
        "spent": sum(p["cpu_seconds"] for p in points_a + points_b),
        "budget": args.cpu_budget,
        "figure": f"{STEM_A}{suffix}.png",
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if "a" in tables:
        draw_a(points_a, seeds, args.out_dir / head["figure"])
        starts = _points(work / "map_vs_elbo_starts.json")
        common.publish(STEM_A + suffix, *render_a(points_a, size, seeds, preset, head, starts), args.out_dir)
    if "b" in tables:
        stem_b = STEM_B + (f"_cap{args.cap}" if args.cap is not None else "") + suffix
        common.publish(stem_b, *render_b(points_b, size, seeds, preset, head), args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
