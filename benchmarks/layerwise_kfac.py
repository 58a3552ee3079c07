"""Paper 004 Table 1 (the quadrant task) with the KFAC-Laplace evidence, over seeds and both starts.

Rows: FC / CONV / the learned FC+CONV and F-FC+CONV (``--variants``; default FC, CONV, FC+CONV), each
by MAP (δ = 1: weight decay), by the diagonal Laplace evidence with MacKay's update (what
``benchmarks/layerwise_tables.py`` runs) and by the KFAC Laplace evidence (paper 004 Eq. 9) with δ
learned by its gradient (``fit_laplace(curvature="kfac", labels="exact", delta_update="gradient")``:
100 Adam steps of rate 0.1 on log δ per update, laplace-torch's ``marglik_training`` defaults), from
both starts (``equivariant``: non-equivariant pathways at 0; ``prior``: a prior draw), seeds 0, 1, 2.
By default every other setting is Table 1's reduced size (``layerwise_tables.SIZES["reduced"]``: α = 2,
16-px quadrant digits, 300 steps, batch 128, Laplace updates every 50 steps after 50); ``--base
fashion-mnist --size 32`` (quadrant Fashion-MNIST, 5000 / 2000 images, on a 32-px canvas), ``--steps``,
``--laplace-every`` and ``--laplace-warmup`` change them: the Settings list is what ran. The settings
were fixed before any of these runs.

Columns: test accuracy mean ± sd over seeds on the 10-class (the digit or garment) and 40-class (it and the quadrant)
tasks, the Laplace log evidence per datum, and for the learned models in how many of the early
blocks (0–3) δ of the non-equivariant pathway ended above its start (the pathway switched off).

Results: ``benchmarks/results/layerwise_kfac[_quick].md`` / ``.json`` (rewritten after every fit).

Every fit is a unit (``--part k/n`` runs fits k, k + n, … in one process, each writing its own file
under ``--work-dir``, default ``results/grids/<stem>``, so a stopped run resumes); the fits are ordered
baselines first, then the 10-class task, so that a stopped run has the table's first columns, and every
run writes the table from the fits finished so far (missing ones show "…"; ``--collect`` only writes).
``--baseline-methods`` sets the methods of the variants without a non-equivariant pathway (FC, CONV)
apart from ``--methods``.

Paper size (``--preset paper``, for a GPU: ``--device cuda``): α = 10, paper 004's width; the whole
training set, 60000 / 10000 quadrant images of ``--base`` on a 32-px canvas (``mnist`` as in the paper,
through torchvision, which needs a network once; ``fashion-mnist`` offline from ``--data-dir`` or the
Debian package); ``--epochs`` epochs (default 20) of 469 steps of batch 128, with one KFAC-Laplace
update of δ per epoch after the first (laplace-torch's ``marglik_training`` updates once per epoch
too). Every fit records ``ms_per_step`` (the Laplace updates included). Sizes for planning, measured
on an H200: a MAP step of α = 10 CONV takes 0.090 s and F-FC+CONV 0.156 s,
so an epoch of MAP steps takes 40-75 s before the curvature passes over the 60000 images. One epoch
as a GPU check: ``PARTS=layerwise_paper`` in ``benchmarks/gpu_session.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import layerwise_tables as tables  # noqa: E402

import pyro_invariance  # noqa: E402
from pyro_invariance.catalogue import model_kwargs_for  # noqa: E402
from pyro_invariance.diagnostics.layerwise_analysis import analyse_pathways  # noqa: E402
from pyro_invariance.infer.laplace import fit_laplace  # noqa: E402
from pyro_invariance.models.layerwise import FIT_DEFAULTS  # noqa: E402
from pyro_invariance.registry import MODELS  # noqa: E402

VARIANTS = ("fc", "conv", "fc+conv")
#: method -> fit_laplace options (None: plain MAP)
METHODS: dict[str, dict[str, Any] | None] = {
    "MAP": None,
    "Laplace diag (MacKay)": {"curvature": "diagonal", "delta_update": "mackay"},
    "Laplace KFAC (gradient)": {
        "curvature": "kfac",
        "labels": "exact",
        "delta_update": "gradient",
        "delta_steps": 100,
        "delta_lr": 0.1,
    },
}
STARTS = ("equivariant", "prior")
SEEDS = (0, 1, 2)
#: the non-equivariant pathway of each learned variant
OPEN = {"fc+conv": "fc", "f-fc+conv": "ffc", "s-fc+s-conv": "sfc"}
#: ``--preset paper``: paper 004's network width and the whole training set, for a GPU (``--device cuda``);
#: 60000 / 10000 images (MNIST and Fashion-MNIST), one Laplace update per epoch after the first epoch
PAPER = {"alpha": 10, "train_size": 60000, "test_size": 10000, "eval_samples": 8, "ggn_batch": 128}
PAPER_EPOCHS = 20
BATCH = 128
EARLY_BLOCKS = (0, 1, 2, 3)


def run_fit(
    variant: str, method: str, start: str, data: Any, sizes: dict[str, Any], seed: int, device: str = "cpu"
) -> dict[str, Any]:
    name = f"layerwise-{variant}"
    model = MODELS.get(name, **model_kwargs_for(name, data, alpha=sizes["alpha"], prior="fixed", start=start))
    delta0 = float(model.blocks[0].bias_precision)
    options = METHODS[method]
    t0 = time.perf_counter()
    common_kw = dict(
        steps=sizes["steps"], batch_size=128, seed=seed, progress=False, lr=FIT_DEFAULTS["lr"], device=device
    )
    if options is None:
        result = pyro_invariance.fit(model, "map", data, **common_kw)
    else:
        result = fit_laplace(
            model,
            "map",
            data,
            every=sizes["laplace_every"],
            warmup=sizes["laplace_warmup"],
            ggn_batch_size=sizes["ggn_batch"],
            **options,
            **common_kw,
        )
    seconds = time.perf_counter() - t0
    metrics = pyro_invariance.evaluate(result, data, num_samples=1, num_particles=1, device=device)
    out: dict[str, Any] = {
        "variant": variant,
        "method": method,
        "start": start,
        "seed": seed,
        "seconds": round(seconds, 1),
        "ms_per_step": round(1000 * seconds / sizes["steps"], 1),
        "accuracy": round(metrics["accuracy"], 4),
        "nll": round(metrics["nll"], 4),
        "delta_start": delta0,
    }
    if options is not None:
        out["log_evidence_per_datum"] = round(result.log_evidence / result.num_data, 4)
        reports = analyse_pathways(model, result.laplace)
        out["delta"] = {f"{r.block}.{r.kind}": r.precision[0] for r in reports if isinstance(r.block, int)}
    return out


_DATA: dict[tuple, Any] = {}


def run_cell(key: tuple, args: argparse.Namespace, sizes: dict[str, Any]) -> dict[str, Any]:
    """One fit ``(variant, method, start, task, seed)``, seeded by itself (the data are loaded once per task)."""
    variant, method, start, task, seed = key
    if task not in _DATA:
        _DATA[task] = tables.load("1", args.base, args.size, sizes, task, args.data_dir)
    return {
        "key": f"{variant}|{method}|{start}|{task}|{seed}",
        **run_fit(variant, method, start, _DATA[task], sizes, seed, args.device),
    }


def _mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    if not values:
        return "…"
    vals = [scale * v for v in values]
    sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
    return f"{statistics.mean(vals):.{digits}f} ± {sd:.{digits}f}" + (
        f" ({len(vals)})" if len(vals) < len(SEEDS) else ""
    )


KFAC = "Laplace KFAC (gradient)"


def _mean(
    rows: dict[str, Any], variant: str, method: str, start: str, task: int, field: str = "accuracy"
) -> tuple[float | None, int]:
    """Mean of ``field`` over the finished seeds of one row, and how many seeds it has."""
    vals = [rows[k][field] for s in SEEDS if (k := f"{variant}|{method}|{start}|{task}|{s}") in rows]
    return (statistics.mean(vals), len(vals)) if vals else (None, 0)


def _seeds_note(n: int) -> str:
    return "" if n == len(SEEDS) else f" ({n} of {len(SEEDS)} seeds)"


def criteria(rows: dict[str, Any], variants: tuple[str, ...]) -> str:
    """The criteria of the KFAC rerun, judged from the rows (met / NOT met / not measured).

    Accuracy is compared with the *better* of a baseline's rows (MAP or KFAC-Laplace), the evidence with
    the baseline's KFAC-Laplace row; "δ grew in most early blocks" pools the early blocks of every fit of
    a start (seeds × tasks) and asks that δ ended above its start in more than half of them.
    """
    lines, checks = ["Criteria, computed from the rows above:", ""], []

    def best(variant: str, task: int) -> tuple[float, str, int] | None:
        found = [(m, *_mean(rows, variant, m, STARTS[0], task)) for m in METHODS]
        found = [(v, m, n) for m, v, n in found if v is not None]
        return max(found) if found else None

    def verdict(ok: bool) -> str:
        checks.append(ok)
        return "met" if ok else "**NOT met**"

    premise = []
    for method in METHODS:
        conv, fc = _mean(rows, "conv", method, STARTS[0], 10), _mean(rows, "fc", method, STARTS[0], 10)
        if conv[0] is not None and fc[0] is not None:
            holds = "holds" if conv[0] >= fc[0] else "**does not hold**"
            premise.append(
                f"{method}: CONV {100 * conv[0]:.1f}{_seeds_note(conv[1])} vs FC {100 * fc[0]:.1f}"
                f"{_seeds_note(fc[1])} — {holds}"
            )
    if premise:
        lines.append("- **The premise, CONV ≥ FC on the 10-class task** (mean accuracy): " + "; ".join(premise) + ".")

    for variant in (v for v in variants if v in OPEN):
        name = variant.upper().replace("+", " + ")
        for start in STARTS:
            acc = {t: _mean(rows, variant, KFAC, start, t) for t in (10, 40)}
            ev = {t: _mean(rows, variant, KFAC, start, t, "log_evidence_per_datum") for t in (10, 40)}
            if acc[10][0] is None and acc[40][0] is None:
                continue
            parts = []
            for task, base, what in ((10, "conv", "within 2 points of CONV"), (40, "fc", "≥ FC − 2")):
                ref = best(base, task)
                if acc[task][0] is None or ref is None:
                    parts.append(f"{task}-class accuracy vs {base.upper()}: not measured")
                    continue
                a, r = 100 * acc[task][0], 100 * ref[0]
                ok = a >= r - 2.0
                parts.append(
                    f"{task}-class accuracy {what}: {a:.1f}{_seeds_note(acc[task][1])} vs {r:.1f} "
                    f"({ref[1]}{_seeds_note(ref[2])}) — {verdict(ok)}"
                )
            fits = [rows[k] for t in (10, 40) for s in SEEDS if (k := f"{variant}|{KFAC}|{start}|{t}|{s}") in rows]
            grew = sum(r["delta"][f"{b}.{OPEN[variant]}"] > r["delta_start"] for r in fits for b in EARLY_BLOCKS)
            total = len(fits) * len(EARLY_BLOCKS)
            parts.append(f"δ grew in {grew} of {total} early blocks of {len(fits)} fits — {verdict(2 * grew > total)}")
            for task, base, strict in ((40, "conv", True), (10, "fc", False)):
                ref = _mean(rows, base, KFAC, STARTS[0], task, "log_evidence_per_datum")
                if ev[task][0] is None or ref[0] is None:
                    parts.append(f"{task}-class evidence vs {base.upper()}: not measured")
                    continue
                ok = ev[task][0] > ref[0] if strict else ev[task][0] >= ref[0]
                sign = ">" if strict else "≥"
                parts.append(
                    f"{task}-class log evidence/N {sign} {base.upper()}'s: "
                    f"{ev[task][0]:.2f}{_seeds_note(ev[task][1])} "
                    f"vs {ref[0]:.2f}{_seeds_note(ref[1])} — {verdict(ok)}"
                )
            lines.append(f"- **{name}, {start} start** (KFAC-Laplace): " + "; ".join(parts) + ".")
    seeds = sorted({int(k.rsplit("|", 1)[1]) for k in rows})
    if checks:
        lines += [
            "",
            common.verdict_section(
                common.verdict_of(checks),
                f"seeds {', '.join(map(str, seeds))}: "
                f"{sum(checks)} of {len(checks)} criteria met, on means over the seeds",
            ),
        ]
    else:
        lines += ["", common.verdict_section("not run", "no learned model in this run: the premise line only")]
    return "\n".join(lines)


def render(rows: dict[str, Any], variants: tuple[str, ...], header: str) -> str:
    body = []
    for variant in variants:
        for method in METHODS:
            if not any(k.startswith(f"{variant}|{method}|") for k in rows):
                continue  # not run
            for start in STARTS if variant in OPEN else STARTS[:1]:
                if not any(k.startswith(f"{variant}|{method}|{start}|") for k in rows):
                    continue  # this start not run
                cells = [variant.upper().replace("+", " + "), method, start if variant in OPEN else "–"]
                for task in (10, 40):
                    rs = [rows[k] for s in SEEDS if (k := f"{variant}|{method}|{start}|{task}|{s}") in rows]
                    cells.append(_mean_sd([r["accuracy"] for r in rs], 100))
                    if METHODS[method] is not None:
                        cells.append(_mean_sd([r["log_evidence_per_datum"] for r in rs], digits=2))
                    else:
                        cells.append("–")
                    if variant in OPEN and METHODS[method] is not None and rs:
                        grew = [
                            sum(r["delta"][f"{b}.{OPEN[variant]}"] > r["delta_start"] for b in EARLY_BLOCKS) for r in rs
                        ]
                        cells.append("/".join(str(g) for g in grew))
                    else:
                        cells.append("–")
                body.append(cells)
    heads = ["model", "method", "start"]
    for task in ("10-class", "40-class"):
        heads += [f"acc % {task}", f"log ev./N {task}", f"early blocks δ grew {task} (per seed)"]
    return header + "\n" + common.md_table(heads, body) + "\n\n" + criteria(rows, variants)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke-test size")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stem", default="layerwise_kfac", help="results file name (without _quick / extension)")
    p.add_argument("--base", default="digits", help="quadrant base: digits (default) or fashion-mnist")
    p.add_argument("--size", type=int, default=None, help="canvas side length (default 16; 32 with --preset paper)")
    p.add_argument(
        "--preset",
        choices=("reduced", "paper"),
        default="reduced",
        help="reduced: Table 1's CPU size (α = 2); paper: α = 10, 60000 / 10000 images on a 32-px canvas, "
        "--epochs epochs with one Laplace update per epoch after the first (for a GPU: --device cuda)",
    )
    p.add_argument("--epochs", type=int, default=None, help=f"with --preset paper: epochs (default {PAPER_EPOCHS})")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--data-dir", default=None, help="folder of the base's files (default: the dataset's own default)")
    p.add_argument("--steps", type=int, default=None, help="MAP steps (default: Table 1's reduced size, 300)")
    p.add_argument("--alpha", type=int, default=None, help="network width α (default 2)")
    p.add_argument("--starts", default=",".join(STARTS), help="comma-separated subset of the starts")
    p.add_argument("--baseline-methods", default=None, help="methods of FC and CONV (default: --methods)")
    p.add_argument("--laplace-every", type=int, default=None, help="steps between Laplace updates (default 50)")
    p.add_argument("--laplace-warmup", type=int, default=None, help="steps before the first update (default 50)")
    p.add_argument("--part", default="0/1", help="k/n: run fits k, k + n, … of the table (default all)")
    p.add_argument("--collect", action="store_true", help="only write the table from the fits finished so far")
    p.add_argument("--work-dir", type=Path, default=None, help="unit files (default results/grids/<stem>)")
    args = p.parse_args(argv)
    k, n = common.parse_part(p, args.part)
    starts = tuple(s.strip() for s in args.starts.split(",") if s.strip())
    if not starts or set(starts) - set(STARTS):
        p.error(f"--starts: use a subset of {list(STARTS)}")
    common.set_threads(args.threads)
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    baseline_methods = (
        methods if args.baseline_methods is None else [m.strip() for m in args.baseline_methods.split(",") if m.strip()]
    )
    unknown = [m for m in methods + baseline_methods if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; use {list(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    sizes = dict(tables.SIZES["quick" if args.quick else "reduced"])
    if args.epochs is not None and args.preset != "paper":
        p.error("--epochs goes with --preset paper (the reduced size counts --steps)")
    if args.preset == "paper":
        if args.quick:
            p.error("--quick and --preset paper are two different sizes: pick one")
        per_epoch = -(-PAPER["train_size"] // BATCH)
        sizes.update(
            PAPER, steps=(args.epochs or PAPER_EPOCHS) * per_epoch, laplace_every=per_epoch, laplace_warmup=per_epoch
        )
    if args.size is None:
        args.size = 32 if args.preset == "paper" else 16
    for key in ("steps", "alpha", "laplace_every", "laplace_warmup"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    settings = {
        **sizes,
        "base": args.base,
        "size": args.size,
        "batch_size": 128,
        "threads": args.threads,
        "methods": {m: METHODS[m] for m in METHODS},
        "starts": starts,
    }
    if args.baseline_methods is not None:
        settings["baseline_methods"] = baseline_methods
    if args.device != "cpu":
        settings["device"] = args.device
    if args.base != "digits" and sizes["train_size"] is None:
        settings.update(tables.FASHION_SIZES)  # what tables.load uses for a non-digits base
    stem = args.stem + (f"_{args.base}{args.size}" if (args.base, args.size) != ("digits", 16) else "")
    stem += "".join(f"_{k}{getattr(args, k)}" for k in ("steps", "alpha") if getattr(args, k) is not None)
    stem += f"_every{args.laplace_every}" if args.laplace_every is not None else ""
    stem += f"_warmup{args.laplace_warmup}" if args.laplace_warmup is not None else ""
    stem += f"_paper{args.epochs or PAPER_EPOCHS}ep" if args.preset == "paper" else ""
    stem += "_quick" if args.quick else ""
    header = common.header_markdown(
        "Layer-wise equivariance: Table 1 with the KFAC-Laplace evidence",
        common.machine_info(),
        settings,
        common.command_line(),
        __doc__.split("\n\n", 1)[1].rsplit("\n\nResults:", 1)[0],
    )
    keys = [
        (v, m, st, t, sd)
        for base_first in (True, False)
        for t in (10, 40)
        for v in variants
        if (v not in OPEN) == base_first
        for m in (methods if v in OPEN else baseline_methods)
        for sd in seeds
        for st in (starts if v in OPEN else STARTS[:1])
    ]
    work = args.work_dir or common.REPO_ROOT / "results" / "grids" / stem

    def key_of(point):
        return tuple(point["key"].split("|")[:3]) + tuple(int(v) for v in point["key"].split("|")[3:])

    def describe(key, r):
        return f"{key}: acc {r['accuracy']:.3f} log ev/N {r.get('log_evidence_per_datum')} ({r['seconds']} s)"

    if not args.collect:
        work.mkdir(parents=True, exist_ok=True)
        common.fill_unit(
            work / f"part{k}of{n}.json",
            {"stem": stem},
            keys[k::n],
            key_of,
            lambda key: run_cell(key, args, sizes),
            describe,
        )
    points = common.unit_points(sorted(work.glob("part*.json")), keys, key_of, partial=True)
    rows = {p["key"]: {f: v for f, v in p.items() if f != "key"} for p in points}
    if len(rows) < len(keys):
        header = header.replace("Regenerate with", f"{len(rows)} of {len(keys)} fits finished. Regenerate with")
    payload = {"settings": settings, "rows": rows, "criteria": criteria(rows, variants)}
    common.write_results(stem, render(rows, variants, header), payload)


if __name__ == "__main__":
    main()
