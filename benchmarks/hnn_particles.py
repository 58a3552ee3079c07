"""Time per SVI step of ``symmetrised-hnn`` with P ELBO particles: sequential vs vectorised (issue 14).

Sequential (``Trace*_ELBO(num_particles=P)``, what ``fit`` did before): the P weight samples run
one after another, each through its own guide draw, flows and E Euler sub-steps. Vectorised
(``vectorize_particles=True, max_plate_nesting=1``): one pass for all P particles; every Euler
sub-step is one ``autograd.grad`` over (particles, symmetry samples, rows)
(``SymmetrisedHNN._particle_step``). Both are the same estimator (``tests/test_vectorized_particles.py``:
identical draws give identical losses and gradients). With one particle Pyro adds no particle
plate, so the two variants run the same code there (the difference is timing noise).

A step is the body of ``fit``'s loop: ``TraceMeanField_ELBO.differentiable_loss`` + ``backward`` +
Adam on model and guide parameters, on the full SHO training set (28 pairs). The variants run
interleaved, repetition by repetition, the order rotating every repetition, so that load from other
jobs hits them alike. Reported: median (and interquartile range) of the per-step wall time.
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

import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402

import pyro_invariance as pi  # noqa: E402
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.data.arrays import train_arrays  # noqa: E402

#: Reduced SHO settings: noether_tables.py's (hidden 32,32, S = 8, E = 4) and the model's defaults
#: (hidden 64,64, S = 16, E = 5); one learned quadratic generator.
SETTINGS: dict[str, dict[str, Any]] = {
    "SHO (32,32) S=8 E=4": dict(hidden=(32, 32), num_transforms=8, euler_steps=4),
    "SHO (64,64) S=16 E=5": dict(hidden=(64, 64), num_transforms=16, euler_steps=5),
}
VARIANTS = ("sequential", "vectorised")


def _runner(setting: dict[str, Any], particles: int, vectorised: bool, guide_name: str,
            x: torch.Tensor, y: torch.Tensor, seed: int) -> Any:  # fmt: skip
    pyro.set_rng_seed(seed)
    model = pi.MODELS.get("symmetrised-hnn", symmetry="quadratic", num_generators=1, sampling="cube", **setting)
    guide = guides.get(guide_name, model, init_scale=0.01)
    n = x.shape[0]
    guide(x, y, num_data=n)
    opt = torch.optim.Adam(list(model.parameters()) + list(guide.parameters()), lr=1e-3)
    kw = dict(vectorize_particles=True, max_plate_nesting=1) if vectorised else {}
    loss_fn = TraceMeanField_ELBO(num_particles=particles, **kw)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn.differentiable_loss(model, guide, x, y, num_data=n)
        loss.backward()
        opt.step()
        loss.item()
        return time.perf_counter() - t0

    return step


def run(args: argparse.Namespace) -> dict[str, Any]:
    data = pi.DATASETS.get("sho", cache_dir=False)
    rows = []
    with pi.pyro_scope():
        for label, setting in SETTINGS.items():
            for p in args.particles:
                x, y = train_arrays(data)
                steps = {v: _runner(setting, p, v == "vectorised", args.guide, x, y, args.seed) for v in VARIANTS}
                for fn in steps.values():  # warm-up
                    for _ in range(args.warmup):
                        fn()
                times: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for rep in range(args.reps):
                    order = VARIANTS[rep % 2:] + VARIANTS[: rep % 2]
                    for v in order:
                        times[v].append(steps[v]())
                row: dict[str, Any] = {"setting": label, "particles": p}
                for v in VARIANTS:
                    q = statistics.quantiles(times[v], n=4)
                    row[v] = {"median_s": statistics.median(times[v]), "iqr_s": [q[0], q[2]], "times_s": times[v]}
                row["speedup"] = row["sequential"]["median_s"] / row["vectorised"]["median_s"]
                rows.append(row)
                common.log(f"{label} P={p}: sequential {row['sequential']['median_s']:.4f} s, "
                           f"vectorised {row['vectorised']['median_s']:.4f} s, ×{row['speedup']:.2f}")  # fmt: skip
    return {"rows": rows, "train_pairs": int(x.shape[0])}


def markdown(result: dict[str, Any], info: dict[str, Any], settings: dict[str, Any]) -> str:
    intro = __doc__.split("\n\n", 1)[1]
    out = common.header_markdown("symmetrised-hnn: time per step, sequential vs vectorised particles", info,
                                 settings, common.command_line(), intro)  # fmt: skip
    table = []
    for r in result["rows"]:
        cells = [r["setting"], r["particles"]]
        for v in VARIANTS:
            lo, hi = r[v]["iqr_s"]
            cells.append(f"{r[v]['median_s'] * 1e3:.1f} ({lo * 1e3:.1f}–{hi * 1e3:.1f})")
        cells.append(f"×{r['speedup']:.2f}")
        table.append(cells)
    out += "\n" + common.md_table(
        ["setting", "particles", "sequential ms/step (IQR)", "vectorised ms/step (IQR)", "speed-up"], table
    ) + "\n"
    by = {(r["setting"], r["particles"]): r for r in result["rows"]}
    lines = []
    for label in SETTINGS:
        one, many = by.get((label, 1)), by.get((label, max(settings["particles"])))
        if one and many and many is not one:
            p = many["particles"]
            lines.append(
                f"- {label}: {p} particles cost ×{many['sequential']['median_s'] / one['sequential']['median_s']:.1f} "
                f"one particle sequentially, ×{many['vectorised']['median_s'] / one['sequential']['median_s']:.1f} vectorised."
            )
    if lines:
        out += "\n" + "\n".join(lines) + "\n"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--particles", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--guide", default="matrix-normal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="hnn_particles", help="results file stem (benchmarks/results/<out>.md/.json)")
    args = parser.parse_args()
    common.set_threads(args.threads)
    info = common.machine_info()
    settings = {"particles": args.particles, "reps": args.reps, "warmup": args.warmup, "guide": args.guide,
                "elbo": "TraceMeanField_ELBO", "seed": args.seed, "model": "symmetrised-hnn, quadratic K=1, cube",
                "data": "sho (full batch)", "settings": SETTINGS}  # fmt: skip
    result = run(args)
    common.write_results(args.out, markdown(result, info, settings), {"machine": info, "settings": settings, **result})


if __name__ == "__main__":
    main()
