"""Forward+backward time of ``InvariantMLP.features``: warp the weight rows or the inputs (issue 14).

``InvariantMLP.features`` averages the first layer over S sampled affine transforms T_s (paper 003,
Eq. 6). It can warp the S·H rows of W1 by T_s (``transform_on="weights"``, ~S·H·D bilinear
interpolations) or the S·B input images by T_s⁻¹ (``"inputs"``, ~S·B·D interpolations, with the
Jacobian |det T_s|⁻¹); the matmul FLOPs 2·S·B·H·D are the same (Sec. 3.2 of the paper; the model
docstring has the derivation). ``"auto"`` (the default) takes ``"inputs"`` when B < H.

Timed here, interleaved repetition by repetition (the order rotates every repetition) so that load
from other jobs hits all variants alike, median and IQR of the wall time of one
``features(x)`` forward pass plus the backward of ``⟨features(x), g⟩`` for a fixed random g
(η learned, so the warp is differentiated; ReLU also differentiates W1):

* ``weights (old)``: the code before issue 14: ``W1`` expanded to ``(S, H, h, w)`` and warped by a
  batched ``grid_sample``, then ``einsum("bd,shd->bsh")``;
* ``weights``: :func:`~pyro_invariance.symmetry.affine.warp_stack` (one ``grid_sample`` with the S
  grids stacked along the height, no expanded copy) to ``(H, S, D)``, then one
  ``(H·S, D) × (D, B)`` matmul;
* ``inputs (old)``: the code before issue 14: x expanded to ``(S·B, C, h, w)``, one grid per image
  (``repeat_interleave``), warped by T_s (not T_s⁻¹, no Jacobian), then a matmul;
* ``inputs``: ``warp_stack`` of x by T_s⁻¹ to ``(B, S, D)`` (× |det T_s|⁻¹ when the subgroup scales),
  then one ``(B·S, D) × (D, H)`` matmul.

Also timed: the matmul formulations of each path alone on fixed warped operands (for the weights
path: einsum vs bmm vs reshapes to one big matmul), and a sweep over B at fixed S, H to locate the crossover of the two
new paths (training: fwd+bwd; evaluation: forward under ``no_grad``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from pyro_invariance.models import InvariantMLP  # noqa: E402
from pyro_invariance.symmetry.affine import transform_images  # noqa: E402

PAPER = {"batch": 128, "samples": 32, "hidden": 1024, "side": 28}
SMALL = {"batch": 32, "samples": 4, "hidden": 64, "side": 28}
VARIANTS = ("weights (old)", "weights", "inputs (old)", "inputs")


# --------------------------------------------------------------------------------------------
# The code before issue 14, kept here to time it against the new paths
# --------------------------------------------------------------------------------------------
def old_transform_weight_rows(weight: Tensor, matrices: Tensor, image_shape: Sequence[int]) -> Tensor:
    """``transform_weight_rows`` before issue 14: expand W1 S times, batched ``grid_sample``."""
    c, h, w = image_shape
    hidden, d = weight.shape
    s = matrices.shape[0]
    rows = weight.reshape(1, hidden * c, h, w).expand(s, hidden * c, h, w)
    theta = matrices[:, :2, :].to(weight.dtype)
    grid = F.affine_grid(theta, [s, hidden * c, h, w], align_corners=True)
    out = F.grid_sample(rows, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out.reshape(s, hidden, d)


def old_features(model: InvariantMLP, x: Tensor, path: str) -> Tensor:
    """``InvariantMLP.features`` before issue 14 (``transform_on`` "weights" or "inputs")."""
    w1, b1 = model.w1, model.b1
    transforms = model.sample_transforms()
    if path == "weights":
        rows = old_transform_weight_rows(w1, transforms, model.image_shape)  # (S, H, D)
        pre = torch.einsum("bd,shd->bsh", x, rows) + b1
    else:
        s, b = transforms.shape[0], x.shape[0]
        images = x.reshape(1, b, *model.image_shape).expand(s, b, *model.image_shape)
        warped = transform_images(images.reshape(s * b, *model.image_shape), transforms.repeat_interleave(b, dim=0))
        pre = (warped.reshape(s, b, -1) @ w1.T + b1).transpose(0, 1)  # (B, S, H)
    return model._phi(pre).mean(dim=1)


# --------------------------------------------------------------------------------------------
def build(cfg: dict[str, int], activation: str, seed: int) -> tuple[InvariantMLP, Tensor, Tensor]:
    """A model (rotation learned, η = 0.5), a batch x and a cotangent g for the backward."""
    model = InvariantMLP(
        image_shape=(1, cfg["side"], cfg["side"]), hidden=cfg["hidden"], activation=activation,
        symmetry="rotation", eta_init=0.5, num_transforms=cfg["samples"], init_seed=seed,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(cfg["batch"], cfg["side"] ** 2, generator=gen)
    g = torch.randn(cfg["batch"], cfg["hidden"], generator=gen)
    return model, x, g


def features_fn(model: InvariantMLP, x: Tensor, variant: str) -> Callable[[], Tensor]:
    if variant.endswith("(old)"):
        path = variant.split()[0]
        return lambda: old_features(model, x, path)

    def new() -> Tensor:
        model.transform_on = variant
        return model.features(x)

    return new


def train_step(model: InvariantMLP, fn: Callable[[], Tensor], g: Tensor) -> Callable[[], None]:
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        torch.autograd.grad((fn() * g).sum(), params)

    return step


def eval_step(fn: Callable[[], Tensor]) -> Callable[[], None]:
    def step() -> None:
        with torch.no_grad():
            fn()

    return step


def interleaved_times(steppers: dict[str, Callable[[], None]], warmup: int, reps: int) -> dict[str, list[float]]:
    """Wall times per call, the variants' order rotated each repetition."""
    names = list(steppers)
    for _ in range(warmup):
        for name in names:
            steppers[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            steppers[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def summary(ts: Sequence[float]) -> dict[str, float]:
    q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
    return {"median": statistics.median(ts), "q25": q[0], "q75": q[2], "min": min(ts), "n": len(ts)}


def check_paths(cfg: dict[str, int], activation: str, seed: int) -> dict[str, float]:
    """Max |Δ features| / max |features| with the same draws: new vs old weights path (same
    function: rounding only), and inputs vs weights (interpolation: W1 warped vs x warped)."""
    model, x, _ = build(cfg, activation, seed)
    out = {}
    with torch.no_grad():
        torch.manual_seed(seed)
        ref = old_features(model, x, "weights")
        for variant in ("weights", "inputs"):
            torch.manual_seed(seed)
            h = features_fn(model, x, variant)()
            out[f"{variant} vs weights (old)"] = float((h - ref).abs().max() / ref.abs().max())
    return out


# --------------------------------------------------------------------------------------------
def time_features(cfg: dict[str, int], activation: str, warmup: int, reps: int, seed: int) -> dict[str, Any]:
    model, x, g = build(cfg, activation, seed)
    steppers = {v: train_step(model, features_fn(model, x, v), g) for v in VARIANTS}
    times = interleaved_times(steppers, warmup, reps)
    stats = {k: summary(v) for k, v in times.items()}
    paired = {k: summary([a / b for a, b in zip(v, times["weights (old)"])]) for k, v in times.items()}
    return {"times": times, "stats": stats, "paired_ratio_to_old_weights": paired}


def time_matmuls(cfg: dict[str, int], warmup: int, reps: int, seed: int) -> dict[str, Any]:
    """Each path's matmul alone, forward + backward to the warped operand: x (B, D) against warped rows
    (weights path), warped inputs (B, S, D) against W1 (inputs path)."""
    B, S, H, D = cfg["batch"], cfg["samples"], cfg["hidden"], cfg["side"] ** 2
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(B, D, generator=gen)
    shd = torch.randn(S, H, D, generator=gen, requires_grad=True)
    hsd = torch.randn(H, S, D, generator=gen, requires_grad=True)
    g_bsh = torch.randn(B, S, H, generator=gen)
    w1 = torch.randn(H, D, generator=gen)
    bsd = torch.randn(B, S, D, generator=gen, requires_grad=True)

    def run(rows: Tensor, fn: Callable[[], Tensor], g: Tensor) -> Callable[[], None]:
        return lambda: torch.autograd.grad(fn(), rows, g)

    steppers = {
        'einsum "bd,shd->bsh" (old)': run(shd, lambda: torch.einsum("bd,shd->bsh", x, shd), g_bsh),
        "bmm: x @ rows.mT, rows (S, H, D)": run(shd, lambda: torch.matmul(x, shd.mT), g_bsh.transpose(0, 1)),
        "mm: (S·H, D) @ (D, B)": run(shd, lambda: shd.reshape(S * H, D) @ x.T, g_bsh.permute(1, 2, 0).reshape(S * H, B)),
        "F.linear: (B, D) @ (D, S·H)": run(shd, lambda: F.linear(x, shd.reshape(S * H, D)), g_bsh.reshape(B, S * H)),
        "F.linear: (B, D) @ (D, H·S), rows (H, S, D)": run(
            hsd, lambda: F.linear(x, hsd.reshape(H * S, D)), g_bsh.transpose(1, 2).reshape(B, H * S)
        ),
        "mm: (H·S, D) @ (D, B), rows (H, S, D) [weights, new]": run(
            hsd, lambda: hsd.reshape(H * S, D) @ x.T, g_bsh.permute(2, 1, 0).reshape(H * S, B)
        ),
        "inputs: F.linear (B·S, D) @ (D, H) [inputs, new]": run(bsd, lambda: F.linear(bsd, w1), g_bsh),
        "inputs: mm (H, D) @ (D, B·S)": run(
            bsd, lambda: w1 @ bsd.reshape(B * S, D).T, g_bsh.reshape(B * S, H).T
        ),
    }  # fmt: skip
    times = interleaved_times(steppers, warmup, reps)
    return {"times": times, "stats": {k: summary(v) for k, v in times.items()}}


def time_sweep(side: int, samples: int, hidden: int, batches: Sequence[int], activation: str, reps: int,
               seed: int) -> list[dict[str, Any]]:  # fmt: skip
    """Median time of the new weights and inputs paths, training (fwd+bwd) and evaluation (forward)."""
    rows = []
    for b in batches:
        cfg = {"batch": b, "samples": samples, "hidden": hidden, "side": side}
        model, x, g = build(cfg, activation, seed)
        steppers = {}
        for v in ("weights", "inputs"):
            steppers[f"train {v}"] = train_step(model, features_fn(model, x, v), g)
            steppers[f"eval {v}"] = eval_step(features_fn(model, x, v))
        times = interleaved_times(steppers, 1, reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"batch": b, "hidden": hidden, "samples": samples, "activation": activation, "median_s": med})
        common.log(f"  sweep {activation} H={hidden} B={b}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
    return rows


# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions per variant at paper size")
    parser.add_argument("--small-reps", type=int, default=200, help="timed repetitions per variant at the small size")
    parser.add_argument("--sweep-reps", type=int, default=7, help="timed repetitions per point of the B sweep")
    parser.add_argument("--activations", default="rff,relu", help="comma-separated: rff, relu")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweep over B")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)

    common.set_threads(args.threads)
    activations = [a.strip() for a in args.activations.split(",") if a.strip()]
    info = common.machine_info()
    common.log(f"machine: {info['cpu']}, torch {info['torch']}, {info['torch_threads']} thread(s)")
    matmul = common.matmul_gflops()
    common.log(f"float32 2048² matmul: {matmul:.1f} GFLOP/s")

    sizes = {"paper": (PAPER, 2, args.reps), "small": (SMALL, 10, args.small_reps)}
    results: dict[str, Any] = {"features": {}, "checks": {}}
    for size_name, (cfg, warmup, reps) in sizes.items():
        for act in activations:
            key = f"{size_name}/{act}"
            results["checks"][key] = check_paths(cfg, act, args.seed)
            t0 = time.perf_counter()
            results["features"][key] = time_features(cfg, act, warmup, reps, args.seed)
            stats = results["features"][key]["stats"]
            common.log(f"[{key}] ({time.perf_counter() - t0:.0f} s) "
                       + ", ".join(f"{k} {v['median'] * 1e3:.2f} ms" for k, v in stats.items()))  # fmt: skip
    t0 = time.perf_counter()
    results["matmul"] = time_matmuls(PAPER, 2, max(5, args.reps // 2), args.seed)
    common.log(f"[matmul] ({time.perf_counter() - t0:.0f} s) "
               + ", ".join(f"{k} {v['median'] * 1e3:.1f} ms" for k, v in results["matmul"]["stats"].items()))  # fmt: skip
    sweep_cfg = {"side": 28, "samples": 8, "grid": {256: [32, 64, 128, 256, 512, 1024], 1024: [256, 512, 1024, 2048]}}
    results["sweep"] = []
    if not args.no_sweep:
        for act in activations:
            for hidden, batches in sweep_cfg["grid"].items():
                results["sweep"] += time_sweep(sweep_cfg["side"], sweep_cfg["samples"], hidden, batches, act,
                                               args.sweep_reps, args.seed)  # fmt: skip

    settings = {
        "paper size": "B=128, S=32, H=1024, 1×28×28 (D=784)",
        "small (overhead-bound) size": "B=32, S=4, H=64, 1×28×28",
        "symmetry": "rotation, η learned (init 0.5)",
        "timed": "features(x) forward + autograd.grad of ⟨features(x), g⟩ w.r.t. the parameters (η; W1, b1 for ReLU)",
        "repetitions (paper / small)": f"{args.reps} / {args.small_reps} after 2 / 10 warm-up, interleaved, order rotated",
        "matmul-only repetitions": max(5, args.reps // 2),
        "sweep": f"S={sweep_cfg['samples']}, 28×28, B per H: {sweep_cfg['grid']}, {args.sweep_reps} reps (median)",
        "threads": args.threads,
    }  # fmt: skip
    markdown = render(info, settings, matmul, results, activations)
    payload = {"machine": info, "settings": settings, "matmul_gflops": matmul, "command": common.command_line(),
               "sizes": {"paper": PAPER, "small": SMALL}, "results": results}  # fmt: skip
    md_path, json_path = common.write_results("transform_path", markdown, payload, args.out_dir)
    common.log(f"wrote {md_path} and {json_path}")
    return 0


def _ms(v: float) -> str:
    return f"{v * 1e3:.2f}" if v < 0.1 else f"{v * 1e3:.1f}"


def render(info: dict[str, Any], settings: dict[str, Any], matmul: float, results: dict[str, Any],
           activations: Sequence[str]) -> str:  # fmt: skip
    intro = (
        "`InvariantMLP.features`: forward + backward of the first layer averaged over S affine transforms, "
        "warping the weight rows (`transform_on=\"weights\"`) or the inputs (`\"inputs\"`), each before and after "
        "issue 14. `\"auto\"`, the default, takes `inputs` when B < H. The machine is shared with other jobs "
        "(see the load average): absolute times are noisy, the interleaving keeps the ratios fair."
    )
    parts = [common.header_markdown("Transform path of InvariantMLP: warp weights or inputs", info, settings,
                                    common.command_line(), intro)]  # fmt: skip
    parts += [f"Measured float32 matmul rate (2048×2048 @ 2048×2048, {info['torch_threads']} thread(s)): "
              f"**{matmul:.1f} GFLOP/s**.", ""]  # fmt: skip
    parts += ["## features: forward + backward", ""]
    parts += ["GFLOP/s counts 4·B·S·H·D (the forward matmul and its backward to the warped operand; ReLU's "
              "inputs path also multiplies for ∂W1, not counted). Paired ratio: each call's time over the "
              "`weights (old)` call of the same repetition.", ""]  # fmt: skip
    for key, entry in results["features"].items():
        size = PAPER if key.startswith("paper") else SMALL
        flops = 4 * size["batch"] * size["samples"] * size["hidden"] * size["side"] ** 2
        rows = []
        for v, st in entry["stats"].items():
            pr = entry["paired_ratio_to_old_weights"][v]
            rows.append([f"`{v}`", _ms(st["median"]), f"{_ms(st['q25'])}–{_ms(st['q75'])}", _ms(st["min"]),
                         f"{pr['median']:.3f}× ({pr['q25']:.2f}–{pr['q75']:.2f})",
                         f"{flops / st['median'] / 1e9:.1f}"])  # fmt: skip
        b, s, h = size["batch"], size["samples"], size["hidden"]
        parts += [f"### {key} (B={b}, S={s}, H={h}, D={size['side'] ** 2}; `auto` → "
                  f"`{'inputs' if b < h else 'weights'}`)", ""]  # fmt: skip
        parts += [common.md_table(["variant", "median ms", "IQR ms", "min ms", "paired ratio to weights (old): median (IQR)",
                                   "GFLOP/s"], rows), ""]  # fmt: skip
    parts += ["## Verdict", ""]
    for key, entry in results["features"].items():
        st, pr = entry["stats"], entry["paired_ratio_to_old_weights"]
        size = PAPER if key.startswith("paper") else SMALL
        auto = "inputs" if size["batch"] < size["hidden"] else "weights"
        old_auto = "weights (old)"
        parts.append(
            f"- {key}: `auto` (= `{auto}`) takes {st[auto]['median'] / st[old_auto]['median']:.2f}× the time of the "
            f"old default `weights (old)` (ratio of medians; paired {pr[auto]['median']:.2f}×); the new `weights` "
            f"{st['weights']['median'] / st[old_auto]['median']:.2f}×, the new `inputs` "
            f"{st['inputs']['median'] / st['inputs (old)']['median']:.2f}× the old `inputs`."
        )
    parts.append("")
    parts += ["## Same function", "",
              "Max |Δ features| / max |features| with the same draws ε_s (paper size, float32). "
              "`weights` vs `weights (old)` is the same computation reordered (rounding only). `inputs` vs "
              "`weights (old)` is the interpolation difference with the default white-noise W1: bilinear "
              "warping low-passes the rows (the inputs are smooth, tests/test_invariant_mlp.py).", ""]  # fmt: skip
    rows = [[k] + [f"{v:.2e}" for v in c.values()] for k, c in results["checks"].items()]
    first = next(iter(results["checks"].values()))
    parts += [common.md_table(["size/activation", *first.keys()], rows), ""]
    parts += ["## Each path's matmul alone (paper size)", "",
              "x (B, D) against fixed warped rows (weights path), or fixed warped inputs (B, S, D) against W1 "
              "(inputs path, last two rows): forward + backward to the warped operand (4·B·S·H·D FLOPs). "
              "`[..., new]` marks what `features` uses.", ""]  # fmt: skip
    flops = 4 * PAPER["batch"] * PAPER["samples"] * PAPER["hidden"] * PAPER["side"] ** 2
    rows = [[f"`{k}`", _ms(st["median"]), f"{_ms(st['q25'])}–{_ms(st['q75'])}", f"{flops / st['median'] / 1e9:.1f}"]
            for k, st in results["matmul"]["stats"].items()]  # fmt: skip
    parts += [common.md_table(["formulation", "median ms", "IQR ms", "GFLOP/s"], rows), ""]
    if results["sweep"]:
        parts += ["## Crossover: time of the new paths over B (S=8, 28×28)", "",
                  "Median ms; `train` = forward + backward (η learned), `eval` = forward under `no_grad`. "
                  "`w/i` = weights / inputs time: above 1, warping the inputs is faster.", ""]  # fmt: skip
        rows = []
        for r in results["sweep"]:
            m = r["median_s"]
            rows.append([r["activation"], r["hidden"], r["batch"], f"{r['batch'] / r['hidden']:.3g}",
                         _ms(m["train weights"]), _ms(m["train inputs"]), f"{m['train weights'] / m['train inputs']:.2f}",
                         _ms(m["eval weights"]), _ms(m["eval inputs"]), f"{m['eval weights'] / m['eval inputs']:.2f}"])  # fmt: skip
        parts += [common.md_table(["activation", "H", "B", "B/H", "train weights", "train inputs", "train w/i",
                                   "eval weights", "eval inputs", "eval w/i"], rows), ""]  # fmt: skip
        parts += ["Crossover (smallest B/H of the sweep from which on the weights path is faster, "
                  "for every larger B too; `auto` switches at B/H = 1):", ""]  # fmt: skip
        for act in activations:
            for hidden in sorted({r["hidden"] for r in results["sweep"]}):
                pts = [r for r in results["sweep"] if r["activation"] == act and r["hidden"] == hidden]
                cells = []
                for mode in ("train", "eval"):
                    faster = [r["median_s"][f"{mode} weights"] < r["median_s"][f"{mode} inputs"] for r in pts]
                    idx = next((i for i in range(len(pts)) if all(faster[i:])), None)
                    cells.append(f"{mode}: " + (f"B/H = {pts[idx]['batch'] / hidden:.3g}" if idx is not None
                                                else f"beyond B/H = {pts[-1]['batch'] / hidden:.3g}"))  # fmt: skip
                parts.append(f"- {act}, H = {hidden}: " + "; ".join(cells))
        parts.append("")
    return "\n".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
