"""Cost of each guide per SVI step as the model grows: InvariantMLP on rotated digits, H = 32 … 512.

For every hidden width H (doubling), one InvariantMLP (RFF, learned rotation, S transform samples,
hierarchical prior; latents: the read-out W2 (10 × H), b2 (10) and σ_p) is built from the same seed
and each guide is attached to its own copy. The step timed is the body of ``pyro_invariance.fit``'s
loop: ``TraceMeanField_ELBO.differentiable_loss`` on a minibatch of B rows + ``backward`` + Adam
with ``fit``'s parameter groups. Steps are interleaved guide by guide, repetition by repetition (the
order rotates), so load from other jobs hits every guide alike; the median over the repetitions is
reported. The ``map`` guide (AutoDelta: no sampling, no log q) gives the cost of the model itself,
so ``guide overhead = t(guide) − t(map)`` isolates what the variational family costs.

Guide parameter counts are effective free coordinates
(:func:`pyro_invariance.guides.num_guide_parameters`): for D = 10H + 11 latents, mean-field has 2D,
full-rank D(D+3)/2, block-Cholesky one H×H Cholesky factor per class, matrix-normal a 10×10 and an
H×H factor per weight matrix.

    .venv/bin/python benchmarks/guide_cost.py            # H = 32..512, writes results/guide_cost.md
    .venv/bin/python benchmarks/guide_cost.py --quick    # H = 32, 64, few repetitions (smoke test)
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

import pyro_invariance  # noqa: E402
from pyro_invariance import pyro_scope  # noqa: E402  (module-local params for main's own loops)
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.infer import training  # noqa: E402
from pyro_invariance.data.images import load_dataset  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402

GUIDES = ("map", "mean-field", "matrix-normal", "block-cholesky", "full-rank")


def setup(name: str, hidden: int, samples: int, x: torch.Tensor, y: torch.Tensor, n: int, seed: int) -> dict[str, Any]:
    pyro.set_rng_seed(seed)
    model = InvariantMLP(image_shape=(1, 8, 8), num_classes=10, hidden=hidden, num_transforms=samples, symmetry="rotation")
    guide = guides.get(name, model)
    with torch.no_grad():
        guide(x, y, num_data=n)
    cfg = training.FitConfig()
    optim = torch.optim.Adam(training._param_groups(model, guide, cfg))
    return {"model": model, "guide": guide, "optim": optim, "loss": TraceMeanField_ELBO(),
            "params": guides.num_guide_parameters(guide)}


def step(s: dict[str, Any], x: torch.Tensor, y: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter()
    s["optim"].zero_grad(set_to_none=True)
    loss = s["loss"].differentiable_loss(s["model"], s["guide"], x, y, num_data=n)
    loss.backward()
    s["optim"].step()
    loss.item()
    return time.perf_counter() - t0


def run(widths: list[int], reps: int, warmup: int, batch: int, samples: int, seed: int,
        guide_names: tuple[str, ...]) -> list[dict[str, Any]]:
    data = load_dataset("rotated-digits")
    n = data.x_train.shape[0]
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for h in widths:
        states = {g: setup(g, h, samples, data.x_train[:batch], data.y_train[:batch], n, seed) for g in guide_names}
        times: dict[str, list[float]] = {g: [] for g in guide_names}
        order = list(guide_names)
        for rep in range(warmup + reps):
            idx = torch.randperm(n, generator=gen)[:batch]
            xb, yb = data.x_train[idx], data.y_train[idx]
            for g in order:
                t = step(states[g], xb, yb, n)
                if rep >= warmup:
                    times[g].append(t)
            order = order[1:] + order[:1]
        base = statistics.median(times["map"]) if "map" in times else None
        for g in guide_names:
            med = statistics.median(times[g])
            q = statistics.quantiles(times[g], n=4) if len(times[g]) >= 4 else [med, med, med]
            rows.append({"hidden": h, "latents": 10 * h + 11, "guide": g, "params": states[g]["params"],
                         "median_s": med, "iqr_s": q[2] - q[0],
                         "overhead_s": (med - base) if base is not None else None})
            common.log(f"H={h} {g}: {med * 1e3:.1f} ms/step (params {states[g]['params']})")
        del states
    return rows


def markdown(rows: list[dict[str, Any]], info: dict[str, Any], settings: dict[str, Any]) -> str:
    intro = __doc__.split("\n\n")[1] + "\n\n" + __doc__.split("\n\n")[2]
    parts = [common.header_markdown("Guide cost per SVI step as the model grows (InvariantMLP, rotated digits)",
                                    info, settings, common.command_line(), intro)]
    guide_names = list(dict.fromkeys(r["guide"] for r in rows))
    widths = list(dict.fromkeys(r["hidden"] for r in rows))
    by = {(r["hidden"], r["guide"]): r for r in rows}
    parts += ["## Median time per SVI step (ms)", ""]
    parts.append(common.md_table(["H", "latents D"] + guide_names,
                                 [[h, 10 * h + 11] + [f"{by[h, g]['median_s'] * 1e3:.1f}" for g in guide_names] for h in widths]))
    if "map" in guide_names:
        others = [g for g in guide_names if g != "map"]
        parts += ["", "## Guide overhead per step, t(guide) − t(map) (ms)", ""]
        parts.append(common.md_table(["H"] + others,
                                     [[h] + [f"{by[h, g]['overhead_s'] * 1e3:.1f}" for g in others] for h in widths]))
    parts += ["", "## Guide parameters (effective free coordinates)", ""]
    parts.append(common.md_table(["H"] + guide_names, [[h] + [f"{by[h, g]['params']:,}" for g in guide_names] for h in widths]))
    if len(widths) >= 2:
        parts += ["", "## Growth of the step time per doubling of H (ratio of medians)", ""]
        ratio_rows = []
        for a, b in zip(widths, widths[1:]):
            ratio_rows.append([f"{a} → {b}"] + [f"{by[b, g]['median_s'] / by[a, g]['median_s']:.2f}" for g in guide_names])
        parts.append(common.md_table(["H"] + guide_names, ratio_rows))
    parts += ["", "IQR of the per-step times (ms), for the noise: " + "; ".join(
        f"H={h}: " + ", ".join(f"{g} {by[h, g]['iqr_s'] * 1e3:.1f}" for g in guide_names) for h in widths), ""]
    return "\n".join(parts)


@pyro_scope()
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="32,64,128,256,512")
    ap.add_argument("--guides", default=",".join(GUIDES))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--samples", type=int, default=16, help="transform samples S per step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="H = 32, 64 and 5 repetitions; writes guide_cost_quick.md")
    args = ap.parse_args(argv)
    common.set_threads(args.threads)
    widths = [32, 64] if args.quick else [int(w) for w in args.widths.split(",")]
    reps = 5 if args.quick else args.reps
    guide_names = tuple(g.strip() for g in args.guides.split(",") if g.strip())
    for g in guide_names:
        pyro_invariance.GUIDES.entry(g)  # unknown names fail before any timing
    settings = {"model": "invariant-mlp (RFF, symmetry=rotation, learned η, hierarchical prior)", "data": "rotated-digits",
                "widths H": widths, "guides": list(guide_names), "batch B": args.batch, "transform samples S": args.samples,
                "repetitions": reps, "warm-up steps": args.warmup, "seed": args.seed,
                "step": "TraceMeanField_ELBO.differentiable_loss + backward + Adam (fit's parameter groups)"}
    t0 = time.perf_counter()
    rows = run(widths, reps, args.warmup, args.batch, args.samples, args.seed, guide_names)
    settings["total seconds"] = round(time.perf_counter() - t0, 1)
    info = common.machine_info()
    stem = "guide_cost_quick" if args.quick else "guide_cost"
    md, js = common.write_results(stem, markdown(rows, info, settings), {"settings": settings, "machine": info,
                                                                          "command": common.command_line(), "rows": rows})
    common.log(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
