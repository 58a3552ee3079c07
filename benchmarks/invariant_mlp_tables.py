"""Paper 003's Table 1 and Table 2 (invariant shallow BNN) on Fashion-MNIST, at a reduced size.

Table 1 (RFF network, rotation): on fully rotated / partially rotated / regular Fashion-MNIST, a model
with rotation invariance held fixed at η ∈ {0 (none), 5°, 45°, 90°, 135°, 175°} and one that learns
η; columns: test accuracy, ELBO per datum, η.

Table 2 (ReLU network, W1 learned): the plain MLP and MLPs that learn rotation / translation / scale
/ affine invariance, on rotated / translated / scaled / regular / partially rotated Fashion-MNIST;
test accuracy (plus the learned η and the ELBO per datum in their own tables).

Every fit uses ``pyro_invariance.fit`` with its defaults (Adam lr 0.05, η lr 0.1, factor lr 1e-3,
cosine to 0, TraceMeanField_ELBO, one particle), the block-Cholesky guide, the hierarchical prior
and the model's default RFF lengthscale √D/8 = 3.5; ReLU fits use ``model_lr=3e-4`` for W1, b1
(docs/methods.md §6). Learned η starts at 0.1 (rad / half-sides / log-scale) for every generator.

Sizes: the default is a REDUCED size chosen to run both tables in about half an hour on one CPU
thread (see ``SIZES``); ``--paper-size`` uses the paper's H=1024, S=32, batch 128 and the full data
(``--steps`` to choose the length; the paper does not state it); ``--quick`` is a ~1–2 min smoke test.

Held-out metrics: accuracy and NLL of the posterior predictive averaged over ``eval_samples`` guide
draws on the test split (``pyro_invariance.tasks.posterior_predictive``, as ``evaluate`` does), and
the ELBO per datum on the training split with ``elbo_particles`` draws. The ELBO is computed in chunks
of training rows with a fresh guide draw per chunk (the same expectation as ``evaluate``'s full-batch
estimate, whose memory grows as N·S·H and would need ~8 GB per tensor at paper size).

Results: ``benchmarks/results/invariant_mlp_tables[_quick|_paper].md`` and ``.json`` (rewritten
after every fit, so a partial run can be read while it goes; ``--resume`` reuses finished fits with
identical settings from the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402

import pyro_invariance  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.data.images import dataset_name, load_dataset  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402
from pyro_invariance.symmetry.affine import eta_to_human  # noqa: E402
from pyro_invariance.tasks import posterior_predictive  # noqa: E402

BASE = "fashion-mnist"

#: size presets; "steps" is per fit.
SIZE_KEYS = ("train_size", "test_size", "hidden", "samples", "batch_size", "steps", "eval_samples", "elbo_particles")
SIZES: dict[str, dict[str, Any]] = {
    "quick": dict(zip(SIZE_KEYS, (500, 250, 32, 4, 64, 40, 4, 1))),
    "reduced": dict(zip(SIZE_KEYS, (5000, 2000, 128, 16, 128, 800, 16, 2))),
    "paper": dict(zip(SIZE_KEYS, (None, None, 1024, 32, 128, 30 * math.ceil(60000 / 128), 16, 8))),
}

# Table 1: paper column order (fully rotated, partially rotated, regular).
T1_DATASETS = ("rotated", "partially-rotated", "regular")
T1_ROWS: tuple[tuple[str, float | None], ...] = (
    ("none (η = 0)", 0.0),
    ("fixed 5°", 5.0),
    ("fixed 45°", 45.0),
    ("fixed 90°", 90.0),
    ("fixed 135°", 135.0),
    ("fixed 175°", 175.0),
    ("learned", None),
)
# Table 2: paper column order (fully rotated, translated, scaled, regular), then partially rotated.
T2_DATASETS = ("rotated", "translated", "scaled", "regular", "partially-rotated")
T2_ROWS: tuple[tuple[str, str], ...] = (
    ("MLP", "none"),
    ("MLP + rotation", "rotation"),
    ("MLP + translation", "translation"),
    ("MLP + scale", "scale"),
    ("MLP + affine", "affine"),
)
DATASET_TITLES = {
    "rotated": "fully rotated",
    "partially-rotated": "partially rotated",
    "regular": "regular",
    "translated": "translated",
    "scaled": "scaled",
}

# Paper 003 (MNIST, full size; H=1024, S=32): Table 1 -> row:
# (acc rotated, partial, regular, ELBO rotated, partial, regular)
PAPER_T1 = {
    "fixed 5°": (79.29, 86.71, 96.00, -1.07, -0.80, -0.36),
    "fixed 45°": (87.35, 91.13, 95.93, -0.63, -0.49, -0.26),
    "fixed 90°": (90.33, 91.69, 94.69, -0.52, -0.44, -0.30),
    "fixed 135°": (91.19, 91.04, 92.13, -0.45, -0.45, -0.36),
    "fixed 175°": (91.57, 90.47, 90.97, -0.43, -0.47, -0.45),
    "learned": (91.72, 92.34, 96.40, -0.43, -0.42, -0.26),
}
# Table 2 -> row: (fully rotated, translated, scaled, regular) test accuracy (%)
PAPER_T2 = {
    "SGPR": (91.19, 89.22, 72.10, 97.52),
    "MLP": (90.35, 89.34, 96.61, 98.10),
    "MLP + rotation": (98.05, 94.08, 97.62, 98.64),
    "MLP + translation": (93.59, 97.87, 97.98, 98.76),
    "MLP + scale": (93.80, 94.30, 98.06, 98.35),
    "MLP + affine": (98.14, 97.66, 98.31, 98.93),
}
#: the invariance each dataset calls for (Table 2 verdicts)
MATCHING = {
    "rotated": "MLP + rotation",
    "partially-rotated": "MLP + rotation",
    "translated": "MLP + translation",
    "scaled": "MLP + scale",
    "regular": None,
}


# --------------------------------------------------------------------------------------------
# One fit
# --------------------------------------------------------------------------------------------
def fit_spec(table: str, dataset: str, row: str, size: dict[str, Any], seed: int) -> dict[str, Any]:
    """Everything that determines one fit (also the cache key's settings for --resume)."""
    spec: dict[str, Any] = {
        "table": table,
        "dataset": dataset_name(BASE, dataset),
        "row": row,
        "seed": seed,
        **{k: size[k] for k in SIZE_KEYS},
    }
    if table == "1":
        deg = dict(T1_ROWS)[row]
        spec.update(activation="rff", model_lr=None)
        if deg is None:
            spec.update(symmetry="rotation", learn_eta=True, eta_init=0.1)
        elif deg == 0.0:
            spec.update(symmetry="none", learn_eta=False, eta_init=0.0)  # η = 0: identity transforms, S-fold cheaper
        else:
            spec.update(symmetry="rotation", learn_eta=False, eta_init=math.radians(deg))
    else:
        symmetry = dict(T2_ROWS)[row]
        spec.update(activation="relu", model_lr=3e-4, symmetry=symmetry, learn_eta=symmetry != "none", eta_init=0.1)
    return spec


@torch.no_grad()
def chunked_elbo_per_datum(
    model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor, particles: int, chunk: int = 1000
) -> float:
    """ELBO / N on (x, y): Σ_chunks (B_c/N)·(−loss_c(num_data=N)), one guide draw per chunk and particle."""
    n = x.shape[0]
    elbo = TraceMeanField_ELBO(num_particles=1)
    total = 0.0
    for _ in range(particles):
        for start in range(0, n, chunk):
            xb, yb = x[start : start + chunk], y[start : start + chunk]
            total -= float(elbo.loss(model, guide, xb, yb, num_data=n)) * xb.shape[0] / n
    return total / particles / n


def run_fit(spec: dict[str, Any], data: Any, device: str) -> dict[str, Any]:
    """Build, fit and evaluate one model; returns the metrics (and η trajectory)."""
    pyro.set_rng_seed(spec["seed"])
    model = InvariantMLP(
        image_shape=data.image_shape,
        num_classes=data.num_classes,
        hidden=spec["hidden"],
        activation=spec["activation"],
        symmetry=spec["symmetry"],
        learn_symmetry=spec["learn_eta"],
        eta_init=spec["eta_init"],
        num_transforms=spec["samples"],
        prior="hierarchical",
        init_seed=0,
    )
    guide = guides.get("block-cholesky", model)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = pyro_invariance.fit(
        model,
        guide,
        data,
        steps=spec["steps"],
        batch_size=spec["batch_size"],
        model_lr=spec["model_lr"],
        seed=spec["seed"],
        device=device,
        progress=False,
    )
    fit_wall, fit_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    t0, cpu0 = time.perf_counter(), time.process_time()
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    model.eval()
    pyro.set_rng_seed(spec["seed"] + 1)
    logits = posterior_predictive(model, guide, x_test, spec["eval_samples"], batch_size=1000)
    mixture = torch.logsumexp(torch.log_softmax(logits, -1), 0) - math.log(spec["eval_samples"])
    accuracy = float((mixture.argmax(-1) == y_test).float().mean())
    nll = float(-mixture.gather(1, y_test.unsqueeze(1)).mean())
    elbo = chunked_elbo_per_datum(model, guide, x_train, y_train, spec["elbo_particles"])
    eval_seconds, eval_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    names = list(model.generator_names)
    eta = [float(v) for v in result.eta.values()]
    history = result.history["eta"]
    every = max(1, spec["steps"] // 50)
    return {
        "accuracy": accuracy,
        "nll": nll,
        "elbo_per_datum": elbo,
        "train_elbo_last10pct": result.final_elbo,
        "eta_names": names,
        "eta": eta,
        "eta_human": eta_to_human(eta, names, image_size=data.image_shape[-1]),
        "eta_history": {k: v[::every] + v[-1:] for k, v in history.items()},
        "fit_seconds": fit_wall,
        "eval_seconds": eval_seconds,
        "seconds_per_step": result.seconds / spec["steps"],
        "fit_cpu_seconds": fit_cpu,
        "eval_cpu_seconds": eval_cpu,
    }


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
def _key(table: str, dataset: str, row: str) -> str:
    return f"table{table}|{dataset}|{row}"


def _pct(v: float | None) -> str:
    return "…" if v is None else f"{100 * v:.2f}"


def _bold_best(values: list[float | None], fmt: Any) -> list[str]:
    present = [v for v in values if v is not None]
    best = max(present) if present else None
    return [("…" if v is None else (f"**{fmt(v)}**" if v == best else fmt(v))) for v in values]


def _eta_deg(res: dict[str, Any] | None) -> str:
    if res is None:
        return "…"
    return f"{math.degrees(res['eta'][0]):.1f}" if res["eta"] else "0"


def _eta_short(res: dict[str, Any] | None) -> str:
    if res is None:
        return "…"
    if not res["eta"]:
        return "–"
    return ", ".join(f"{n} {h}" for n, h in res["eta_human"].items())


def render_table1(results: dict[str, Any]) -> list[str]:
    def get(ds: str, row: str) -> dict[str, Any] | None:
        return results.get(_key("1", ds, row))

    out = [
        "## Table 1: RFF network, rotation invariance fixed or learned",
        "",
        "Ours: Fashion-MNIST at the reduced size above (accuracy in %, ELBO per training datum, η in degrees; "
        "bold = best in the column).",
        "",
    ]
    acc_cols = {
        ds: _bold_best([(get(ds, r) or {}).get("accuracy") for r, _ in T1_ROWS], lambda v: f"{100 * v:.2f}")
        for ds in T1_DATASETS
    }
    elbo_cols = {
        ds: _bold_best([(get(ds, r) or {}).get("elbo_per_datum") for r, _ in T1_ROWS], lambda v: f"{v:.3f}")
        for ds in T1_DATASETS
    }
    rows = []
    for i, (row, _) in enumerate(T1_ROWS):
        rows.append(
            [
                f"MLP + {row} rotation" if row != "none (η = 0)" else "MLP, no invariance (η = 0)",
                *(acc_cols[ds][i] for ds in T1_DATASETS),
                *(elbo_cols[ds][i] for ds in T1_DATASETS),
                *(_eta_deg(get(ds, row)) for ds in T1_DATASETS),
            ]
        )
    titles = [DATASET_TITLES[d] for d in T1_DATASETS]
    header = ["model", *(f"acc {t}" for t in titles), *(f"ELBO/N {t}" for t in titles), *(f"η° {t}" for t in titles)]
    out += [common.md_table(header, rows), ""]
    out += [
        "Paper (MNIST, full size: H=1024, S=32, 60k training images), Table 1 — for reference only; "
        "a different dataset (MNIST, not Fashion-MNIST) and a different size:",
        "",
    ]
    prow = [[f"MLP + {r} rotation", *(f"{v:.2f}" for v in vals)] for r, vals in PAPER_T1.items()]
    out += [common.md_table(["model", *(f"acc {t}" for t in titles), *(f"ELBO {t}" for t in titles)], prow), ""]
    # verdicts
    out += ["Learned η against the fixed ones (automatic read-out of the table above):", ""]
    for ds in T1_DATASETS:
        fixed = [(r, get(ds, r)) for r, d in T1_ROWS if d is not None and get(ds, r) is not None]
        learned = get(ds, "learned")
        if not fixed or learned is None:
            out.append(f"- {DATASET_TITLES[ds]}: not finished.")
            continue
        best_a = max(fixed, key=lambda t: t[1]["accuracy"])
        all_fixed = [(r, get(ds, r)) for r, _ in T1_ROWS[:-1] if get(ds, r) is not None]
        best_e_all = max(all_fixed, key=lambda t: t[1]["elbo_per_datum"])
        de = learned["elbo_per_datum"] - best_e_all[1]["elbo_per_datum"]
        da = learned["accuracy"] - best_a[1]["accuracy"]
        word = "matches or beats" if de >= -0.01 else "falls short of"
        out.append(
            f"- {DATASET_TITLES[ds]}: best fixed ELBO/N at {best_e_all[0]} ({best_e_all[1]['elbo_per_datum']:.3f}); "
            f"best fixed accuracy at {best_a[0]} ({100 * best_a[1]['accuracy']:.2f}%). Learned η = "
            f"{_eta_deg(learned)}°, ELBO/N {learned['elbo_per_datum']:.3f} ({de:+.3f}: {word} the best fixed, "
            f"tolerance 0.01), accuracy {100 * learned['accuracy']:.2f}% ({100 * da:+.2f} points vs the best fixed)."
        )
    out.append("")
    return out


def render_table2(results: dict[str, Any]) -> list[str]:
    def get(ds: str, row: str) -> dict[str, Any] | None:
        return results.get(_key("2", ds, row))

    titles = [DATASET_TITLES[d] for d in T2_DATASETS]
    out = [
        "## Table 2: ReLU network (W1 learned), learned invariances",
        "",
        "Ours: test accuracy (%) on Fashion-MNIST at the reduced size above (bold = best in the column).",
        "",
    ]
    cols = {
        ds: _bold_best([(get(ds, r) or {}).get("accuracy") for r, _ in T2_ROWS], lambda v: f"{100 * v:.2f}")
        for ds in T2_DATASETS
    }
    rows = [[row, *(cols[ds][i] for ds in T2_DATASETS)] for i, (row, _) in enumerate(T2_ROWS)]
    out += [common.md_table(["model", *titles], rows), ""]
    out += ["ELBO per training datum (bold = best in the column):", ""]
    ecols = {
        ds: _bold_best([(get(ds, r) or {}).get("elbo_per_datum") for r, _ in T2_ROWS], lambda v: f"{v:.3f}")
        for ds in T2_DATASETS
    }
    out += [
        common.md_table(
            ["model", *titles], [[row, *(ecols[ds][i] for ds in T2_DATASETS)] for i, (row, _) in enumerate(T2_ROWS)]
        ),
        "",
    ]
    out += [
        "Learned η (rotation ±degrees, translation ±pixels on 28 px, scale as the factor range e^{∓η}; "
        "the data were made with rotation ±180° / ±90°, shifts ±7.7 px, scale ×0.5…×2):",
        "",
    ]
    out += [
        common.md_table(
            ["model", *titles],
            [[row, *(_eta_short(get(ds, row)) for ds in T2_DATASETS)] for row, sym in T2_ROWS if sym != "none"],
            align=["l"] * (len(titles) + 1),
        ),
        "",
    ]
    out += [
        "Paper (MNIST, full size: H=1024, S=32, 60k training images), Table 2 test accuracy — for reference "
        "only; a different dataset (MNIST, not Fashion-MNIST), no partially rotated column, and an SGPR row "
        "we do not run:",
        "",
    ]
    out += [
        common.md_table(["model", *titles[:4]], [[r, *(f"{v:.2f}" for v in vals)] for r, vals in PAPER_T2.items()]),
        "",
    ]
    out += ["Which invariance wins (automatic read-out of the accuracy table):", ""]
    for ds in T2_DATASETS:
        done = [(r, get(ds, r)) for r, _ in T2_ROWS if get(ds, r) is not None]
        if len(done) < len(T2_ROWS):
            out.append(f"- {DATASET_TITLES[ds]}: not finished.")
            continue
        best = max(done, key=lambda t: t[1]["accuracy"])
        base = get(ds, "MLP")["accuracy"]
        want = MATCHING[ds]
        line = f"- {DATASET_TITLES[ds]}: best {best[0]} ({100 * best[1]['accuracy']:.2f}%; plain MLP {100 * base:.2f}%)"
        if want is not None:
            wa = get(ds, want)["accuracy"]
            line += f"; the matching invariance ({want}) reaches {100 * wa:.2f}%" + (
                " — it is the best single invariance"
                if wa >= max(get(ds, r)["accuracy"] for r, s in T2_ROWS if s not in ("none", "affine"))
                else " — NOT the best single invariance"
            )
        aff = get(ds, "MLP + affine")["accuracy"]
        line += f"; affine {100 * aff:.2f}%."
        out.append(line)
    out.append("")
    return out


#: Table 1: the fixed rows whose amount of invariance fits each dataset (fully ±180°, partially ±90°, regular: small)
T1_RIGHT = {
    "rotated": ("fixed 175°",),
    "partially-rotated": ("fixed 90°",),
    "regular": ("none (η = 0)", "fixed 5°", "fixed 45°"),
}


def verdict(results: dict[str, Any], tables: list[str], seed: int) -> str:
    """Paper 003's claims read from this run: Table 1, the best ELBO is at the fitting amount of invariance and the
    learned η reaches it (within 0.01 nats per datum); Table 2, every learned invariance beats the plain MLP, the
    matching one is the best single invariance and affine is best overall (the paper's four columns)."""
    lines, checks = [], []

    def check(text: str, ok: bool) -> None:
        checks.append(ok)
        lines.append(f"- {text}: {'yes' if ok else 'no'}")

    for ds in T1_DATASETS if "1" in tables else ():
        fits = {r: results.get(_key("1", ds, r)) for r, _ in T1_ROWS}
        if None in fits.values():
            continue
        elbo = {r: f["elbo_per_datum"] for r, f in fits.items() if r != "learned"}
        best = max(elbo, key=elbo.get)
        check(f"Table 1, {DATASET_TITLES[ds]}: best fixed ELBO/N at a fitting amount ({best})", best in T1_RIGHT[ds])
        check(
            f"Table 1, {DATASET_TITLES[ds]}: learned η's ELBO/N within 0.01 of the best fixed "
            f"({fits['learned']['elbo_per_datum']:.3f} vs {elbo[best]:.3f})",
            fits["learned"]["elbo_per_datum"] >= elbo[best] - 0.01,
        )
    for ds in T2_DATASETS[:4] if "2" in tables else ():
        acc = {r: (results.get(_key("2", ds, r)) or {}).get("accuracy") for r, _ in T2_ROWS}
        if None in acc.values():
            continue
        worst = min((r for r in acc if r != "MLP"), key=acc.get)
        check(
            f"Table 2, {DATASET_TITLES[ds]}: every learned invariance above the plain MLP (lowest {worst} "
            f"{100 * acc[worst]:.2f} vs {100 * acc['MLP']:.2f})",
            acc[worst] > acc["MLP"],
        )
        if MATCHING[ds] is not None:
            single = max((r for r, sym in T2_ROWS if sym not in ("none", "affine")), key=acc.get)
            check(
                f"Table 2, {DATASET_TITLES[ds]}: the matching invariance is the best single one ({single})",
                single == MATCHING[ds],
            )
        best = max(acc, key=acc.get)
        check(f"Table 2, {DATASET_TITLES[ds]}: affine is the best row ({best})", best == "MLP + affine")
    word = common.verdict_of(checks) if checks else "not run"
    lines.append(
        "- Fashion-MNIST at a reduced size, against the paper's MNIST tables: the claims are compared, not the numbers."
    )
    return common.verdict_section(word, f"seed {seed} only; {sum(checks)} of {len(checks)} checks hold", lines)


def render_eta_paths(results: dict[str, Any]) -> list[str]:
    """η at 0, 25, 50, 75 and 100% of the steps for every fit that learns η (is it still moving?)."""
    rows = []
    for key, r in results.items():
        table, ds, row = key.split("|")
        for name, path in r.get("eta_history", {}).items():
            if not path or not (row == "learned" or table == "table2"):
                continue
            picks = [path[round(q * (len(path) - 1))] for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
            fmt = (lambda v: f"{math.degrees(v):.0f}°") if name == "rot" else (lambda v: f"{v:.2f}")
            rows.append([table, ds, row, name, *(fmt(v) for v in picks)])
    if not rows:
        return []
    return [
        "## η during training",
        "",
        "η after the first step and at 25 / 50 / 75 / 100% of the SVI steps of every fit that learns η "
        "(rotation in degrees, other generators as raw η: translation in half-sides, scale and shear as "
        "log-scale). The cosine schedule takes "
        "η's learning rate to 0 at the end, so a value still climbing at 75% was stopped by the schedule, not "
        "converged.",
        "",
        common.md_table(
            "table | dataset | model | generator | step 1 | 25% | 50% | 75% | 100%",
            rows,
            align=["l", "l", "l", "l"] + ["r"] * 5,
        ),
        "",
    ]


def render(
    info: dict[str, Any],
    settings: dict[str, Any],
    results: dict[str, Any],
    timing: dict[str, Any],
    preset: str,
    tables: list[str],
    command: str,
) -> str:
    label = {"quick": " (quick smoke-test size)", "reduced": " (reduced size)", "paper": " (paper size)"}[preset]
    intro = (
        "Paper 003 (van der Ouderaa & van der Wilk, *Learning Invariant Weights in Neural Networks*, UAI 2022), "
        "Tables 1 and 2, re-run with `pyro_invariance` on **Fashion-MNIST** (the paper's tables are on "
        "**MNIST**; the paper's numbers are quoted below each of our tables for reference only, not as a "
        "target to match). "
        + (
            "This is a REDUCED size (fewer hidden units, transform samples, training images and steps than the "
            "paper's H=1024, S=32, 60k images, many epochs) so that both tables take about half an hour of CPU "
            "time on one thread (measured beforehand: ≈0.05–0.1 s of CPU per SVI step with S transforms, ≈0.03 s "
            "without); `--paper-size` gives the paper's size. "
            if preset == "reduced"
            else ""
        )
        + ("This is the QUICK smoke-test size: the numbers mean nothing. " if preset == "quick" else "")
        + "ELBO/N is per training datum with N = the training size used; with fewer training images the "
        "KL term weighs more per datum, so our ELBO/N is not comparable to the paper's in absolute value — "
        "compare rows within a column."
    )
    out = [
        common.header_markdown(
            "Invariant MLP, paper 003 Tables 1–2 on Fashion-MNIST" + label, info, settings, command, intro
        )
    ]
    n_done = sum(1 for k in results if k.split("|")[0][-1] in [t for t in tables])
    out.append(
        f"Fits finished: {n_done} of {timing['planned']}; fitting {timing['fit_seconds']:.0f} s, "
        f"evaluation {timing['eval_seconds']:.0f} s, wall {timing['wall_seconds']:.0f} s in all, of which "
        f"{timing['cpu_seconds']:.0f} s of CPU time for this process (the rest is waiting for a core "
        f"on the shared machine; + {timing['reused']} fits reused from an earlier run).\n"
    )
    if "1" in tables:
        out += render_table1(results)
    if "2" in tables:
        out += render_table2(results)
    out += render_eta_paths(results)
    out += [
        "## Per fit",
        "",
        "Seconds of each fit call (wall and this process's CPU time, set-up included), wall ms per SVI step "
        "(loop only), evaluation seconds; the final "
        "minibatch ELBO/N (mean of the last 10% of steps) beside the ELBO/N estimate at the final parameters.",
        "",
    ]
    rows = []
    for key, r in results.items():
        table, ds, row = key.split("|")
        rows.append(
            [
                table,
                ds,
                row,
                f"{r['fit_seconds']:.1f}",
                f"{r.get('fit_cpu_seconds', float('nan')):.1f}",
                f"{1e3 * r['seconds_per_step']:.1f}",
                f"{r['eval_seconds']:.1f}",
                f"{r['train_elbo_last10pct']:.3f}",
                f"{r['elbo_per_datum']:.3f}",
                f"{100 * r['accuracy']:.2f}",
                f"{r['nll']:.3f}",
            ]
        )
    out += [
        common.md_table(
            "table | dataset | row | fit s (wall) | fit s (CPU) | ms/step (wall) | eval s "
            "| train ELBO/N (last 10%) | ELBO/N | acc % | test NLL",
            rows,
            align=["l", "l", "l"] + ["r"] * 8,
        ),
        "",
    ]
    if preset == "quick":
        return "\n".join([*out, common.verdict_section("not run", "quick smoke-test size: its numbers test nothing")])
    return "\n".join([*out, verdict(results, tables, settings.get("seed", 0))])


# --------------------------------------------------------------------------------------------
@pyro_invariance.pyro_scope()  # module-local params for the script's own loops
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny smoke-test size (~1–2 min)")
    size.add_argument("--paper-size", action="store_true", help="paper 003's size: H=1024, S=32, full data (slow)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--tables", default="1,2", help="which tables: 1, 2 or 1,2 (default)")
    for name in (
        "train-size",
        "test-size",
        "hidden",
        "samples",
        "batch-size",
        "steps",
        "eval-samples",
        "elbo-particles",
    ):
        parser.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name.replace('-', '_')}")
    parser.add_argument("--seed", type=int, default=0, help="seed of every fit (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--data-dir", default=None, help="Fashion-MNIST IDX folder (default /usr/share/datasets/fashion-mnist)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="reuse finished fits with identical settings from the JSON"
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the markdown from the existing JSON (no fitting; machine, settings, command kept)",
    )
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)

    common.set_threads(args.threads)
    preset = "quick" if args.quick else "paper" if args.paper_size else "reduced"
    size = dict(SIZES[preset])
    for k in list(size):
        override = getattr(args, k, None)
        if override is not None:
            size[k] = override
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not set(tables) <= {"1", "2"} or not tables:
        parser.error("--tables takes 1, 2 or 1,2")
    stem = {
        "quick": "invariant_mlp_tables_quick",
        "reduced": "invariant_mlp_tables",
        "paper": "invariant_mlp_tables_paper",
    }[preset]
    if tables != ["1", "2"]:
        stem += "_table" + "".join(tables)
    json_path = args.out_dir / f"{stem}.json"
    if args.render_only:
        saved = json.loads(json_path.read_text())
        results = {k: {kk: vv for kk, vv in v.items() if kk != "spec"} for k, v in saved["fits"].items()}
        md = render(saved["machine"], saved["settings"], results, saved["timing"], preset, tables, saved["command"])
        md_path, _ = common.write_results(stem, md, saved, args.out_dir)
        common.log(f"re-rendered {md_path} from {json_path}")
        return 0

    info = common.machine_info()
    settings = {
        "size preset": preset,
        "training images (first n of the 60k)": size["train_size"] or "all (60000)",
        "test images (first n of the 10k)": size["test_size"] or "all (10000)",
        "hidden units H": size["hidden"],
        "transform samples S": size["samples"],
        "batch size": size["batch_size"],
        "SVI steps per fit": size["steps"],
        "epochs per fit": round(size["steps"] * size["batch_size"] / (size["train_size"] or 60000), 1),
        "guide": "block-cholesky (W2), mean-field (b2, σ_p)",
        "prior": "hierarchical (σ_p ~ LogNormal(0, 1))",
        "fit": "pyro_invariance.fit defaults: Adam lr 0.05, eta_lr 0.1, factor_lr 1e-3, cosine to 0, "
        "TraceMeanField_ELBO 1 particle; ReLU: model_lr 3e-4",
        "RFF lengthscale": "default √D/8 = 3.5",
        "learned η init": "0.1 per generator",
        "Table 1 η = 0 row": "symmetry='none' (identical to η = 0, without the S identity warps)",
        "evaluation": f"{size['eval_samples']} guide draws for test accuracy/NLL; ELBO/N on the training split, "
        f"{size['elbo_particles']} draw(s) per chunk of 1000 rows",
        "seed": args.seed,
        "feature seed": 0,
        "device": args.device,
        "threads": args.threads,
        "data": f"{BASE} IDX files"
        + (f" in {args.data_dir}" if args.data_dir else " in /usr/share/datasets/fashion-mnist"),
    }

    plan: list[tuple[str, str, str]] = []  # (table, dataset, row), grouped by dataset (each loaded once)
    for ds in ("rotated", "partially-rotated", "regular", "translated", "scaled"):
        if "1" in tables and ds in T1_DATASETS:
            plan += [("1", ds, r) for r, _ in T1_ROWS]
        if "2" in tables and ds in T2_DATASETS:
            plan += [("2", ds, r) for r, _ in T2_ROWS]

    previous: dict[str, Any] = {}
    if args.resume and json_path.exists():
        previous = json.loads(json_path.read_text()).get("fits", {})
    results: dict[str, Any] = {}
    specs: dict[str, Any] = {}
    timing = {
        "planned": len(plan),
        "fit_seconds": 0.0,
        "eval_seconds": 0.0,
        "wall_seconds": 0.0,
        "reused": 0,
        "cpu_seconds": 0.0,
    }
    common.log(
        f"{preset} size {size}; {len(plan)} fits; {info['cpu']}, torch {info['torch']}, "
        f"{info['torch_threads']} thread(s); writing {json_path.with_suffix('.md')}"
    )
    wall0 = time.perf_counter()
    data, loaded = None, None

    def save() -> None:
        timing["wall_seconds"] = time.perf_counter() - wall0
        md = render(info, settings, results, timing, preset, tables, common.command_line())
        payload = {
            "machine": info,
            "settings": settings,
            "size": size,
            "command": common.command_line(),
            "timing": timing,
            "complete": len(results) == len(plan),
            "fits": {k: {"spec": specs[k], **results[k]} for k in results},
        }
        common.write_results(stem, md, payload, args.out_dir)

    for i, (table, ds, row) in enumerate(plan, 1):
        key = _key(table, ds, row)
        spec = fit_spec(table, ds, row, size, args.seed)
        specs[key] = spec
        old = previous.get(key)
        if old is not None and old.get("spec") == spec:
            results[key] = {k: v for k, v in old.items() if k != "spec"}
            timing["reused"] += 1
            common.log(f"[{i}/{len(plan)}] table {table} {ds} {row}: reused")
            continue
        if loaded != ds:
            data = load_dataset(
                dataset_name(BASE, ds),
                train_size=size["train_size"],
                test_size=size["test_size"],
                data_dir=args.data_dir,
            )
            loaded = ds
        res = run_fit(spec, data, args.device)
        results[key] = res
        timing["fit_seconds"] += res["fit_seconds"]
        timing["eval_seconds"] += res["eval_seconds"]
        timing["cpu_seconds"] += res["fit_cpu_seconds"] + res["eval_cpu_seconds"]
        eta = f"η {_eta_short(res)}" if res["eta"] else "η –"
        common.log(
            f"[{i}/{len(plan)}] table {table} {ds:17s} {row:18s} fit {res['fit_seconds']:6.1f} s "
            f"(CPU {res['fit_cpu_seconds']:.1f} s) "
            f"({1e3 * res['seconds_per_step']:.0f} ms/step) eval {res['eval_seconds']:4.1f} s | "
            f"acc {100 * res['accuracy']:.2f}% ELBO/N {res['elbo_per_datum']:.3f} {eta}"
        )
        save()
    save()
    common.log(f"done in {time.perf_counter() - wall0:.0f} s; wrote {json_path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
