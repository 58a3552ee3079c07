"""Time per SVI step of InvariantMLP at paper 003 size: pyro_invariance vs hand-written PyTorch.

Paper size (default): batch B=128, S=32 transforms, H=1024 hidden units, 28×28 inputs (D=784),
C=10 classes, N=60000, rotation learned, block-Cholesky guide over W2, both activations
(RFF: W1 fixed; ReLU: W1 learned). Per step, four ways, interleaved repetition by repetition
(the order rotates every repetition) so that load from other jobs hits them alike:

(Since issue 14 ``fit``'s loop is leaner than the ``pyro`` step below: no host synchronisation,
validation off after the first step, fused Adam, optional capture/compilation. The ``pyro`` step
here is the loop body as it was; ``benchmarks/gpu_step_time.py`` times ``fit``'s own loop against
the twin defined here and against this step, on CPU or GPU.)

* ``pyro``            the body of ``pyro_invariance.fit``'s loop before issue 14: ``TraceMeanField_ELBO
                      .differentiable_loss`` + ``backward`` + Adam (``fit``'s parameter groups and
                      learning rates) + cosine scheduler + ``loss.item()``; Pyro validation on
                      (Pyro's default).
* ``pyro-noval``      the same with ``pyro.enable_validation(False)``.
* ``hand``            a plain PyTorch step computing the same ELBO: the same transforms
                      (``pyro_invariance.symmetry.affine``: ``sample_epsilon``, ``lie_exp``,
                      ``transform_weight_rows``) and features, one reparameterised draw of W2 from a
                      block-Cholesky Gaussian (and of b2, σ_p from their mean-field guides), the
                      analytic KL to the prior, the categorical log-likelihood scaled by N/B, and the
                      same Adam groups + cosine scheduler. It warps the weight rows or the inputs, as
                      the model's ``transform_path`` decides for the batch. It starts from the Pyro guide's
                      parameters and, with the same seed, reproduces Pyro's loss and gradients
                      (checked at start, reported below).

Reported: median / min / IQR of the per-step wall time over ``--steps`` steps after ``--warmup``,
the ratio pyro / hand, the achieved GFLOP/s of the dominant FLOPs (x·W1^(s)ᵀ forward
2·B·S·H·D plus the backward to the warped rows 2·B·S·H·D; grid_sample, the guide and Adam are not
counted) against a measured float32 matmul rate at the same thread count, and a torch.profiler
breakdown of where each step's time goes. ``fit()`` itself is also timed for a few steps as a check
that the timed loop body is representative.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402

import pyro  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pyro.infer import TraceMeanField_ELBO  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.distributions.utils import _standard_normal  # noqa: E402

import pyro_invariance  # noqa: E402
from pyro_invariance import pyro_scope  # noqa: E402  (module-local params for main's own loops)
from pyro_invariance import guides  # noqa: E402
from pyro_invariance.infer import training  # noqa: E402
from pyro_invariance.models import InvariantMLP  # noqa: E402
from pyro_invariance.symmetry.affine import (  # noqa: E402
    affine_det, invert_affine, lie_exp, sample_epsilon, transform_weight_rows, warp_stack,
)

VARIANTS = ("pyro", "pyro-noval", "hand")


# --------------------------------------------------------------------------------------------
# The hand-written step
# --------------------------------------------------------------------------------------------
def _eta_raw(model: InvariantMLP) -> Tensor:
    """The unconstrained η parameter u of the model, η = η_max·sigmoid(u) (``eta_unit = sigmoid(u)``)."""
    return model.eta_unit_unconstrained


class HandWrittenInvariantMLP(nn.Module):
    """InvariantMLP + block-Cholesky guide as plain tensors, initialised from a Pyro pair.

    Unconstrained parameters mirror the Pyro ones (η = η_max·sigmoid(u); guide scales softplus;
    unit-lower-triangular factor = tril(U, −1) + I), so the two start from the same point.
    """

    def __init__(self, model: InvariantMLP, guide: Any) -> None:
        super().__init__()

        def p(t: Tensor) -> nn.Parameter:
            return nn.Parameter(t.detach().clone())

        self.image_shape = model.image_shape
        self.num_samples = model.num_transforms
        self.activation = model.activation
        self.hidden = model.hidden
        self.k = len(model.generator_names)
        self.sampling = model.sampling
        self.transform_path = model.transform_path  # the model's choice of warping weights or inputs, per batch size
        self.area_changing = bool(getattr(model, "_area_changing", False))
        self.register_buffer("generators", model.generators.clone())
        self.register_buffer("eta_upper", model.eta_upper.clone())
        self.eta_u = p(_eta_raw(model))
        if model.activation == "relu":
            self.w1, self.b1 = p(model.w1), p(model.b1)
        else:
            self.register_buffer("w1", model.w1.clone())
            self.register_buffer("b1", model.b1.clone())
        self.register_buffer("prior_loc", model.prior_scale_loc.clone())  # log σ_p prior location
        w2 = guide.structured.out_weight
        self.w2_loc = p(w2.loc_unconstrained)
        self.w2_scale_u = p(w2.scale_unconstrained)
        self.w2_tril = p(w2.scale_tril_unconstrained)  # the "factor" (lower learning rate in fit)
        self.b2_loc, self.b2_scale_u = p(guide.locs.out_bias_unconstrained), p(guide.scales.out_bias_unconstrained)
        self.sp_loc, self.sp_scale_u = p(guide.locs.prior_scale_unconstrained), p(
            guide.scales.prior_scale_unconstrained
        )

    def _phi(self, pre: Tensor) -> Tensor:
        return math.sqrt(2.0 / self.hidden) * torch.cos(pre) if self.activation == "rff" else F.relu(pre)

    def param_groups(self, cfg: training.FitConfig) -> list[dict[str, Any]]:
        """The same Adam groups and learning rates as ``fit`` (see ``training._param_groups``)."""
        guide = [self.w2_loc, self.w2_scale_u, self.b2_loc, self.b2_scale_u, self.sp_loc, self.sp_scale_u]
        groups = [{"params": guide, "lr": cfg.lr}, {"params": [self.w2_tril], "lr": cfg.factor_lr}]
        if self.activation == "relu":
            groups.append({"params": [self.w1, self.b1], "lr": cfg.model_lr or cfg.lr})
        groups.append({"params": [self.eta_u], "lr": cfg.eta_lr})
        return groups

    def loss(self, x: Tensor, y: Tensor, num_data: int) -> Tensor:
        """−ELBO estimate on a minibatch (one draw), in the RNG order of the Pyro guide + model."""
        # guide: σ_p (log-normal), W2 (block-Cholesky), b2 (mean-field)
        sp_scale = F.softplus(self.sp_scale_u)
        log_sigma = self.sp_loc + sp_scale * _standard_normal((), dtype=x.dtype, device=x.device)
        sigma = log_sigma.exp()
        C, H = self.w2_loc.shape
        s = F.softplus(self.w2_scale_u)
        chol = s.unsqueeze(-1) * (self.w2_tril.tril(-1) + torch.eye(H, dtype=x.dtype, device=x.device))
        eps = torch.randn(C, H, dtype=x.dtype, device=x.device)
        w2 = self.w2_loc + (chol @ eps.unsqueeze(-1)).squeeze(-1)
        b2_scale = F.softplus(self.b2_scale_u)
        b2 = self.b2_loc + b2_scale * _standard_normal((C,), dtype=x.dtype, device=x.device)
        # model: S transforms shared by the batch, warped W1 rows, averaged features
        x = x.reshape(x.shape[0], -1)
        eta = self.eta_upper * torch.sigmoid(self.eta_u)
        eps = sample_epsilon(self.num_samples, self.k, self.sampling, dtype=x.dtype, device=x.device)
        transforms = lie_exp(eta, eps, self.generators)
        b, d = x.shape
        if self.transform_path(b) == "weights":  # warp the S·H rows of W1 (paper 003, Eq. 6)
            rows = transform_weight_rows(self.w1, transforms, self.image_shape, layout="hsd")  # (H, S, D)
            pre = F.linear(x, rows.reshape(-1, d)).view(b, self.hidden, -1) + self.b1.unsqueeze(-1)  # (B, H, S)
            features = self._phi(pre).mean(-1)
        else:  # warp the S·B inputs by T_s⁻¹ (times |det T_s|⁻¹)
            inverse = invert_affine(transforms)
            warped = warp_stack(x.reshape(b, *self.image_shape), inverse).reshape(b, -1, d)  # (B, S, D)
            if self.area_changing:
                warped = warped * affine_det(inverse).unsqueeze(-1)
            features = self._phi(F.linear(warped, self.w1, self.b1)).mean(1)
        logits = features @ w2.T + b2
        nll = F.cross_entropy(logits, y, reduction="sum") * (num_data / x.shape[0])
        # analytic KLs: σ_p (Normal vs Normal in log space), W2 and b2 vs N(0, σ_p²)
        kl_sigma = -torch.log(sp_scale) + 0.5 * (sp_scale**2 + (self.sp_loc - self.prior_loc) ** 2) - 0.5
        var_w2 = chol.pow(2).sum(-1)
        log_det = 2.0 * torch.log(s).sum()
        kl_w2 = 0.5 * (
            ((var_w2 + self.w2_loc**2) / sigma**2).sum() - C * H + C * H * torch.log(sigma**2) - log_det
        )
        kl_b2 = (torch.log(sigma / b2_scale) + (b2_scale**2 + self.b2_loc**2) / (2 * sigma**2) - 0.5).sum()
        return nll + kl_sigma + kl_w2 + kl_b2


# --------------------------------------------------------------------------------------------
# Setting up the three steppers
# --------------------------------------------------------------------------------------------
def build_pyro(activation: str, cfg: dict[str, int], x: Tensor, y: Tensor, seed: int,
               transform_on: str = "weights") -> tuple[Any, Any]:  # fmt: skip
    """Model and block-Cholesky guide (set up on (x, y)). ``transform_on="weights"`` (default here): the
    path of the results in ``results/step_time.md``; the twin follows whichever path the model takes."""
    pyro.set_rng_seed(seed)
    model = InvariantMLP(
        image_shape=(1, cfg["side"], cfg["side"]), num_classes=cfg["classes"], hidden=cfg["hidden"],
        activation=activation, symmetry="rotation", learn_symmetry=True, num_transforms=cfg["samples"],
        transform_on=transform_on,
    )  # fmt: skip
    guide = guides.get("block-cholesky", model)
    with pyro.poutine.block():
        guide(x, y, num_data=cfg["num_data"])
    return model, guide


def make_pyro_step(model: Any, guide: Any, fit_cfg: training.FitConfig, total_steps: int, x: Tensor, y: Tensor,
                   num_data: int, validation: bool) -> Callable[[], float]:  # fmt: skip
    """The loop body of ``fit`` (minus history bookkeeping)."""
    optim = torch.optim.Adam(training._param_groups(model, guide, fit_cfg))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)
    loss_fn = TraceMeanField_ELBO(num_particles=1, vectorize_particles=False)

    def step() -> float:
        pyro.enable_validation(validation)
        loss = common.legacy_svi_step(loss_fn, model, guide, optim, sched, x, y, num_data)
        return -loss.item() / num_data

    return step


def make_hand_step(hand: HandWrittenInvariantMLP, fit_cfg: training.FitConfig, total_steps: int, x: Tensor,
                   y: Tensor, num_data: int) -> Callable[[], float]:  # fmt: skip
    optim = torch.optim.Adam(hand.param_groups(fit_cfg))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=total_steps, eta_min=0.0)

    def step() -> float:
        optim.zero_grad(set_to_none=True)
        loss = hand.loss(x, y, num_data)
        if not torch.isfinite(loss):
            raise FloatingPointError("non-finite loss")
        loss.backward()
        optim.step()
        sched.step()
        return -loss.item() / num_data

    return step


def check_same_elbo(model: Any, guide: Any, hand: HandWrittenInvariantMLP, x: Tensor, y: Tensor, num_data: int,
                    seed: int) -> dict[str, float]:  # fmt: skip
    """Same seed, same parameters: Pyro's loss and gradients vs the hand-written ones."""
    pyro.enable_validation(True)
    pyro.set_rng_seed(seed)
    model.zero_grad(set_to_none=True)
    guide.zero_grad(set_to_none=True)
    loss_p = TraceMeanField_ELBO().differentiable_loss(model, guide, x, y, num_data=num_data)
    loss_p.backward()
    pyro.set_rng_seed(seed)
    hand.zero_grad(set_to_none=True)
    loss_h = hand.loss(x, y, num_data)
    loss_h.backward()
    pairs = {
        "eta": (_eta_raw(model).grad, hand.eta_u.grad),
        "W2 loc": (guide.structured.out_weight.loc_unconstrained.grad, hand.w2_loc.grad),
        "W2 factor": (guide.structured.out_weight.scale_tril_unconstrained.grad.tril(-1), hand.w2_tril.grad.tril(-1)),
        "sigma_p loc": (guide.locs.prior_scale_unconstrained.grad, hand.sp_loc.grad),
    }
    if hand.activation == "relu":
        pairs["W1"] = (model.w1.grad, hand.w1.grad)
    lp, lh = loss_p.item(), loss_h.item()
    out = {"loss_pyro": lp, "loss_hand": lh, "loss_rel_diff": abs(lp - lh) / abs(lp)}
    for name, (a, b) in pairs.items():
        out[f"grad_rel_diff[{name}]"] = float((a - b).norm() / a.norm().clamp_min(1e-30))
    for module in (model, guide, hand):
        module.zero_grad(set_to_none=True)
    return out


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------
def interleaved_times(steppers: dict[str, Callable[[], float]], warmup: int, steps: int) -> dict[str, list[float]]:
    names = list(steppers)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(warmup + steps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            t0 = time.perf_counter()
            steppers[name]()
            dt = time.perf_counter() - t0
            if rep >= warmup:
                times[name].append(dt)
    return times


def summary(ts: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {"median": statistics.median(ts), "min": min(ts), "q1": q[0], "q3": q[2], "n": len(ts)}


def profile_steps(step: Callable[[], float], reps: int, row_limit: int = 12) -> dict[str, Any]:
    """torch.profiler over ``reps`` steps: top ops by self CPU time and the share of wall time
    spent inside aten ops (the rest is Python / dispatch overhead)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        wall = (time.perf_counter() - t0) / reps
    events = prof.key_averages(group_by_input_shape=True)
    aten = [e for e in events if e.key.startswith("aten::")]
    aten_self = sum(e.self_cpu_time_total for e in aten) / 1e6 / reps
    top = sorted(aten, key=lambda e: e.self_cpu_time_total, reverse=True)[:row_limit]
    rows = [
        {"op": e.key, "shapes": str(e.input_shapes)[:90], "calls_per_step": e.count / reps,
         "ms_per_step": e.self_cpu_time_total / 1e3 / reps}
        for e in top
    ]  # fmt: skip
    n_ops = sum(e.count for e in aten) / reps
    return {"wall_s_per_step": wall, "aten_self_s_per_step": aten_self, "aten_calls_per_step": n_ops, "top": rows}


def component_times(cfg: dict[str, int], activation: str, reps: int) -> dict[str, float]:
    """Median forward+backward time of the two big pieces alone: warping W1 (grid_sample) and
    the x·W1^(s)ᵀ einsum."""
    B, S, H, side = cfg["batch"], cfg["samples"], cfg["hidden"], cfg["side"]
    D = side * side
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(H, D, generator=gen).requires_grad_(activation == "relu")
    eta = torch.tensor([0.5], requires_grad=True)
    x = torch.rand(B, D, generator=gen)
    from pyro_invariance.symmetry.affine import affine_generators

    g = affine_generators()[2:3]
    rows_fixed = torch.randn(S, H, D, generator=gen, requires_grad=True)

    def warp() -> None:
        t = lie_exp(eta, sample_epsilon(S, 1), g)
        transform_weight_rows(w1, t, (1, side, side)).sum().backward()

    def einsum() -> None:
        torch.einsum("bd,shd->bsh", x, rows_fixed).sum().backward()

    out = {}
    for name, fn in (("grid_sample warp of W1 (fwd+bwd)", warp), ("einsum x·W1^(s) (fwd+bwd)", einsum)):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    return out


def time_fit(activation: str, cfg: dict[str, int], x: Tensor, y: Tensor, steps: int, seed: int) -> float:
    """Seconds per step of ``pyro_invariance.fit`` itself (validation on, progress bar off) on the
    minibatch (x, y) tiled to ``num_data`` rows (so the N/B scaling matches the timed steps)."""
    pyro.enable_validation(True)
    reps = max(1, cfg["num_data"] // x.shape[0])
    xs, ys = x.repeat(reps, 1, 1, 1), y.repeat(reps)
    model, guide = build_pyro(activation, cfg, x, y, seed)
    result = pyro_invariance.fit(model, guide, (xs, ys), steps=steps, batch_size=cfg["batch"], progress=False, seed=seed)
    return result.seconds / steps


# --------------------------------------------------------------------------------------------
@pyro_scope()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (B=32, S=4, H=128), few steps: a smoke test")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per variant (default 25; quick 10)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per variant first (default 3; quick 2)")
    parser.add_argument("--fit-steps", type=int, default=None, help="steps of the fit() check (default 8; quick 4)")
    parser.add_argument("--activations", default="rff,relu", help="comma-separated: rff, relu")
    parser.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)

    common.set_threads(args.threads)
    if args.quick:
        cfg = {"batch": 32, "samples": 4, "hidden": 128, "side": 28, "classes": 10, "num_data": 60000}
        steps, warmup, fit_steps, prof_reps = args.steps or 10, args.warmup or 2, args.fit_steps or 4, 2
        stem = "step_time_quick"
    else:
        cfg = {"batch": 128, "samples": 32, "hidden": 1024, "side": 28, "classes": 10, "num_data": 60000}
        steps, warmup, fit_steps, prof_reps = args.steps or 25, args.warmup or 3, args.fit_steps or 8, 3
        stem = "step_time"
    activations = [a.strip() for a in args.activations.split(",") if a.strip()]
    B, S, H, D = cfg["batch"], cfg["samples"], cfg["hidden"], cfg["side"] ** 2
    flops = 4 * B * S * H * D  # einsum forward 2BSHD + backward to the warped rows 2BSHD
    fit_cfg = training.FitConfig(model_lr=None)
    info = common.machine_info()
    common.log(f"machine: {info['cpu']}, torch {info['torch']}, {info['torch_threads']} thread(s); sizes {cfg}")

    matmul = common.matmul_gflops()
    common.log(f"float32 2048² matmul: {matmul:.1f} GFLOP/s")

    gen = torch.Generator().manual_seed(args.seed)
    x = torch.rand(B, 1, cfg["side"], cfg["side"], generator=gen)
    y = torch.randint(0, cfg["classes"], (B,), generator=gen)

    results: dict[str, Any] = {}
    total_steps = warmup + steps + 10
    for act in activations:
        common.log(f"[{act}] building Pyro model/guide and the hand-written twin")
        model_v, guide_v = build_pyro(act, cfg, x, y, args.seed)
        model_n, guide_n = build_pyro(act, cfg, x, y, args.seed)
        hand = HandWrittenInvariantMLP(model_v, guide_v)
        check = check_same_elbo(model_v, guide_v, hand, x, y, cfg["num_data"], args.seed + 1)
        common.log(f"[{act}] same-ELBO check: {check}")
        steppers = {
            "pyro": make_pyro_step(model_v, guide_v, fit_cfg, total_steps, x, y, cfg["num_data"], True),
            "pyro-noval": make_pyro_step(model_n, guide_n, fit_cfg, total_steps, x, y, cfg["num_data"], False),
            "hand": make_hand_step(hand, fit_cfg, total_steps, x, y, cfg["num_data"]),
        }
        t0 = time.perf_counter()
        times = interleaved_times(steppers, warmup, steps)
        stats = {k: summary(v) for k, v in times.items()}
        paired = {k: summary([a / b for a, b in zip(v, times["hand"])]) for k, v in times.items()}
        common.log(
            f"[{act}] interleaved timing ({time.perf_counter() - t0:.0f} s): "
            + ", ".join(f"{k} {v['median'] * 1e3:.1f} ms" for k, v in stats.items())
        )
        entry: dict[str, Any] = {"check": check, "times": times, "stats": stats, "paired_ratio": paired}
        if not args.no_profile:
            entry["profile"] = {}
            for name, stepper in steppers.items():
                entry["profile"][name] = profile_steps(stepper, prof_reps)
                common.log(f"[{act}] profiled {name}: {entry['profile'][name]['wall_s_per_step'] * 1e3:.1f} ms/step")
        pyro.enable_validation(True)
        entry["components"] = component_times(cfg, act, reps=5 if not args.quick else 3)
        common.log(f"[{act}] components: {entry['components']}")
        del steppers, model_v, guide_v, model_n, guide_n, hand
        entry["fit_s_per_step"] = time_fit(act, cfg, x, y, fit_steps, args.seed)
        common.log(f"[{act}] fit(): {entry['fit_s_per_step'] * 1e3:.1f} ms/step over {fit_steps} steps")
        results[act] = entry

    settings = {
        "batch B": B, "transforms S": S, "hidden H": H, "input D": f"{D} (1×{cfg['side']}×{cfg['side']})",
        "classes C": cfg["classes"], "N (likelihood scale N/B)": cfg["num_data"], "symmetry": "rotation (learned, η init 0.1)",
        "guide": "block-cholesky (W2), mean-field (b2, σ_p)", "prior": "hierarchical", "ELBO": "TraceMeanField_ELBO, 1 particle",
        "optimiser": f"Adam, fit's groups (lr {fit_cfg.lr}, factor_lr {fit_cfg.factor_lr}, eta_lr {fit_cfg.eta_lr}, model_lr = lr), cosine",
        "warm-up steps / timed steps per variant": f"{warmup} / {steps}", "order": "interleaved, rotated each repetition",
        "threads": args.threads, "dominant FLOPs per step (4·B·S·H·D)": f"{flops / 1e9:.2f} GFLOP",
    }  # fmt: skip
    markdown = render(info, settings, cfg, flops, matmul, results, fit_steps, quick=args.quick)
    payload = {"machine": info, "settings": settings, "sizes": cfg, "matmul_gflops": matmul, "flops_per_step": flops,
               "command": common.command_line(), "results": results}  # fmt: skip
    md_path, json_path = common.write_results(stem, markdown, payload, args.out_dir)
    common.log(f"wrote {md_path} and {json_path}")
    return 0


def render(info: dict[str, Any], settings: dict[str, Any], cfg: dict[str, int], flops: float, matmul: float,
           results: dict[str, Any], fit_steps: int, quick: bool) -> str:  # fmt: skip
    title = "SVI step time of InvariantMLP: pyro_invariance vs hand-written PyTorch" + (" (quick sizes)" if quick else "")
    intro = (
        "One SVI step of the invariant MLP of paper 003 (rotation learned, block-Cholesky guide), timed "
        "four ways in one run, interleaved: `pyro` = the loop body of `pyro_invariance.fit` (Pyro's default "
        "validation on), `pyro-noval` = the same after `pyro.enable_validation(False)`, `hand` = plain "
        "PyTorch computing the same ELBO (same `pyro_invariance.symmetry.affine` transforms, one reparameterised "
        "block-Cholesky draw of W2, analytic KLs, categorical log-likelihood × N/B, same Adam groups). "
        "The machine is shared with other jobs (see the load average), so absolute times carry noise; "
        "the interleaving keeps the ratios fair."
    )
    out = [common.header_markdown(title, info, settings, common.command_line(), intro)]
    out.append(f"Measured float32 matmul rate (2048×2048 @ 2048×2048, {info['torch_threads']} thread(s)): "
               f"**{matmul:.1f} GFLOP/s**.\n")  # fmt: skip
    rows = []
    for act, e in results.items():
        st = e["stats"]
        hand = st["hand"]["median"]
        for name in VARIANTS:
            s = st[name]
            rate = flops / s["median"] / 1e9
            pr = e["paired_ratio"][name]
            rows.append([
                act.upper(), f"`{name}`", f"{s['median'] * 1e3:.1f}", f"{s['min'] * 1e3:.1f}",
                f"{s['q1'] * 1e3:.1f}–{s['q3'] * 1e3:.1f}", f"{s['median'] / hand:.3f}×",
                f"{pr['median']:.3f}× ({pr['q1']:.2f}–{pr['q3']:.2f})", f"{rate:.1f}", f"{100 * rate / matmul:.0f}%",
            ])  # fmt: skip
        rows.append([act.upper(), f"`fit()` ({fit_steps} steps, mean; not interleaved)", f"{e['fit_s_per_step'] * 1e3:.1f}",
                     "", "", f"{e['fit_s_per_step'] / hand:.3f}×", "", f"{flops / e['fit_s_per_step'] / 1e9:.1f}", ""])  # fmt: skip
    out += ["## Time per step", "",
            common.md_table(["model", "variant", "median ms", "min ms", "IQR ms", "ratio of medians to hand",
                             "paired ratio to hand: median (IQR)", "GFLOP/s", "of matmul rate"], rows), "",
            "The paired ratio divides each step's time by the `hand` step of the same repetition (adjacent in "
            "time), which cancels most of the drift in the machine's load.", "",
            f"GFLOP/s counts only the dominant 4·B·S·H·D = {flops / 1e9:.2f} GFLOP per step (einsum forward and its "
            "backward to the warped W1 rows).", ""]  # fmt: skip
    verdict = []
    for act, e in results.items():
        st = e["stats"]
        r_v, r_n = st["pyro"]["median"] / st["hand"]["median"], st["pyro-noval"]["median"] / st["hand"]["median"]
        p_v, p_n = e["paired_ratio"]["pyro"]["median"], e["paired_ratio"]["pyro-noval"]["median"]
        ok = "within" if max(r_v, p_v) <= 1.15 else "above" if min(r_v, p_v) > 1.15 else "at the edge of"
        verdict.append(f"- {act.upper()}: pyro / hand = {r_v:.3f}× (ratio of medians), {p_v:.3f}× (paired) with "
                       f"validation ({ok} the 1.15× aim); {r_n:.3f}× / {p_n:.3f}× without.")  # fmt: skip
    out += ["Verdict:", "", *verdict, ""]
    out += ["## Same ELBO check", "",
            "Before timing, both implementations evaluate the loss and its gradients from the same parameters "
            "and the same seed (relative differences; float32):", ""]  # fmt: skip
    keys = list(dict.fromkeys(k for e in results.values() for k in e["check"]))
    out.append(common.md_table(["model", *keys], [[a.upper(), *(f"{e['check'][k]:.4g}" if k in e["check"] else "–" for k in keys)]
                                                  for a, e in results.items()]))
    out.append("")
    out += ["## Components alone", "", "Median forward+backward time of the two big pieces on their own:", ""]
    comp_rows = []
    for act, e in results.items():
        for name, t in e["components"].items():
            extra = f"{flops / t / 1e9:.1f} GFLOP/s" if "einsum" in name else ""
            comp_rows.append([act.upper(), name, f"{t * 1e3:.1f}", extra])
    out += [common.md_table(["model", "piece", "ms", "rate"], comp_rows, align=["l", "l", "r", "r"]), ""]
    if any("profile" in e for e in results.values()):
        out += ["## Where the time goes (torch.profiler)", "",
                "Self CPU time per step of the top aten ops; `aten total` is the sum over all aten ops, the rest of "
                "the wall time is Python, Pyro's handlers and dispatch.", ""]  # fmt: skip
        for act, e in results.items():
            for name, p in e.get("profile", {}).items():
                out.append(f"### {act.upper()} `{name}`: wall {p['wall_s_per_step'] * 1e3:.1f} ms/step (profiled), "
                           f"aten total {p['aten_self_s_per_step'] * 1e3:.1f} ms in {p['aten_calls_per_step']:.0f} op calls")  # fmt: skip
                out.append("")
                out.append(common.md_table(["op", "input shapes", "calls/step", "ms/step"], align=["l", "l", "r", "r"], rows=
                                           [[r["op"], f"`{r['shapes']}`", f"{r['calls_per_step']:.0f}",
                                             f"{r['ms_per_step']:.2f}"] for r in p["top"]]))  # fmt: skip
                out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
