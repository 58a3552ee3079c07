"""The guide-comparison workbench: one model × data, several guides, the same seeds and budget.

:func:`compare_guides` fits every guide with :func:`~pyro_invariance.infer.training.fit` from the same
model initialisation (a fresh model per guide, built after seeding with ``seed``; a model
*instance* is deep-copied per guide) and the same settings, then reports per guide:

* the bounds on the training evidence from :mod:`pyro_invariance.infer.bounds` -- the Monte-Carlo ELBO
  and the importance-weighted bounds IWAE_K (``RenyiELBO(alpha=0)``) for each K, per datum, with
  standard errors, and the PSIS k̂ of the guide as an importance proposal;
* the exact log evidence per datum where the model has one (``basis-regression``);
* the learned symmetry parameters η;
* held-out metrics, as the model's task defines them (:mod:`pyro_invariance.tasks`: accuracy / NLL
  for classification, the talk's MSE columns for dynamics, RMSE / NLL for regression);
* time per SVI step and the guide's number of parameters;
* what the numbers are worth: the difference of each row's ELBO and largest-K IWAE to the best row's,
  ± its standard error (:func:`difference_to_best`), and flags (:func:`row_flags`) on rows whose k̂ is
  above 0.7 or whose fit had not converged (:data:`CONVERGENCE_RULE`, from the fit's ELBO trace).

:func:`compare_guides` is :func:`fit_guides` (fit and measure each guide: the :class:`GuideRun` s)
followed by :func:`comparison_table` (their rows and the settings). :class:`GuideComparison` renders
the table as text, markdown, JSON and a bar chart, in one unit (nats per datum, said in the header)
with ± one standard error on every bound in every format::

    import pyro_invariance as pi
    cmp = pi.compare_guides("invariant-mlp", "rotated-digits", guides=["mean-field", "matrix-normal", "block-cholesky"],
                            steps=300, model_kwargs={"hidden": 32})
    print(cmp.to_text()); cmp.plot().savefig("bounds.png")

All bounds are on log p(y_1..n | x_1..n, η) for the first n training points (all of them unless
``eval_subset`` says otherwise); with a subset they bound the evidence of that subset, computed with
the guide fitted to the full training set (a valid but looser bound than a guide fitted to the
subset would give).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyro
import torch
from torch import nn

import pyro_invariance.guides as guide_registry
import pyro_invariance.models as _models  # noqa: F401  (registers the models)
from pyro_invariance._optional import pyplot as plt
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.catalogue import check_model_fits_data, model_kwargs_for
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.diagnostics.evaluation import evaluate, exact_log_evidence, task_for
from pyro_invariance.diagnostics.plots import save_figure
from pyro_invariance.guides import num_guide_parameters
from pyro_invariance.infer.bounds import PSIS_MIN_DRAWS, _validate_Ks, check_observed, evidence_bounds
from pyro_invariance.infer.config import FitConfig, resolve_config
from pyro_invariance.infer.training import fit
from pyro_invariance.models.base import CatalogueModel, symmetry_summary
from pyro_invariance.registry import DATASETS, GUIDES, MODELS
from pyro_invariance.symmetry.affine import GENERATOR_NAMES, eta_to_human
from pyro_invariance.tasks import Column
from pyro_invariance.tasks import get as get_task
from pyro_invariance.validation import check_positive_int, derived_seed

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pyro_invariance.infer.bounds import EvidenceBounds
    from pyro_invariance.infer.training import FitResult

__all__ = [
    "ComparisonPlan",
    "GuideComparison",
    "GuideRun",
    "compare_guides",
    "comparison_table",
    "convergence_of",
    "default_bound_samples",
    "difference_to_best",
    "elbo_trace_change",
    "fit_guides",
    "format_eta",
    "guide_row",
    "image_size_of",
    "is_converged",
    "row_flags",
    "text_table",
]

DEFAULT_GUIDES = ("mean-field", "matrix-normal", "block-cholesky")


# ------------------------------------------------------------------------------------------------
# metrics and η, shared with the CLI


def format_eta(model: Any, image_size: int | None = None, guide: Any = None) -> str:
    """η of ``model`` for tables: ``rot=3.015 (±172.7°)`` for image generators, else ``name=value``
    (a latent η: the ``guide``'s median, marked ``q-median``)."""
    params = symmetry_summary(model, guide)
    latent = isinstance(model, CatalogueModel) and bool(model.symmetry_sites())
    text = _format_params(params, image_size)
    return f"q-median {text}" if latent and params else text


def _format_params(params: dict[str, Any], image_size: int | None) -> str:
    if not params:
        return "-"
    values = {k: v for k, v in params.items() if torch.as_tensor(v).numel() == 1}
    if not values:  # matrix-valued generators (symmetrised-hnn): report their size
        return ", ".join(f"{k}: {tuple(torch.as_tensor(v).shape)}" for k, v in params.items())
    if all(k in GENERATOR_NAMES for k in values):
        human = eta_to_human(list(values.values()), list(values), image_size)
        return ", ".join(f"{k}={float(v):.3f} ({human[k]})" for k, v in values.items())
    if len(values) > 4:  # many generators (symmetrised-hnn): a range keeps tables readable
        vs = [float(v) for v in values.values()]
        return f"{len(vs)} values in [{min(vs):.3g}, {max(vs):.3g}]"
    return ", ".join(f"{k}={float(v):.3f}" for k, v in values.items())


def _eta_values(model: Any, guide: Any = None) -> dict[str, Any]:
    params = symmetry_summary(model, guide)
    return {
        k: (float(v) if torch.as_tensor(v).numel() == 1 else torch.as_tensor(v).tolist()) for k, v in params.items()
    }


def image_size_of(data: Any) -> int | None:
    """The side of ``data``'s square images (its ``image_shape``'s last entry) for η in pixels, or ``None``."""
    shape = getattr(data, "image_shape", None)
    return int(shape[-1]) if shape else None


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Plain-text columns, each as wide as its widest cell, with a dashed rule under the first row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# result


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _finite_or_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_or_none(x) for x in v]
    return v


def _plot_range(vals: list[list[float]], errs: list[list[float]], exact: list[float]) -> tuple[float, float]:
    """The lowest and highest value the bar chart shows: bounds ± their errors and the exact values."""
    ends = [
        (v - e, v + e) if math.isfinite(e) else (v, v)
        for rv, re in zip(vals, errs)
        for v, e in zip(rv, re)
        if math.isfinite(v)
    ]
    if not ends:
        return -1.0, 0.0
    return min([a for a, _ in ends] + exact), max([b for _, b in ends] + exact)


def _fmt(v: Any, spec: str) -> str:
    if v is None:
        return "-"
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


# ------------------------------------------------------------------------------------------------
# what a row's numbers are worth: convergence, k̂ and the difference to the best row

#: PSIS k̂ above this: the guide is a poor importance proposal, its IWAE estimates and their errors
#: are unreliable (Yao et al. 2018).
KHAT_LIMIT = 0.7
#: The convergence windows: the last 10 % of a fit's learning-rate time and the 10 % before it.
CONVERGENCE_WINDOW = 0.1
#: A change of the training ELBO, or a difference between two rows, counts as real beyond this many of its
#: standard errors.
SIGNIFICANCE_Z = 2.0
#: Fewer steps than this in either window: the run is too short to judge.
MIN_WINDOW_STEPS = 5

CONVERGENCE_RULE = (
    "moving: the bound has not converged. The mean training ELBO/N (the fit's per-step estimates) over the "
    "last 10 % of the run's learning-rate time (Σ lr: with a constant rate the last 10 % of the steps; the "
    "default cosine schedule puts the last ≈ 40 % of the steps there) differs from its mean over the 10 % before "
    "by more than 2 standard errors of that difference and by more than the ELBO's ±: more steps would move the "
    "bound by more than its error bar"
)


def _window_indices(lrs: Sequence[float], n: int, window: float) -> tuple[list[int], list[int]]:
    """The steps whose learning-rate time starts in the last ``window`` of the total, and those in
    the ``window`` before (equal shares of the steps when the rates are missing or sum to 0)."""
    rates = [float(v) for v in lrs[:n]] if len(lrs) >= n else []
    if not rates or not all(math.isfinite(v) and v >= 0 for v in rates) or sum(rates) <= 0:
        rates = [1.0] * n
    total, start = sum(rates), 0.0
    last: list[int] = []
    previous: list[int] = []
    for i, rate in enumerate(rates):
        share = start / total
        if share >= 1.0 - window - 1e-12:
            last.append(i)
        elif share >= 1.0 - 2 * window - 1e-12:
            previous.append(i)
        start += rate
    return previous, last


def elbo_trace_change(history: Mapping[str, Any], window: float = CONVERGENCE_WINDOW) -> dict[str, Any]:
    """How much a fit's training ELBO/N still moved at its end, from ``history`` (``elbo``: the
    per-step estimates, ``lr``: the guide's rate per step).

    Returns ``change`` (mean over the last ``window`` of the learning-rate time minus the mean over
    the ``window`` before it, nats per datum), ``change_se`` (``sqrt(s_a²/n_a + s_b²/n_b)`` from the
    per-step spread) and the two windows' step counts; ``change`` and ``change_se`` are None when
    either window has fewer than :data:`MIN_WINDOW_STEPS` finite values. Learning-rate time, not
    steps: a schedule that anneals the rate to 0 freezes the last steps whether or not the fit had
    converged, so equal shares of Σ lr compare like with like."""
    values = [float(v) for v in history.get("elbo", [])]
    previous, last = _window_indices(list(history.get("lr", [])), len(values), window)
    a = [values[i] for i in previous if math.isfinite(values[i])]
    b = [values[i] for i in last if math.isfinite(values[i])]
    out: dict[str, Any] = {"change": None, "change_se": None, "previous_steps": len(previous), "last_steps": len(last)}
    if min(len(a), len(b)) < MIN_WINDOW_STEPS:
        return out
    var = [statistics.variance(w) / len(w) for w in (a, b)]
    out.update(change=statistics.fmean(b) - statistics.fmean(a), change_se=math.sqrt(sum(var)))
    return out


def is_converged(change: float | None, change_se: float | None, bound_se: float | None) -> bool | None:
    """The convergence rule (:data:`CONVERGENCE_RULE`): False when ``|change|`` exceeds
    :data:`SIGNIFICANCE_Z` × ``change_se`` and the bound's own standard error ``bound_se`` (per datum;
    ignored when unknown), True otherwise, None when ``change`` is unknown (a run too short to judge)."""
    if change is None or change_se is None or not math.isfinite(change):
        return None
    moved = abs(change) > SIGNIFICANCE_Z * change_se
    if bound_se is not None and math.isfinite(float(bound_se)):
        moved = moved and abs(change) > float(bound_se)
    return not moved


def convergence_of(history: Mapping[str, Any], bound_se: float | None) -> dict[str, Any]:
    """:func:`elbo_trace_change` of a fit's ``history`` with its verdict under :func:`is_converged`."""
    trace = elbo_trace_change(history)
    return {**trace, "converged": is_converged(trace["change"], trace["change_se"], bound_se)}


def row_flags(row: Mapping[str, Any]) -> list[str]:
    """What makes a row's bounds untrustworthy: ``k̂>0.7`` (a poor importance proposal), ``k̂ n/a``
    (too few draws to tell), ``moving`` (not converged, :data:`CONVERGENCE_RULE`), ``short`` (a run
    too short to judge its convergence). Point estimates get no k̂ flag (they have no k̂)."""
    flags = []
    k = row.get("k_hat")
    if row.get("is_bound", True) and k is not None:
        k = float(k)
        if math.isnan(k):
            flags.append("k̂ n/a")
        elif k > KHAT_LIMIT:
            flags.append(f"k̂>{KHAT_LIMIT}")
    convergence = row.get("convergence")
    if isinstance(convergence, Mapping):
        verdict = convergence.get("converged")
        if verdict is False:
            flags.append("moving")
        elif verdict is None:
            flags.append("short")
    return flags


def _finite(v: Any) -> bool:
    return v is not None and math.isfinite(float(v))


def difference_to_best(rows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float, float] | None]:
    """Per row, ``(value − best, se)`` for the bound ``key`` (``"elbo"``, ``"iwae100"``, per datum):
    best is the highest finite value among the rows that are bounds; the standard error of the
    difference is ``sqrt(se² + se_best²)`` (the two estimates treated as independent; NaN when
    either error is unknown), 0 for the best row itself. None for rows that are no bound (point
    estimates) or whose value is not finite."""
    candidates = [i for i, r in enumerate(rows) if r.get("is_bound", True) and _finite(r.get(key))]
    if not candidates:
        return [None] * len(rows)
    best = max(candidates, key=lambda i: float(rows[i][key]))
    top, top_se = float(rows[best][key]), rows[best].get(f"{key}_se")
    out: list[tuple[float, float] | None] = []
    for i, r in enumerate(rows):
        if i not in candidates:
            out.append(None)
        elif i == best:
            out.append((0.0, 0.0))
        else:
            se = r.get(f"{key}_se")
            both = _finite(se) and _finite(top_se)
            out.append((float(r[key]) - top, math.hypot(float(se), float(top_se)) if both else float("nan")))
    return out


def _resolved(diff: tuple[float, float] | None) -> bool:
    """Whether a difference to the best row is larger than twice its standard error."""
    return diff is not None and math.isfinite(diff[1]) and abs(diff[0]) > SIGNIFICANCE_Z * diff[1]


@dataclass
class GuideComparison:
    """What :func:`compare_guides` returns.

    Attributes:
        rows: one dict per guide (keys listed in :func:`compare_guides`).
        settings: model, data, fit and bound settings (everything needed to rerun it).
        kind: the name of the model's task (:mod:`pyro_invariance.tasks`; selects the metric columns).
        Ks: the importance sample sizes of the IWAE columns.
    """

    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    kind: str
    Ks: tuple[int, ...]
    results: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- table ------------------------------------------------------------------------------------
    def _metric_columns(self) -> list[Column]:
        """The task's held-out columns present in the rows; its bound columns are left out (the table
        has its own ELBO / IWAE / log Z columns)."""
        present = set().union(*(r["metrics"] for r in self.rows)) if self.rows else set()
        return get_task(self.kind).table_columns(present, bounds=False)

    def has_exact_evidence(self) -> bool:
        return any(r.get("log_evidence") is not None for r in self.rows)

    def header(self) -> list[str]:
        """The column titles; every bound and difference is per datum (``/N``)."""
        kmax = max(self.Ks)
        cols = ["guide", "params", "s/step", "ELBO/N"] + [f"IWAE{k}/N" for k in self.Ks]
        if self.has_exact_evidence():
            cols.append("log Z/N")
        cols += ["ELBO/N − best", f"IWAE{kmax}/N − best", "k̂", "flags", "η"]
        return cols + [c.title for c in self._metric_columns()]

    def differences(self) -> dict[str, list[tuple[float, float] | None]]:
        """:func:`difference_to_best` for the ELBO and for the largest K's IWAE, keyed by bound."""
        return {key: difference_to_best(self.rows, key) for key in ("elbo", f"iwae{max(self.Ks)}")}

    def table_rows(self, with_stderr: bool = True) -> list[list[str]]:
        """The table's cells (strings); ``with_stderr`` (default) adds ``± se`` to the bounds and
        the differences (``± n/a``: no usable error)."""
        diffs = self.differences()
        out = []
        for i, r in enumerate(self.rows):
            mark = "" if r.get("is_bound", True) else "*"

            def pm(se: Any) -> str:
                if not with_stderr:
                    return ""
                return " ± n/a" if se is None or math.isnan(float(se)) else f" ± {_fmt(se, '.4f')}"

            def bound(key: str) -> str:
                return _fmt(r.get(key), ".4f") + mark + pm(r.get(f"{key}_se"))

            def diff(d: tuple[float, float] | None) -> str:
                if d is None:
                    return "-"
                return "best" if d == (0.0, 0.0) else _fmt(d[0], "+.4f") + pm(d[1])

            cells = [r["guide"], str(r.get("params", "-")), _fmt(r.get("seconds_per_step"), ".4f"), bound("elbo")]
            cells += [bound(f"iwae{k}") for k in self.Ks]
            if self.has_exact_evidence():
                cells.append(_fmt(r.get("log_evidence"), ".4f"))
            cells += [diff(d[i]) for d in diffs.values()]
            cells += [_fmt(r.get("k_hat"), ".2f"), ", ".join(row_flags(r)), r.get("eta_readable", "-")]
            cells += [_fmt(r["metrics"].get(c.key), c.format) for c in self._metric_columns()]
            out.append(cells)
        return out

    def units(self) -> str:
        """The one line that states the table's unit."""
        return (
            f"All bounds and differences in nats per datum (÷ n = {self.settings['n_eval']}); "
            "± one Monte-Carlo standard error."
        )

    def _ranking_notes(self) -> list[str]:
        """Which row is best on each bound, and which rows its difference does not separate from it
        (within :data:`SIGNIFICANCE_Z` standard errors) or cannot (no usable error)."""
        lines = []
        for key, diffs in self.differences().items():
            best = [self.rows[i]["guide"] for i, d in enumerate(diffs) if d == (0.0, 0.0)]
            if not best:
                continue
            others = [(self.rows[i]["guide"], d) for i, d in enumerate(diffs) if d is not None and d != (0.0, 0.0)]
            close = [g for g, d in others if math.isfinite(d[1]) and not _resolved(d)]
            unknown = [g for g, d in others if not math.isfinite(d[1])]
            parts = [f"within {SIGNIFICANCE_Z:g} se of it (not separated): {', '.join(close)}"] if close else []
            parts += [f"no usable error to compare with: {', '.join(unknown)}"] if unknown else []
            if not parts and others:
                parts = [f"every other row is more than {SIGNIFICANCE_Z:g} se below it"]
            name = "ELBO/N" if key == "elbo" else f"IWAE{max(self.Ks)}/N"
            lines.append(f"Highest {name}: {'; '.join([best[0], *parts])}.")
        return lines

    def _flag_notes(self) -> list[str]:
        flags = {f for r in self.rows for f in row_flags(r)}
        lines = [
            f"flags: k̂>{KHAT_LIMIT}: the guide is a poor importance proposal, its IWAE estimates and errors "
            "are unreliable; " + CONVERGENCE_RULE + "."
        ]
        if "k̂ n/a" in flags:
            lines.append(f"k̂ n/a: fewer than {PSIS_MIN_DRAWS} guide draws, too few for PSIS k̂ (raise bound_samples).")
        if "short" in flags:
            lines.append(f"short: fewer than {MIN_WINDOW_STEPS} steps in a convergence window, too short to judge.")
        if flags & {f"k̂>{KHAT_LIMIT}", "moving"}:
            flagged = [r["guide"] for r in self.rows if set(row_flags(r)) & {f"k̂>{KHAT_LIMIT}", "moving"}]
            lines.append(f"Flagged rows ({', '.join(flagged)}): read their bounds and differences with care.")
        return lines

    def _bound_notes(self, with_units: bool) -> list[str]:
        """What the bound, difference and k̂ columns are."""
        s = self.settings
        n, n_train = s["n_eval"], s.get("n_train", s["n_eval"])
        which = "all" if n == n_train else f"the first {n} of the {n_train}"
        draws = s.get("bound_samples")
        groups = ", ".join(f"{draws // k} (K={k})" for k in self.Ks) if draws else "?"
        kmax = max(self.Ks)
        units = f"{self.units()} " if with_units else ""
        return [
            f"{units}Bounds on log p(y | x, η) of {which} training points (n = {n}), from {draws} guide draws per "
            f"guide (IWAE_K: mean of {groups} independent estimates; ELBO: Monte-Carlo, no analytic KL); "
            "`*_se` in JSON.",
            f"ELBO/N − best, IWAE{kmax}/N − best: the row's bound minus the highest among the rows that are bounds, "
            "± sqrt(se² + se_best²) (the two estimates treated as independent).",
            f"k̂: PSIS k̂ of the guide as an importance proposal (< 0.5 good, 0.5–0.7 usable, > {KHAT_LIMIT} "
            "unreliable IWAE estimates and errors; ± n/a: a single IWAE estimate from heavy-tailed weights has no "
            "usable error).",
        ]

    def notes(self, with_units: bool = True) -> list[str]:
        """The lines below the table; ``with_units`` starts them with :meth:`units` (the text table
        states it above instead)."""
        s = self.settings
        n, n_train = s["n_eval"], s.get("n_train", s["n_eval"])
        lines = [*self._bound_notes(with_units), *self._ranking_notes(), *self._flag_notes()]
        if n != n_train:
            lines.append(
                "With a subset the guide fitted to all training data is the proposal: a valid, looser bound "
                "on the subset's evidence."
            )
        if any(not r.get("is_bound", True) for r in self.rows):
            lines.append(
                "*: point-estimate guide; the number is log p(D, ẑ) at the point, not a bound on the evidence."
            )
        if any(r.get("symmetry_prior") is not None for r in self.rows):
            lines.append(
                "η point (type-II): the bounds are on log p(D | η̂) at the learned η̂. η latent (a prior "
                "name): on log p(D) = log ∫ p(D | η) p(η) dη, which pays an Occam factor for the prior's "
                "spread; the two are different quantities, not two bounds on one."
            )
        if self.has_exact_evidence():
            lines.append(
                "log Z/N: exact log evidence per datum (at the guide's learned η; for a latent η, "
                "log p(D) by quadrature over η)."
            )
        if s.get("eval_seed") is not None:
            lines.append(
                f"Test metrics from {s.get('eval_samples', '?')} guide draws seeded by {s['eval_seed']}, "
                "the run's seed: the numbers `pyro-invariance fit` reports for the same run."
            )
        if s.get("test_on_train"):
            lines.append("Test metrics were computed on the training data (data given as a pair).")
        return lines

    def to_text(self) -> str:
        """A plain-text table (as the CLI prints it), bounds with ± standard errors, and the notes below."""
        lines = [line.rstrip() for line in text_table([self.header()] + self.table_rows(with_stderr=True)).split("\n")]
        s = self.settings
        title = f"{s['model']} on {s['data']}: {s['steps']} SVI steps per guide, seed {s['seed']}"
        return "\n".join([title, self.units(), "", *lines, "", *self.notes(with_units=False)])

    def to_markdown(self, with_stderr: bool = True) -> str:
        """A GitHub markdown table (bounds with ± standard errors) and the notes."""
        header = self.header()
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.table_rows(with_stderr)]
        return "\n".join(lines + [""] + [f"- {n}" for n in self.notes()]) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """Settings, Ks and rows, each row with its ``flags`` (:func:`row_flags`) and the
        differences to the best row (``elbo_minus_best`` / ``elbo_minus_best_se``,
        ``iwae{K}_minus_best`` / ``..._se`` for the largest K; None for point estimates)."""
        rows = []
        diffs = self.differences()
        for i, r in enumerate(self.rows):
            extra: dict[str, Any] = {"flags": row_flags(r)}
            for key, d in diffs.items():
                extra[f"{key}_minus_best"], extra[f"{key}_minus_best_se"] = (None, None) if d[i] is None else d[i]
            rows.append({**r, **extra})
        return _finite_or_none({"settings": self.settings, "kind": self.kind, "Ks": list(self.Ks), "rows": rows})

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> GuideComparison:
        """Rebuild a comparison (without the fitted models) from :meth:`to_dict` / a saved JSON file."""
        rows = [dict(r) for r in payload["rows"]]
        for r in rows:  # JSON null / "inf" back to floats; the derived columns are recomputed, not read
            r.pop("flags", None)
            for key, value in list(r.items()):
                if key.endswith(("_minus_best", "_minus_best_se")):
                    del r[key]
                elif key == "k_hat" or key.startswith(("elbo", "iwae")):
                    r[key] = float("nan") if value is None else float(value)
        return cls(rows, dict(payload["settings"]), payload["kind"], tuple(int(k) for k in payload["Ks"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=str, ensure_ascii=False)

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        """Write ``table.md``, ``table.json`` and ``bounds.png`` (:meth:`plot`) to ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(self.to_markdown())
        plot = save_figure(self.plot(), out / "bounds.png", dpi=120)
        return {"markdown": out / "table.md", "json": self.save_json(out / "table.json"), "plot": plot}

    # -- plot -------------------------------------------------------------------------------------
    def plot(self, *, title: str | None = None, ax: Axes | None = None) -> Figure:
        """Bar chart of ELBO/N and IWAE_K/N per guide with ± one standard error as error bars
        (``±?`` where a bound has no usable error), k̂ and the row's flags (:func:`row_flags`, red)
        above each group, the exact log Z/N as a dashed mark where known (point estimates hatched:
        not bounds).

        Draws into ``ax`` (a matplotlib ``Axes``; default: a new figure) and returns its
        ``matplotlib.figure.Figure``; save it with ``fig.savefig(path)`` (:meth:`save` writes
        ``bounds.png``)."""
        keys = ["elbo"] + [f"iwae{k}" for k in self.Ks]
        vals = [[float(r.get(k, float("nan"))) for k in keys] for r in self.rows]
        errs = [[float(r.get(f"{k}_se", float("nan"))) for k in keys] for r in self.rows]
        lo, hi = _plot_range(vals, errs, [r["log_evidence"] for r in self.rows if r.get("log_evidence") is not None])
        span = max(hi - lo, 1e-3)
        bottom = lo - 0.15 * span
        if ax is None:
            fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(self.rows) + 3), 3.8))
        else:
            fig = ax.figure
        self._draw_bars(ax, vals, errs, bottom, span)
        flagged = []
        for i, r in enumerate(self.rows):
            if r.get("log_evidence") is not None:
                ax.hlines(
                    r["log_evidence"],
                    i - 0.45,
                    i + 0.45,
                    colors="k",
                    linestyles="--",
                    lw=1,
                    label="exact log Z/N" if i == 0 else None,
                )
            flags = row_flags(r)
            flagged.append(bool(flags))
            text = "k̂ n/a (point est.)" if not r.get("is_bound", True) else f"k̂={_fmt(r.get('k_hat'), '.2f')}"
            label = "\n".join([text, *flags]).replace("k̂", r"$\hat{k}$")  # the combining hat has no glyph
            ax.text(i, hi + 0.04 * span, label, ha="center", va="bottom", fontsize=8, color="C3" if flags else "k")
        ax.set_ylim(bottom, hi + 0.35 * span)
        ax.set_xticks(range(len(self.rows)))
        ax.set_xticklabels([r["guide"] + ("*" if not r.get("is_bound", True) else "") for r in self.rows], fontsize=9)
        for label, bad in zip(ax.get_xticklabels(), flagged):
            label.set_color("C3" if bad else "k")
        ax.set_ylabel(f"nats per datum (n = {self.settings['n_eval']}), ± 1 se")
        s = self.settings
        ax.set_title(title or f"{s['model']} on {s['data']}: evidence bounds per guide", fontsize=10)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
        fig.tight_layout()
        return fig

    def _draw_bars(
        self, ax: Axes, vals: list[list[float]], errs: list[list[float]], bottom: float, span: float
    ) -> None:
        """One bar per bound and row, with its error bar; ``±?`` above a bound without a usable error."""
        names = ["ELBO"] + [f"IWAE$_{{{k}}}$" for k in self.Ks]
        n_rows, n_bars = len(self.rows), len(names)
        width = 0.8 / n_bars
        for j in range(n_bars):
            xs = [i + (j - (n_bars - 1) / 2) * width for i in range(n_rows)]
            heights = [vals[i][j] - bottom if math.isfinite(vals[i][j]) else 0.0 for i in range(n_rows)]
            yerr = [errs[i][j] if math.isfinite(errs[i][j]) else 0.0 for i in range(n_rows)]
            bars = ax.bar(
                xs,
                heights,
                width,
                bottom=bottom,
                yerr=yerr,
                label=names[j],
                color=f"C{j}",
                capsize=3,
                error_kw={"ecolor": "k", "elinewidth": 1},
            )
            for i, (patch, r) in enumerate(zip(bars.patches, self.rows)):
                if not r.get("is_bound", True):  # point estimates: log joint, not a bound
                    patch.set_alpha(0.35)
                    patch.set_hatch("//")
                elif math.isfinite(vals[i][j]) and not math.isfinite(errs[i][j]):
                    ax.text(xs[i], vals[i][j] + 0.01 * span, "±?", ha="center", va="bottom", fontsize=7)


# ------------------------------------------------------------------------------------------------
# the workbench


def _resolve_data(data: Any, data_kwargs: Mapping[str, Any] | None) -> tuple[Any, str]:
    if isinstance(data, str):
        return DATASETS.get(data, **(data_kwargs or {})), data
    if data_kwargs:
        raise ValueError("data_kwargs only apply when data is a dataset name")
    if isinstance(data, (tuple, list)):
        return data, "(x, y)"
    label = getattr(data, "name", None) or type(data).__name__
    return data, str(label)


def _model_factory(
    model: Any, data: Any, model_kwargs: Mapping[str, Any] | None, seed: int
) -> tuple[Callable[[], nn.Module], str, dict]:
    """A zero-argument function returning the same initial model every call."""
    if isinstance(model, str):
        kwargs = model_kwargs_for(model, data, **(model_kwargs or {}))
        MODELS.entry(model)  # unknown names fail here, before any fitting

        def build() -> nn.Module:
            pyro.set_rng_seed(seed)
            return MODELS.get(model, **kwargs)

        return build, model, kwargs
    if model_kwargs:
        raise ValueError("model_kwargs only apply when model is a catalogue name")
    if isinstance(model, nn.Module):
        template = copy.deepcopy(model)
        return (lambda: copy.deepcopy(template)), type(model).__name__, {}
    if callable(model):

        def build_callable() -> nn.Module:
            pyro.set_rng_seed(seed)
            return model()

        return build_callable, getattr(model, "__name__", type(model).__name__), {}
    raise TypeError(f"model must be a catalogue name, a model instance or a factory, got {type(model).__name__}")


def default_bound_samples(Ks: Sequence[int]) -> int:
    """Guide draws for the bounds when none are given: two independent IWAE estimates at the
    largest K (so every IWAE_K has a standard error from their spread) and at least
    :data:`~pyro_invariance.infer.bounds.PSIS_MIN_DRAWS` (so PSIS k̂ is defined)."""
    return max(2 * max(Ks), PSIS_MIN_DRAWS)


@dataclass
class ComparisonPlan:
    """What :func:`compare_guides` checked and prepared before fitting anything: the runs (every
    guide under every ``symmetry_prior``), the model builders, the training data and the bound and
    evaluation settings. :func:`fit_guides` runs it, :func:`comparison_table` tabulates the runs."""

    guides: list[str]
    guide_kwargs: dict[str, Any]
    symmetry_priors: list[str | None]
    builders: dict[str | None, tuple[Callable[[], nn.Module], str, dict]]
    dataset: Any
    data_label: str
    data_kwargs: dict[str, Any]
    x_train: torch.Tensor
    y_train: torch.Tensor
    n_eval: int
    kind: str
    Ks: tuple[int, ...]
    num_draws: int
    config: FitConfig | None
    overrides: dict[str, Any]
    shared: FitConfig
    eval_samples: int
    bound_batch_size: int
    bound_vectorize: bool

    def runs(self) -> list[tuple[str, str | None, str]]:
        """``(guide, symmetry_prior, label)`` per run, in fitting order (priors outer, guides inner)."""
        single = self.symmetry_priors == [None]
        return [
            (name, prior, name if single else f"{name} / η {'point' if prior is None else prior}")
            for prior in self.symmetry_priors
            for name in self.guides
        ]


@dataclass
class GuideRun:
    """One guide fitted and measured (:func:`fit_guides`).

    Attributes:
        label: the row's name (the guide, with the η treatment when several are compared).
        symmetry_prior: ``None`` (η point-estimated) or the prior of a latent η.
        model, guide: the fitted model and guide.
        result: the :class:`~pyro_invariance.infer.training.FitResult`.
        bounds: the :class:`~pyro_invariance.infer.bounds.EvidenceBounds` on the first ``n_eval`` points.
        bound_seconds: time spent on the bounds.
        metrics: held-out metrics, seeded by the run's seed.
        log_evidence: exact log evidence per datum, or ``None`` where the model has none.
    """

    label: str
    symmetry_prior: str | None
    model: nn.Module
    guide: Any
    result: FitResult
    bounds: EvidenceBounds
    bound_seconds: float
    metrics: dict[str, float]
    log_evidence: float | None

    def flag_fields(self) -> dict[str, Any]:
        """The fields :func:`row_flags` reads: ``k_hat``, ``is_bound``, ``convergence``."""
        return {
            "k_hat": self.bounds.k_hat,
            "is_bound": not self.bounds.point_estimate,
            "convergence": convergence_of(self.result.history, self.bounds.elbo.per_datum_stderr),
        }


def _check_guides(guides: Sequence[str] | str) -> list[str]:
    """Guide names (a comma-separated string is split), checked against the registry."""
    if isinstance(guides, str):
        guides = [g.strip() for g in guides.split(",") if g.strip()]
    guides = list(guides)
    if not guides:
        raise ValueError("need at least one guide")
    for name in guides:
        GUIDES.entry(name)  # UnknownNameError with suggestions
    if len(set(guides)) != len(guides):
        raise ValueError(f"guide names repeat: {guides}")
    return guides


def _check_guide_kwargs(guide_kwargs: Mapping[str, Mapping[str, Any]] | None, guides: list[str]) -> dict[str, Any]:
    """Per-guide keyword arguments, checked against each guide's signature before anything is fitted."""
    kwargs_by_guide = dict(guide_kwargs or {})
    unknown = set(kwargs_by_guide) - set(guides)
    if unknown:
        raise ValueError(f"guide_kwargs for guides not compared: {sorted(unknown)}")
    for name, kwargs in kwargs_by_guide.items():  # a misspelt keyword fails now, not after the first guides
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"guide_kwargs[{name!r}] must be a mapping of keyword arguments, got {kwargs!r}")
        GUIDES.check_keywords(name, dict(kwargs), positional=1)
    return kwargs_by_guide


def _check_bound_settings(
    K: Sequence[int] | int, bound_samples: int | None, eval_samples: int
) -> tuple[tuple[int, ...], int]:
    """The IWAE sizes and the number of guide draws for the bounds."""
    Ks = _validate_Ks(K)
    if bound_samples is None:
        num_draws = default_bound_samples(Ks)
    else:
        num_draws = check_positive_int("bound_samples", bound_samples)
    if num_draws < max(Ks):
        raise ValueError(f"bound_samples={num_draws} is smaller than the largest K={max(Ks)}")
    check_positive_int("eval_samples", eval_samples)
    return Ks, num_draws


def _check_symmetry_priors(symmetry_priors: Sequence[str | None], model: Any) -> list[str | None]:
    symmetry_priors = list(symmetry_priors)
    if not symmetry_priors or len(set(symmetry_priors)) != len(symmetry_priors):
        raise ValueError(f"symmetry_priors must be distinct and not empty, got {symmetry_priors}")
    if symmetry_priors != [None] and not isinstance(model, str):
        raise ValueError("symmetry_priors needs a catalogue model name (the model is rebuilt with each prior)")
    return symmetry_priors


def _plan(
    model: Any,
    data: Any,
    guides: Sequence[str],
    config: FitConfig | None,
    K: Sequence[int] | int,
    bound_samples: int | None,
    eval_subset: int | None,
    eval_samples: int,
    bound_batch_size: int,
    bound_vectorize: bool,
    guide_kwargs: Mapping[str, Mapping[str, Any]] | None,
    model_kwargs: Mapping[str, Any] | None,
    data_kwargs: Mapping[str, Any] | None,
    symmetry_priors: Sequence[str | None],
    overrides: dict[str, Any],
) -> ComparisonPlan:
    """Check every argument and build one model (the probe) on the data: everything that can fail
    fails here, before the first fit."""
    guides = _check_guides(guides)
    Ks, num_draws = _check_bound_settings(K, bound_samples, eval_samples)
    kwargs_by_guide = _check_guide_kwargs(guide_kwargs, guides)
    FitConfig.check_names(overrides)
    shared = resolve_config(config, None, None, overrides)  # the settings common to every guide
    priors = _check_symmetry_priors(symmetry_priors, model)
    dataset, data_label = _resolve_data(data, data_kwargs)
    builders = {}
    for prior in priors:
        extra = {} if prior is None else {"symmetry_prior": prior}
        builders[prior] = _model_factory(model, dataset, {**(model_kwargs or {}), **extra} or None, shared.seed)
    build, model_label, _ = builders[priors[0]]
    probe = build()
    check_model_fits_data(model_label, probe, data_label, dataset)  # names the datasets that fit
    x_train, y_train = train_arrays(dataset, probe)  # converted and checked once, for the model
    n_train = x_train.shape[0]
    n_eval = n_train if eval_subset is None else check_positive_int("eval_subset", eval_subset)
    if n_eval > n_train:
        raise ValueError(f"eval_subset={eval_subset} exceeds the {n_train} training points")
    kind = task_for(probe, dataset).name
    check_observed(probe, x_train[:2], y_train[:2], num_data=n_train)  # fail before fitting
    return ComparisonPlan(
        guides,
        kwargs_by_guide,
        priors,
        builders,
        dataset,
        data_label,
        dict(data_kwargs or {}),
        x_train,
        y_train,
        n_eval,
        kind,
        Ks,
        num_draws,
        config,
        overrides,
        shared,
        eval_samples,
        bound_batch_size,
        bound_vectorize,
    )


@pyro_scope()
def fit_guides(
    plan: ComparisonPlan, *, progress: bool = False, log: Callable[[str], None] | None = None
) -> list[GuideRun]:
    """Fit and measure every run of ``plan``, one after another: a fresh model (the same start for
    every guide), the guide, :func:`~pyro_invariance.infer.training.fit`, then the evidence bounds
    (seeded by ``derived_seed(seed, 1)``), the held-out metrics (seeded by the run's seed) and the
    exact log evidence. ``log`` gets two lines per run."""
    say = log or (lambda _msg: None)
    seed, device, Ks = plan.shared.seed, plan.shared.device, plan.Ks
    runs = []
    for name, prior, label in plan.runs():
        m = plan.builders[prior][0]()
        g = guide_registry.get(name, m, **plan.guide_kwargs.get(name, {}))
        result = fit(m, g, plan.dataset, plan.config, progress=progress, **plan.overrides)
        say(f"fitted {label} ({result.config.steps} steps)")
        dev = torch.device(device)
        xe, ye = plan.x_train[: plan.n_eval].to(dev), plan.y_train[: plan.n_eval].to(dev)
        t0 = time.perf_counter()
        pyro.set_rng_seed(derived_seed(seed, 1))
        bounds = evidence_bounds(
            m,
            g,
            xe,
            ye,
            Ks,
            num_samples=plan.num_draws,
            batch_size=plan.bound_batch_size,
            vectorize=plan.bound_vectorize,
        )
        bound_seconds = time.perf_counter() - t0
        # the run's own seed, as `pyro-invariance fit` evaluates a run: the same run gives the same numbers
        metrics = evaluate((m, g), plan.dataset, num_samples=plan.eval_samples, device=device, seed=result.config.seed)
        log_z = exact_log_evidence(m, xe, ye)
        log_z = None if log_z is None else log_z / plan.n_eval
        run = GuideRun(label, prior, m, g, result, bounds, bound_seconds, metrics, log_z)
        runs.append(run)
        flags = ", ".join(row_flags(run.flag_fields()))
        kmax = max(Ks)
        say(
            f"{label}: ELBO/N {bounds.elbo.per_datum:.4f}, IWAE{kmax}/N {bounds.iwae[kmax].per_datum:.4f}, "
            f"k̂ {_fmt(bounds.k_hat, '.2f')}, {result.seconds / result.config.steps:.4f} s/step, "
            f"bounds {bound_seconds:.1f}s{f'; flags: {flags}' if flags else ''}"
        )
    return runs


def guide_row(run: GuideRun, n_eval: int, image_size: int | None = None) -> dict[str, Any]:
    """The table row of one run (the keys listed in :func:`compare_guides`)."""
    result, bounds, m, g = run.result, run.bounds, run.model, run.guide
    row: dict[str, Any] = {
        "guide": run.label,
        "symmetry_prior": run.symmetry_prior,
        "params": num_guide_parameters(g),
        "fit_seconds": result.seconds,
        "seconds_per_step": result.seconds / result.config.steps,
        "bound_seconds": run.bound_seconds,
        "train_elbo_minibatch": result.final_elbo,
        "n_eval": n_eval,
        "elbo": bounds.elbo.per_datum,
        "elbo_se": bounds.elbo.per_datum_stderr,
    }
    for k, b in bounds.iwae.items():
        row[f"iwae{k}"] = b.per_datum
        row[f"iwae{k}_se"] = b.per_datum_stderr
    flag_fields = run.flag_fields()
    row.update(
        k_hat=flag_fields["k_hat"],
        is_bound=flag_fields["is_bound"],
        note=bounds.note,
        log_evidence=run.log_evidence,
        eta=_eta_values(m, g),
        eta_readable=format_eta(m, image_size, g),
        metrics=run.metrics,
        convergence=flag_fields["convergence"],
        bounds=bounds.to_dict(),
    )
    return row


def comparison_table(plan: ComparisonPlan, runs: Sequence[GuideRun]) -> GuideComparison:
    """The :class:`GuideComparison` of ``runs``: one row per run (:func:`guide_row`) and the
    settings that reproduce them."""
    rows = [guide_row(run, plan.n_eval, image_size_of(plan.dataset)) for run in runs]
    results = {run.label: run.result for run in runs}
    _, model_label, built_kwargs = plan.builders[plan.symmetry_priors[0]]
    shared = plan.shared
    settings = {
        "model": model_label,
        "model_kwargs": built_kwargs,
        "data": plan.data_label,
        "data_kwargs": plan.data_kwargs,
        "guides": plan.guides,
        "symmetry_priors": plan.symmetry_priors,
        "guide_kwargs": plan.guide_kwargs,
        "steps": shared.steps,
        "seed": shared.seed,
        "batch_size": shared.batch_size,
        "fit_settings": dict(plan.overrides) if plan.config is None else asdict(shared),
        "fit_config": {name: asdict(result.config) for name, result in results.items()},
        "K": list(plan.Ks),
        "bound_samples": plan.num_draws,
        "bound_vectorize": plan.bound_vectorize,
        "n_train": plan.x_train.shape[0],
        "n_eval": plan.n_eval,
        "eval_samples": plan.eval_samples,
        "eval_seed": shared.seed,
        "units": "per datum (nats / n_eval)",
        "device": str(shared.device),
        "test_on_train": not hasattr(plan.dataset, "x_test"),
        "torch_threads": torch.get_num_threads(),
    }
    return GuideComparison(rows, settings, plan.kind, plan.Ks, results)


@pyro_scope()
def compare_guides(
    model: Any,
    data: Any,
    guides: Sequence[str] = DEFAULT_GUIDES,
    config: FitConfig | None = None,
    *,
    K: Sequence[int] | int = (10, 100, 1000),
    bound_samples: int | None = None,
    eval_subset: int | None = None,
    eval_samples: int = 16,
    bound_batch_size: int = 4096,
    bound_vectorize: bool = False,
    guide_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    data_kwargs: Mapping[str, Any] | None = None,
    symmetry_priors: Sequence[str | None] = (None,),
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    **overrides: Any,
) -> GuideComparison:
    """Fit ``guides`` on ``model`` × ``data`` with the same seeds and budget; tabulate bounds and metrics.

    Args:
        model: a catalogue model name (built with ``model_kwargs`` and what the dataset determines),
            a model instance (deep-copied per guide, so every guide starts from it) or a
            zero-argument factory.
        data: a dataset name (built with ``data_kwargs``), a dataset object, or a pair ``(x, y)``
            (then the test metrics are on the same pair).
        guides: guide names (:mod:`pyro_invariance.guides`); checked before anything is fitted.
        config: with ``**overrides``, the training settings, as in :func:`~pyro_invariance.infer.training.fit`
            (:class:`~pyro_invariance.infer.config.FitConfig` fields), resolved per guide: explicit
            settings, then the model's and that guide's ``fit_defaults``, then the library's. The
            seed (and so the model's start and the minibatches) is the same for every guide.
        K: importance sample sizes of the IWAE bounds (ints ≥ 1).
        bound_samples: guide draws for the bounds (default :func:`default_bound_samples`:
            ``max(2 · max(K), 46)``, so that every IWAE_K has a standard error and PSIS k̂ is defined).
        eval_subset: bound the evidence of the first ``eval_subset`` training points only (speed);
            default all of them.
        eval_samples: guide draws in the predictive test metrics.
        bound_batch_size: rows per forward pass when evaluating the bounds.
        bound_vectorize: draw the bound's particles in vectorised batches (only for models that
            broadcast over a batch of latents, e.g. ``basis-regression``; see
            :func:`~pyro_invariance.infer.bounds.log_weights`).
        guide_kwargs: per-guide keyword arguments, ``{"mean-field": {"init_scale": 0.1}}``.
        symmetry_priors: the model's ``symmetry_prior`` values to compare, each fitted with every
            guide: ``None`` is η point-estimated (type-II), a prior name makes η latent
            (:mod:`pyro_invariance.symmetry.priors`), e.g. ``(None, "uniform")``. More than one needs
            a catalogue model name. The bounds then differ in what they bound: ``log p(D | η̂)`` at the
            learned η̂ for a point estimate, ``log p(D) = log ∫ p(D | η) p(η) dη`` for a latent η.
        log: optional ``print``-like progress callback.

    Returns:
        :class:`GuideComparison`. Each row has ``guide``, ``params`` (effective count,
        :func:`~pyro_invariance.guides.num_guide_parameters`), ``fit_seconds``,
        ``seconds_per_step``, ``train_elbo_minibatch`` (smoothed end of training), ``n_eval``,
        ``elbo`` / ``elbo_se`` and ``iwae{K}`` / ``iwae{K}_se`` (per datum), ``k_hat``,
        ``is_bound``, ``note``, ``log_evidence`` (exact, per datum, or None), ``symmetry_prior``
        (``None``: η point-estimated), ``eta``, ``eta_readable``, ``metrics`` (held-out, seeded by the
        run's seed: what ``pyro-invariance fit`` reports for the same run), ``convergence``
        (:func:`convergence_of` the fit's ELBO trace: ``change``, ``change_se``, ``converged``) and
        ``bounds`` (totals in nats, :class:`~.bounds.EvidenceBounds`). :meth:`GuideComparison.to_dict`
        adds ``flags`` (:func:`row_flags`) and the differences to the best row
        (:func:`difference_to_best`).

    Raises:
        UnknownNameError: a guide, model or dataset name is not registered.
        ValueError: K or another setting is invalid, or the model observes nothing.
    """
    plan = _plan(
        model,
        data,
        guides,
        config,
        K,
        bound_samples,
        eval_subset,
        eval_samples,
        bound_batch_size,
        bound_vectorize,
        guide_kwargs,
        model_kwargs,
        data_kwargs,
        symmetry_priors,
        overrides,
    )
    return comparison_table(plan, fit_guides(plan, progress=progress, log=log))
