"""Metrics, symmetry analysis and plots for Hamiltonian models (talk 000 tables; methods.md §4).

:func:`evaluate_hnn` returns the columns of the talk's tables:

* ``train_mse``: mean squared error of the posterior-predictive mean on the training pairs,
* ``nll``: E_q[−log p(y | x, θ)] / N on the training data,
* ``kl``: KL(q ‖ p) / N (analytic where registered, else a one-sample estimate),
* ``neg_elbo``: ``nll + kl`` (−ELBO / N, lower is better),
* ``test_mse``, ``wider_mse``, ``moved_mse``: predictive-mean MSE on the other splits,
* ``energy_drift``: median over rollouts of the mean relative change of the *true* energy,
  |H(x̂_t) − H(x_0)| / |H(x_0)| (absolute for |H(x_0)| < 1e-6), along rollouts of the learned
  model from the test initial states (the median: a few diverging rollouts should not dominate).

MSEs are averaged over state coordinates and pairs (the talk's convention of a per-element MSE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from pyro import poutine
from torch import Tensor

from pyro_invariance.symmetry.conserved import SymmetryAnalysis, analyse_generators, oracle_generators
from pyro_invariance.data.arrays import prepare_arrays
from pyro_invariance.validation import check_positive_int, check_seed

_ORACLE_FOR = {"sho": "so2", "oscillators": "un", "nbody": "se2"}


def _draw(model: Any, guide: Any, x: Tensor) -> tuple[Any, Any]:
    guide_tr = poutine.trace(guide).get_trace(x[:1])
    return guide_tr, poutine.replay(model, trace=guide_tr)


@torch.no_grad()
def predict(model: Any, guide: Any, x: Tensor, num_samples: int = 8, batch_size: int = 4096) -> Tensor:
    """Next-state predictions under ``num_samples`` guide draws: ``(num_samples, N, M)``."""
    check_positive_int("num_samples", num_samples)
    out = []
    for _ in range(num_samples):
        _, conditioned = _draw(model, guide, x)
        out.append(torch.cat([poutine.block(conditioned)(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)]))
    return torch.stack(out)


@torch.no_grad()
def rollout(model: Any, guide: Any, x0: Tensor, steps: int, num_samples: int = 4) -> Tensor:
    """Autoregressive rollouts ``(num_samples, T, steps + 1, M)``, one guide draw per rollout."""
    check_positive_int("steps", steps)
    out = []
    for _ in range(num_samples):
        _, conditioned = _draw(model, guide, x0)
        xs = [x0]
        for _ in range(steps):
            xs.append(poutine.block(conditioned)(xs[-1]))
        out.append(torch.stack(xs, dim=1))
    return torch.stack(out)


@torch.no_grad()
def nll_kl(model: Any, guide: Any, x: Tensor, y: Tensor, num_particles: int = 4) -> tuple[float, float]:
    """``(E_q[−log p(y|x,θ)]/N, KL(q‖p)/N)`` on the full data, averaged over particles."""
    from torch.distributions import kl_divergence

    n = x.shape[0]
    nll = kl = 0.0
    for _ in range(num_particles):
        guide_tr, _ = _draw(model, guide, x)
        model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(x, y, num_data=n)
        for name, site in model_tr.nodes.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"]:
                nll -= float(site["fn"].log_prob(site["value"]).sum())
            elif name in guide_tr.nodes:
                q = guide_tr.nodes[name]["fn"]
                try:
                    kl += float(kl_divergence(q, site["fn"]).sum())
                except NotImplementedError:
                    v = site["value"]
                    kl += float((q.log_prob(v) - site["fn"].log_prob(v)).sum())
    return nll / (n * num_particles), kl / (n * num_particles)


def energy_drift(system: Any, traj: Tensor) -> float:
    """Median over rollouts of the mean relative drift of the true energy along ``traj (..., steps+1, M)``."""
    h = system.energy(traj.detach().cpu().double())
    h0 = h[..., :1]
    denom = torch.where(h0.abs() < 1e-6, torch.ones_like(h0), h0.abs())
    per_rollout = ((h - h0).abs() / denom).mean(-1)
    per_rollout = torch.where(torch.isfinite(per_rollout), per_rollout, torch.full_like(per_rollout, float("inf")))
    return float(per_rollout.flatten().median())


def evaluate_hnn(
    model: Any,
    guide: Any,
    data: Any,
    *,
    num_samples: int = 8,
    num_particles: int = 4,
    rollout_steps: int | None = None,
    max_test: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """The talk's table columns for a fitted model on a :class:`~pyro_invariance.data.physics.PhysicsDataset`.

    Args:
        num_samples: guide draws in the predictive mean.
        num_particles: draws in the NLL / KL estimates.
        rollout_steps: steps of the energy-drift rollouts (default the test split's ``steps``; 0 skips
            the energy drift).
        max_test: evaluate at most this many pairs per held-out split (speed).
        seed: seeds every draw (:func:`~pyro_invariance.diagnostics.evaluation.seeded_rng`): two calls give the
            same numbers, and the caller's RNG state is left as it was.

    Every split is converted and checked once for the model
    (:func:`~pyro_invariance.data.arrays.prepare_arrays`) and moved to the model's device.
    """
    from pyro_invariance.diagnostics.evaluation import model_device, seeded_rng

    check_positive_int("num_samples", num_samples)
    check_positive_int("num_particles", num_particles)
    if rollout_steps is not None:
        check_positive_int("rollout_steps", rollout_steps, minimum=0)
    if max_test is not None:
        check_positive_int("max_test", max_test)
    check_seed(seed)
    dev = model_device(model)

    def split_arrays(x: Any, y: Any) -> tuple[Tensor, Tensor]:
        return tuple(t.to(dev) for t in prepare_arrays(x, y, model))  # type: ignore[return-value]

    was_training = model.training
    model.eval()
    try:
        with seeded_rng(seed, dev):
            return _hnn_columns(model, guide, data, split_arrays, num_samples, num_particles, rollout_steps, max_test)
    finally:
        model.train(was_training)


def _hnn_columns(model: Any, guide: Any, data: Any, split_arrays: Any, num_samples: int, num_particles: int,
                 rollout_steps: int | None, max_test: int | None) -> dict[str, float]:  # fmt: skip
    x, y = split_arrays(data.x_train, data.y_train)
    out: dict[str, float] = {}
    out["train_mse"] = float(((predict(model, guide, x, num_samples).mean(0) - y) ** 2).mean())
    nll, kl = nll_kl(model, guide, x, y, num_particles)
    out.update(nll=nll, kl=kl, neg_elbo=nll + kl)
    for split in ("test", "wider", "moved"):
        if split not in data.arrays:
            continue
        xs, ys = data.split(split)
        if max_test is not None:
            xs, ys = xs[:max_test], ys[:max_test]
        xs, ys = split_arrays(xs, ys)
        out[f"{split}_mse"] = float(((predict(model, guide, xs, num_samples).mean(0) - ys) ** 2).mean())
    if "test" in data.trajectories and rollout_steps != 0:
        traj = torch.as_tensor(data.trajectories["test"], dtype=x.dtype, device=x.device)
        x0 = traj[: (max_test or traj.shape[0]), 0]
        steps = rollout_steps or data.splits["test"].steps
        out["energy_drift"] = energy_drift(data.system, rollout(model, guide, x0, steps, num_samples=2))
    return out


def symmetry_analysis(model: Any, oracle: str | None = None, system: str | None = None,
                      rel_threshold: float = 0.1) -> SymmetryAnalysis:
    """SVD of the model's generators and parallelness to the oracle (``oracle`` name, or the
    oracle of ``system``: sho → so2, oscillators → un, nbody → se2)."""
    if oracle is None and system is not None:
        oracle = _ORACLE_FOR.get(system)
    g = model.generators().detach()
    if g.shape[0] == 0:
        raise ValueError("the model has no generators (symmetry='none')")
    o = oracle_generators(oracle, model.state_dim, torch.float64) if oracle else None
    return analyse_generators(g, o, rel_threshold)


def plot_symmetry_analysis(analysis: SymmetryAnalysis, path: str | Path | None = None, title: str = "",
                           target: int | None = None) -> Any:
    """Two panels: singular values (bars; dashed line at ``target`` count) and the parallelness
    |cos| of each singular vector to the oracle span. Returns the figure (saved if ``path``)."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    s = analysis.singular_values.numpy()
    idx = range(1, len(s) + 1)
    axes[0].bar(idx, s, color="C0")
    axes[0].set(xlabel="index", ylabel="singular value", title=f"SVD ({analysis.num_significant} significant)")
    if target is not None:
        axes[0].axvline(target + 0.5, ls="--", color="k", lw=1, label=f"target {target}")
        axes[0].legend()
    if analysis.parallelness is not None:
        axes[1].bar(idx, analysis.parallelness.numpy()[: len(s)], color="C1")
        axes[1].set(xlabel="singular vector", ylabel="|cos| to oracle span", ylim=(0, 1.05), title="parallelness")
    else:
        axes[1].axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def plot_generators(generators: Sequence[Tensor], titles: Sequence[str], path: str | Path | None = None) -> Any:
    """Heat maps of generators ``(D, D)`` side by side (e.g. learned next to SO(2))."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(generators), figsize=(2.6 * len(generators), 2.6))
    axes = [axes] if len(generators) == 1 else list(axes)
    for ax, g, t in zip(axes, generators, titles):
        g = g.detach().cpu()
        lim = float(g.abs().max()) or 1.0
        ax.imshow(g.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(t)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
