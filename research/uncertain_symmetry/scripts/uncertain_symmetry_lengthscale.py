r"""Issue 15: does the wide η that the evidence picks on upright digits stand in for a too-short RFF lengthscale?

Why (a probe added after the data-size benchmark's seed-0 units had been seen; exploratory, not a test of a claim made
in advance). ``uncertain_symmetry_datasize.py`` found, on upright digits, the Laplace evidence's top at η = 2.35 rad at
N = 300, 600 and 1200 alike, and the held-out NLL lowest there at N = 1200: the preference for a wide rotation average
does not fade with data, so it is not Occam's razor at small N. The reference model's first layer is random Fourier
features of an RBF kernel with the default lengthscale ℓ = √D / 8 = 1 on 8×8 digits in [0, 1]; digits lie several ℓ
apart, so the kernel between two different digits is small, and averaging the features over rotations makes it wider
(smoother) — what a longer ℓ would also do. If η stands in for ℓ, a longer ℓ must move the evidence's top to smaller
η and raise the evidence at small η; and the evidence across ℓ says which ℓ the data prefer.

Method (every setting fixed and committed before any point of this script ran):

a. **Model and data.** ``uncertain_symmetry_datasize.py``'s model on upright digits, N = ``SIZE`` = 1200, seed 0,
   with the RFF lengthscale ℓ ∈ ``LENGTHSCALES`` = 1 (the default: the data-size run's own points), 2, 4.
b. **Points.** η ∈ ``ETAS`` (every other point of the data-size grid, and its top 2.35): the Laplace evidence and the
   held-out NLL of the Laplace predictive at its σ_p mode, as ``uncertain_symmetry_datasize.evaluate_point``; two
   processes take alternate points of each ℓ (``--part``).
c. **Measures** (``--render``), per ℓ: the evidence's top η and value, ℓ(top) − ℓ(0.1), the lowest held-out NLL and its
   η; at ℓ = 1 the largest difference from the data-size run's points (the same function on the same data: a check).
d. **±90° digits** (added after (b)'s upright points had been rendered; the same settings otherwise): does a longer ℓ
   move the ±90° evidence's top (2.85 rad at every N with ℓ = 1) toward π/2? ``DATASETS`` gains ``partially-rotated``,
   run after upright (``--dataset``).

Results: ``research/uncertain_symmetry/results/uncertain_symmetry_lengthscale.md``, ``.json``; unit files in
``--work-dir``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the repository root: research.uncertain_symmetry

import numpy as np  # noqa: E402
import uncertain_symmetry_datasize as usd  # noqa: E402

from research.uncertain_symmetry import common  # noqa: E402

STEM = "uncertain_symmetry_lengthscale"
SIZE, SEED = 1200, 0
#: (a) upright; (d) ±90°, added after (b)'s upright points were rendered
DATASETS = ("upright", "partially-rotated")
LENGTHSCALES = (1.0, 2.0, 4.0)
ETAS = (0.1, 0.6, 1.1, 1.6, 2.1, 2.35, 2.6, math.pi)


def unit_path(work: Path, dataset: str, lengthscale: float, k: int) -> Path:
    return work / f"{dataset}_lengthscale{lengthscale:g}_part{k}.json"


def run_unit(dataset: str, lengthscale: float, path: Path, k: int = 0, n: int = 1, data: Any = None) -> dict[str, Any]:
    """Points k, k + n, … of ``ETAS`` at ℓ, resuming from ``path``; the file is replaced after each η."""
    data = usd.load(dataset, SIZE) if data is None else data
    return usd.run_points(
        path, {"dataset": dataset, "lengthscale": lengthscale}, data, SEED, ETAS[k::n], lengthscale=lengthscale
    )


def render(work: Path, datasize_work: Path, out_dir: Path | None) -> tuple[Path, Path] | None:
    rows = []
    for dataset, ell in ((d, e) for d in DATASETS for e in LENGTHSCALES):
        pts = sorted(
            (
                q
                for p in sorted(work.glob(f"{dataset}_lengthscale{ell:g}_part*.json"))
                for q in json.loads(p.read_text())["points"]
            ),
            key=lambda q: q["eta"],
        )
        if len(pts) < len(ETAS):
            continue
        etas, lev, nll = (np.array([q[k] for q in pts]) for k in ("eta", "log_evidence", "nll"))
        top, best = int(np.argmax(lev)), int(np.argmin(nll))
        rows.append(
            {
                "dataset": dataset,
                "lengthscale": ell,
                "etas": etas.tolist(),
                "log_evidence": lev.tolist(),
                "nll": nll.tolist(),
                "top_eta": float(etas[top]),
                "top": float(lev[top]),
                "gain": float(lev[top] - lev[0]),
                "best_eta": float(etas[best]),
                "best_nll": float(nll[best]),
                "best_accuracy": pts[best]["accuracy"],
            }
        )
    if not rows:
        return None
    diffs = []
    for r in (r for r in rows if r["lengthscale"] == 1.0):
        theirs = {q["eta"]: q["log_evidence"] for q in (usd.unit_points(datasize_work, r["dataset"], SIZE, SEED) or [])}
        diffs += [abs(theirs[e] - v) for e, v in zip(r["etas"], r["log_evidence"]) if e in theirs]
    check = max(diffs) if diffs else None
    table = [
        "| data | ℓ | evidence's top: η / log p(D \\| η) | ℓ(top) − ℓ(0.1) | log p(D \\| η) − the best ℓ's top, at η = "
        + " / ".join(f"{e:.2f}" for e in ETAS)
        + " | lowest held-out NLL: η / NLL / accuracy |",
        "|:---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        best_top = max(q["top"] for q in rows if q["dataset"] == r["dataset"])
        table.append(
            f"| {r['dataset']} | {r['lengthscale']:g} | {r['top_eta']:.2f} / {r['top']:.1f} | {r['gain']:.1f} | "
            + " / ".join(f"{v - best_top:.1f}" for v in r["log_evidence"])
            + f" | {r['best_eta']:.2f} / {r['best_nll']:.4f} / {r['best_accuracy']:.3f} |"
        )
    settings = {
        "DATASETS": list(DATASETS),
        "SIZE": SIZE,
        "SEED": SEED,
        "LENGTHSCALES": list(LENGTHSCALES),
        "ETAS": list(ETAS),
        "NUM_SCALES": usd.NUM_SCALES,
        "SCALE_SPAN": list(usd.SCALE_SPAN),
        "HELDOUT_DRAWS": usd.HELDOUT_DRAWS,
    }
    info, command = common.machine_info(), common.command_line()
    intro = (
        "Issue 15: the Laplace evidence and held-out NLL along η on 1200 upright and ±90° digits for three RFF "
        "lengthscales. "
        "Method: section *Method* (the module docstring of "
        "`research/uncertain_symmetry/scripts/uncertain_symmetry_lengthscale.py`)."
    )
    md = "\n".join(
        [
            common.header_markdown("Uncertain symmetry: η against the RFF lengthscale", info, settings, command, intro),
            *table,
            "\nCheck at ℓ = 1 against `uncertain_symmetry_datasize.py`'s points: "
            + ("no shared point" if check is None else f"largest |Δ log p(D | η)| = {check:.2e} nats")
            + ".\n",
            "\n## Method\n",
            __doc__.split("\n\n", 1)[1],
        ]
    )
    return common.write_results(
        STEM, md, {"info": info, "settings": settings, "command": command, "units": rows, "check": check}, out_dir
    )


def main(argv: list[str] | None = None) -> int:
    parser, group = common.unit_script_parser(__doc__, STEM)
    group.add_argument("--run", action="store_true", help="(b): every point of --part not yet in --work-dir")
    group.add_argument("--render", action="store_true", help="no runs: the table from the unit files (c)")
    parser.add_argument("--part", default="0/1", help="k/n: run points k, k + n, … of each ℓ")
    parser.add_argument("--dataset", default=DATASETS[0], choices=DATASETS)
    parser.add_argument(
        "--datasize-work-dir", type=Path, default=Path(f"research/uncertain_symmetry/results/{usd.STEM}_units")
    )
    args = common.parse_script_args(parser, argv)
    if args.render:
        return 0 if render(args.work_dir, args.datasize_work_dir, args.out_dir) else 1
    k, n = common.parse_part(parser, args.part)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = usd.load(args.dataset, SIZE)
    for ell in LENGTHSCALES:
        run_unit(args.dataset, ell, unit_path(args.work_dir, args.dataset, ell, k), k, n, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
